"""`toolsd mcp` as a client meets it: the first call after the session was lost (the daemon
restarted) runs in a fresh one; the repl tool says how long its state lasts under MCP; an
unknown tool's error lists every tool; numbers sent as strings are read as numbers."""

from __future__ import annotations

import os

import pytest

import agentkit
from agent.calls.tools import TOOLS
from conftest import needs_bwrap, wait_gone
from test_mcp_server import connect, texts

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place


@pytest.mark.daemon(shared=False)  # it restarts the daemon
async def test_the_first_call_after_a_daemon_restart_runs(place, daemon):
    async with connect(place, socket=daemon.socket) as client:
        first = await client.call_tool("run_terminal", {"command": "echo one"})
        assert daemon.stop() == 0, daemon.read_log()
        daemon.start()
        second = await client.call_tool("run_terminal", {"command": "echo two"})
        third = await client.call_tool("run_terminal", {"command": "echo three"})
        with daemon.client() as c:
            sessions = c.session_list()["sessions"]
    assert texts(first) == ["one\n[exit code 0]"]
    assert not second.is_error
    [text] = texts(second)
    assert text.startswith("two\n[exit code 0]\n[toolsd: the session was lost (toolsd stopped "
                           "answering: ")
    assert texts(third) == ["three\n[exit code 0]"]
    assert len(sessions) == 1
    with open(os.path.join(place.root, "mcp.log")) as f:
        assert "was lost (toolsd stopped answering" in f.read()


async def test_the_repl_says_its_state_lasts_until_repl_reset(place, daemon):
    async with connect(place, socket=daemon.socket) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
    repl = listed["repl"].description
    assert "until repl_reset" in repl and "turn" not in repl and "user message" not in repl
    agents = next(t for t in TOOLS if t.name == "repl").description
    assert repl != agents and "this turn" in agents


async def test_an_unknown_tool_lists_every_tool(place, daemon):
    async with connect(place, socket=daemon.socket) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        wrong = await client.call_tool("shell", {"command": "ls"})
    assert wrong.is_error
    assert texts(wrong) == [f"There is no tool 'shell'; the tools are {', '.join(names)}."]
    assert "repl_reset" in names


async def test_numbers_sent_as_strings_are_read_as_numbers(place, daemon):
    async with connect(place, socket=daemon.socket) as client:
        slow = await client.call_tool("run_terminal", {"command": "sleep 30",
                                                       "timeout_s": "1.5"})
        started = await client.call_tool("process_start", {"command": "echo up; exec sleep 99"})
        bg = texts(started)[0].split()[1].rstrip(".")
        read = await client.call_tool("process_output", {"id": bg, "wait_s": "5",
                                                         "until": "up"})
        await client.call_tool("process_stop", {"id": bg})
        bad = await client.call_tool("run_terminal", {"command": "true", "timeout_s": "5s"})
    assert not slow.is_error and "timed out after 1.5 s" in texts(slow)[0]
    assert texts(read)[0].startswith("up\n")
    assert bad.is_error and texts(bad) == [
        "run_terminal: Expected `float`, got `str` - at `timeout_s`"]
    assert wait_gone(daemon.running("sleep"), timeout=30) == []


def test_the_agent_reads_numbers_sent_as_strings_too():
    from agent.calls.arguments import ProcessOutput, RunTerminal, parse_arguments
    from agent.history.messages import ToolCall

    assert parse_arguments(ToolCall("c1", "run_terminal", {"command": "ls", "timeout_s": "5"})) \
        == RunTerminal("ls", 5.0)
    assert parse_arguments(ToolCall("c2", "process_output", {"id": "bg1", "wait_s": "0.5"})) \
        == ProcessOutput("bg1", 0.5)
    wrong = parse_arguments(ToolCall("c3", "run_terminal", {"command": 5}))
    assert wrong.is_error and wrong.text == "run_terminal: Expected `str`, got `int` - at `command`"
