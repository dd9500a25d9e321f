"""Restart and offline: a turn whose `toolsd agent` was killed is marked `interrupted` at the
next start, and `--continue` says so with the conversation intact; a prompt entered while the
model endpoint does not answer is queued (shown, droppable, kept across an exit) and sent
when the endpoint answers again."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import sys

import pexpect
import pytest

import agentkit
from agentkit import descendants, running
from conftest import needs_bwrap, wait_for, wait_gone
from model_server import Call, ModelServer, openai_stream
from test_agent_cli import argv, run, spawn

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place


server = agentkit.server  # a model server of the test's own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there until a test says


def at_port(port: int, place, *args: str, socket: str) -> list[str]:
    """`toolsd agent` pointed at a port where a ModelServer may or may not listen."""
    return [sys.executable, "-m", "toolsd", "agent", "--base-url",
            f"http://127.0.0.1:{port}/v1", "--model", "scripted", "--workspace",
            place.workspace, "--socket", socket, "--mode", "auto", *args]


def said(request) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] == "user"]


def events_of(place) -> list[dict]:
    [path] = glob.glob(os.path.join(place.env["XDG_STATE_HOME"], "toolsd", "agent", "*", "*",
                                    "events.jsonl"))
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def kill_mid_turn(server, place) -> None:
    """`toolsd agent` killed with SIGKILL while a tool call of its turn runs."""
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "sleep 4747"})]))
    # Its own daemon: a killed agent's daemon goes with it (parent-death), sessions and all.
    child = spawn(argv(server, place, "--mode", "auto"), place)
    child.expect_exact("one prompt per line")
    child.sendline("wait here")
    child.expect_exact("● run_terminal: sleep 4747")
    wait_for(lambda: running(descendants(child.pid), "sleep 4747"))
    tree = descendants(child.pid)
    child.kill(signal.SIGKILL)
    child.expect(pexpect.EOF)
    child.close()
    assert wait_gone(tree, timeout=60) == [], "a killed agent left its daemon or sandbox"
    assert [e["type"] for e in events_of(place)][-1] == "tool_call"  # no outcome: it died


def test_a_killed_agents_turn_is_interrupted_at_the_next_start(server, place, daemon):
    kill_mid_turn(server, place)

    server.push(openai_stream(text="Going on."))
    again = run(argv(server, place, "--continue", "--mode", "auto", "and now?",
                     socket=daemon.socket), place)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines()[0] == (
        "toolsd agent: turn 1 was interrupted: the agent process ended while it was in "
        "flight (its conversation is kept; tool calls left open say so)")
    outcomes = [(e["turn"], e["outcome"], e["reason"]) for e in events_of(place)
                if e["type"] == "outcome"]
    assert outcomes == [
        (1, "interrupted", "the agent process ended while the turn was in flight"),
        (2, "completed", "")]
    messages = server.requests[1].body["messages"]
    assert said(server.requests[1]) == ["wait here", "and now?"]
    call = [m for m in messages if m["role"] == "assistant"][0]["tool_calls"][0]
    result = [m for m in messages if m["role"] == "tool"][0]
    assert result["tool_call_id"] == call["id"]
    assert result["content"] == \
        "Error: [no result: the agent stopped before this call's result]"
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_a_prompt_waits_for_an_endpoint_that_is_down_and_is_sent_when_it_is_back(
        place, daemon):
    port = free_port()
    child = spawn(at_port(port, place, socket=daemon.socket), place)
    child.expect_exact("one prompt per line")
    child.sendline("are you there?")
    child.expect_exact("toolsd agent: queued: the model endpoint does not answer "
                       "(connection refused)")
    child.sendline("and this too")
    child.expect_exact("queued too (2 prompts waiting)")
    with ModelServer(port) as back:
        back.push(openai_stream(text="Yes, back."), openai_stream(text="Second."))
        child.expect_exact("the endpoint answers again: sending 2 prompts")
        child.expect_exact("Yes, back.")
        child.expect_exact("Second.")
        child.expect_exact("> ")
        child.sendeof()
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 0
    assert said(back.requests[0]) == ["are you there?"]
    assert said(back.requests[1]) == ["are you there?", "and this too"]
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_a_queued_prompt_can_be_dropped_or_kept_for_continue(place, daemon):
    port = free_port()
    child = spawn(at_port(port, place, socket=daemon.socket), place)
    child.expect_exact("one prompt per line")
    child.sendline("never mind this")
    child.expect_exact("toolsd agent: queued:")
    child.sendline("/drop")
    child.expect_exact("toolsd agent: dropped the last queued prompt")
    child.expect_exact("> ")
    child.sendline("keep this one")
    child.expect_exact("toolsd agent: queued:")
    child.sendintr()  # exits; the queue stays for --continue
    child.expect_exact("1 prompt still queued, kept: `toolsd agent --continue` sends them")
    child.expect(pexpect.EOF)
    child.close()
    with ModelServer(port) as back:
        back.push(openai_stream(text="Kept and answered."))
        done = run(at_port(port, place, "--continue", socket=daemon.socket), place,
                   stdin="")
        assert done.returncode == 0, done.stderr
        assert "1 prompt queued while the endpoint did not answer" in done.stderr
        assert done.stdout == "Kept and answered.\n"
    assert [said(r) for r in back.requests] == [["keep this one"]]
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_what_a_run_says_of_what_it_finds(tmp_path):
    from agent.turns.offline import PromptQueue, start_lines

    queue = PromptQueue(str(tmp_path))
    assert start_lines([], queue) == []
    queue.add("one")
    assert PromptQueue(str(tmp_path)).items == ["one"]  # on disk
    assert start_lines([2], queue, interactive=False) == [
        "toolsd agent: turn 2 was interrupted: the agent process ended while it was in "
        "flight (its conversation is kept; tool calls left open say so)",
        "toolsd agent: 1 prompt queued while the endpoint did not answer, kept: `toolsd "
        "agent --continue` without a PROMPT sends them"]
    (tmp_path / "queued.json").write_text("[not json")
    damaged = PromptQueue(str(tmp_path))
    assert damaged.items == []
    assert start_lines([], damaged) == [
        f"toolsd agent: the queue of prompts could not be read; it is kept as "
        f"{tmp_path}/queued.json.damaged for you to read"]
    assert (tmp_path / "queued.json.damaged").read_text() == "[not json"


def test_a_fresh_start_marks_and_says_what_a_killed_run_left(server, place, daemon):
    kill_mid_turn(server, place)
    [killed] = os.listdir(glob.glob(os.path.join(place.env["XDG_STATE_HOME"], "toolsd",
                                                 "agent", "*"))[0])
    server.push(openai_stream(text="New."))
    fresh = run(argv(server, place, "--mode", "auto", "something else",
                     socket=daemon.socket), place)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stderr.splitlines()[0] == (
        f"toolsd agent: the last run's turn 1 (conversation {killed}) was interrupted: the "
        f"agent process ended while it was in flight; --continue goes on from it")
    folder = glob.glob(os.path.join(place.env["XDG_STATE_HOME"], "toolsd", "agent", "*",
                                    killed))[0]
    with open(os.path.join(folder, "events.jsonl")) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    assert (last["type"], last["outcome"]) == ("outcome", "interrupted")
    assert said(server.requests[1]) == ["something else"]  # a new conversation
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_a_turn_waits_for_an_endpoint_that_went_away_between_steps(place, daemon):
    port = free_port()
    fifo = os.path.join(place.workspace, "go.fifo")
    os.mkfifo(fifo)
    child = spawn(at_port(port, place, socket=daemon.socket), place)
    child.expect_exact("one prompt per line")
    with ModelServer(port) as first:
        first.push(openai_stream(calls=[Call("run_terminal", {"command": "head -n1 go.fifo"})]))
        child.sendline("wait for the fifo")
        child.expect_exact("● run_terminal: head -n1 go.fifo")
    # The endpoint is gone now (a local server restarting) while the tool runs.
    with open(fifo, "w") as f:
        f.write("went\n")
    child.expect_exact("toolsd agent: the model endpoint stopped answering (cannot connect to "
                       f"http://127.0.0.1:{port}/v1/chat/completions: connection refused")
    with ModelServer(port) as back:
        back.push(openai_stream(text="Back again."))
        child.expect_exact("the endpoint answers again: sending the request")
        child.expect_exact("Back again.")
        child.expect_exact("[completed] 2 steps, 1 tool call")
        child.sendeof()
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 0
    tool = [m for m in back.requests[0].body["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool] == ["went\n[exit code 0]"]
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []
