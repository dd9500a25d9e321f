"""`toolsd exec` and `toolsd repl` with no daemon answering: each starts one for its run, as
`toolsd agent` and `toolsd mcp` do, says so, and leaves nothing behind."""

from __future__ import annotations

import os

import pexpect
import psutil
import pytest

from _cli import toolsd, toolsd_at_terminal
from conftest import RunningDaemon, needs_bwrap

pytestmark = needs_bwrap


@pytest.fixture
def nobody(daemon_root):
    """A workspace, a home and a $TMPDIR with no daemon on the socket (RunningDaemon is only
    used for its folders and environment: it is never started)."""
    d = RunningDaemon(daemon_root)
    d.env["TMPDIR"] = os.path.join(daemon_root, "tmp")
    os.makedirs(d.env["TMPDIR"])
    return d


def daemons_on(folder: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(folder in arg for arg in p.info["cmdline"] or []) and "serve" in (
                p.info["cmdline"] or []):
            found.append(p)
    return found


def test_exec_with_no_daemon_starts_one_for_the_run(nobody):
    r = toolsd(nobody, "exec", "--", "echo from a daemon of its own; exit 3")
    assert r.returncode == 3, r.stderr
    assert r.stdout == "from a daemon of its own\n"
    assert f"no toolsd answers on {nobody.socket}; started one for this run only" in r.stderr
    # Stopped and removed with the run.
    assert os.listdir(nobody.env["TMPDIR"]) == []
    assert daemons_on(nobody.env["TMPDIR"]) == []


def test_repl_with_no_daemon_starts_one_for_the_run(nobody):
    child = toolsd_at_terminal(nobody, "repl")
    try:
        child.expect_exact("started one for this run only")
        child.expect_exact(">>> ")
        assert len(daemons_on(nobody.env["TMPDIR"])) == 1
        child.sendline("6 * 7")
        child.expect_exact("42\r\n>>> ")
        child.sendeof()
        child.expect(pexpect.EOF)
        child.close()
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert os.listdir(nobody.env["TMPDIR"]) == []
    assert daemons_on(nobody.env["TMPDIR"]) == []


def test_a_kept_session_never_gets_a_daemon_of_its_own(nobody):
    r = toolsd(nobody, "exec", "--session", "s1", "--", "true")
    assert r.returncode == 1 and "cannot reach toolsd" in r.stderr
    assert "started one" not in r.stderr
