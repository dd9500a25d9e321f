"""shell.run through a real daemon: output, exit, timeouts, leftovers, floods, bad input."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys

import msgspec
import psutil
import pytest
import trio

from conftest import has_ended, needs_bwrap, wait_for, wait_gone
from toolsd.client import ToolsdError
from toolsd.wire.framing import FrameReader

pytestmark = pytest.mark.daemon(shared=True)


def test_output_and_exit_code(client, session):
    r = client.shell_run(session, "echo out; echo err >&2; exit 3")
    assert r["exit_code"] == 3
    assert r["signal"] is None and not r["timed_out"]
    assert r["output"] == "out\nerr\n"
    assert r["output_bytes"] == 8
    assert r["shell"] == "bash"
    assert r["orphans_ended"] == 0


def test_bash_syntax_runs_in_bash(client, session):
    r = client.shell_run(session, "for ((i=0; i<3; i++)); do echo $i; done; echo ${BASH_VERSION:+bash}")
    assert r["output"] == "0\n1\n2\nbash\n"


def test_commands_one_after_another_reuse_the_shims(daemon, client, session):
    # Each shell.run's shim is let go once the answer is out (toolsd/tools/answers.py); one never
    # let go would stay, and every command after would need a new one.
    for _ in range(15):
        assert client.shell_run(session, "true")["exit_code"] == 0
    # The reader, its standby, the launcher, and one that a release raced: never one per
    # command.
    assert len(launcher_processes(daemon)) <= 5


def launcher_processes(daemon) -> list[psutil.Process]:
    """The live launcher and shims (forks of it: `python -I -S ... launcher.py`) of the
    daemon's sandboxes; one that exits while we look is not counted."""
    found = []
    for p in daemon.tree():
        try:
            if p.cmdline()[1:3] == ["-I", "-S"] and not has_ended(p):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_a_client_that_does_not_read_its_answers_holds_no_shims(daemon, session):
    # Shims are let go after the answer's first write, not its last: answers that wait for
    # a client that does not read must not keep a shim (a process of the session) each.
    n, size = 30, 100_000
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(daemon.socket)
        for i in range(1, n + 1):
            command = f"head -c {size} /dev/zero | tr '\\0' x; touch done-{i}"
            body = msgspec.msgpack.encode({"id": i, "method": "shell.run", "params": {
                "session": session, "command": command, "max_output_chars": size}})
            s.sendall(struct.pack(">I", len(body)) + body)
        # Every command has run; their answers, 3 MB, mostly wait for us to read.
        wait_for(lambda: all(os.path.exists(os.path.join(daemon.workspace, f"done-{i}"))
                             for i in range(1, n + 1)))
        wait_for(lambda: len(launcher_processes(daemon)) <= 5)
        s.settimeout(30)
        reader, answers = FrameReader(1 << 24), []
        while len(answers) < n:
            data = s.recv(1 << 16)
            assert data
            answers += [msgspec.msgpack.decode(body) for body in reader.feed(data)]
    assert sorted(a["id"] for a in answers) == list(range(1, n + 1))
    assert all(a["result"]["output"] == "x" * size for a in answers)


def test_killed_by_signal_is_reported(client, session):
    r = client.shell_run(session, "kill -KILL $$")
    assert r["exit_code"] is None
    assert r["signal"] == "SIGKILL"


def test_stdin_is_empty(client, session):
    r = client.shell_run(session, "cat; echo done", timeout_s=30)
    assert r["output"] == "done\n" and not r["timed_out"]


def test_cwd_and_env(daemon, client, session):
    os.makedirs(os.path.join(daemon.workspace, "sub"))
    r = client.shell_run(session, 'pwd; echo "$GREETING"', cwd="sub", env={"GREETING": "hi"})
    assert r["output"] == f"{os.path.realpath(daemon.workspace)}/sub\nhi\n"


