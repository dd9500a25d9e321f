"""Nothing that a session's code does with signals ends the session or its machinery: the
commands agents run to clean up (pkill, killall, kill -9 -1, loops over every pid, SIGSTOP),
from shell.run, process.start and the REPL. The agent's own processes die (or stop) as asked;
a REPL that died says `state_lost: true` once and comes back `fresh: true`; the next
shell.run, process.start and repl.exec work; session.close leaves nothing."""

from __future__ import annotations

import shutil

import psutil
import pytest

from conftest import RunningDaemon, needs_bwrap, short_tempdir, wait_for, wait_gone
from toolsd.client import ToolsdError
from toolsd.sandbox.launch.launcher_client import LAUNCHER_PY

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


def sandbox_of(client, session: str) -> list[psutil.Process]:
    """bwrap and every process below it, for the session: found from a background process
    (its parent is its shim, whose parent is the launcher, whose parent is bwrap)."""
    bg = client.process_start(session, "sleep 1000")
    try:
        bwrap = psutil.Process(bg["pid"]).parent().parent().parent()
        assert bwrap.name() == "bwrap", bwrap
        return [bwrap, *bwrap.children(recursive=True)]
    finally:
        client.process_stop(bg["id"], grace_s=0)


def running(procs: list[psutil.Process], text: str) -> list[psutil.Process]:
    """Those of `procs` still running whose command line contains `text`."""
    found = []
    for p in procs:
        try:
            if text in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass  # ended meanwhile
    return found


def close_leaves_nothing(client, session: str) -> None:
    procs = sandbox_of(client, session)
    client.session_close(session)
    assert not wait_gone(procs, timeout=20)


def still_works(client, session: str) -> None:
    """shell.run, and process.start with process.output, as if nothing happened."""
    r = client.shell_run(session, "echo ok")
    assert (r["exit_code"], r["output"]) == (0, "ok\n"), r
    bg = client.process_start(session, "echo started; sleep 1000")
    out = client.process_output(bg["id"], wait_s=30, until="started")
    assert (out["status"], out["output"]) == ("running", "started\n"), out
    assert client.process_stop(bg["id"], grace_s=0)["status"] == "stopped"


# 41 while the REPL keeps its state (x = 41), 1 on a fresh interpreter.
PROBE = "x = x if 'x' in globals() else 1; x"


def repl_comes_back(client, session: str, turn: str, reached: bool | None,
                    timeout_s=60.0) -> None:
    """The REPL (which holds x = 41) still has its state if the kill did not reach it
    (`reached` None: either). If it did, the next call says state_lost: true, having run on
    a fresh interpreter (fresh: true), or having found it going (a stopped one times out):
    then the call after is fresh."""
    first = client.repl_exec(session, turn, PROBE, timeout_s=timeout_s)
    if reached is False or (reached is None and not first["state_lost"]):
        assert (first["status"], first["output"], first["state_lost"]) == ("ok", "41\n", False)
        return
    repl_found_dead(client, session, turn, first)


def repl_found_dead(client, session: str, turn: str, first: dict) -> None:
    """`first` is the answer of the first call after the REPL died (a PROBE, or code that
    killed it)."""
    assert first["state_lost"], first
    if not first["fresh"]:
        first = client.repl_exec(session, turn, PROBE)
        assert not first["state_lost"], first
    assert (first["status"], first["output"], first["fresh"]) == ("ok", "1\n", True), first


def background_reported(client, bg_id: str, *expected: str) -> None:
    """`expected`: "running", or the signal it must have died of (or several of these)."""
    out = client.process_output(bg_id)
    if out["status"] == "running" and "running" in expected:
        client.process_stop(bg_id, grace_s=0)
        return
    out = client.process_output(bg_id, wait_s=60)  # returns as soon as it has exited
    assert out["status"] == "exited" and out["signal"] in expected, out


# (command run by shell.run; does it end the REPL (None: it may or may not); what may
# become of a `sleep` in the background). A stopped REPL is resumed by its next call. A loop
# that kills every pid kills its own shim early on, and the machinery then ends what that
# shim ran, the loop included, which may or may not have got further.
# The shims' command line names toolsd's folder, which may itself contain "python": then
# pkill -9 -f python kills them, and with them what they ran.
SHIMS_MATCH_PYTHON = "python" in LAUNCHER_PY
NEEDS_KILLALL = pytest.mark.skipif(shutil.which("killall") is None, reason="killall (psmisc) "
                                   "is not installed; apt-get install psmisc")
