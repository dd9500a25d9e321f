"""`toolsd repl` as a person uses it: typed into a terminal (pexpect), against a real daemon."""

from __future__ import annotations

import os
import shutil
import signal
import sys

import pexpect
import psutil
import pytest

from conftest import needs_bwrap
from toolsd.cli.repl import is_complete

pytestmark = pytest.mark.daemon(shared=True)

# Safety net against a hung prompt, not a timing assertion.
STUCK_S = 30


def spawn_repl(daemon, *extra: str) -> pexpect.spawn:
    # Ctrl-C at its default, as a shell starts a program in the foreground: tests run in the
    # background (by a script's `cmd &`) would otherwise pass on SIGINT ignored.
    return pexpect.spawn(
        sys.executable, ["-m", "toolsd", "--socket", daemon.socket, "repl",
                         "--workspace", daemon.workspace, *extra],
        env=daemon.env, encoding="utf-8", timeout=STUCK_S, dimensions=(24, 200),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def interpreter_pids(daemon, marker: str) -> list[int]:
    found = []
    for proc in daemon.tree():
        try:
            if any(marker in a for a in proc.cmdline()):
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def gone(pids) -> bool:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=STUCK_S)
    return not alive


@needs_bwrap
def test_typed_session_keeps_state_and_ctrl_d_closes_it(daemon, client):
    started = os.path.join(daemon.workspace, "started")
    os.mkfifo(started)
    child = spawn_repl(daemon)
    try:
        child.expect_exact(">>> ")
        child.sendline("def twice(x):")
        child.expect_exact("... ")
        child.sendline("    return x * 2")
        child.expect_exact("... ")
        child.sendline("")
        child.expect_exact(">>> ")
        child.sendline("print('got', twice(21))")
        child.expect_exact("got 42\r\n>>> ")

        # Ctrl-C while typing throws the unfinished input away.
        child.sendline("half = (1 +")
        child.expect_exact("... ")
        child.sendintr()
        child.expect_exact("KeyboardInterrupt")
        child.expect_exact(">>> ")
        child.sendline("'half' in globals()")
        child.expect_exact("False\r\n>>> ")

        # Ctrl-C while code runs interrupts it; the state stays.
        child.sendline("exec(\"open('started', 'w').close()\\nwhile True: pass\")")
        with open(started) as f:
            f.read()
        child.sendintr()
        child.expect_exact("KeyboardInterrupt")
        child.expect_exact(">>> ")
        child.sendline("twice(5)")
        child.expect_exact("10\r\n>>> ")

        [session] = client.session_list()["sessions"]
        assert session["repls"] == 1
        interpreters = interpreter_pids(daemon, "python_repl")
        assert len(interpreters) == 1

        child.sendeof()
        child.expect(pexpect.EOF)
        child.wait()
        assert child.exitstatus == 0
        assert client.session_list()["sessions"] == []
        assert gone(interpreters)
    finally:
        child.close(force=True)


@needs_bwrap
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_prompt_reads_on_while_brackets_are_open(daemon, client):
    child = spawn_repl(daemon, "--language", "node")
    try:
        child.expect_exact("> ")
        child.sendline("function inc(a) {")
        child.expect_exact("... ")
        child.sendline("  return a + 1;")
        child.expect_exact("... ")
        child.sendline("}")
        child.expect_exact("> ")
        child.sendline("inc(41)")
        child.expect_exact("42\r\n> ")
        child.sendeof()
        child.expect(pexpect.EOF)
        child.wait()
        assert child.exitstatus == 0
        assert client.session_list()["sessions"] == []
    finally:
        child.close(force=True)


@pytest.mark.parametrize("source, complete", [
    ("x = 1", True),
    ("def f():", False),
    ("def f():\n    return 1", False),
    ("def f():\n    return 1\n", True),
    ("x = (1 +", False),
    ("1 +* 2", True),  # a syntax error is sent, so the REPL reports it
])
def test_python_input_is_complete_as_at_the_interactive_prompt(source, complete):
    assert is_complete(source, "python") is complete


@pytest.mark.parametrize("source, complete", [
    ("inc(1)", True),
    ("function f(a) {", False),
    ("const s = '{';", True),
    ("/* ( */ f(", False),
    ("[1, 2,\n 3]", True),
])
def test_node_input_is_complete_when_brackets_close(source, complete):
    assert is_complete(source, "node") is complete
