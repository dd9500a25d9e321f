"""The session's DNS server (its /etc/resolv.conf names 127.0.0.1), over UDP and TCP: every
query goes to `answer` (EgressProxy.answer_dns), which refuses what the rule does not allow
without asking any resolver."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from toolsd.sandbox.egress.dns_message import BadQuery, Query, error_reply, parse_query

log = logging.getLogger("toolsd.egress")

MAX_UDP = 4096
# Queries being answered at once per session (over UDP, past it a query is dropped and the
# client asks again; over TCP each connection answers one query at a time).
IN_FLIGHT = 16
TCP_IDLE_S = 10.0

Answer = Callable[[Query], Awaitable[bytes]]


async def _reply_to(data: bytes, answer: Answer) -> bytes | None:
    try:
        query = parse_query(data)
    except BadQuery as e:
        return error_reply(data, e)
    return await answer(query)


async def serve_udp(sock: trio.socket.SocketType, answer: Answer) -> None:
    """Answer the datagrams of `sock` until cancelled."""
    busy = trio.Semaphore(IN_FLIGHT)
    async with trio.open_nursery() as nursery:
        while True:
            try:
                data, peer = await sock.recvfrom(MAX_UDP)
            except OSError:
                continue  # an ICMP error of an earlier reply, say
            try:
                busy.acquire_nowait()
            except trio.WouldBlock:
                continue
            nursery.start_soon(_answer_datagram, sock, data, peer, answer, busy)


async def _answer_datagram(sock, data: bytes, peer, answer: Answer, busy) -> None:
    try:
        reply = await _reply_to(data, answer)
        if reply is not None:
            if len(reply) > 512:
                reply = reply[:2] + bytes([reply[2] | 0x02, reply[3]]) + bytes(8)  # TC: ask by TCP
            await sock.sendto(reply, peer)
    except OSError:
        pass
    finally:
        busy.release()


async def serve_tcp(stream: trio.SocketStream, answer: Answer) -> None:
    """Answer length-prefixed queries on one connection until it ends or stays idle."""
    buffer = b""
    while True:
        with trio.move_on_after(TCP_IDLE_S):
            while len(buffer) < 2 or len(buffer) < 2 + int.from_bytes(buffer[:2], "big"):
                data = await stream.receive_some(MAX_UDP)
                if not data:
                    return
                buffer += data
        if len(buffer) < 2 or len(buffer) < 2 + int.from_bytes(buffer[:2], "big"):
            return  # idle
        size = int.from_bytes(buffer[:2], "big")
        message, buffer = buffer[2:2 + size], buffer[2 + size:]
        reply = await _reply_to(message, answer)
        if reply is None:
            return
        await stream.send_all(len(reply).to_bytes(2, "big") + reply)
