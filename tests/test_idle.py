"""Sessions nobody uses any more: a session whose sandbox died says `alive: false`, and
`toolsd serve --idle-timeout` closes sessions that have had no activity for that long while
keeping those with a call in flight (a repl.exec too) or a background process running."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading

import msgspec
import pytest

from conftest import RunningDaemon, has_ended, needs_bwrap, wait_for, wait_gone
from toolsd.cli.serve import duration
from toolsd.client import ToolsdError
from toolsd.wire.framing import encode_frame
from toolsd.daemon.activity import Activity

pytestmark = needs_bwrap

# Long enough that a session is never idle between its session.open and the call that
# follows it (the only gap these tests leave), on the slowest machine.
IDLE = "3s"
WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.05; done"


@pytest.fixture
def idle_daemon(daemon_root):
    d = RunningDaemon(daemon_root, extra_args=("--idle-timeout", IDLE)).start()
    yield d
    assert d.stop() == 0, d.read_log()


def listed(client) -> dict[str, dict]:
    return {s["session"]: s for s in client.session_list()["sessions"]}


def in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    """Run a client call in a thread of its own; `box` gets its "result" or "error"."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn(*args, **kwargs)
        except Exception as e:  # handed to the test, which asserts on it
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_idle_sessions_are_closed_and_busy_ones_kept(idle_daemon):
    d = idle_daemon
    clients = [d.client() for _ in range(3)]
    c, c_shell, c_repl = clients
    try:
        # Each busy session gets its activity right after it opens: a call that waits for
        # the file `go`, a repl.exec that does, a background process that does.
        by_call = c.session_open(d.workspace)["session"]
        shell_call = in_thread(c_shell.shell_run, by_call, WAIT_FOR_GO + "; echo done",
                               timeout_s=600)
        by_repl = c.session_open(d.workspace)["session"]
        turn = c.turn_begin(by_repl)["turn"]
        assert c.repl_exec(by_repl, turn, "import os, time")["status"] == "ok"
        repl_call = in_thread(c_repl.repl_exec, by_repl, turn,
                              "while not os.path.exists('go'): time.sleep(0.05)\n'done'",
                              timeout_s=600)
        by_process = c.session_open(d.workspace)["session"]
        c.process_start(by_process, WAIT_FOR_GO)
        idle = c.session_open(d.workspace)["session"]

        # The idle one goes; at that moment every busy one is still there, and alive.
        wait_for(lambda: idle not in listed(c), timeout=120)
        sessions = listed(c)
        for busy in (by_call, by_repl, by_process):
            assert sessions[busy]["alive"], sessions
        with pytest.raises(ToolsdError) as e:
            c.shell_run(idle, "echo hi")
        assert e.value.code == "session_closed" and "without activity" in e.value.message
        assert f"session {idle} closed: no call and no running process" in d.read_log()

        # Their calls finish as usual; then they are idle too, and go in their turn.
        open(os.path.join(d.workspace, "go"), "w").close()
        for thread, box in (shell_call, repl_call):
            thread.join(timeout=120)
            assert "error" not in box, box
        assert shell_call[1]["result"]["output"] == "done\n"
        assert repl_call[1]["result"]["output"] == "'done'\n"
        wait_for(lambda: not listed(c), timeout=120)
        for busy in (by_call, by_repl, by_process):
            assert f"session {busy} closed: no call" in d.read_log()
        assert wait_gone([p for p in d.tree() if not has_ended(p)], timeout=30) == []
    finally:
        for client in clients:
            client.close()


def test_a_session_whose_open_reply_was_never_read_is_closed(idle_daemon):
    d = idle_daemon
    with d.client() as c:
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect(d.socket)
        request = {"id": 1, "method": "session.open", "params": {"workspace": d.workspace}}
        raw.sendall(encode_frame(msgspec.msgpack.encode(request)))
        wait_for(lambda: listed(c), timeout=120)  # opened, its reply unread
        raw.close()
        wait_for(lambda: not listed(c), timeout=120)
        assert "closed: no call and no running process" in d.read_log()
    assert wait_gone([p for p in d.tree() if not has_ended(p)], timeout=30) == []


def test_a_session_whose_sandbox_died_is_listed_as_dead(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    other = client.session_open(daemon.workspace)["session"]
    turn = client.turn_begin(s)["turn"]
    assert client.repl_exec(s, turn, "1")["status"] == "ok"
    sandbox = sandbox_of(daemon, client, s)
    os.kill(sandbox, signal.SIGKILL)  # from the host: as an OOM kill or an admin would

    wait_for(lambda: not listed(client)[s]["alive"], timeout=60)
    assert listed(client)[other]["alive"]
    for call in (lambda: client.shell_run(s, "echo hi"), lambda: client.turn_begin(s),
                 lambda: client.process_start(s, "sleep 1")):
        with pytest.raises(ToolsdError) as e:
            call()
        assert e.value.code == "session_closed"
        assert "sandbox has died" in e.value.message and "alive: false" in e.value.message
    status = subprocess.run([sys.executable, "-m", "toolsd", "status", "--socket", daemon.socket],
                            capture_output=True, text=True, timeout=60, env=daemon.env)
    lines = {line.split()[0]: line for line in status.stdout.splitlines()
             if line.startswith("  s")}
    assert "DEAD" in lines[s] and "DEAD" not in lines[other]
    assert client.shell_run(other, "echo fine")["output"] == "fine\n"

    client.session_close(s)
    assert s not in listed(client)
    client.session_close(other)
    assert wait_gone([p for p in daemon.tree() if not has_ended(p)], timeout=30) == []


def sandbox_of(daemon, client, session: str) -> int:
    """The host pid of the outer bwrap of `session`: the one its command runs under."""
    marker = f"sleep 999.{os.getpid()}"
    bg = client.process_start(session, marker)["id"]
    wait_for(lambda: [p for p in daemon.running(marker) if p.name() == "sleep"])
    (sleep,) = [p for p in daemon.running(marker) if p.name() == "sleep"]
    try:
        return [p for p in sleep.parents() if p.name() == "bwrap"][-1].pid
    finally:
        client.process_stop(bg)


@pytest.mark.parametrize("bad", ["5x", "0", "-3", "1h30m", ""])
def test_a_bad_idle_timeout_is_a_clear_startup_error(daemon_root, bad):
    out = subprocess.run(
        [sys.executable, "-m", "toolsd", "serve", "--socket",
         os.path.join(daemon_root, "t.sock"), f"--idle-timeout={bad}"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--idle-timeout" in out.stderr and repr(bad) in out.stderr
    assert not os.path.exists(os.path.join(daemon_root, "t.sock"))


def test_durations():
    assert [duration(t) for t in ("90", "90s", "1.5m", "30m", "2h", "1d", " 10 s")] == [
        90, 90, 90, 1800, 7200, 86400, 10]
    for bad in ("5x", "0", "0s", "-1", "1h30m", "", "inf", "nan", "1e3", "9" * 400):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)


def test_activity_counts_from_the_end_of_the_last_busy_thing():
    a = Activity(now=100.0)
    assert a.idle_for(130.0) == 30.0
    a.begin()  # a call
    a.begin()  # a background process
    assert a.idle_for(500.0) == 0.0
    a.end(now=510.0)
    assert a.idle_for(600.0) == 0.0  # the process still runs
    a.end(now=520.0)
    assert a.idle_for(600.0) == 80.0
    a.restart(now=590.0)
    assert a.idle_for(600.0) == 10.0


# An echo server in a thread of the REPL: no call in flight and no background process.
ECHO_IN_A_THREAD = """
import socket, threading
server = socket.socket()
server.bind(("127.0.0.1", 7000))
server.listen()
def echo(conn):
    while data := conn.recv(100):
        conn.sendall(data)
def serve():
    while True:
        threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
"""


def test_a_forwarded_connection_keeps_its_session_from_idling(idle_daemon):
    d = idle_daemon
    with d.client() as c:
        s = c.session_open(d.workspace)["session"]
        turn = c.turn_begin(s)["turn"]
        assert c.repl_exec(s, turn, ECHO_IN_A_THREAD)["status"] == "ok"
        forward = c.port_forward(s, 7000)
        with socket.create_connection((forward["host"], forward["port"]), timeout=30) as conn:
            conn.sendall(b"a")
            assert conn.recv(1) == b"a"
            # Opened after s's last call: it would go after s, were s idle.
            idle = c.session_open(d.workspace)["session"]
            wait_for(lambda: idle not in listed(c), timeout=120)
            assert s in listed(c)
            conn.sendall(b"b")
            assert conn.recv(1) == b"b"
        wait_for(lambda: s not in listed(c), timeout=120)
        assert wait_gone([p for p in d.tree() if not has_ended(p)], timeout=30) == []
