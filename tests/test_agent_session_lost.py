"""A session that is gone under the agent (its sandbox died, or the daemon closed it for
idleness: calls answer `session_closed`): a fresh one is opened on the same workspace, the
model is told plainly what is gone, and the turn goes on; when none can be opened, the turn
fails saying why."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest
import trio

import agentkit
from agent.history.messages import Text, ToolResult, UserMessage
from agent.models.scripted import call, reply
from agentkit import kill_sandbox
from conftest import RunningDaemon, needs_bwrap, short_tempdir, wait_for

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

kit = agentkit.kit


def results(request) -> list[str]:
    return [m.text for m in request.messages if isinstance(m, ToolResult)]


def sessions(daemon) -> dict[str, dict]:
    with daemon.client() as c:
        return {s["session"]: s for s in c.session_list()["sessions"]}


LOST = ("[toolsd: the session was lost ({reason}); a fresh one was opened on the same "
        "workspace. Gone with the earlier one: its background processes{processes}, the "
        "REPL's state and its /tmp (saved outputs, figures); the terminal is back in the "
        "workspace root. The workspace's files are as they were.]")


async def test_a_session_whose_sandbox_died_mid_turn_is_replaced_and_the_model_told(kit):
    os.makedirs(os.path.join(kit.workspace, "sub"))
    ws = os.path.realpath(kit.workspace)
    agent = await kit.open([
        reply("", call("process_start", command="exec sleep 6161")),
        reply("", call("repl", code="x = 1")),
        reply("", call("run_terminal", command="cd sub")),
        reply("set up"),
    ])
    assert (await agent.run_turn("set up")).outcome == "completed"
    lost = agent.backend.session
    [bg] = agent.backend.processes

    def die_then_pwd(request):
        kill_sandbox(kit.daemon, lost)
        return reply("", call("run_terminal", command="pwd"))

    agent.model.add(die_then_pwd,
                    reply("", call("run_terminal", command="pwd")),
                    reply("", call("process_output", id=bg)),
                    reply("", call("repl", code="x")),
                    reply("", call("repl", code="y = 2; y")),
                    reply("went on"))
    result = await agent.run_turn("go on")
    assert result.outcome == "completed", result
    cut, where, stale, gone, fresh = results(agent.model.requests[-1])[-5:]
    [event] = [e for e in agent.conversation.events() if e["type"] == "session_replaced"]
    assert cut == LOST.format(reason=event["reason"], processes=f" ({bg})") + (
        "\n[run_terminal did not finish: it was not run, or cut off, with the lost session; "
        "run it again if it is still needed]")
    assert "sandbox has died" in event["reason"]
    assert (event["turn"], event["lost"], event["stale"]) == (2, lost, [bg])
    assert where == f"{ws}\n[exit code 0]"  # the terminal's folder is reset, said above
    assert stale == (f"{bg} ended with an earlier toolsd session, which was lost. Processes "
                     f"of this session: none. Start it again with process_start.")
    assert "NameError: name 'x' is not defined" in gone
    assert fresh == "2"  # the REPL works in the new session's turn
    # The new session is the one in use; the dead one is closed, and nothing of it is left.
    now = sessions(kit.daemon)
    assert agent.backend.session == event["session"] != lost
    assert list(now) == [agent.backend.session] and now[agent.backend.session]["alive"]
    assert kit.daemon.running("sleep 6161") == []


@contextlib.asynccontextmanager
async def own_kit(*extra_args: str):
    """A kit on a daemon of its own (`serve` with `extra_args`), stopped at the end."""
    root = short_tempdir()
    daemon = RunningDaemon(root, extra_args=extra_args).start()
    try:
        k = agentkit.Kit(daemon)
        yield k
        await k.close()
        assert daemon.stop() == 0, daemon.read_log()
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def idle_kit():
    """A kit on a daemon of its own that closes sessions idle for 3 s."""
    async with own_kit("--idle-timeout", "3s") as k:
        yield k


async def test_a_session_closed_for_idleness_is_replaced_as_the_turn_begins(idle_kit):
    kit = idle_kit
    agent = await kit.open([reply("", call("run_terminal", command="pwd")), reply("done")])
    lost = agent.backend.session
    wait_for(lambda: lost not in sessions(kit.daemon), timeout=120)
    result = await agent.run_turn("where am I")
    assert result.outcome == "completed", result
    [event] = [e for e in agent.conversation.events() if e["type"] == "session_replaced"]
    assert "without activity" in event["reason"] and event["stale"] == []
    # Told before the model's first request of the turn, after the prompt: not a turn.
    prompt, notice = agent.model.requests[0].messages
    assert prompt == UserMessage([Text("where am I")])
    assert notice == UserMessage([Text(LOST.format(reason=event["reason"], processes=""))],
                                 attachment=True)
    assert results(agent.model.requests[1]) == [f"{os.path.realpath(kit.workspace)}\n"
                                                f"[exit code 0]"]


async def test_when_no_session_can_be_opened_the_turn_fails_saying_why(kit):
    agent = await kit.open([reply("", call("run_terminal", command="true")), reply("ok")])
    assert (await agent.run_turn("first")).outcome == "completed"
    lost = agent.backend.session
    kill_sandbox(kit.daemon, lost)
    moved = kit.workspace + ".away"
    os.rename(kit.workspace, moved)  # a new session has nowhere to open
    result = await agent.run_turn("second")
    assert result.outcome == "failed"
    assert result.reason.startswith(f"the toolsd session {lost} was lost (")
    assert f"and a new one could not be opened on {os.path.realpath(kit.workspace)}: " in \
        result.reason
    # The agent tries again at the next turn, once the folder is back.
    os.rename(moved, kit.workspace)
    agent.model.add(reply("", call("run_terminal", command="echo back")), reply("fine"))
    assert (await agent.run_turn("third")).outcome == "completed"
    assert results(agent.model.requests[-1])[-1] == "back\n[exit code 0]"
    assert agent.backend.session != lost


async def test_calls_that_find_the_session_lost_at_once_open_one_session(kit):
    """`toolsd mcp` runs calls side by side: each that finds the session gone is told, and
    only one new session is opened."""
    agent = await kit.open()
    backend = agent.backend
    lost = backend.session
    kill_sandbox(kit.daemon, lost)
    got = []
    async with trio.open_nursery() as nursery:
        for word in ("one", "two", "three"):
            nursery.start_soon(_collect,
                               backend.call(call("run_terminal", command=f"echo {word}")), got)
    assert len(got) == 3
    assert all(o.is_error and o.text.startswith("[toolsd: the session was lost (") for o in got)
    assert list(sessions(kit.daemon)) == [backend.session] != [lost]
    assert (await backend.call(call("run_terminal", command="echo on"))).text == \
        "on\n[exit code 0]"


async def _collect(coroutine, into: list):
    into.append(await coroutine)


async def test_a_session_closed_by_someone_else_is_replaced(kit):
    # Closed from another client (a person's `toolsd` at the socket): the daemon forgets it,
    # and its calls answer `not_found` "no session".
    agent = await kit.open([reply("", call("run_terminal", command="true")), reply("ok")])
    assert (await agent.run_turn("first")).outcome == "completed"
    lost = agent.backend.session

    def close_then_echo(request):
        with kit.daemon.client() as c:
            c.session_close(lost)
        return reply("", call("run_terminal", command="echo cut"))

    agent.model.add(close_then_echo, reply("", call("run_terminal", command="echo on")),
                    reply("fine"))
    result = await agent.run_turn("second")
    assert result.outcome == "completed", result
    cut, on = results(agent.model.requests[-1])[-2:]
    [event] = [e for e in agent.conversation.events() if e["type"] == "session_replaced"]
    assert event["reason"].startswith(f"no session {lost!r}")
    assert cut.startswith(LOST.format(reason=event["reason"], processes="")) and \
        cut.endswith("[run_terminal did not finish: it was not run, or cut off, with the lost "
                     "session; run it again if it is still needed]")
    assert on == "on\n[exit code 0]"
    assert list(sessions(kit.daemon)) == [agent.backend.session] != [lost]


async def test_after_a_daemon_restart_the_agent_connects_again():
    async with own_kit() as kit:
        agent = await kit.open([reply("", call("process_start", command="exec sleep 6363")),
                                reply("started")])
        assert (await agent.run_turn("first")).outcome == "completed"
        [bg] = agent.backend.processes
        lost = agent.backend.session
        assert kit.daemon.stop() == 0, kit.daemon.read_log()
        kit.daemon.start()
        agent.model.add(reply("", call("run_terminal", command="echo back")),
                        reply("", call("process_stop", id=bg)), reply("fine"))
        result = await agent.run_turn("second")
        assert result.outcome == "completed", result
        [event] = [e for e in agent.conversation.events() if e["type"] == "session_replaced"]
        assert event["lost"] == lost and event["stale"] == [bg]
        assert event["reason"].startswith("toolsd stopped answering: ")
        notice = agent.model.requests[-3].messages[-1]
        assert notice == UserMessage([Text(LOST.format(reason=event["reason"],
                                                       processes=f" ({bg})"))],
                                     attachment=True)
        back, stale = results(agent.model.requests[-1])[-2:]
        assert back == "back\n[exit code 0]"
        assert stale.startswith(f"{bg} ended with an earlier toolsd session, which was lost.")
        assert list(sessions(kit.daemon)) == [agent.backend.session]


async def test_a_fresh_session_lost_at_once_fails_the_turn_instead_of_looping(kit):
    agent = await kit.open([reply("", call("run_terminal", command="true")), reply("ok")])
    assert (await agent.run_turn("first")).outcome == "completed"
    first = agent.backend.session
    kill_sandbox(kit.daemon, first)
    replaced = []

    def close_the_new_one(event):
        if event["type"] == "session_replaced":
            replaced.append(event["session"])
            with kit.daemon.client() as c:
                c.session_close(event["session"])

    result = await agent.run_turn("second", on_event=close_the_new_one)
    assert result.outcome == "failed"
    assert result.reason == (f"the toolsd session {replaced[0]}, opened in place of a lost "
                             f"one, was lost too (no session {replaced[0]!r}; open one with "
                             f"session.open (session.list shows the open ones)): not opening "
                             f"another in this call")
    assert len(replaced) == 1 and sessions(kit.daemon) == {}
    # The next turn tries again.
    agent.model.add(reply("", call("run_terminal", command="echo again")), reply("fine"))
    assert (await agent.run_turn("third")).outcome == "completed"
    assert results(agent.model.requests[-1])[-1] == "again\n[exit code 0]"
