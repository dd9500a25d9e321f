"""`toolsd ps / logs / kill` run as a person would (a subprocess), against a real daemon and
real background processes; `logs` never moves the agent's read mark."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import psutil
import pytest

from conftest import needs_bwrap
from toolsd.cli.logs import next_piece
from toolsd.cli.ps import format_bytes, format_duration, format_table
from toolsd.tools.output import render
from toolsd.wire.protocol import MARKER

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


def toolsd(daemon, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolsd", "--socket", daemon.socket, *args],
                          capture_output=True, text=True, timeout=60, env=daemon.env, **kwargs)


def wait_exit(client, process_id: str) -> None:
    out = client.process_output(process_id, since=0, wait_s=60, until=r"[^\s\S]")
    assert out["status"] != "running", out


def test_ps_shows_a_running_process_and_its_tree(daemon, client, session):
    bg = client.process_start(session, "sleep 1000 & echo ready; sleep 1000", name="sleeper")
    client.process_output(bg["id"], wait_s=60, until="ready")
    table = toolsd(daemon, "ps")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "SESSION", "PID", "STATUS", "UPTIME", "CPU", "RSS", "DESC",
                              "COMMAND"]
    [row] = [r for r in rows if r.split()[0] == bg["id"]]
    fields = row.split()
    assert fields[1:4] == [session, str(bg["pid"]), "running"]
    assert fields[7] == "1"  # the background sleep; the shell's own process is not counted
    assert row.endswith("sleeper: sleep 1000 & echo ready; sleep 1000")

    listed = json.loads(toolsd(daemon, "ps", "--json").stdout)
    [info] = [p for p in listed if p["id"] == bg["id"]]
    assert info["pid"] == bg["pid"] and info["status"] == "running"
    client.process_stop(bg["id"])
    running = toolsd(daemon, "ps", "--running").stdout
    assert bg["id"] not in running.split()


def test_logs_prints_output_and_leaves_the_agent_read_mark(daemon, client, session):
    bg = client.process_start(session, "echo hello; echo world")
    wait_exit(client, bg["id"])
    assert toolsd(daemon, "logs", bg["id"]).stdout == "hello\nworld\n"
    assert toolsd(daemon, "logs", bg["id"], "--since", "6").stdout == "world\n"
    # The agent still gets everything: the person's reads moved nothing.
    assert client.process_output(bg["id"])["output"] == "hello\nworld\n"


def test_logs_of_long_output_prints_every_byte_once_in_order(daemon, client, session):
    # About 2.9 MB: more than one read (and more than the in-memory ring) holds.
    bg = client.process_start(session, "seq 1 400000")
    wait_exit(client, bg["id"])
    out = toolsd(daemon, "logs", bg["id"])
    assert out.returncode == 0, out.stderr
    assert out.stdout == "".join(f"{i}\n" for i in range(1, 400001))


def test_logs_of_binary_output_prints_it_escaped_once_in_order(daemon, client, session):
    data = os.urandom(1_500_000)  # renders to ~3.5 M characters: many reads, escapes at seams
    with open(os.path.join(daemon.workspace, "noise.bin"), "wb") as f:
        f.write(data)
    bg = client.process_start(session, "cat noise.bin")
    wait_exit(client, bg["id"])
    out = subprocess.run(  # bytes: text mode would turn the \r in the noise into \n
        [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "logs", bg["id"]],
        capture_output=True, timeout=60, env=daemon.env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == render(data)


def test_ps_shows_names_and_commands_without_terminal_controls(daemon, client, session):
    # OSC 52 would write the operator's clipboard; \r and "erase line" would hide the row.
    name = "\x1b]52;c;aGk=\x07web"
    bg = client.process_start(session, "sleep 1000 # \r\x1b[2K\u202e", name=name)
    out = toolsd(daemon, "ps")
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\u202e" not in out.stdout
    [row] = [r for r in out.stdout.splitlines() if r.startswith(bg["id"] + " ")]
    assert row.endswith("\\x1b]52;c;aGk=\\x07web: sleep 1000 # \\x1b[2K\\u202e")
    client.process_stop(bg["id"])


def test_ps_of_an_unknown_session_says_so(daemon, session):
    out = toolsd(daemon, "ps", "--session", "nope")
    assert out.returncode == 1
    assert "no session nope" in out.stderr and out.stdout == ""
    assert toolsd(daemon, "ps", "--session", session).returncode == 0  # known, no processes


def test_logs_follow_prints_new_output_until_the_process_ends(daemon, client, session):
    go = os.path.join(daemon.workspace, "go-follow")
    os.mkfifo(go)
    try:
        bg = client.process_start(session, "echo one; read x < go-follow; echo two")
        follow = subprocess.Popen(
            [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "logs", "-f", bg["id"]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=daemon.env)
        try:
            ready, _, _ = select.select([follow.stdout], [], [], 60)
            assert ready, "logs -f printed nothing"
            assert follow.stdout.readline() == "one\n"
            assert follow.poll() is None  # still following
            with open(go, "w") as f:
                f.write("go\n")
            rest, err = follow.communicate(timeout=60)
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.wait()
    finally:
        os.unlink(go)
    assert follow.returncode == 0, err
    assert rest == "two\n"
    assert client.process_output(bg["id"])["output"] == "one\ntwo\n"


def test_kill_stops_the_whole_tree(daemon, client, session):
    bg = client.process_start(session, "sleep 1000 & echo ready; sleep 1000")
    client.process_output(bg["id"], wait_s=60, until="ready")
    tree = psutil.Process(bg["pid"]).parent().children(recursive=True)
    assert len(tree) >= 2
    out = toolsd(daemon, "kill", bg["id"], "--grace", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{bg['id']}: stopped")
    assert "0 survivors" in out.stdout
    _gone, alive = psutil.wait_procs(tree, timeout=5)
    assert alive == []
    assert client.process_output(bg["id"])["status"] == "stopped"


def test_unknown_id_says_not_found(daemon, client, session):
    for args in (("logs", "bg9999"), ("kill", "bg9999")):
        out = toolsd(daemon, *args)
        assert out.returncode == 1
        assert "not_found" in out.stderr and "bg9999" in out.stderr


# ------------------------------------------------------------------ pure parts


def test_truncated_read_is_printed_up_to_its_marker_and_resumed_there():
    marker = MARKER.format(left=500, since=1234)
    reply = {"output": "head" + marker + "tail", "truncated": True, "next": 9999}
    assert next_piece(reply) == ("head", 1234, False)
    reply = {"output": "all of it", "truncated": False, "next": 9}
    assert next_piece(reply) == ("all of it", 9, True)


def test_table_cells():
    assert format_duration(5) == "5s"
    assert format_duration(125) == "2m05s"
    assert format_duration(3 * 3600 + 120) == "3h02m"
    assert format_bytes(512) == "512B"
    assert format_bytes(3 * 1024 * 1024) == "3.0M"
    now = time.time()
    proc = {"id": "bg2", "session": "s1", "pid": 42, "status": "exited", "exit_code": 3,
            "started_at": now - 70, "ended_at": now - 10, "cpu_percent": 1.25,
            "rss_bytes": 0, "descendants": 0, "name": "", "command": "make\n  all"}
    table = format_table([proc], now=now)
    row = table.splitlines()[1]
    assert row.split() == ["bg2", "s1", "42", "exited", "3", "1m00s", "1.2%", "0B", "0",
                           "make", "all"]
    assert len(format_table([proc], now=now, width=30).splitlines()[1]) == 30