def test_environment_is_clean(client, session):
    r = client.shell_run(session, "env | sort")
    names = {line.split("=", 1)[0] for line in r["output"].splitlines()}
    assert {"PATH", "HOME", "TERM", "NO_COLOR", "PAGER"} <= names
    assert "PYTEST_CURRENT_TEST" not in names  # nothing of the daemon's environment leaks


def test_background_child_does_not_hold_the_call(daemon, client, session):
    # `sleep 1000 &` keeps the output pipe open; the call must return when bash exits, and the
    # sleep must be ended and counted.
    r = client.shell_run(session, "sleep 1000 & echo started", timeout_s=60)
    assert r["output"] == "started\n"
    assert not r["timed_out"]
    assert r["orphans_ended"] == 1
    assert not daemon.running("sleep 1000")


def test_setsid_double_fork_leftover_is_ended(daemon, client, session):
    code = ("import os,time\n"
            "if os.fork()==0:\n"
            "    os.setsid()\n"
            "    if os.fork()==0:\n"
            "        time.sleep(1000)\n"
            "    os._exit(0)\n")
    r = client.shell_run(session, f"python3 -c '{code}' > /dev/null; echo parent done")
    assert r["output"] == "parent done\n"
    assert r["orphans_ended"] >= 1
    assert not daemon.running("time.sleep(1000)")


# A background process that takes a descriptor passed to it on a socket and keeps it.
FD_KEEPER = """
import socket, time
server = socket.socket(socket.AF_UNIX)
server.bind("/tmp/keeper.sock")
server.listen()
print("ready", flush=True)
kept = socket.recv_fds(server.accept()[0], 1, 1)
time.sleep(1000)
"""
PASS_STDOUT = ("import socket; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/keeper.sock'); "
               "socket.send_fds(s, [b'x'], [1])")


def test_an_output_still_open_after_the_exit_says_that_it_may_be_cut(daemon, client, session):
    # The command hands its output pipe to a process outside its tree, which is not ended
    # with it: the answer comes once the drain gives up, and must say that the output had
    # not ended rather than pass for all of it.
    keeper = client.process_start(session, f"python3 -c '{FD_KEEPER}'")
    try:
        assert "ready" in client.process_output(keeper["id"], wait_s=60,
                                                until="ready")["output"]
        r = client.shell_run(session, f'echo before; python3 -c "{PASS_STDOUT}"')
        assert r["exit_code"] == 0 and r["orphans_ended"] == 0
        before, notice = r["output"].split("\n", 1)
        assert before == "before"
        assert notice.startswith("[toolsd: the output did not end within 1 s of the "
                                 "command's exit")
        # The log says who holds it: what a load run that meets this needs to know.
        held = [line for line in daemon.read_log().splitlines()
                if "its output did not end" in line]
        assert held and "'python3')]" in held[-1] and "0 bytes unread" in held[-1]
    finally:
        assert client.process_stop(keeper["id"])["survivors"] == 0


def test_a_command_that_kills_its_shim_ends_with_its_whole_tree(daemon, client, session):
    # $PPID of `bash -c` is the launcher's shim, the subreaper of the command's tree. Killing
    # it must neither hold the call until its timeout nor leave the tree running. (The
    # launcher ends the tree as soon as it reaps the shim: whatever bash would do after the
    # kill races with that, so what it printed before is what must come through.)
    r = client.shell_run(session, "echo before; sleep 1000 & kill -9 $PPID; sleep 1000",
                         timeout_s=600)
    assert not r["timed_out"]
    assert r["signal"] == "SIGKILL" and r["exit_code"] is None
    assert r["output"] == "before\n"
    assert daemon.running("sleep 1000") == []
    again = client.shell_run(session, "echo still here")
    assert again["output"] == "still here\n" and again["exit_code"] == 0


