"""Interactive background processes (issue 17, protocol 1.1 "tty" and "stdin") on a real daemon
with real bwrap sessions: a program on a terminal made inside the sandbox, typing into it and
into a stdin pipe, resizing, `waiting_for_input`, floods that never block the daemon, clear
errors, and nothing left behind by stop, daemon SIGKILL or a restart."""

from __future__ import annotations

import shlex
import sys

import psutil
import pytest

from conftest import RunningDaemon, needs_bwrap, wait_for
from test_processes import (
    assert_all_gone,
    command_tree,
    sleeps,
    wait_exit,
    wait_for_tree,
)
from toolsd.client import ToolsdError

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

PY = shlex.quote(sys.executable)


def read_until(client, process_id: str, pattern: str, **options) -> dict:
    out = client.process_output(process_id, wait_s=60, until=pattern, **options)
    return out


def waiting(client, process_id: str) -> bool:
    return client.process_output(process_id, since=0, max_output_chars=0)["waiting_for_input"]


# ------------------------------------------------------------------ terminals


def test_python_on_a_terminal_answers_a_line_and_knows_its_terminal(client, session):
    bg = client.process_start(session, f"{PY} -i -q", tty=True, cols=91, rows=27)
    read_until(client, bg["id"], ">>> ")
    written = client.process_write(bg["id"], "import os; print(os.isatty(0), "
                                             "os.get_terminal_size(), os.tcgetpgrp(0) == "
                                             "os.getpgrp(), 6 * 7)\n")
    assert written["written"] > 0
    out = read_until(client, bg["id"], r"42\r?\n", plain=True)
    assert "True os.terminal_size(columns=91, lines=27) True 42" in out["output"]
    client.process_stop(bg["id"])


def test_ctrl_c_at_a_busy_prompt_interrupts_and_the_prompt_comes_back(client, session):
    bg = client.process_start(session, f"{PY} -i -q", tty=True)
    read_until(client, bg["id"], ">>> ")
    client.process_write(bg["id"], "n = 0\nwhile True: n += 1\n\n")
    # Busy: never waiting for input, however often it is asked.
    wait_for(lambda: any(p.cpu_percent(0.05) > 0 for p in command_tree(bg["pid"])))
    for _ in range(5):
        assert waiting(client, bg["id"]) is False
    client.process_write(bg["id"], "\u0003")
    out = read_until(client, bg["id"], "KeyboardInterrupt[^>]*>>> ", plain=True)
    assert "KeyboardInterrupt" in out["output"]
    wait_for(lambda: waiting(client, bg["id"]))
    client.process_write(bg["id"], "print('after', n > 0)\n")
    assert "after True" in read_until(client, bg["id"], "after True")["output"]
    client.process_stop(bg["id"])


def test_stty_size_matches_cols_rows_and_follows_a_resize(client, session):
    bg = client.process_start(session, "stty size; read _; stty size; read _",
                              tty=True, cols=100, rows=30)
    assert "30 100" in read_until(client, bg["id"], "30 100")["output"]
    wait_for(lambda: waiting(client, bg["id"]))
    assert client.process_resize(bg["id"], cols=132, rows=50) == {}
    client.process_write(bg["id"], "\n")
    assert "50 132" in read_until(client, bg["id"], "50 132")["output"]
    client.process_stop(bg["id"])


def test_plain_read_strips_what_raw_read_keeps(client, session):
    bg = client.process_start(session, r"printf '\033[1;31mred\033[0m \033]0;title\007done\n'",
                              tty=True)
    wait_exit(client, bg["id"])
    raw = client.process_output(bg["id"], since=0)["output"]
    plain = client.process_output(bg["id"], since=0, plain=True)["output"]
    assert "\x1b[1;31m" in raw and raw.endswith("\r\n")
    assert plain == "red done\n"


def test_ctrl_d_ends_a_shell_on_a_terminal(client, session):
    bg = client.process_start(session, "cat; echo cat-ended", tty=True)
    wait_for(lambda: waiting(client, bg["id"]))
    assert client.process_write(bg["id"], "", eof=True) == {"written": 0}
    out = wait_exit(client, bg["id"])
    assert "cat-ended" in out["output"] and out["exit_code"] == 0


