"""`toolsd agent` end to end: the command as a subprocess (under a terminal with pexpect where
a person types), a scripted model server on loopback (tests/model_server.py), a real daemon:
the module's, or with no daemon answering, the one the agent starts for its run."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import threading

import pexpect
import pytest
from PIL import Image

import agentkit
from agentkit import Place, descendants, running
from conftest import needs_bwrap, wait_for, wait_gone
from model_server import Call, JSONReply, ModelServer, anthropic_stream, openai_stream

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place
RESULT_CHARS = 4000


server = agentkit.server  # a model server of the test's own


def argv(server: ModelServer, place: Place, *args: str, socket: str | None = None) -> list[str]:
    return [sys.executable, "-m", "toolsd", "agent", "--base-url", server.openai_url,
            "--model", "scripted", "--workspace", place.workspace,
            *(["--socket", socket] if socket else []), *args]


def run(cmd: list[str], place: Place, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=place.env, input=stdin, capture_output=True, text=True,
                          timeout=180)


def spawn(cmd: list[str], place: Place) -> pexpect.spawn:
    child = pexpect.spawn(cmd[0], cmd[1:], env=place.env, encoding="utf-8", timeout=90,
                          dimensions=(40, 160))
    child.logfile_read = io.StringIO()
    return child


def tool_message(request) -> dict:
    return [m for m in request.body["messages"] if m["role"] == "tool"][-1]


# ---------------------------------------------------------------- a whole turn


def test_every_tool_end_to_end_on_a_daemon_of_its_own(server, place):
    Image.new("RGB", (64, 48), "red").save(os.path.join(place.workspace, "shot.png"))
    release = threading.Event()
    last = openai_stream(text="Done: 42, and the server said ready.")
    last.hold = release  # the agent waits on this reply while the test looks at processes
    server.push(
        openai_stream(text="Looking.", calls=[Call("run_terminal", {"command": "seq 1 5000"})]),
        openai_stream(calls=[Call("repl", {"code": "x = 6 * 7\nx"})]),
        openai_stream(calls=[Call("process_start", {"command": "echo ready; exec sleep 4242",
                                                    "name": "srv"})]),
        openai_stream(calls=[Call("process_output", {"id": "bg1", "until": "ready"})]),
        openai_stream(calls=[Call("read_image", {"path": "shot.png"})]),
        last)
    proc = subprocess.Popen(argv(server, place, "--mode", "auto", "count", "and", "look"),
                            env=place.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        requests = server.wait_for_requests(6)
        wait_for(lambda: running(descendants(proc.pid), "sleep 4242"))
        tree = descendants(proc.pid)
        assert running(tree, "toolsd serve") and running(tree, "bwrap")
        release.set()
        out, err = proc.communicate(timeout=120)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert wait_gone(tree, timeout=30) == [], "the agent left processes behind"

    # What a person saw: the text as it streamed, a line per call and result, the outcome.
    assert out == "Looking.\nDone: 42, and the server said ready.\n"
    assert "no toolsd answers on" in err and "started one for this run only" in err
    lines = err.splitlines()
    assert "● run_terminal: seq 1 5000" in lines
    assert any(line.startswith("  ⎿ 1 (+") and "[exit code 0]" in line for line in lines)
    assert "● repl: x = 6 * 7 (+1 line)" in lines and "  ⎿ 42" in lines
    assert "● process_output: bg1  until=ready" in lines
    assert lines[-1] == "[completed] 6 steps, 5 tool calls"

    # What the model was sent: each result in the next request, capped, with a notice.
    cut = tool_message(requests[1])["content"]
    assert len(cut) <= RESULT_CHARS and cut.startswith("1\n2\n3\n") and "5000\n" in cut
    assert "[output cut: " in cut and "the whole output is in /tmp/" in cut
    assert tool_message(requests[2])["content"] == "42"
    assert tool_message(requests[3])["content"].startswith("Started bg1.")
    output = tool_message(requests[4])["content"]
    assert output.startswith("ready") and output.endswith("[bg1 is running]")
    messages = requests[5].body["messages"]
    assert messages[-2]["role"] == "tool" and "PNG image, shown 64x48" in messages[-2]["content"]
    picture = messages[-1]
    assert picture["role"] == "user"
    url = next(p["image_url"]["url"] for p in picture["content"] if p["type"] == "image_url")
    assert url.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as seen:
        assert seen.size == (64, 48)


def test_json_prints_the_events_as_lines(server, place, daemon):
    server.push(openai_stream(text="One call.", calls=[Call("run_terminal",
                                                            {"command": "echo hi"})]),
                openai_stream(text="bye"))
    done = run(argv(server, place, "--mode", "auto", "--json", "go",
                    socket=daemon.socket), place)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["type"] for e in events] == [
        "turn_start", "request", "reply", "tool_call", "tool_result", "request", "reply",
        "outcome"]
    assert events[0]["prompt"] == "go"
    assert events[3]["name"] == "run_terminal" and events[3]["arguments"] == {"command": "echo hi"}
    assert events[4]["text"] == "hi\n[exit code 0]"
    assert events[-1]["outcome"] == "completed" and events[-1]["steps"] == 2
    assert "[completed]" not in done.stderr  # the human lines are not printed with --json


def test_anthropic_api(server, place, daemon):
    server.push(anthropic_stream(calls=[Call("run_terminal", {"command": "echo hi"})]),
                anthropic_stream(text="fine"))
    place.env["ANTHROPIC_API_KEY"] = "ak-test"
    cmd = argv(server, place, "--api", "anthropic", "--mode", "auto", "go",
               socket=daemon.socket)
    cmd[cmd.index("--base-url") + 1] = server.url
    done = run(cmd, place)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fine\n"
    first, second = server.requests
    assert first.path == "/v1/messages" and first.headers["x-api-key"] == "ak-test"
    result = second.body["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["content"] == \
        "hi\n[exit code 0]"


def test_what_the_hosts_git_would_run_is_a_warning_line(server, place, daemon):
    server.push(openai_stream(calls=[Call("run_terminal", {
                    "command": "git init -q app && echo evil > app/.git/hooks/pre-commit"})]),
                openai_stream(calls=[Call("run_terminal", {"command": "echo again"})]),
                openai_stream(text="made a repository"))
    done = run(argv(server, place, "--mode", "auto", "go", socket=daemon.socket), place)
    assert done.returncode == 0, done.stderr
    hook = f"{os.path.realpath(place.workspace)}/app/.git/hooks/pre-commit"
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert warnings == [f"toolsd agent: WARNING: the session added what git on this machine "
                        f"would run: {hook} (look at it before you run git in that "
                        f"repository)"]
    told = tool_message(server.requests[1])["content"]
    assert told.endswith(f"[host_exec: the user's git would run this, which the session added "
                         f"(the user is told): {hook}]")
    assert tool_message(server.requests[2])["content"] == "again\n[exit code 0]"


# ---------------------------------------------------------------- errors a person makes


def test_a_wrong_url_is_one_line(server, place, daemon):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    cmd = argv(server, place, "--mode", "auto", "hello", socket=daemon.socket)
    cmd[cmd.index("--base-url") + 1] = f"http://127.0.0.1:{port}/v1"
    done = run(cmd, place)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"[failed] 1 step, 0 tool calls: cannot connect to http://127.0.0.1:{port}/v1/chat/"
        f"completions: connection refused; check the base URL and that the server is running"]


def test_a_wrong_key_is_one_line_naming_its_variable(server, place, daemon):
    server.push(JSONReply(401, {"error": {"message": "Incorrect API key provided"}}))
    place.env["MY_KEY"] = "sk-wrong"
    done = run(argv(server, place, "--api-key-env", "MY_KEY", "--mode", "auto", "hello",
                    socket=daemon.socket), place)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"[failed] 1 step, 0 tool calls: {server.openai_url}/chat/completions refused the API "
        f"key (HTTP 401: Incorrect API key provided); check the key in $MY_KEY"]
    assert server.requests[0].headers["authorization"] == "Bearer sk-wrong"


def test_bad_options_say_what_to_do(server, place):
    done = run(argv(server, place, "--api-key-env", "NO_SUCH_VARIABLE", "hi"), place)
    assert done.returncode == 2
    assert done.stderr == ("toolsd agent: --api-key-env NO_SUCH_VARIABLE: that environment "
                           "variable is not set; export it, or name the one that holds the "
                           "key\n")
    cmd = argv(server, place, "hi")
    cmd[cmd.index("--base-url") + 1] = "127.0.0.1:8080"
    done = run(cmd, place)
    assert done.returncode == 2 and "is not an http:// or https:// URL" in done.stderr
    done = run(argv(server, place, "--max-steps", "0", "hi"), place)
    assert done.returncode == 2 and "'0' is not a whole number of at least 1" in done.stderr
    cmd = argv(server, place, "--api", "anthropic", "hi")
    del cmd[cmd.index("--base-url"):cmd.index("--base-url") + 2]  # the hosted API
    done = run(cmd, place)
    assert done.returncode == 2
    assert done.stderr == ("toolsd agent: no API key for https://api.anthropic.com: export "
                           "ANTHROPIC_API_KEY (or name the variable that holds it with "
                           "--api-key-env); a local server needs none, give its --base-url\n")
    assert server.requests == []


# ---------------------------------------------------------------- a person at a terminal


def test_ask_mode_yes_no_always(server, place, daemon):
    server.push(*(openai_stream(calls=[Call("run_terminal", {"command": f"echo {word}"})])
                  for word in ("one", "two", "three", "four")),
                openai_stream(text="All asked."))
    child = spawn(argv(server, place, "--mode", "ask", "echo four words",
                       socket=daemon.socket), place)
    child.expect_exact("● run_terminal: echo one")
    child.expect_exact("Run it? [y]es / [n]o (or n, and why) / [a]lways for run_terminal: ")
    child.sendline("maybe")
    child.expect_exact("Answer y, n (or n and why: n use uv instead) or a.")
    child.expect_exact("Run it?")
    child.sendline("y")
    child.expect_exact("⎿ one  [exit code 0]")
    child.expect_exact("● run_terminal: echo two")
    child.expect_exact("Run it?")
    child.sendline("n")
    child.expect_exact("✗ The user declined this call.")
    child.expect_exact("Run it?")
    child.sendline("a")
    child.expect_exact("⎿ three  [exit code 0]")
    child.expect_exact("⎿ four  [exit code 0]")  # no question: "always" for run_terminal
    child.expect_exact("[completed] 5 steps, 4 tool calls")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert child.logfile_read.getvalue().count("Run it?") == 4  # three calls, asked again once
    results = [tool_message(r)["content"] for r in server.requests[1:]]
    assert results[0] == "one\n[exit code 0]"
    assert results[1] == "Error: The user declined this call. Ask them, or do something else."
    assert results[2:] == ["three\n[exit code 0]", "four\n[exit code 0]"]


def test_a_spinner_counts_the_time_while_a_tool_runs(server, place, daemon):
    go = os.path.join(place.workspace, "go")
    server.push(openai_stream(calls=[Call("run_terminal", {
        "command": "until [ -e go ]; do sleep 0.05; done; echo went"})]),
        openai_stream(text="ok"))
    child = spawn(argv(server, place, "--mode", "auto", "wait for go",
                       socket=daemon.socket), place)
    child.expect_exact("● run_terminal: until [ -e go ]")
    child.expect(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] run_terminal \d+\.\ds")
    child.expect(r"run_terminal [1-9]\d*\.\ds")  # it counts on, past the first second
    with open(go, "w"):
        pass
    child.expect_exact("⎿ went  [exit code 0]")
    child.expect_exact("[completed] 2 steps, 1 tool call")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_running_commands_output_shows_as_it_comes(server, place, daemon):
    go = os.path.join(place.workspace, "go")
    server.push(openai_stream(calls=[Call("run_terminal", {
        "command": "printf 'live %s\\n' out; until [ -e go ]; do sleep 0.05; done; echo went"})]),
        openai_stream(text="ok"))
    child = spawn(argv(server, place, "--mode", "auto", "wait for go",
                       socket=daemon.socket), place)
    child.expect_exact("● run_terminal: printf")
    # The command waits for the file: its first line can only be here as it runs.
    child.expect_exact("live out")
    with open(go, "w"):
        pass
    child.expect_exact("went")
    child.expect_exact("⎿ live out (+1 line)  [exit code 0]")
    child.expect_exact("[completed] 2 steps, 1 tool call")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_mid_tool_interrupts_and_leaves_no_process(server, place):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "sleep 4343"})]))
    child = spawn(argv(server, place, "--mode", "auto", "wait a while"), place)
    child.expect_exact("● run_terminal: sleep 4343")
    wait_for(lambda: running(descendants(child.pid), "sleep 4343"))
    tree = descendants(child.pid)
    child.sendintr()
    child.expect_exact("[interrupted] 1 step, 1 tool call: cancelled")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    assert wait_gone(tree, timeout=30) == [], "Ctrl-C left processes behind"
    assert len(server.requests) == 1  # nothing was asked after the cancel


def test_one_turn_per_line_ctrl_c_cancels_then_exits(server, place, daemon):
    server.push(openai_stream(text="Hi there."),
                openai_stream(calls=[Call("run_terminal", {"command": "sleep 4444"})]))
    child = spawn(argv(server, place, "--mode", "auto", socket=daemon.socket), place)
    child.expect_exact("one prompt per line, Ctrl-D ends")
    child.expect_exact("> ")
    child.sendline("hello")
    child.expect_exact("Hi there.")
    child.expect_exact("[completed] 1 step, 0 tool calls")
    child.expect_exact("> ")
    child.sendline("now wait")
    child.expect_exact("● run_terminal: sleep 4444")
    wait_for(lambda: daemon.running("sleep 4444"))
    child.sendintr()
    child.expect_exact("[interrupted] 1 step, 1 tool call: cancelled")
    assert wait_gone(daemon.running("sleep 4444"), timeout=30) == []
    child.expect_exact("> ")
    child.sendintr()  # at the prompt: exits
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []
    second = server.requests[1].body["messages"]
    assert [m["content"] for m in second if m["role"] in ("user", "assistant")][-3:] == \
        ["hello", "Hi there.", "now wait"]


def test_prompts_from_a_pipe_until_its_end_and_continue(server, place, daemon):
    server.push(openai_stream(text="Noted: 7."), openai_stream(text="Still 7."),
                openai_stream(text="It was 7."))
    done = run(argv(server, place, "--mode", "auto", socket=daemon.socket), place,
               stdin="remember 7\n\nanything else?\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Noted: 7.\nStill 7.\n"
    assert done.stderr.count("[completed] 1 step, 0 tool calls") == 2
    again = run(argv(server, place, "--continue", "--mode", "auto", "what number?",
                     socket=daemon.socket), place)
    assert again.returncode == 0, again.stderr
    said = [m["content"] for m in server.requests[2].body["messages"]
            if m["role"] in ("user", "assistant")]
    assert said[-5:] == ["remember 7", "Noted: 7.", "anything else?", "Still 7.",
                         "what number?"]


def test_a_killed_agent_leaves_no_sandbox(server, place):
    """SIGKILL gives the agent no chance to clean up: the daemon it started for the run gets
    SIGTERM from the kernel (parent-death signal) and ends its sessions."""
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "sleep 4848"})]))
    proc = subprocess.Popen(argv(server, place, "--mode", "auto", "wait"), env=place.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: running(descendants(proc.pid), "sleep 4848"))
        tree = descendants(proc.pid)
        assert running(tree, "toolsd serve") and running(tree, "bwrap")
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert wait_gone(tree, timeout=60) == [], "a killed agent left its daemon or sandbox"


def test_ask_mode_with_nobody_to_answer_declines(server, place, daemon):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "touch asked"})]),
                openai_stream(text="Declined, so I stop."))
    done = run(argv(server, place, "--mode", "ask", "make a file",
                    socket=daemon.socket), place, stdin="")
    assert done.returncode == 0, done.stderr
    assert "(end of input: declined)" in done.stderr
    assert tool_message(server.requests[1])["content"].startswith(
        "Error: The user declined this call.")
    assert not os.path.exists(os.path.join(place.workspace, "asked"))


def test_escape_sequences_never_reach_the_terminal(server, place, daemon):
    """A model's text and a command's output are shown with their control characters
    replaced: they cannot clear the screen, retitle it or write the clipboard (OSC 52)."""
    server.push(openai_stream(text="Hi\x1b]52;c;cHduZWQ=\x07 there\x1b[2J.",
                              calls=[Call("run_terminal",
                                          {"command": "printf '\\033]0;owned\\007out\\n'"})]),
                openai_stream(text="ok"))
    done = run(argv(server, place, "--mode", "auto", "go", socket=daemon.socket), place)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
    assert done.stdout.startswith("Hi?]52;c;cHduZWQ=? there?[2J.")
    assert "  ⎿ ?]0;owned?out  [exit code 0]" in done.stderr.splitlines()


def test_a_servers_error_is_shown_without_its_escape_sequences(server, place, daemon):
    """The reason a turn failed quotes the server: it is shown as text, not acted on."""
    server.push(JSONReply(400, {"error": {"message": "bad\x1b]52;c;cHduZWQ=\x07 \x1b[2Jmodel"}}))
    done = run(argv(server, place, "--mode", "auto", "go", socket=daemon.socket), place)
    assert done.returncode == 1
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert done.stderr.splitlines()[-1].endswith(
        "rejected the request (HTTP 400: bad?]52;c;cHduZWQ=? ?[2Jmodel)")


def test_ctrl_c_at_a_question_cancels_the_turn_and_loses_no_line(server, place,
                                                                  daemon):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "touch never"})]),
                openai_stream(text="Second turn."))
    child = spawn(argv(server, place, "--mode", "ask", socket=daemon.socket), place)
    child.expect_exact("> ")
    child.sendline("make a file")
    child.expect_exact("Run it?")
    child.sendintr()
    child.expect_exact("[interrupted] 1 step, 1 tool call: cancelled")
    child.expect_exact("> ")
    child.sendline("next")  # read by the question's read, still pending: it is the prompt
    child.expect_exact("Second turn.")
    child.expect_exact("[completed] 1 step, 0 tool calls")
    child.expect_exact("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert not os.path.exists(os.path.join(place.workspace, "never"))
    said = [m["content"] for m in server.requests[1].body["messages"] if m["role"] == "user"]
    assert said[-1] == "next"
