"""A turn's wall-clock budget binds during a model request too: a reply that never ends (a
token every 0.25 s, so the read timeout never fires) is cut off at the deadline, and the turn
ends `budget_exhausted` with what streamed kept. `toolsd agent --wall-time` sets the budget."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import agentkit
from agentkit import Place
from conftest import needs_bwrap, wait_gone
from model_server import ModelServer, openai_endless, openai_stream

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place


server = agentkit.server  # a model server of the test's own


def agent(server: ModelServer, place: Place, socket: str, *args: str,
          stdin: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "toolsd", "agent", "--base-url", server.openai_url,
           "--model", "scripted", "--workspace", place.workspace, "--socket", socket,
           "--mode", "auto", *args]
    # The timeout only keeps a broken agent from hanging the suite: a fixed one ends in
    # about the budget it is given.
    return subprocess.run(cmd, env=place.env, input=stdin, capture_output=True, text=True,
                          timeout=120)


def test_a_reply_that_never_ends_is_cut_at_the_wall_time(server, place, daemon):
    server.push(openai_endless("Thinking", "."))
    done = agent(server, place, daemon.socket, "--wall-time", "2", "think")
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("Thinking.")  # what streamed was shown
    assert done.stderr.splitlines()[-1] == (
        "[budget_exhausted] 1 step, 0 tool calls: the turn's wall-clock budget (2 s) was "
        "spent during request 1; the reply so far is kept")
    assert len(server.requests) == 1
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_the_cut_reply_is_kept_and_the_next_turn_goes_on_from_it(server, place,
                                                                  daemon):
    server.push(openai_endless("Half an answer", "."), openai_stream(text="Whole now."))
    done = agent(server, place, daemon.socket, "--wall-time", "1.5", "--json",
                 stdin="first\nsecond\n")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    outcomes = [e["outcome"] for e in events if e["type"] == "outcome"]
    assert outcomes == ["budget_exhausted", "completed"]
    cut = next(e for e in events if e["type"] == "reply" and e.get("partial"))
    assert cut["stop"] == "budget" and cut["text"].startswith("Half an answer.")
    said = [(m["role"], m["content"]) for m in server.requests[1].body["messages"]
            if m["role"] in ("user", "assistant")]
    assert said[-3][0] == "user" and said[-3][1] == "first"
    assert said[-2][0] == "assistant" and said[-2][1].startswith("Half an answer.")
    assert said[-2][1].endswith("[cut off: the turn's wall-clock budget was spent]")
    assert said[-1] == ("user", "second")
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_wall_time_must_be_a_positive_number(server, place, daemon):
    for bad in ("0", "-3", "soon", "inf"):
        done = agent(server, place, daemon.socket, "--wall-time", bad, "hi")
        assert done.returncode == 2
        assert f"{bad!r} is not a number of seconds above 0" in done.stderr
    assert server.requests == []