KILLERS = [
    pytest.param("pkill -f python", True, ("running",), id="pkill-f-python"),
    pytest.param("pkill python", True, ("running",), id="pkill-python"),
    # killall matches the exact name: python3 (the REPL) is another.
    pytest.param("killall python", False, ("running",), id="killall-python",
                 marks=NEEDS_KILLALL),
    # (Its own bash matches -f python too: it ends there, as asked.)
    pytest.param("pkill -9 -f python", True,
                 ("running", "SIGKILL") if SHIMS_MATCH_PYTHON else ("running",),
                 id="pkill-9-f-python"),
    pytest.param("pkill -9 python", True, ("running",), id="pkill-9-python"),
    pytest.param("killall -9 python", False, ("running",), id="killall-9-python",
                 marks=NEEDS_KILLALL),
    pytest.param("kill -9 -1", True, ("SIGKILL",), id="kill-9-all"),
    pytest.param("kill -STOP -1", False, ("running",), id="stop-all"),
    pytest.param("for p in $(seq 1 400); do kill -9 $p; done", None, ("SIGKILL", "running"),
                 id="kill-9-each-pid"),
    pytest.param("for p in $(seq 1 400); do [ $p != $$ ] && kill -9 $p; done", None,
                 ("SIGKILL", "running"), id="kill-9-each-pid-but-self"),
    pytest.param("for p in $(seq 1 400); do kill -TERM $p; done", True, ("SIGTERM",),
                 id="term-each-pid"),
    pytest.param("for p in $(seq 1 400); do [ $p != $$ ] && kill -STOP $p; done", False,
                 ("running",), id="stop-each-pid-but-self"),
    pytest.param("for s in INT HUP QUIT USR1 USR2 ALRM SEGV ABRT TSTP TTIN; do "
                 "for p in $(seq 1 400); do [ $p != $$ ] && kill -$s $p; done; done", True,
                 ("SIGINT",), id="every-signal-each-pid-but-self"),
]


@pytest.mark.parametrize("killer, reaches_repl, background", KILLERS)
def test_signals_from_shell_run_leave_the_session_working(
        client, daemon, killer, reaches_repl, background):
    s = client.session_open(daemon.workspace)["session"]
    turn = client.turn_begin(s)["turn"]
    assert client.repl_exec(s, turn, "x = 41")["status"] == "ok"
    bg = client.process_start(s, "sleep 1000")
    # The command may end by its own hand (a loop that reaches its own pid, or its shim's):
    # what it answers is its business. It must answer.
    client.shell_run(s, f"{killer} 2>/dev/null; true", timeout_s=30)
    still_works(client, s)
    background_reported(client, bg["id"], *background)
    # A stopped REPL is resumed by its next call, its state kept.
    repl_comes_back(client, s, turn, reaches_repl)
    still_works(client, s)
    close_leaves_nothing(client, s)


def test_kill_9_all_from_a_background_process(client, daemon):
    s = client.session_open(daemon.workspace)["session"]
    turn = client.turn_begin(s)["turn"]
    assert client.repl_exec(s, turn, "x = 41")["status"] == "ok"
    sleeper = client.process_start(s, "sleep 1000")
    killer = client.process_start(s, "kill -9 -1")
    out = client.process_output(killer["id"], wait_s=60)
    # Its shim died under it, so it may have been ended before its own exit: either way
    # its end is reported.
    assert out["status"] == "exited" and (out["exit_code"] == 0 or out["signal"] == "SIGKILL")
    background_reported(client, sleeper["id"], "SIGKILL")
    still_works(client, s)
    repl_comes_back(client, s, turn, reached=True)
    close_leaves_nothing(client, s)