def test_timeout_ends_the_whole_tree(daemon, client, session):
    r = client.shell_run(session, "echo before; sleep 1000 & sleep 1000", timeout_s=1)
    assert r["timed_out"]
    assert r["output"] == "before\n"
    assert r["exit_code"] is None
    assert daemon.running("sleep") == []


def test_flood_is_capped_and_counted(daemon, client, session):
    rss_before = psutil.Process(daemon.proc.pid).memory_info().rss
    r = client.shell_run(session, "yes | head -c 1000000000", max_output_chars=2000,
                         timeout_s=300)
    assert r["exit_code"] == 0
    assert r["output_bytes"] == 1_000_000_000
    assert r["truncated"]
    assert len(r["output"]) <= 2000
    assert "bytes left out" in r["output"]
    assert r["output"].startswith("y\ny\n") and r["output"].endswith("y\ny\n")
    growth = psutil.Process(daemon.proc.pid).memory_info().rss - rss_before
    assert growth < 64 * 1024 * 1024, f"daemon grew by {growth} bytes"


def test_invalid_utf8_output_is_shown_escaped(client, session):
    r = client.shell_run(session, r"printf 'a\377b\n'")
    assert r["output"] == "a\\xffb\n"
    assert r["output_bytes"] == 4


@pytest.mark.parametrize("params, code, word", [
    ({"timeout_s": 0}, "bad_params", "timeout_s"),
    ({"timeout_s": -1}, "bad_params", "timeout_s"),
    ({"cwd": "/etc"}, "bad_params", "outside the workspace"),
    ({"cwd": "../.."}, "bad_params", "outside the workspace"),
    ({"cwd": "no-such-folder"}, "bad_params", "not an existing folder"),
    ({"env": {"A": 1}}, "bad_params", "env"),
])
def test_bad_params_start_nothing(daemon, client, session, params, code, word):
    marker = "touch started-anyway"
    with pytest.raises(ToolsdError) as e:
        client.shell_run(session, marker, **params)
    assert e.value.code == code
    assert word in e.value.message
    assert not os.path.exists(os.path.join(daemon.workspace, "started-anyway"))


def test_unknown_session(client):
    with pytest.raises(ToolsdError) as e:
        client.shell_run("s999", "true")
    assert e.value.code == "not_found"


@pytest.mark.parametrize("workspace, word", [
    ("relative/path", "absolute"),
    ("/no/such/folder/anywhere", "does not exist"),
])
def test_bad_workspace(client, workspace, word):
    with pytest.raises(ToolsdError) as e:
        client.session_open(workspace)
    assert e.value.code == "bad_params"
    assert word in e.value.message


def test_workspace_that_is_a_file(daemon, client):
    path = os.path.join(daemon.root, "a-file")
    open(path, "w").close()
    with pytest.raises(ToolsdError) as e:
        client.session_open(path)
    assert e.value.code == "bad_params" and "not a folder" in e.value.message


def test_session_env_with_non_string_value(daemon, client):
    with pytest.raises(ToolsdError) as e:
        client.session_open(daemon.workspace, env={"A": 1})
    assert e.value.code == "bad_params"
    assert client.session_list()["sessions"] == []


def test_closed_session_refuses_and_leaves_nothing(daemon, client, session):
    client.process_start(session, "sleep 1000")
    client.shell_run(session, "true")
    assert daemon.running("sleep")
    closed = client.session_close(session)
    assert closed["processes_stopped"] == 1
    with pytest.raises(ToolsdError) as e:
        client.shell_run(session, "true")
    assert e.value.code in ("not_found", "session_closed")
    assert [p for p in daemon.tree() if not has_ended(p)] == []


@pytest.mark.daemon(shared=False)  # it stops the daemon
def test_daemon_stop_leaves_no_process(daemon, client, session):
    client.process_start(session, "sleep 1000")
    tree = daemon.tree()
    assert tree
    assert daemon.stop() == 0
    gone, alive = psutil.wait_procs(tree, timeout=10)
    assert alive == []


