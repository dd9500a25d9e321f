"""ask_user: offered to the model only where a person can answer (`toolsd agent` on a
terminal), and the answer is the tool's result; not with --json, from a pipe, or over MCP."""

from __future__ import annotations

import pexpect
import pytest

import agentkit
from conftest import needs_bwrap
from model_server import Call, openai_stream
from test_agent_cli import argv, run, server, spawn, tool_message  # noqa: F401 (a fixture)

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place


def declared(request) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools", [])]


def test_the_persons_answer_is_the_result_and_the_turn_goes_on(server, place, daemon):
    server.push(openai_stream(calls=[Call("ask_user", {"question": "Which port?"})]),
                openai_stream(text="Using 8080."))
    child = spawn(argv(server, place, "--mode", "ask", "start the server",
                       socket=daemon.socket), place)
    child.expect_exact("? Which port?")
    child.expect_exact("Your answer: ")
    child.sendline("8080, please")
    child.expect_exact("Using 8080.")
    child.expect_exact("[completed] 2 steps, 1 tool call")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "ask_user" in declared(server.requests[0])
    assert tool_message(server.requests[1])["content"] == "The user answered: 8080, please"


def test_not_offered_with_json_or_from_a_pipe(server, place, daemon):
    server.push(openai_stream(text="one"), openai_stream(text="two"))
    piped = run(argv(server, place, "--mode", "auto", socket=daemon.socket), place,
                stdin="hello\n")
    assert piped.returncode == 0, piped.stderr
    child = spawn(argv(server, place, "--mode", "auto", "--json", "hi",
                       socket=daemon.socket), place)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert len(server.requests) == 2
    assert all("ask_user" not in declared(r) for r in server.requests)
    assert "run_terminal" in declared(server.requests[0])
