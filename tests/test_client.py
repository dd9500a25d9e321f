"""The clients: the async one from trio and from asyncio, many tasks on one connection."""

from __future__ import annotations

import asyncio

import pytest
import trio

from toolsd.client import AsyncClient, ToolsdError


async def test_trio_many_tasks_one_connection_none_stuck_behind_a_slow_call(daemon):
    async with await AsyncClient.connect(daemon.socket) as client:
        session = (await client.session_open(daemon.workspace))["session"]
        done = []

        async def slow():
            await client.shell_run(session, "sleep 2")
            done.append("slow")

        async def quick(i):
            assert (await client.hello())["protocol"] == 1
            done.append(i)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            await trio.sleep(0)
            for i in range(30):
                nursery.start_soon(quick, i)
        assert done[-1] == "slow"
        assert sorted(x for x in done if x != "slow") == list(range(30))


async def test_trio_error_reply_raises_with_code(daemon):
    async with await AsyncClient.connect(daemon.socket) as client:
        with pytest.raises(ToolsdError) as e:
            await client.shell_run("s404", "true")
        assert e.value.code == "not_found"
        assert (await client.hello())["protocol"] == 1  # the connection is still good


def test_asyncio_client(daemon):
    async def main():
        client = await AsyncClient.connect(daemon.socket)
        async with client:
            session = (await client.session_open(daemon.workspace))["session"]
            slow = asyncio.ensure_future(client.shell_run(session, "sleep 1; echo slow"))
            hellos = await asyncio.gather(*(client.hello() for _ in range(20)))
            assert not slow.done()
            assert all(h["protocol"] == 1 for h in hellos)
            assert (await slow)["output"] == "slow\n"
            with pytest.raises(ToolsdError) as e:
                await client.call("no.such.method")
            assert e.value.code == "unknown_method"

    asyncio.run(main())


def test_sync_client_maps_errors(client):
    with pytest.raises(ToolsdError) as e:
        client.process_output("bg999999")
    assert e.value.code == "not_found"
    assert client.hello()["protocol"] == 1