async def test_cancel_ends_the_command_and_answers_cancelled(daemon):
    client = await daemon.async_client()
    async with client:
        session = (await client.session_open(daemon.workspace))["session"]
        result = {}

        async def long_call():
            try:
                await client.shell_run(session, "sleep 1000", timeout_s=600)
            except ToolsdError as e:
                result["code"] = e.code

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_call)
            while not daemon.running("sleep"):
                await trio.sleep(0.05)
            # The client numbers requests from 1: session.open was 1, shell.run is 2.
            await client.call("cancel", request=2)
        assert result["code"] == "cancelled"
        assert not daemon.running("sleep")


def test_client_disconnect_cancels_its_runs_but_not_the_session(daemon, client, session):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(daemon.socket)
    body = msgspec.msgpack.encode({"id": 1, "method": "shell.run",
                                   "params": {"session": session, "command": "sleep 1000"}})
    s.sendall(struct.pack(">I", len(body)) + body)
    while not daemon.running("sleep"):
        pass
    s.close()
    assert wait_gone(daemon.running("sleep"), timeout=10) == []
    assert client.shell_run(session, "echo still here")["output"] == "still here\n"


async def test_slow_call_does_not_delay_another(daemon):
    client = await daemon.async_client()
    async with client:
        session = (await client.session_open(daemon.workspace))["session"]
        order = []

        async def slow():
            await client.shell_run(session, "sleep 3")
            order.append("slow")

        async def fast():
            await client.shell_run(session, "true")
            order.append("fast")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            await trio.sleep(0)
            nursery.start_soon(fast)
        assert order == ["fast", "slow"]


def test_exec_cli_prints_output_and_exit_code(daemon):
    out = subprocess.run(
        [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "exec", "--workspace",
         daemon.workspace, "--", "echo hello; exit 7"],
        capture_output=True, text=True, timeout=60, env=daemon.env)
    assert out.stdout == "hello\n"
    assert out.returncode == 7
    with daemon.client() as c:
        assert c.session_list()["sessions"] == []  # exec closed its session


@needs_bwrap
def test_sh_is_used_where_the_sandbox_has_no_bash(daemon_root):
    from conftest import daemon_without_bash

    d = daemon_without_bash(daemon_root)
    d.start()
    try:
        with d.client() as c:
            assert c.hello()["sandbox"] == "bwrap"
            s = c.session_open(d.workspace)["session"]
            r = c.shell_run(s, "echo hi; echo ${BASH_VERSION:-no bash}")
            assert r["shell"] == "sh"
            assert r["output"] == "hi\nno bash\n"
    finally:
        assert d.stop() == 0


def test_cwd_symlink_out_of_the_workspace_is_refused(daemon, client, session):
    os.symlink("/etc", os.path.join(daemon.workspace, "etc-link"))
    with pytest.raises(ToolsdError) as e:
        client.shell_run(session, "pwd", cwd="etc-link")
    assert e.value.code == "bad_params" and "outside the workspace" in e.value.message


def test_exec_cli_exit_code_of_a_signal_is_128_plus_its_number(daemon):
    out = subprocess.run(
        [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "exec", "--workspace",
         daemon.workspace, "--", "kill -TERM $$"],
        capture_output=True, text=True, timeout=60, env=daemon.env)
    assert out.returncode == 128 + 15
    assert "SIGTERM" in out.stderr


def test_workspace_inside_toolsd_state_is_refused(daemon, client):
    with pytest.raises(ToolsdError) as e:
        client.session_open(os.path.join(daemon.state_dir, "logs"))
    assert e.value.code == "bad_params" and "toolsd's own folder" in e.value.message


def test_workspace_with_non_utf8_name_is_refused(daemon, client):
    raw = os.path.join(os.fsencode(daemon.root), b"ws-\xff")
    os.makedirs(raw)
    # A client can only send text: the name arrives through a symlink with a valid name.
    os.symlink(raw, os.path.join(os.fsencode(daemon.root), b"link"))
    with pytest.raises(ToolsdError) as e:
        client.session_open(os.path.join(daemon.root, "link"))
    assert e.value.code == "bad_params" and "UTF-8" in e.value.message
    assert client.session_list()["sessions"] == []


