"""`toolsd agent` at a real terminal (pexpect): what Ctrl-D and Ctrl-C do at a question and at
the prompt, a no that tells the model why, and a daemon restarted between two prompts."""

from __future__ import annotations

import io
import os
import shutil
import signal
import sys

import pexpect
import pytest

import agentkit
from agentkit import Place
from conftest import RunningDaemon, needs_bwrap, short_tempdir, wait_gone
from model_server import Call, ModelServer, openai_stream

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place


server = agentkit.server  # a model server of the test's own


def spawn(server: ModelServer, place: Place, socket: str, mode: str = "ask") -> pexpect.spawn:
    args = ["-m", "toolsd", "agent", "--base-url", server.openai_url, "--model", "scripted",
            "--workspace", place.workspace, "--socket", socket, "--mode", mode]
    child = pexpect.spawn(sys.executable, args, env=place.env, encoding="utf-8", timeout=90,
                          dimensions=(40, 160))
    child.logfile_read = io.StringIO()
    return child


def ended(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def users(request) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] == "user"]


def tool_results(request) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] == "tool"]


def test_ctrl_d_at_a_question_declines_and_the_agent_waits_for_the_next_prompt(
        server, place, daemon):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "touch asked"})]),
                openai_stream(text="Not done, then."),
                openai_stream(text="Still here."))
    child = spawn(server, place, daemon.socket)
    child.expect_exact("> ")
    child.sendline("make a file")
    child.expect_exact("Run it?")
    child.sendeof()
    child.expect_exact("(Ctrl-D: declined)")
    child.expect_exact("Not done, then.")
    child.expect_exact("[completed] 2 steps, 1 tool call")
    child.expect_exact("> ")
    child.sendline("are you there?")
    child.expect_exact("Still here.")
    child.expect_exact("> ")
    child.sendeof()  # on an empty prompt line: exits
    assert ended(child) == 0
    assert not os.path.exists(os.path.join(place.workspace, "asked"))
    assert tool_results(server.requests[1])[-1].startswith("Error: The user declined this call.")
    assert users(server.requests[2])[-1] == "are you there?"
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_ctrl_c_at_the_prompt_clears_the_line_and_on_an_empty_line_exits(
        server, place, daemon):
    server.push(openai_stream(text="Got it."))
    child = spawn(server, place, daemon.socket)
    child.expect_exact("> ")
    child.send("half a thought")
    child.expect_exact("half a thought")  # echoed: the line is being typed
    child.sendintr()
    child.expect_exact("(line cleared; Ctrl-C on an empty line, or Ctrl-D, exits)")
    child.expect_exact("> ")
    child.sendline("the real prompt")
    child.expect_exact("Got it.")
    child.expect_exact("[completed] 1 step, 0 tool calls")
    child.expect_exact("> ")
    child.sendintr()
    assert ended(child) == 130
    [request] = server.requests
    assert users(request)[-1] == "the real prompt"  # nothing of the cleared line
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_a_declined_call_tells_the_model_why(server, place, daemon):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "pip install x"})]),
                openai_stream(text="I will use uv."))
    child = spawn(server, place, daemon.socket)
    child.expect_exact("> ")
    child.sendline("install x")
    child.expect_exact("Run it?")
    child.sendline("n use uv instead")
    child.expect_exact("✗ The user declined this call, saying: use uv instead")
    child.expect_exact("I will use uv.")
    child.expect_exact("> ")
    child.sendeof()
    assert ended(child) == 0
    assert tool_results(server.requests[1])[-1] == \
        "Error: The user declined this call, saying: use uv instead"
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_after_the_daemon_restarts_the_next_prompt_runs(server, place, how):
    root = short_tempdir()
    daemon = RunningDaemon(root, warm_spare=True).start()
    try:
        server.push(openai_stream(calls=[Call("run_terminal", {"command": "echo one"})]),
                    openai_stream(text="first done"),
                    openai_stream(calls=[Call("run_terminal", {"command": "echo two"})]),
                    openai_stream(text="second done"))
        child = spawn(server, place, daemon.socket, mode="auto")
        child.expect_exact("> ")
        child.sendline("first")
        child.expect_exact("⎿ one  [exit code 0]")
        child.expect_exact("[completed] 2 steps, 1 tool call")
        child.expect_exact("> ")
        daemon.stop(how)
        daemon.start()
        child.sendline("second")
        child.expect_exact("was lost (toolsd stopped answering")
        child.expect_exact("⎿ two  [exit code 0]")
        child.expect_exact("[completed] 2 steps, 1 tool call")
        child.expect_exact("> ")
        child.sendeof()
        assert ended(child) == 0, child.logfile_read.getvalue()
        assert tool_results(server.requests[3])[-1] == "two\n[exit code 0]"
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
