"""A person at a terminal approves a file tool's change: `toolsd agent --mode ask` under
pexpect, a scripted model server on loopback, the module's daemon. The diff is shown colored
before the question; nothing is written before the answer; Ctrl-C cancels."""

from __future__ import annotations

import os

import pexpect
import pytest

import agentkit
from conftest import needs_bwrap
from model_server import Call, openai_stream
from test_agent_cli import argv, server, spawn, tool_message  # noqa: F401 (a fixture)

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place

RED, GREEN = "\x1b[31m", "\x1b[32m"


def test_the_diff_is_shown_colored_and_yes_applies_it(server, place, daemon):
    path = os.path.join(place.workspace, "app.py")
    with open(path, "w") as f:
        f.write("x = 1\ny = 2\n")
    server.push(openai_stream(calls=[Call("edit_file", {"path": "app.py", "old": "y = 2",
                                                        "new": "y = 20"})]),
                openai_stream(text="Edited."))
    child = spawn(argv(server, place, "--mode", "ask", "change y",
                       socket=daemon.socket), place)
    child.expect_exact("● edit_file: app.py")
    child.expect_exact(f"{RED}-y = 2")
    child.expect_exact(f"{GREEN}+y = 20")
    child.expect_exact("Apply it? [y]es / [n]o (or n, and why) / [a]lways for edit_file: ")
    with open(path) as f:
        assert f.read() == "x = 1\ny = 2\n"  # the question is up: nothing written yet
    child.sendline("y")
    child.expect_exact("[completed] 2 steps, 1 tool call")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    with open(path) as f:
        assert f.read() == "x = 1\ny = 20\n"
    assert tool_message(server.requests[1])["content"] == "edited app.py: 1 replacement."


def test_ctrl_c_at_the_diff_cancels_and_writes_nothing(server, place, daemon):
    server.push(openai_stream(calls=[Call("write_file", {"path": "new/notes.md",
                                                         "content": "hello\n"})]),
                openai_stream(text="Second turn."))
    child = spawn(argv(server, place, "--mode", "ask", socket=daemon.socket), place)
    child.expect_exact("> ")
    child.sendline("write notes")
    child.expect_exact(f"{GREEN}+hello")
    child.expect_exact("Apply it?")
    child.sendintr()
    child.expect_exact("[interrupted] 1 step, 1 tool call: cancelled")
    child.expect_exact("> ")
    child.sendline("next")
    child.expect_exact("[completed] 1 step, 0 tool calls")
    child.expect_exact("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert os.listdir(place.workspace) == []
