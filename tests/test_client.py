"""The clients: the async one from trio and from asyncio, many tasks on one connection; each
test over the Unix socket and over TLS with a token (protocol 1.2), which must behave alike."""

from __future__ import annotations

import asyncio
import os

import pytest
import trio

from conftest import wait_gone
from toolsd.client import AsyncClient, ToolsdError

pytestmark = pytest.mark.daemon(shared=True, tls=True)


@pytest.fixture(params=["unix", "tls"])
def transport(request):
    return request.param


@pytest.fixture
def client(daemon, transport):
    with daemon.client(transport) as c:
        yield c


async def test_trio_many_tasks_one_connection_none_stuck_behind_a_slow_call(daemon, transport):
    async with await daemon.async_client(transport) as client:
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


async def test_trio_error_reply_raises_with_code(daemon, transport):
    async with await daemon.async_client(transport) as client:
        with pytest.raises(ToolsdError) as e:
            await client.shell_run("s404", "true")
        assert e.value.code == "not_found"
        assert (await client.hello())["protocol"] == 1  # the connection is still good


def test_asyncio_client(daemon, transport):
    async def main():
        client = await daemon.async_client(transport)
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


def sleeps_in(daemon, marker: str) -> list:
    return daemon.running(f"sleep {marker}")


async def test_trio_cancelled_call_ends_its_command(daemon, transport):
    # A caller that gives up (Ctrl-C in an agent) must not leave the command running in the
    # daemon until its timeout: the client sends `cancel` for it.
    async with await daemon.async_client(transport) as client:
        session = (await client.session_open(daemon.workspace))["session"]
        started = trio.Event()

        async def run():
            started.set()
            await client.shell_run(session, "sleep 4242; echo never", timeout_s=600)

        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await started.wait()
                # The command is running when its sleep is.
                while not sleeps_in(daemon, "4242"):
                    await trio.sleep(0.05)
                scope.cancel()
        assert wait_gone(sleeps_in(daemon, "4242"), timeout=30) == []
        # The connection is in step: the next calls get their own answers.
        assert (await client.shell_run(session, "echo next"))["output"] == "next\n"
        assert (await client.hello())["protocol"] == 1
        await client.session_close(session)


def test_asyncio_cancelled_call_ends_its_command(daemon, transport):
    async def main():
        async with await daemon.async_client(transport) as client:
            session = (await client.session_open(daemon.workspace))["session"]
            task = asyncio.ensure_future(client.shell_run(session, "sleep 4343", timeout_s=600))
            while not sleeps_in(daemon, "4343"):
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert wait_gone(sleeps_in(daemon, "4343"), timeout=30) == []
            assert (await client.shell_run(session, "echo next"))["output"] == "next\n"
            await client.session_close(session)

    asyncio.run(main())


def test_an_unknown_keyword_is_refused_before_anything_is_sent(daemon, client, session):
    # The daemon ignores params it does not know: a misspelt option would be dropped silently.
    ran = f"{daemon.workspace}/ran"
    with pytest.raises(TypeError) as e:
        client.shell_run(session, f"touch {ran}", timeout=1)
    assert "'timeout'" in str(e.value) and "'timeout_s'" in str(e.value)
    assert "shell_run()" in str(e.value)
    with pytest.raises(TypeError, match="'wait_s'"):
        client.process_output("bg1", wait=5)
    with pytest.raises(TypeError, match="'max_dim'"):
        client.image_read(session, "x.png", maxdim=10)
    assert not os.path.exists(ran)
    # Known options, and the client's own (on_event), still go through.
    r = client.shell_run(session, "echo ok", timeout_s=30, on_event=lambda e: None)
    assert r["output"] == "ok\n"


async def test_the_async_client_refuses_an_unknown_keyword_too(daemon):
    async with await AsyncClient.connect(daemon.socket) as client:
        session = (await client.session_open(daemon.workspace))["session"]
        with pytest.raises(TypeError, match="'timeout_s'"):
            await client.shell_run(session, f"touch {daemon.workspace}/ran", timeout=1)
        with pytest.raises(TypeError, match="'language'"):
            await client.repl_exec(session, "t1", "1", lang="python")
        assert not os.path.exists(f"{daemon.workspace}/ran")
        assert (await client.shell_run(session, "echo ok", timeout_s=30))["output"] == "ok\n"
        await client.session_close(session)
def test_session_and_process_survive_a_dropped_connection(daemon, transport):
    # Reconnecting is the caller's choice; what a connection started is not its own.
    first = daemon.client(transport)
    session = first.session_open(daemon.workspace)["session"]
    bg = first.process_start(session, "sleep 4545")["id"]
    first._sock.close()  # dropped, not closed politely
    with daemon.client(transport) as second:
        assert second.process_output(bg)["status"] == "running"
        assert second.shell_run(session, "echo again")["output"] == "again\n"
        second.session_close(session)
    assert wait_gone(sleeps_in(daemon, "4545"), timeout=30) == []