def test_ctrl_z_stops_a_job_of_an_interactive_shell_and_stop_still_ends_it(client, session):
    bg = client.process_start(session, "PS1='$ ' bash --norc -i", tty=True)
    wait_for(lambda: waiting(client, bg["id"]))
    client.process_write(bg["id"], "sleep 1000\n")
    tree = wait_for_tree(bg["pid"], lambda t: len(sleeps(t)) == 1)
    client.process_write(bg["id"], "\u001a")
    wait_for(lambda: sleeps(tree)[0].status() == psutil.STATUS_STOPPED)
    assert "Stopped" in read_until(client, bg["id"], "Stopped")["output"]
    wait_for(lambda: waiting(client, bg["id"]))  # the shell's prompt, in the foreground again
    result = client.process_stop(bg["id"], grace_s=0.5)
    assert result["survivors"] == 0 and result["status"] == "stopped"
    assert_all_gone(tree)


def test_a_prompt_that_reads_dev_tty_is_waiting_for_input(client, session):
    # getpass, like ssh, sudo, gpg and git's credential prompts, opens /dev/tty (device 5:0)
    # and reads that, not fd 0: here fd 0 is not even the terminal.
    script = (f"{PY} -c 'import getpass; print(\"got\", getpass.getpass(\"pw: \"))' "
              "0</dev/null")
    bg = client.process_start(session, script, tty=True)
    read_until(client, bg["id"], "pw: ")
    tree = command_tree(bg["pid"])
    wait_for(lambda: waiting(client, bg["id"]))
    client.process_write(bg["id"], "hunter2\n")
    out = wait_exit(client, bg["id"])
    assert "got hunter2" in out["output"] and out["exit_code"] == 0
    assert out["waiting_for_input"] is False
    assert_all_gone(tree)


# ------------------------------------------------------------------ stdin pipe


def test_read_on_a_pipe_waits_for_input_until_written(client, session):
    bg = client.process_start(session, "read name; echo hi $name; sleep 1000", stdin="pipe")
    wait_for(lambda: waiting(client, bg["id"]))
    assert client.process_write(bg["id"], "bob\n") == {"written": 4}
    out = read_until(client, bg["id"], "hi bob")
    assert "hi bob" in out["output"]
    assert out["waiting_for_input"] is False  # reading nothing: in sleep
    assert waiting(client, bg["id"]) is False
    client.process_stop(bg["id"])


def test_written_but_unread_input_is_not_waiting(client, session):
    bg = client.process_start(session, "sleep 1000", stdin="pipe")
    client.process_write(bg["id"], "pending\n")
    assert waiting(client, bg["id"]) is False
    client.process_stop(bg["id"])


def test_busy_loop_with_a_pipe_is_never_waiting(client, session):
    bg = client.process_start(session, f"{PY} -c 'while True: pass'", stdin="pipe")
    wait_for(lambda: any(p.cpu_percent(0.05) > 0 for p in command_tree(bg["pid"])))
    for _ in range(5):
        assert waiting(client, bg["id"]) is False
    client.process_stop(bg["id"])


def test_eof_closes_the_pipe(client, session):
    bg = client.process_start(session, "wc -c", stdin="pipe")
    assert client.process_write(bg["id"], "12345", eof=True)["written"] == 5
    out = wait_exit(client, bg["id"])
    assert out["output"].strip() == "5"
    with pytest.raises(ToolsdError) as e:
        client.process_write(bg["id"], "more")
    assert e.value.code == "bad_params" and "exited" in e.value.message


@pytest.mark.parametrize("how", [{"tty": True}, {"stdin": "pipe"}])
def test_flood_to_a_process_that_never_reads_returns_short_counts(daemon, client, session,
                                                                  how):
    bg = client.process_start(session, "sleep 1000", **how)
    chunk = "x" * 65536
    counts = []
    while not counts or counts[-1] == len(chunk):
        counts.append(client.process_write(bg["id"], chunk)["written"])
        assert len(counts) < 200, "a buffer that never fills"
        # The daemon never waited on the process: another client is answered meanwhile.
        with daemon.client() as other:
            assert other.hello()["protocol"] == 1
    assert counts[-1] < len(chunk)
    if "stdin" in how:
        assert client.process_write(bg["id"], chunk)["written"] == 0  # a full pipe stays so
    assert client.process_stop(bg["id"])["survivors"] == 0


# ------------------------------------------------------------------ errors


