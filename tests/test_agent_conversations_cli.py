"""`toolsd agent --list`, `--resume ID` and `--continue` where nothing was saved yet."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import agentkit
from agentkit import Place
from conftest import needs_bwrap, wait_gone
from model_server import ModelServer, openai_stream

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place


server = agentkit.server  # a model server of the test's own


def agent(place: Place, *args: str, server: ModelServer | None = None, socket: str = "",
          stdin: str = "") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "toolsd", "agent", "--workspace", place.workspace,
           *(["--base-url", server.openai_url, "--model", "scripted", "--mode", "auto"]
             if server else []),
           *(["--socket", socket] if socket else []), *args]
    return subprocess.run(cmd, env=place.env, input=stdin, capture_output=True, text=True,
                          timeout=180)


def said(request) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] in ("user", "assistant")]


def test_continue_with_no_conversation_says_so(server, place):
    done = agent(place, "--continue", "go on", server=server)
    assert done.returncode == 2
    assert done.stderr == (f"toolsd agent: --continue: no conversation was saved for "
                           f"{place.workspace} yet; leave out --continue to start one\n")
    assert server.requests == []
    listed = agent(place, "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == (f"No conversation saved for {place.workspace} yet: run `toolsd "
                             f"agent` there to start one.\n")


def test_list_shows_the_conversations_and_resume_takes_one(server, place, daemon):
    server.push(openai_stream(text="Noted: red."), openai_stream(text="Noted: blue."),
                openai_stream(text="Also: green."), openai_stream(text="It was red."))
    for prompt in ("remember red\n", "remember blue\nand green\n"):
        done = agent(place, server=server, socket=daemon.socket, stdin=prompt)
        assert done.returncode == 0, done.stderr
    listed = agent(place, "--list")  # no model, no daemon needed
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == f"Conversations for {place.workspace} (newest last):"
    assert lines[-1] == "Go on with one: toolsd agent --resume ID (the newest: --continue)"
    first, second = lines[1:-1]
    assert re.fullmatch(r"  (\S+)  \d{4}-\d\d-\d\d \d\d:\d\d  1 turn  'remember red'", first)
    assert second.endswith("  2 turns  'remember blue' ... 'and green'")
    old = first.split()[0]

    done = agent(place, "--resume", old, "what colour?", server=server,
                 socket=daemon.socket)
    assert done.returncode == 0, done.stderr
    assert said(server.requests[-1])[-3:] == ["remember red", "Noted: red.", "what colour?"]
    assert "'what colour?'" in agent(place, "--list").stdout.splitlines()[1]
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_resume_of_an_unknown_id_says_what_to_do(server, place):
    done = agent(place, "--resume", "20990101-nothing", "hi", server=server)
    assert done.returncode == 2
    assert done.stderr == (f"toolsd agent: --resume 20990101-nothing: that is not one of the "
                           f"conversations saved for {place.workspace} (saved: none)\n")
    both = agent(place, "--continue", "--resume", "x", "hi", server=server)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    no_model = agent(place, "hi")
    assert no_model.returncode == 2
    assert no_model.stderr == ("toolsd agent: --model NAME is required: the model's name at "
                               "the endpoint\n")
    assert server.requests == []