def test_kill_9_all_from_the_repl(client, daemon):
    s = client.session_open(daemon.workspace)["session"]
    turn = client.turn_begin(s)["turn"]
    sleeper = client.process_start(s, "sleep 1000")
    assert client.repl_exec(s, turn, "x = 41")["status"] == "ok"
    [interpreter] = running(sandbox_of(client, s), "python_repl")
    r = client.repl_exec(s, turn, "import os; os.kill(-1, 9)")
    # The kill spared it, not its shim: the machinery ends what that shim ran, the REPL
    # with it, perhaps after this answer.
    assert not wait_gone([interpreter], timeout=30)
    if not r["state_lost"]:
        assert r["status"] == "ok", r
        r = client.repl_exec(s, turn, PROBE)
    repl_found_dead(client, s, turn, r)
    background_reported(client, sleeper["id"], "SIGKILL")
    still_works(client, s)
    close_leaves_nothing(client, s)


def test_the_machinery_cannot_be_traced(client, daemon):
    s = client.session_open(daemon.workspace)["session"]
    code = ("import ctypes, os, subprocess, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "pids = [1] + [int(p) for p in subprocess.run(['pgrep', '-x', 'toolsd-shim'],"
            " capture_output=True, text=True).stdout.split()]\n"
            "assert len(pids) > 1, pids\n"
            "for pid in pids:\n"
            "    assert libc.ptrace(0x4206, pid, None, None) == -1, pid\n"  # PTRACE_SEIZE
            "    assert ctypes.get_errno() == 1, (pid, os.strerror(ctypes.get_errno()))\n"
            "print('refused', len(pids))\n")
    r = client.shell_run(s, f"python3 -c \"{code}\"")
    assert r["exit_code"] == 0 and r["output"].startswith("refused"), r
    close_leaves_nothing(client, s)


# ---------------------------------------------------------------- races


def hostile_loop(signal: str, rounds: int) -> str:
    """A background command that signals every child of pid 1 (the shims) and everything
    named like a shim (commands not yet exec'd too) but its own shim, `rounds` times over,
    then says so."""
    return (f"for i in $(seq {rounds}); do for p in $(pgrep -P 1; pgrep -x toolsd-shim); do "
            f"[ $p != $PPID ] && kill -{signal} $p 2>/dev/null; done; done; echo finished")


@pytest.mark.parametrize("signal", ["KILL", "STOP"])
def test_spawns_racing_signals_to_every_shim_run_once_at_most(client, daemon, signal):
    s = client.session_open(daemon.workspace)["session"]
    loop = client.process_start(s, hostile_loop(signal, 300))
    answers = []
    for i in range(30):
        try:
            # A command stopped as it started (it bears its shim's name until its exec) is
            # stopped as asked, and times out.
            r = client.shell_run(s, f"echo {i} >> /tmp/runs; echo {i}", timeout_s=10)
            answers.append((i, r))
        except ToolsdError as e:
            # A request whose shims were killed again and again fails, and says why.
            assert signal == "KILL" and e.code != "session_closed" and "shim" in e.message, e
    done = client.process_output(loop["id"], wait_s=120, until="finished")
    assert "finished" in done["output"], done
    runs = client.shell_run(s, "cat /tmp/runs")["output"].split()
    assert len(runs) == len(set(runs)), runs  # never run twice
    for i, r in answers:
        if r["exit_code"] == 0:
            assert r["output"] == f"{i}\n" and str(i) in runs
        elif signal == "STOP":
            assert r["timed_out"], (i, r)  # a stopped shim is resumed: only its command waits
        else:
            assert r["signal"] == "SIGKILL", (i, r)
    still_works(client, s)
    close_leaves_nothing(client, s)


# ---------------------------------------------------------------- the warm spare


def test_kill_9_all_with_the_warm_spare_up():
    root = short_tempdir()
    daemon = RunningDaemon(root, warm_spare=True).start()
    try:
        with daemon.client() as client:
            s = client.session_open(daemon.workspace)["session"]

            def sandboxes():
                found = []
                for p in daemon.tree():
                    try:
                        if p.name() == "bwrap":
                            found.append(p)
                    except psutil.Error:
                        pass  # ended while we looked
                return found

            wait_for(lambda: len(sandboxes()) == 2)  # the session's and the spare
            spare = {p.pid for p in sandboxes()} - {sandbox_of(client, s)[0].pid}
            client.shell_run(s, "kill -9 -1; true")
            still_works(client, s)
            other = client.session_open(daemon.workspace)["session"]
            assert sandbox_of(client, other)[0].pid in spare  # the spare, unharmed
            still_works(client, other)
            close_leaves_nothing(client, other)
            close_leaves_nothing(client, s)
        assert daemon.stop() == 0, daemon.read_log()
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)
