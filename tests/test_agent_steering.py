"""Steering: a line typed at the terminal while a turn runs reaches the model's next request,
within the same turn, and a Ctrl-C after it keeps it. `toolsd agent` under pexpect, a scripted
model server on loopback, the module's daemon."""

from __future__ import annotations

import json
import os

import pexpect
import pytest

import agentkit
from conftest import needs_bwrap
from model_server import Call, openai_stream
from test_agent_cli import argv, server, spawn  # noqa: F401 (a fixture)

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place

WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.05; done; echo went"


def said(request) -> str:
    return json.dumps(request.body["messages"])


def test_a_line_typed_mid_turn_reaches_the_next_request(server, place, daemon):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": WAIT_FOR_GO})]),
                openai_stream(text="Port 9000 it is."))
    child = spawn(argv(server, place, "--mode", "auto", socket=daemon.socket), place)
    child.expect_exact("> ")
    child.sendline("start the server")
    child.expect_exact("● run_terminal")
    child.sendline("use port 9000")
    child.expect_exact("(queued for the model's next request: use port 9000)")
    open(os.path.join(place.workspace, "go"), "w").close()
    child.expect_exact("Port 9000 it is.")
    child.expect_exact("[completed] 2 steps, 1 tool call")
    child.expect_exact("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert len(server.requests) == 2  # one turn: the line did not start another
    assert "use port 9000" not in said(server.requests[0])
    last = server.requests[1].body["messages"][-1]
    assert last["role"] == "user" and "> use port 9000" in json.dumps(last)
    events = [json.loads(line) for folder, _, files in os.walk(place.root) for name in files
              if name == "events.jsonl" for line in open(os.path.join(folder, name))]
    assert [e["text"] for e in events if e["type"] == "steer"] == ["use port 9000"]


def test_ctrl_c_after_a_steering_line_keeps_it(server, place, daemon):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": WAIT_FOR_GO})]),
                openai_stream(text="Seen."))
    child = spawn(argv(server, place, "--mode", "auto", socket=daemon.socket), place)
    child.expect_exact("> ")
    child.sendline("start the server")
    child.expect_exact("● run_terminal")
    child.sendline("actually use port 7000")
    child.expect_exact("(queued for the model's next request: actually use port 7000)")
    child.sendintr()
    child.expect_exact("[interrupted]")
    child.expect_exact("> ")
    child.sendline("go on")
    child.expect_exact("Seen.")
    child.expect_exact("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    history = said(server.requests[1])
    assert "> actually use port 7000" in history
    assert history.index("actually use port 7000") < history.index("go on")
