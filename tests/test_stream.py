"""Live output (protocol 1.1 "stream") through a real daemon: events before the reply, in
order and bounded; a client that does not read holds the command, not the daemon's memory;
cancel and disconnect mid-stream; no events for a request that did not ask."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
import uuid

import psutil
import pytest
import trio

from conftest import wait_for, wait_gone
from test_protocol_bad_input import frame, raw_connect, read_frame
from toolsd.client import AsyncClient, ToolsdError
from toolsd.tools.live_output import RELEASED_BYTES, Flow, LiveOutput, sending
from toolsd.tools.output import render
from toolsd.wire.events import EVENT_MAX_BYTES

pytestmark = pytest.mark.daemon(shared=True)

FLOOD_MB = 64


def go_file(daemon) -> tuple[str, str]:
    """A file name in the workspace (as the session sees it) and its host path: the command
    waits for it, the test makes it once it has seen the output before."""
    name = f"go-{uuid.uuid4().hex}"
    return name, os.path.join(daemon.workspace, name)


def request(request_id: int, method: str, **params) -> bytes:
    return frame({"id": request_id, "method": method, "params": params})


def frames_until_reply(sock, request_id: int) -> tuple[list[dict], dict]:
    """The frames up to the reply to `request_id`: (events, reply); any other frame fails."""
    events = []
    while True:
        f = read_frame(sock)
        assert f is not None, "the daemon closed the connection"
        assert f["id"] == request_id, f
        if "event" not in f:
            return events, f
        assert f["event"] == "output" and isinstance(f["data"], str)
        events.append(f)


def flood_command(marker: str, mb: int = FLOOD_MB) -> str:
    return (f"python3 -c 'import sys\nfor i in range({mb * 16}): "
            f"sys.stdout.buffer.write(b\"x\" * 65536) #{marker}'")


def writer_of(daemon, marker: str) -> psutil.Process:
    """The python of flood_command (not a wrapper script such as pyenv's, on its way to it)."""
    found = []

    def started() -> bool:
        found[:] = [p for p in daemon.running(marker) if p.name().startswith("python")]
        return bool(found)

    wait_for(started)
    return found[0]


def held_in_its_pipe(proc: psutil.Process) -> int:
    """Wait until `proc` sits in a write to its full pipe and writes nothing more between two
    looks; how much it has written by then."""
    last = [-1]

    def held() -> bool:
        try:
            with open(f"/proc/{proc.pid}/wchan") as f:
                waiting = "pipe" in f.read()
            written = proc.io_counters().write_chars
        except (OSError, psutil.NoSuchProcess):
            raise AssertionError("the command wrote all its output: nothing held it") from None
        steady, last[0] = written == last[0], written
        return waiting and steady

    wait_for(held, timeout=60)
    return last[0]


def test_output_comes_live_as_events_before_the_reply(daemon, session):
    name, path = go_file(daemon)
    sock = raw_connect(daemon)
    sock.sendall(request(7, "shell.run", session=session, stream=True, timeout_s=60,
                         command=f"echo first; until [ -e {name} ]; do sleep 0.05; done; "
                                 f"echo second"))
    # The command is still waiting for the file: only live output can be here.
    first = read_frame(sock)
    assert first == {"id": 7, "event": "output", "data": "first\n"}
    open(path, "w").close()
    events, reply = frames_until_reply(sock, 7)
    assert reply["result"]["exit_code"] == 0 and not reply["result"]["timed_out"]
    assert "first\n" + "".join(e["data"] for e in events) == reply["result"]["output"]
    # Nothing of request 7 comes after its reply.
    sock.sendall(request(8, "hello"))
    assert read_frame(sock)["id"] == 8
    sock.close()


def mixed_output() -> bytes:
    """Lines of numbers, multi-byte characters, and invalid bytes that render as \\xNN."""
    return b"".join(b"%06d \xc3\xa9\xf0\x9f\x98\x80%s\n" % (i, b"\xff\xc3" * (i % 997 == 0))
                    for i in range(60000))


def test_events_are_in_order_bounded_and_rendered_as_output_is(daemon, client, session):
    expected = mixed_output()
    with open(os.path.join(daemon.workspace, "mixed.bin"), "wb") as f:
        f.write(expected)
    events = []
    r = client.shell_run(session, "cat mixed.bin", on_event=events.append)
    assert r["output_bytes"] == len(expected) and r["truncated"]
    assert all(e.event == "output" and len(e.data.encode()) <= EVENT_MAX_BYTES
               for e in events)
    assert "".join(e.data for e in events) == render(expected)
    assert len(events) > len(expected) // EVENT_MAX_BYTES


def test_a_client_that_does_not_read_holds_the_command_not_the_daemons_memory(daemon,
                                                                              client,
                                                                              session):
    marker = f"flood-{uuid.uuid4().hex[:8]}"
    own = psutil.Process(daemon.proc.pid)
    rss_before = own.memory_info().rss
    sock = raw_connect(daemon)
    sock.sendall(request(1, "shell.run", session=session, stream=True, timeout_s=600,
                         command=flood_command(marker)))
    writer = writer_of(daemon, marker)
    written = held_in_its_pipe(writer)
    # What left the command waits in the pipe, the daemon's small buffer and the sockets.
    assert written < 8 << 20
    assert own.memory_info().rss < rss_before + (32 << 20)
    # Only that request waits: the same session answers others meanwhile.
    assert client.shell_run(session, "echo other")["output"] == "other\n"
    # Nothing was lost: once the client reads, all of it comes, then the reply.
    total = 0
    while True:
        f = read_frame(sock)
        assert f["id"] == 1
        if "event" not in f:
            break
        assert set(f["data"]) == {"x"}
        total += len(f["data"])
    assert total == FLOOD_MB << 20 == f["result"]["output_bytes"]
    assert own.memory_info().rss < rss_before + (32 << 20)
    sock.close()


def test_cancel_ends_a_streaming_command_whose_client_does_not_read(daemon, client,
                                                                     session):
    marker = f"flood-{uuid.uuid4().hex[:8]}"
    sock = raw_connect(daemon)
    sock.sendall(request(1, "shell.run", session=session, stream=True, timeout_s=600,
                         command=flood_command(marker)))
    writer = writer_of(daemon, marker)
    held_in_its_pipe(writer)
    sock.sendall(request(2, "cancel", request=1))
    assert wait_gone([writer], timeout=30) == []
    # The frames cut by the cancel still come whole: every one parses, then both replies.
    replies = {}
    while len(replies) < 2:
        f = read_frame(sock)
        if "event" not in f:
            replies[f["id"]] = f
    assert replies[2] == {"id": 2, "result": {}}
    assert replies[1]["error"]["code"] == "cancelled"
    assert client.shell_run(session, "echo next")["output"] == "next\n"
    sock.close()


async def test_leaving_the_iteration_cancels_the_request(daemon):
    marker = f"tick-{uuid.uuid4().hex[:8]}"
    async with await AsyncClient.connect(daemon.socket) as c:
        s = (await c.session_open(daemon.workspace))["session"]
        async with c.stream("shell.run", session=s, timeout_s=600,
                            command=f"python3 -c 'while True: print(\"tick\") #{marker}'") as call:
            async for event in call:
                assert event.data.startswith("tick")
                break
        wait_gone(daemon.running(marker), timeout=30)
        assert not daemon.running(marker)
        # The connection goes on, the cancelled request's frames dropped on the way.
        assert (await c.shell_run(s, "echo after"))["output"] == "after\n"
        await c.session_close(s)


async def test_the_async_iterator_gives_events_then_the_result(daemon):
    async with await AsyncClient.connect(daemon.socket) as c:
        s = (await c.session_open(daemon.workspace))["session"]
        call = c.stream("shell.run", session=s, command="seq 1 5000; exit 3")
        seen = [event.data async for event in call]
        assert "".join(seen) == "".join(f"{i}\n" for i in range(1, 5001))
        assert call.result["exit_code"] == 3
        with pytest.raises(ToolsdError) as e:
            async for _ in c.stream("shell.run", session="s-none", command="true"):
                pass
        assert e.value.code == "not_found"
        await c.session_close(s)


def test_asyncio_callback_gets_the_events_in_order(daemon):
    async def main():
        async with await AsyncClient.connect(daemon.socket) as c:
            s = (await c.session_open(daemon.workspace))["session"]
            seen = []
            r = await c.shell_run(s, "seq 1 20000", on_event=lambda e: seen.append(e.data))
            await c.session_close(s)
            return seen, r

    seen, r = asyncio.run(main())
    assert "".join(seen) == "".join(f"{i}\n" for i in range(1, 20001))
    assert r["output_bytes"] == len("".join(seen))


def test_a_request_that_does_not_ask_gets_no_events(daemon, client, session):
    bg = client.process_start(session, "seq 1 3")["id"]
    client.process_output(bg, wait_s=30, until="3")
    sock = raw_connect(daemon)
    sock.sendall(request(1, "shell.run", session=session, command="seq 1 100000"))
    reply = read_frame(sock)
    assert reply["id"] == 1
    assert reply["result"]["output_bytes"] == len("".join(f"{i}\n" for i in range(1, 100001)))
    # `stream` on a read that does not wait: nothing to stream, the reply at once.
    sock.sendall(request(2, "process.output", id=bg, since=0, stream=True))
    assert read_frame(sock)["result"]["output"] == "1\n2\n3\n"
    sock.close()


def test_a_client_gone_mid_stream_leaves_nothing_behind(daemon, client, session):
    marker = f"flood-{uuid.uuid4().hex[:8]}"
    own = psutil.Process(daemon.proc.pid)
    turn = client.turn_begin(session)["turn"]
    client.repl_exec(session, turn, "kept = 42")
    # With the REPL running (its pipes are counted, and closed at turn.end).
    fds_before = own.num_fds()
    bg = client.process_start(session, "while true; do echo tick; sleep 0.01; done")["id"]
    sock = raw_connect(daemon)
    sock.sendall(request(1, "shell.run", session=session, stream=True, timeout_s=600,
                         command=flood_command(marker)))
    sock.sendall(request(2, "repl.exec", session=session, turn=turn, stream=True,
                         code="while True: print('tock')"))
    sock.sendall(request(3, "process.output", id=bg, since=0, wait_s=600, until="never",
                         stream=True))
    seen = set()
    while seen != {1, 2, 3}:
        seen.add(read_frame(sock)["id"])
    sock.close()
    assert wait_gone(daemon.running(marker), timeout=30) == []
    # The REPL was interrupted, not lost; the background process was not touched.
    r = client.repl_exec(session, turn, "kept")
    assert r["status"] == "ok" and r["output"].endswith("42\n") and not r["state_lost"]
    assert client.process_output(bg)["status"] == "running"
    client.process_stop(bg)
    client.turn_end(session, turn)
    wait_for(lambda: own.num_fds() <= fds_before)


def test_repl_output_comes_live_and_ends_with_the_notice(daemon, client, session):
    name, path = go_file(daemon)
    turn = client.turn_begin(session)["turn"]
    events = []

    def on_event(event):
        events.append(event.data)
        if "first" in event.data:
            open(path, "w").close()

    code = (f"import os, time\nprint('first', flush=True)\n"
            f"while not os.path.exists({name!r}): time.sleep(0.05)\nprint('second')\n"
            f"time.sleep(60)")
    r = client.repl_exec(session, turn, code, timeout_s=20, on_event=on_event)
    assert r["status"] == "timeout"
    assert "".join(events) == r["output"]
    assert r["output"].startswith("first\nsecond\n")
    assert r["output"].endswith("[timed out after 20 s: interrupted; the state is kept]")
    client.turn_end(session, turn)


def test_process_output_streams_what_comes_while_it_waits(daemon, client, session):
    name, path = go_file(daemon)
    bg = client.process_start(session, f"echo first; until [ -e {name} ]; do sleep 0.05; "
                                       f"done; echo READY; sleep 600")["id"]
    events = []

    def on_event(event):
        events.append(event.data)
        if "first" in event.data:
            open(path, "w").close()

    r = client.process_output(bg, wait_s=60, until="READY", on_event=on_event)
    assert r["output"] == "first\nREADY\n" == "".join(events)
    assert r["status"] == "running"
    client.process_stop(bg)


def test_exec_prints_the_output_as_it_comes(daemon):
    name, path = go_file(daemon)
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "exec", "--workspace",
         daemon.workspace, "--", f"echo first; until [ -e {name} ]; do sleep 0.05; done; "
                                 f"echo second; exit 3"],
        stdout=subprocess.PIPE, env=daemon.env)
    try:
        # A safety net, not a timing: the command waits for the file, which comes after.
        assert select.select([proc.stdout], [], [], 60)[0], "nothing printed while it ran"
        assert proc.stdout.readline() == b"first\n"
        open(path, "w").close()
        assert proc.stdout.read() == b"second\n"
        assert proc.wait(timeout=60) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_exec_whose_reader_goes_away_ends_the_command(daemon, client):
    marker = f"yes-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "exec", "--workspace",
         daemon.workspace, "--", f"python3 -c 'while True: print(\"y\") #{marker}'"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=daemon.env)
    assert proc.stdout.readline() == b"y\n"
    proc.stdout.close()  # as `| head -1` does
    assert proc.wait(timeout=60) == 141, proc.stderr.read()
    assert proc.stderr.read() == b""
    assert not daemon.running(marker)
    assert client.session_list()["sessions"] == []


async def test_a_stream_read_too_slowly_after_the_end_says_what_it_left_out():
    """The one bound the daemon tests cannot reach without a descriptor smuggled out of a
    command's tree: once released, at most RELEASED_BYTES wait for the client."""
    sent = []
    client_reads = trio.Event()

    async def emit(text: str) -> None:
        await client_reads.wait()
        sent.append(text)

    live = LiveOutput(emit)
    async with sending(live):
        live.release()
        for _ in range((RELEASED_BYTES >> 16) + 3):
            live.feed(b"y" * 65536)
            await live.room()  # never waits once released
        assert live.flow is Flow.CUT and live.left_out == 3 * 65536
        client_reads.set()
        await live.finish("[a notice]")
    text = "".join(sent)
    assert text.startswith("y" * RELEASED_BYTES)
    assert text.endswith(f"\n[... {3 * 65536} bytes left out of the stream: it was read too "
                         f"slowly; the answer's output has them ...]\n[a notice]")
    assert all(len(piece.encode()) <= EVENT_MAX_BYTES for piece in sent)