PROBE = ("echo $(nice) $(ulimit -n) $(ulimit -t) $(cat /proc/self/oom_score_adj)"
         " $(taskset -p $$ | awk '{print $NF}') $(ionice -p $$)")
TAMPER = ("renice -n 15 -p {pid} > /dev/null; prlimit --pid {pid} --nofile=16:16 --cpu=7:7;"
          " echo 900 > /proc/{pid}/oom_score_adj; taskset -p 1 {pid} > /dev/null;"
          " ionice -c3 -p {pid}; echo done")


@pytest.mark.parametrize("tamper", [
    TAMPER.format(pid="$PPID"),
    "taskset -p 1 $PPID > /dev/null; ionice -c3 -p $PPID; echo done",  # alone, each
], ids=["everything", "affinity-and-io-class"])
def test_what_a_command_does_to_its_shim_never_reaches_later_commands(client, session, tamper):
    # Shims are reused, and a command may change its shim from outside (same uid): limits,
    # priority, OOM score, CPU affinity, I/O class. A changed shim must not start anyone
    # else's command.
    before = client.shell_run(session, PROBE)["output"]
    assert client.shell_run(session, tamper)["output"] == "done\n"
    for _ in range(6):  # more than the shims there are
        assert client.shell_run(session, PROBE)["output"] == before


def test_a_command_that_changes_the_launcher_ends_the_session(daemon, client, session):
    # The launcher forks the shims: changed, every shim after would carry the change. The
    # session ends instead (at the launcher's next fork), and no command runs changed.
    before = client.shell_run(session, PROBE)["output"]
    launcher = "$(awk '{print $4}' /proc/$PPID/stat)"  # the shim's parent
    r = client.shell_run(session, TAMPER.format(pid=launcher) + "; " + TAMPER.format(pid="$PPID"))
    assert r["output"] == "done\ndone\n"
    with pytest.raises(ToolsdError) as e:
        for _ in range(10):
            # One call at a time needs no fork while an idle shim is left (the launcher keeps
            # up to three, and the changed one may be one it never picks): each background
            # process holds a shim, so that soon none is idle and the launcher forks.
            client.process_start(session, "sleep 1000")
            assert client.shell_run(session, PROBE)["output"] == before
    assert e.value.code == "session_closed"
    # Said as soon as the launcher finds out (its next fork), or by the next call.
    assert "changed the launcher itself" in e.value.message or "closed" in e.value.message
    assert wait_gone(daemon.running("sleep 1000"), timeout=30) == []


def test_a_command_that_stops_its_shim_is_still_ended_and_reported(daemon, client, session):
    # (The sleep first: stopped before it even reported the start, the shim is a case of its
    # own, tested in test_launcher.py.)
    r = client.shell_run(session, "sleep 0.5; kill -STOP $PPID; sleep 1000", timeout_s=2)
    assert r["timed_out"]
    assert r["signal"] is not None  # the exit was reported, not lost with the stopped shim
    assert daemon.running("sleep 1000") == []
    # The launcher resumes a shim that something stopped.
    bg = client.process_start(session, "kill -STOP $PPID; echo went on; sleep 1000")
    shim = psutil.Process(psutil.Process(bg["pid"]).ppid())
    assert shim.name() == "toolsd-shim"  # the shim, a copy of the launcher
    assert client.process_output(bg["id"], wait_s=60, until="went on")["output"] == "went on\n"
    stopped = client.process_stop(bg["id"])
    assert stopped["status"] == "stopped" and stopped["ended"] >= 1
    assert daemon.running("sleep 1000") == []
    assert client.shell_run(session, "echo fine")["output"] == "fine\n"
