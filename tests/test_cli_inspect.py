"""A person inspecting what an agent left: `toolsd ps` without the history of closed
sessions, `toolsd logs --tail` and how `logs -f` ends, messages that name commands."""

from __future__ import annotations

import pytest

from _cli import toolsd
from conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


def ended(client, process_id: str) -> dict:
    out = client.process_output(process_id, since=0, wait_s=60, until=r"[^\s\S]")
    assert out["status"] != "running", out
    return out


def ids(table: str, *of: str) -> list[str]:
    """The ids in a `toolsd ps` table, of those in `of` (the module's daemon may list the
    processes of other tests too)."""
    return [row.split()[0] for row in table.splitlines()[1:] if row.split()[0] in of]


def test_ps_hides_ended_processes_of_closed_sessions_unless_all(daemon, client):
    gone = client.session_open(daemon.workspace)["session"]
    old = client.process_start(gone, "echo old")["id"]
    ended(client, old)
    client.session_close(gone)
    here = client.session_open(daemon.workspace)["session"]
    done = client.process_start(here, "echo done")["id"]
    ended(client, done)
    live = client.process_start(here, "sleep 1000")["id"]

    shown = toolsd(daemon, "ps")
    assert shown.returncode == 0, shown.stderr
    mine = (old, done, live)
    assert ids(shown.stdout, *mine) == [done, live]  # an ended one of an open session stays
    assert "ended process" in shown.stderr and "--all shows them" in shown.stderr
    assert ids(toolsd(daemon, "ps", "--all").stdout, *mine) == [old, done, live]
    assert ids(toolsd(daemon, "ps", "--running").stdout, *mine) == [live]
    client.session_close(here)


def test_logs_tail_prints_the_last_lines(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    # Far more than the first window read back from the end (64 KiB).
    bg = client.process_start(s, "seq 1 100000; printf 'no newline'")["id"]
    ended(client, bg)
    assert toolsd(daemon, "logs", bg, "--tail", "3").stdout == "99999\n100000\nno newline"
    assert toolsd(daemon, "logs", bg, "-n", "0").stdout == ""
    short = client.process_start(s, "echo one; echo two")["id"]
    ended(client, short)
    assert toolsd(daemon, "logs", short, "--tail", "10").stdout == "one\ntwo\n"
    bad = toolsd(daemon, "logs", short, "--tail", "-1")
    assert bad.returncode == 2 and "--tail is a number of lines" in bad.stderr
    client.session_close(s)


def test_logs_follow_ends_saying_how_the_process_ended(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    bg = client.process_start(s, "echo last words; exit 5")["id"]
    r = toolsd(daemon, "logs", "-f", bg)
    assert r.returncode == 0
    assert r.stdout == "last words\n"
    assert r.stderr == f"[toolsd logs: {bg} exited (exit code 5)]\n"
    killed = client.process_start(s, "sleep 1000")["id"]
    client.process_stop(killed)
    r = toolsd(daemon, "logs", "--follow", "--tail", "5", killed)
    assert r.stderr == f"[toolsd logs: {killed} stopped (killed by SIGTERM)]\n"
    client.session_close(s)


@pytest.mark.parametrize("command", [["logs", "bg999999"], ["kill", "bg999999"],
                                     ["logs", "-f", "bg999999"]])
def test_an_unknown_process_is_answered_with_the_command_that_lists_them(daemon, command):
    r = toolsd(daemon, *command)
    assert r.returncode == 1
    assert "bg999999" in r.stderr and "`toolsd ps`" in r.stderr
    assert "process.list" not in r.stderr
