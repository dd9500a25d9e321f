"""`toolsd attach` driven as a person would drive it: a real terminal (pexpect), a real daemon,
a real program on a terminal in the sandbox."""

from __future__ import annotations

import shlex
import sys

import pexpect
import pytest

from conftest import needs_bwrap
from toolsd.client import ToolsdError

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

PY = shlex.quote(sys.executable)


def attach(daemon, process_id: str, *extra: str) -> pexpect.spawn:
    return pexpect.spawn(sys.executable, ["-m", "toolsd", "attach", process_id, "--socket",
                                          daemon.socket, *extra],
                         env=daemon.env, dimensions=(24, 80), timeout=60)


def test_attach_types_resizes_interrupts_and_detaches_leaving_it_running(daemon, client,
                                                                         session):
    bg = client.process_start(session, f"{PY} -i -q", tty=True)
    client.process_output(bg["id"], wait_s=60, until=">>> ")
    term = attach(daemon, bg["id"])
    try:
        term.expect_exact("^] detaches")
        term.expect_exact(">>> ")  # the prompt printed before attaching is shown
        # Attaching sized the process's terminal as ours.
        term.send("import os; print('size', os.get_terminal_size())\r")
        term.expect_exact("size os.terminal_size(columns=80, lines=24)")
        term.setwinsize(33, 111)  # SIGWINCH to attach, which resizes the process's terminal
        term.send("print('size', os.get_terminal_size())\r")
        term.expect_exact("size os.terminal_size(columns=111, lines=33)")
        # Raw mode: Ctrl-C goes to the program, and attach stays.
        term.send("while True: pass\r\r")
        term.send("\x03")
        term.expect_exact("KeyboardInterrupt")
        term.send("print('still', 6 * 7)\r")
        term.expect_exact("still 42")
        term.send("\x1d")  # Ctrl-]: detach
        term.expect_exact("detached")
        term.expect(pexpect.EOF)
    finally:
        term.close(force=True)
    assert term.exitstatus == 0
    out = client.process_output(bg["id"], since=0)
    assert out["status"] == "running" and "still 42" in out["output"]
    client.process_write(bg["id"], "print('after detach')\n")
    assert "after detach" in client.process_output(bg["id"], wait_s=60,
                                                   until="after detach")["output"]
    assert client.process_stop(bg["id"])["survivors"] == 0


def test_attach_ends_with_the_process_and_says_how(daemon, client, session):
    bg = client.process_start(session, "read -r line; echo got:$line; exit 3", tty=True)
    term = attach(daemon, bg["id"], "--detach-key", "^Q")
    try:
        term.expect_exact("^Q detaches")
        term.send("hello\r")
        term.expect_exact("got:hello")
        term.expect_exact("exit code 3")
        term.expect(pexpect.EOF)
    finally:
        term.close(force=True)
    assert term.exitstatus == 0


def test_attach_to_a_process_without_a_terminal_is_refused_clearly(daemon, client, session):
    bg = client.process_start(session, "sleep 1000")
    term = attach(daemon, bg["id"])
    try:
        term.expect_exact("no terminal")
        term.expect_exact(f"`toolsd logs -f {bg['id']}` follows its output")
        term.expect(pexpect.EOF)
    finally:
        term.close(force=True)
    assert term.exitstatus == 1
    bad = attach(daemon, bg["id"], "--detach-key", "x")
    bad.expect(pexpect.EOF)
    bad.close()
    assert bad.exitstatus == 2 and b"not a control key" in bad.before
    client.process_stop(bg["id"])
    with pytest.raises(ToolsdError):
        client.process_write(bg["id"], "x")
