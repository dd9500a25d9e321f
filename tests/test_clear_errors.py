"""Errors a user can act on: an environment too big for any command says its size and the
limit; a call cut off by session.close or turn.end says so, whatever tool it was."""

from __future__ import annotations

import os

import pytest
import trio

from conftest import wait_for
from toolsd.client import AsyncClient, ToolsdError
from toolsd.sandbox.bwrap.policy import ENV_MAX_BYTES
from toolsd.tools.repl_turns import MAX_OPEN_TURNS

pytestmark = pytest.mark.daemon(shared=True)

MB = 1 << 20


def test_session_open_with_a_1_mb_env_value_is_bad_params_naming_size_and_limit(daemon,
                                                                               client):
    before = client.session_list()["sessions"]
    with pytest.raises(ToolsdError) as e:
        client.session_open(daemon.workspace, env={"BIG": "x" * MB})
    assert e.value.code == "bad_params"
    assert f"{MB + 5:,}" in e.value.message  # BIG=, the value and its NUL
    assert f"{ENV_MAX_BYTES:,}" in e.value.message
    assert "'BIG'" in e.value.message
    assert client.session_list()["sessions"] == before


def test_a_command_env_over_the_limit_is_bad_params_for_shell_and_process(client, session):
    for call in (client.shell_run, client.process_start):
        with pytest.raises(ToolsdError) as e:
            call(session, "echo never", env={"BIG": "x" * MB})
        assert e.value.code == "bad_params"
        assert f"{ENV_MAX_BYTES:,}" in e.value.message and "'BIG'" in e.value.message
    assert client.process_list(session)["processes"] == []


def test_an_env_under_the_limit_reaches_the_command(daemon, client):
    value = "v" * (ENV_MAX_BYTES // 2)
    s = client.session_open(daemon.workspace, env={"HALF": value})["session"]
    assert client.shell_run(s, "echo ${#HALF}")["output"] == f"{len(value)}\n"
    r = client.shell_run(s, "echo ${#MORE}", env={"MORE": "m" * (ENV_MAX_BYTES // 4)})
    assert r["output"] == f"{ENV_MAX_BYTES // 4}\n"
    client.session_close(s)


def read_fifo(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def started_fifo(daemon, tool: str) -> str:
    """A FIFO in the workspace for code of `tool` to say it has started (it opens the FIFO
    for writing, and waits until the test reads)."""
    fifo = os.path.join(daemon.workspace, f"started-{tool}.fifo")
    os.mkfifo(fifo)
    return fifo


async def cut_off_by_session_close(daemon, fifo: str, code: str, *, calls: int = 1,
                                   tool: str = "repl"):
    """Run `calls` requests of `code` (`tool`: "repl" or "shell") in a fresh session, close the
    session once the first has said so on `fifo`; what each request got."""
    outcomes = []
    try:
        async with await AsyncClient.connect(daemon.socket) as client:
            s = (await client.session_open(daemon.workspace))["session"]
            turn = (await client.turn_begin(s))["turn"]

            async def call():
                try:
                    if tool == "shell":
                        outcomes.append(await client.shell_run(s, code, timeout_s=600))
                    else:
                        outcomes.append(await client.repl_exec(s, turn, code, timeout_s=600))
                except ToolsdError as e:
                    outcomes.append(e)

            async with trio.open_nursery() as nursery:
                for _ in range(calls):
                    nursery.start_soon(call)
                await trio.to_thread.run_sync(read_fifo, fifo)
                await client.session_close(s)
    finally:
        os.unlink(fifo)
    return outcomes


def errors(outcomes) -> list[tuple[str, str]]:
    return [(o.code, o.message) if isinstance(o, ToolsdError) else ("no error", repr(o))
            for o in outcomes]


PYTHON_STARTED = "open({fifo!r}, 'w').write('x')\nimport time\ntime.sleep(1000)"


async def test_repl_exec_cut_off_by_session_close_is_session_closed(daemon):
    fifo = started_fifo(daemon, "repl")
    # The second request waits behind the first: it is answered the same.
    got = errors(await cut_off_by_session_close(daemon, fifo, PYTHON_STARTED.format(fifo=fifo),
                                                calls=2))
    assert [code for code, _ in got] == ["session_closed", "session_closed"], got
    assert "was closed" in got[0][1]


async def test_shell_run_cut_off_by_session_close_is_session_closed(daemon):
    fifo = started_fifo(daemon, "shell")
    got = errors(await cut_off_by_session_close(daemon, fifo, f"echo x > {fifo}; sleep 1000",
                                                tool="shell"))
    assert [code for code, _ in got] == ["session_closed"], got


async def test_process_output_waiting_through_session_close_gets_the_final_status(daemon):
    async with await AsyncClient.connect(daemon.socket) as client:
        s = (await client.session_open(daemon.workspace))["session"]
        bg = (await client.process_start(s, "echo up; exec sleep 1000"))["id"]
        first = await client.process_output(bg, wait_s=60, until="up")
        assert first["output"] == "up\n"
        read = {}

        async def wait_for_more():
            read.update(await client.process_output(bg, wait_s=600))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_more)
            await client.session_close(s)
        assert (read["status"], read["signal"]) == ("stopped", "SIGTERM")


async def test_image_read_cut_off_by_session_close_is_session_closed(daemon):
    async with await AsyncClient.connect(daemon.socket) as client:
        s = (await client.session_open(daemon.workspace))["session"]
        got = []

        async def read():
            try:
                # A pty master with no terminal on the other side: reading it waits for ever.
                got.append(await client.image_read(s, "/dev/ptmx"))
            except ToolsdError as e:
                got.append(e)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.to_thread.run_sync(wait_for, lambda: daemon.running("/dev/ptmx"))
            await client.session_close(s)
        assert errors(got)[0][0] == "session_closed", errors(got)


def test_turns_begun_without_end_are_bounded_and_ending_one_makes_room(client, session):
    turns = [client.turn_begin(session)["turn"] for _ in range(MAX_OPEN_TURNS)]
    with pytest.raises(ToolsdError) as e:
        client.turn_begin(session)
    assert e.value.code == "limit_exceeded"
    assert f"{MAX_OPEN_TURNS} turns open" in e.value.message and "turn.end" in e.value.message
    client.turn_end(session, turns[0])
    turn = client.turn_begin(session)["turn"]
    assert client.repl_exec(session, turn, "1 + 1")["output"] == "2\n"
    client.session_close(session)