def test_writing_where_no_input_is_refused_clearly(client, session):
    plain = client.process_start(session, "sleep 1000")
    with pytest.raises(ToolsdError) as e:
        client.process_write(plain["id"], "hello\n")
    assert e.value.code == "bad_params" and "without input" in e.value.message
    with pytest.raises(ToolsdError) as e:
        client.process_resize(plain["id"], 80, 24)
    assert e.value.code == "bad_params" and "no terminal" in e.value.message
    done = client.process_start(session, "true", tty=True)
    wait_exit(client, done["id"])
    for call in (lambda: client.process_write(done["id"], "x"),
                 lambda: client.process_resize(done["id"], 80, 24)):
        with pytest.raises(ToolsdError) as e:
            call()
        assert e.value.code == "bad_params" and "exited" in e.value.message
    with pytest.raises(ToolsdError) as e:
        client.process_write("bg99999", "x")
    assert e.value.code == "not_found"
    client.process_stop(plain["id"])


def test_a_stdin_other_than_null_or_pipe_is_refused_by_name(client, session):
    with pytest.raises(ToolsdError) as e:
        client.process_start(session, "cat", stdin="file")
    assert e.value.code == "bad_params" and "params.stdin" in e.value.message


@pytest.mark.parametrize("cols,rows", [(0, 24), (80, -1), (80, 70000), (10**12, 24)])
def test_terminal_sizes_out_of_range_are_refused_by_name(client, session, cols, rows):
    with pytest.raises(ToolsdError) as e:
        client.process_start(session, "true", tty=True, cols=cols, rows=rows)
    assert e.value.code == "bad_params" and ("cols" in e.value.message
                                             or "rows" in e.value.message)
    bg = client.process_start(session, "sleep 1000", tty=True)
    with pytest.raises(ToolsdError) as e:
        client.process_resize(bg["id"], cols, rows)
    assert e.value.code == "bad_params"
    client.process_resize(bg["id"], 10_000, 10_000)  # the largest allowed
    client.process_stop(bg["id"])


def test_a_program_that_closes_its_terminal_gets_a_clear_error_on_write(client, session):
    bg = client.process_start(session, "exec 0<&- 1>&- 2>&-; sleep 1000", tty=True)
    wait_for_tree(bg["pid"], lambda t: len(sleeps(t)) == 1)
    with pytest.raises(ToolsdError) as e:
        # The terminal, open in nobody, takes what fits and then refuses: written in chunks
        # until it says so.
        for _ in range(200):
            client.process_write(bg["id"], "x" * 65536)
    assert e.value.code == "bad_params" and "closed its terminal" in e.value.message
    assert client.process_stop(bg["id"])["survivors"] == 0


# ------------------------------------------------------------------ nothing left


def test_stop_of_a_terminal_tree_leaves_nothing(daemon, client, session):
    script = ("setsid sleep 1000 & (trap '' HUP; sleep 1000) & "
              f"{PY} -c 'import os, time; os.fork() or os.setsid(); time.sleep(1000)' & "
              "bash -i")
    bg = client.process_start(session, script, tty=True)
    tree = wait_for_tree(bg["pid"], lambda t: len(sleeps(t)) == 2 and sum(
        1 for p in t if "time.sleep" in " ".join(p.cmdline())) == 2)
    result = client.process_stop(bg["id"])
    assert result["survivors"] == 0 and result["status"] == "stopped"
    assert_all_gone(tree)


def test_daemon_sigkill_and_restart_leave_no_terminal_process(daemon_root):
    d = RunningDaemon(daemon_root).start()
    try:
        with d.client() as c:
            s = c.session_open(d.workspace)["session"]
            bg = c.process_start(s, "setsid sleep 1000 & sleep 1000", tty=True)
            c.process_start(s, f"{PY} -i -q", tty=True)
            c.process_start(s, "cat", stdin="pipe")
            wait_for_tree(bg["pid"], lambda t: len(sleeps(t)) == 2)
        everything = d.tree()
        d.proc.kill()
        d.proc.wait(timeout=60)
        assert_all_gone(everything)  # --die-with-parent: the sandbox goes with the daemon
        d.proc.stdout.close()
        d.log.close()
        d = RunningDaemon(daemon_root).start()
        with d.client() as c:
            assert [p for p in c.process_list()["processes"] if p["status"] == "running"] == []
        assert d.running("sleep") == []
        assert d.stop() == 0
    finally:
        for p in d.tree():
            p.kill()
