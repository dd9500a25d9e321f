"""Background processes (issue 5) on a real daemon with real bwrap sessions: ids never reused,
whole-tree stop whatever the tree did to escape, output read while it runs, and nothing left
running after session close, daemon SIGTERM or daemon SIGKILL."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time

import psutil
import pytest
import trio

from conftest import RunningDaemon, needs_bwrap, wait_gone
from toolsd.client import ToolsdError
from toolsd.tools.processes import LOG_CAP_BYTES, MAX_LIVE_PER_SESSION

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

PY = shlex.quote(sys.executable)  # the sandbox sees the host's root read-only

# A classic daemon: fork, setsid, fork again; the middle process exits so the grandchild is
# nobody's child in the command's tree. It writes its pid on a pipe so that "ready" is printed
# only once it exists. With "exit" as argument the main process leaves right after.
DAEMONIZE = """
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, b"x")
        time.sleep(1000)
    os._exit(0)
os.wait()
os.read(r, 1)
print("ready", flush=True)
if sys.argv[1:] != ["exit"]:
    time.sleep(1000)
"""

IGNORE_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(1000)
"""


def write_script(daemon, name: str, text: str) -> str:
    with open(os.path.join(daemon.workspace, name), "w") as f:
        f.write(text)
    return name


def command_tree(pid: int) -> list[psutil.Process]:
    """Every process of a background process's tree, as the host sees it. The command runs
    under its shim, which every orphan of the tree reparents to: the shim's descendants are
    the whole tree, whatever session or group they moved to."""
    return psutil.Process(pid).parent().children(recursive=True)


def wait_for_tree(pid: int, ready) -> list[psutil.Process]:
    # A fork or an exec sends no event we could wait on: watch /proc for it, bounded.
    deadline = time.monotonic() + 20
    while True:
        tree = command_tree(pid)
        if ready(tree):
            return tree
        assert time.monotonic() < deadline, f"tree never got ready: {tree}"
        time.sleep(0.01)


def ended(proc: psutil.Process) -> bool:
    # A zombie has ended: it only waits for its parent (for bwrap's, the host's init, which
    # here reaps on its own schedule) to collect its exit status.
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_all_gone(procs: list[psutil.Process]) -> None:
    # Bounded: signals are delivered and acted on asynchronously.
    deadline = time.monotonic() + 5
    while not all(ended(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    alive = [p for p in procs if not ended(p)]
    assert alive == [], f"still running: {alive}"


def wait_ready(client, process_id: str, pattern: str = "ready") -> dict:
    out = client.process_output(process_id, wait_s=60, until=pattern)
    assert pattern in out["output"], out
    return out


def wait_exit(client, process_id: str) -> dict:
    # An `until` that never matches: the read returns when the process has ended.
    out = client.process_output(process_id, since=0, wait_s=60, until=r"[^\s\S]")
    assert out["status"] != "running", out
    return out


def sleeps(tree) -> list[psutil.Process]:
    found = []
    for p in tree:
        try:
            if p.cmdline() == ["sleep", "1000"]:
                found.append(p)
        except psutil.Error:
            pass
    return found


# ------------------------------------------------------------------ tree kill


def test_stop_ends_shell_and_its_background_child(client, session):
    bg = client.process_start(session, "bash -c 'sleep 1000 & sleep 1000'")
    tree = wait_for_tree(bg["pid"], lambda t: len(sleeps(t)) == 2)
    result = client.process_stop(bg["id"])
    assert result["survivors"] == 0
    assert result["ended"] >= 3
    assert result["status"] == "stopped"
    assert_all_gone(tree)


@pytest.mark.parametrize("main", ["stays", "exits"])
def test_stop_ends_setsid_double_forked_daemon(daemon, client, session, main):
    script = write_script(daemon, "daemonize.py", DAEMONIZE)
    arg = "exit" if main == "exits" else "stay"
    bg = client.process_start(session, f"{PY} {script} {arg}")
    wait_ready(client, bg["id"])
    tree = command_tree(bg["pid"])
    escaped = [p for p in tree if p.pid != bg["pid"]]
    assert len(escaped) == 1
    # It really left: another session, and not below the command's own process.
    assert os.getsid(escaped[0].pid) != os.getsid(escaped[0].ppid())
    assert escaped[0].ppid() != bg["pid"]
    if main == "exits":
        assert wait_exit(client, bg["id"])["status"] == "exited"
        assert escaped[0].is_running()
    result = client.process_stop(bg["id"], grace_s=1)
    assert result["survivors"] == 0
    assert result["ended"] >= 1
    assert_all_gone(tree)


def test_stop_ends_nohup_child_of_exited_shell(daemon, client, session):
    go = os.path.join(daemon.workspace, "go")
    os.mkfifo(go)
    try:
        # The shell waits on the fifo, so its tree can be seen before it exits.
        bg = client.process_start(session, "nohup sleep 1000 >/dev/null 2>&1 & read x < go")
        tree = wait_for_tree(bg["pid"], lambda t: len(sleeps(t)) == 1)
        with open(go, "w") as f:
            f.write("go\n")
    finally:
        os.unlink(go)
    assert wait_exit(client, bg["id"])["status"] == "exited"
    assert all(p.is_running() for p in sleeps(tree))
    result = client.process_stop(bg["id"])
    assert result["survivors"] == 0
    assert result["ended"] == 1
    assert_all_gone(tree)


def test_stop_kills_process_that_ignores_sigterm(daemon, client, session):
    script = write_script(daemon, "ignore_term.py", IGNORE_TERM)
    bg = client.process_start(session, f"{PY} {script}")
    wait_ready(client, bg["id"])
    tree = [psutil.Process(bg["pid"]), *command_tree(bg["pid"])]
    result = client.process_stop(bg["id"], grace_s=0.3)
    assert result["survivors"] == 0
    assert result["signal"] == "SIGKILL"
    assert_all_gone(tree)


def test_list_shows_running_tree_then_final_status(client, session):
    bg = client.process_start(session, "sleep 1000 & sleep 1000", name="two sleeps")
    wait_for_tree(bg["pid"], lambda t: len(sleeps(t)) == 2)
    [info] = client.process_list(session)["processes"]
    assert info["id"] == bg["id"] and info["pid"] == bg["pid"]
    assert info["name"] == "two sleeps" and info["command"] == "sleep 1000 & sleep 1000"
    assert info["status"] == "running" and info["ended_at"] is None
    assert info["descendants"] == 2
    assert info["rss_bytes"] > 0
    client.process_stop(bg["id"])
    [info] = client.process_list(session)["processes"]
    assert info["status"] == "stopped" and info["descendants"] == 0
    assert info["ended_at"] >= info["started_at"]


def test_list_counts_no_descendant_that_has_ended(client, session):
    # A child that exited and that nobody has waited for yet (a zombie) has ended: a stop
    # leaves its tree so until the shim gets to reap it, and a parent may never wait at all.
    code = "import os, time\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(1000)"
    bg = client.process_start(session, f"exec {PY} -c {shlex.quote(code)}")
    # Its parent never waits: once exited, the child stays a zombie.
    wait_for_tree(bg["pid"], lambda t: [p for p in t if p.pid != bg["pid"] and ended(p)])
    [info] = client.process_list(session)["processes"]
    assert info["status"] == "running" and info["descendants"] == 0
    client.process_stop(bg["id"])


def test_process_outlives_the_turn_it_was_started_in(client, session):
    turn = client.turn_begin(session)["turn"]
    bg = client.process_start(session, "echo ready; sleep 1000")
    wait_ready(client, bg["id"])
    client.turn_end(session, turn)
    assert psutil.Process(bg["pid"]).is_running()
    assert client.process_output(bg["id"])["status"] == "running"
    assert client.process_stop(bg["id"])["survivors"] == 0


# ------------------------------------------------------------------ ids


def test_ids_are_never_reused_and_stale_ids_reach_nothing_else(client, session):
    first = client.process_start(session, "echo first; sleep 1000")
    number = int(first["id"].removeprefix("bg"))
    wait_ready(client, first["id"], "first")
    client.process_stop(first["id"])
    second = client.process_start(session, "echo second; sleep 1000")
    assert second["id"] == f"bg{number + 1}"
    wait_ready(client, second["id"], "second")

    stale = client.process_output(first["id"], since=0)
    assert stale["status"] == "stopped"
    assert stale["output"] == "first\n"
    again = client.process_stop(first["id"])
    assert again["status"] == "stopped" and again["ended"] == 0
    assert psutil.Process(second["pid"]).is_running()  # the stale stop did not reach it

    later = f"bg{number + 2}"
    for call in (lambda: client.process_output(later), lambda: client.process_stop(later),
                 lambda: client.process_output("nonsense")):
        with pytest.raises(ToolsdError) as e:
            call()
        assert e.value.code == "not_found"
    client.process_stop(second["id"])


def test_a_stale_stop_never_reaches_a_process_that_reuses_the_shim(client, session):
    # A shim whose job is over runs later commands: its tree is no longer the old process's.
    first = client.process_start(session, "echo first; sleep 1000")
    wait_ready(client, first["id"], "first")
    shim = psutil.Process(first["pid"]).ppid()
    client.process_stop(first["id"])
    later = []
    for n in range(8):  # kept running, so each takes a shim of its own
        proc = client.process_start(session, f"echo later{n}; sleep 1000")
        wait_ready(client, proc["id"], f"later{n}")
        later.append(proc)
        if psutil.Process(proc["pid"]).ppid() == shim:
            break
    else:
        pytest.fail("no later process ran under the stopped process's shim")
    assert client.process_stop(first["id"])["ended"] == 0
    for proc in later:
        assert client.process_output(proc["id"])["status"] == "running"
        assert psutil.Process(proc["pid"]).is_running()
    listed = {p["id"]: p for p in client.process_list(session)["processes"]}
    assert listed[first["id"]]["descendants"] == 0
    assert listed[first["id"]]["rss_bytes"] == 0  # not the later process's tree
    for proc in later:
        client.process_stop(proc["id"])


@pytest.mark.daemon(shared=False)  # it stops the daemon
def test_daemon_sigterm_ends_everything_and_numbering_continues_after(daemon):
    with daemon.client() as c:
        s = c.session_open(daemon.workspace)["session"]
        first = c.process_start(s, "sleep 1000")
        assert first["id"] == "bg1"
        c.process_stop(first["id"])
        assert c.process_start(s, "sleep 1000")["id"] == "bg2"
        start_hard_cases(daemon, c, c.session_open(daemon.workspace)["session"])
    everything = daemon.tree()
    assert len(everything) >= 12  # two sandboxes: bwrap x2, launcher, shims, commands
    assert daemon.stop(signal.SIGTERM) == 0
    assert_all_gone(everything)

    again = RunningDaemon(daemon.root).start()  # same state folder
    try:
        with again.client() as c:
            s = c.session_open(again.workspace)["session"]
            with pytest.raises(ToolsdError) as e:
                c.process_output("bg1")  # the old daemon's: gone, not someone else's
            assert e.value.code == "not_found"
            # bg3..bg5 went to the hard cases.
            assert c.process_start(s, "sleep 1000")["id"] == "bg6"
    finally:
        assert again.stop() == 0


# ------------------------------------------------------------------ reading


def test_server_is_reachable_from_shell_run_once_until_sees_its_line(client, session):
    bg = client.process_start(session, f"{PY} -m http.server 8765 --bind 127.0.0.1")
    started = time.monotonic()
    out = client.process_output(bg["id"], wait_s=120, until="Serving HTTP")
    assert time.monotonic() - started < 120  # answered by the match, not by wait_s
    assert "Serving HTTP" in out["output"] and out["status"] == "running"
    fetch = (f"{PY} -c \"import urllib.request as u; "
             f"print(u.urlopen('http://127.0.0.1:8765/').status)\"")
    run = client.shell_run(session, fetch, timeout_s=60)
    assert run["exit_code"] == 0, run["output"]
    assert run["output"].strip() == "200"
    assert client.process_stop(bg["id"])["survivors"] == 0


def test_until_matches_a_line_split_across_writes(client, session):
    bg = client.process_start(session, "printf 'Serv'; sleep 0.3; printf 'ing HTTP\\n'; "
                                        "sleep 1000")
    out = client.process_output(bg["id"], wait_s=60, until="Serving HTTP")
    assert out["output"] == "Serving HTTP\n"
    assert out["status"] == "running"
    client.process_stop(bg["id"])


async def test_two_shared_mark_readers_get_each_byte_once(daemon, client, session):
    lines = 300
    bg = client.process_start(
        session, f"{PY} -c \"import time\nfor i in range({lines}):\n"
                 f"    print('line %d' % i, flush=True); time.sleep(0.002)\"")
    pieces: list[tuple[int, str]] = []

    async def reader():
        c = await daemon.async_client()
        async with c:
            while True:
                r = await c.process_output(bg["id"], wait_s=10)
                if r["output"]:
                    pieces.append((r["next"] - len(r["output"]), r["output"]))
                elif r["status"] != "running":
                    return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        nursery.start_soon(reader)
    pieces.sort()
    offset = 0
    for start, text in pieces:
        assert start == offset, "a byte was read twice or skipped"
        offset += len(text)
    expected = "".join(f"line {i}\n" for i in range(lines))
    assert "".join(text for _, text in pieces) == expected


def test_explicit_since_reads_do_not_move_the_read_mark(client, session):
    bg = client.process_start(session, "echo hello; echo world")
    wait_exit(client, bg["id"])
    for _ in range(2):
        assert client.process_output(bg["id"], since=0)["output"] == "hello\nworld\n"
    part = client.process_output(bg["id"], since=6)
    assert part["output"] == "world\n" and part["next"] == 12
    assert client.process_output(bg["id"])["output"] == "hello\nworld\n"  # mark was at 0
    assert client.process_output(bg["id"])["output"] == ""


def test_truncated_read_says_where_the_rest_starts(client, session):
    bg = client.process_start(session, "for i in $(seq 1000 1999); do echo line$i; done")
    wait_exit(client, bg["id"])
    full = "".join(f"line{i}\n" for i in range(1000, 2000))
    out = client.process_output(bg["id"], since=0, max_output_chars=1000)
    assert out["truncated"] and len(out["output"]) <= 1000
    head, _sep, after = out["output"].partition("\n[... ")
    assert full.startswith(head) and out["output"].endswith(full[-200:])
    since = int(after.split("since=")[1].split()[0])
    assert since == len(head.encode())
    rest = client.process_output(bg["id"], since=since, max_output_chars=100_000)
    assert head + rest["output"] == full


def test_200_mb_of_output_keeps_daemon_memory_flat_and_log_capped(daemon, client, session):
    def hwm() -> int:
        with open(f"/proc/{daemon.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    rss_before = psutil.Process(daemon.proc.pid).memory_info().rss
    peak_before = hwm()
    total = 200_000_000
    bg = client.process_start(session, f"yes 0123456789abcdef | head -c {total}; "
                                       f"echo; echo DONE-WRITING")
    client.process_output(bg["id"], wait_s=120, until="DONE-WRITING", max_output_chars=100)
    assert hwm() < max(peak_before, rss_before + (64 << 20))

    out = client.process_output(bg["id"], since=0, max_output_chars=1000)
    kept_from = out["dropped_bytes"]
    assert total - LOG_CAP_BYTES <= kept_from < total
    assert out["truncated"] and out["output"].endswith("DONE-WRITING\n")
    assert out["next"] == total + len("\nDONE-WRITING\n")
    first = client.process_output(bg["id"], since=kept_from, max_output_chars=100)
    assert first["dropped_bytes"] == 0 and first["output"]  # the oldest byte kept is readable
    logs = os.path.join(daemon.state_dir, "logs")
    on_disk = sum(os.path.getsize(os.path.join(logs, n)) for n in os.listdir(logs)
                  if n.startswith(bg["id"] + "."))
    assert 0 < on_disk <= LOG_CAP_BYTES


async def test_catastrophic_until_returns_at_wait_s_while_other_clients_are_served(
        daemon, client, session):
    bg = client.process_start(session, "printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!'; sleep 1000")
    wait_ready(client, bg["id"], "!")
    answers = []
    # A backtracking engine takes minutes on this pattern, with the whole daemon frozen: the
    # bound only keeps this test from hanging that long.
    with trio.fail_after(60):
        async with await daemon.async_client() as a, await daemon.async_client() as b:

            async def search():
                answers.append(await a.process_output(bg["id"], since=0, wait_s=2,
                                                      until="(a+)+$"))

            async def hello():
                answers.append(await b.hello())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(search)
                nursery.start_soon(hello)
    hello_answer, out = answers
    assert hello_answer["protocol"] == 1
    assert out["output"] == "a" * 30 + "!" and out["status"] == "running"
    client.process_stop(bg["id"])


async def test_until_anchors_match_at_every_line(daemon, client, session):
    bg = client.process_start(session, "printf 'starting\\nready on :3000\\nlistening\\n'; "
                                       "sleep 1000")
    with trio.fail_after(60):  # without multi-line anchors each read waits its whole wait_s
        async with await daemon.async_client() as c:
            # All of it first (it may come in pieces): each anchored read below then finds
            # its match in the middle of the output, never at its start or end.
            await c.process_output(bg["id"], wait_s=600, until=r"listening\n")
            out = await c.process_output(bg["id"], since=0, wait_s=600, until="^ready")
            assert out["output"] == "starting\nready on :3000\nlistening\n"
            out = await c.process_output(bg["id"], since=0, wait_s=600, until=r":\d+$")
            assert out["output"] == "starting\nready on :3000\nlistening\n"
    client.process_stop(bg["id"])


def test_until_syntax_that_needs_backtracking_is_refused_by_name(client, session):
    bg = client.process_start(session, "sleep 1000")
    for pattern, named in ((r"(\w+) \1", "backreference"), (r"(?<=port )\d+", "lookbehind"),
                           (r"ready(?! on)", "lookahead")):
        with pytest.raises(ToolsdError) as e:
            client.process_output(bg["id"], until=pattern)
        assert e.value.code == "bad_params"
        assert named in e.value.message and "until" in e.value.message
    client.process_stop(bg["id"])


# ------------------------------------------------------------------ lifetime


def start_hard_cases(daemon, client, session) -> list[str]:
    """A shell with a background child, a double-forked daemon, and a SIGTERM ignorer."""
    daemonize = write_script(daemon, "daemonize.py", DAEMONIZE)
    ignore = write_script(daemon, "ignore_term.py", IGNORE_TERM)
    ids = []
    for command in ("sleep 1000 & echo ready; sleep 1000", f"{PY} {daemonize}",
                    f"{PY} {ignore}"):
        bg = client.process_start(session, command)
        wait_ready(client, bg["id"])
        ids.append(bg["id"])
    return ids


def test_session_close_leaves_no_process(daemon, client, session):
    ids = start_hard_cases(daemon, client, session)
    everything = daemon.tree()  # bwrap, launcher, shims and the commands' trees
    assert len(everything) >= 8
    result = client.session_close(session)
    assert result["processes_stopped"] == len(ids)
    assert_all_gone(everything)
    for process_id in ids:  # the final status and the last output stay readable
        out = client.process_output(process_id, since=0)
        assert out["status"] == "stopped" and "ready" in out["output"]
    logs = os.listdir(os.path.join(daemon.state_dir, "logs"))
    assert not [n for n in logs if n.split(".")[0] in ids]  # their log files went with them


def daemon_fds(daemon) -> list[str]:
    fds = []
    for fd in os.listdir(f"/proc/{daemon.proc.pid}/fd"):
        try:
            fds.append(os.readlink(f"/proc/{daemon.proc.pid}/fd/{fd}"))
        except OSError:
            pass  # closed while we looked
    return fds


def test_finished_processes_give_back_memory_and_descriptors(daemon, client, session):
    wait_exit(client, client.process_start(session, "true")["id"])  # first use costs
    me = psutil.Process(daemon.proc.pid)
    rss_before, fds_before = me.memory_info().rss, len(daemon_fds(daemon))
    ids = [client.process_start(session, "true")["id"] for _ in range(300)]
    for process_id in ids:
        assert wait_exit(client, process_id)["status"] == "exited"
    # Each used to keep 1 MiB of ring and its log open until the session closed.
    assert me.memory_info().rss < rss_before + (64 << 20)
    assert len(daemon_fds(daemon)) < fds_before + 20
    assert client.process_output(ids[0], since=0)["status"] == "exited"


def test_finished_process_log_stays_readable_without_an_open_descriptor(daemon, client,
                                                                        session):
    bg = client.process_start(session, "seq 1 300000")  # 2 MB: more than memory keeps
    wait_exit(client, bg["id"])
    log = os.path.join(daemon.state_dir, "logs", f"{bg['id']}.log")
    deadline = time.monotonic() + 10  # it is sealed just after its exit is reported
    while any(path.startswith(log) for path in daemon_fds(daemon)):
        assert time.monotonic() < deadline, "the finished process's log is still open"
        time.sleep(0.01)
    out = client.process_output(bg["id"], since=0, max_output_chars=20)
    assert out["dropped_bytes"] == 0 and out["output"].startswith("1\n2\n")
    rest = client.process_output(bg["id"], since=1_000_000, max_output_chars=2_000_000)
    assert rest["output"].endswith("299999\n300000\n") and not rest["truncated"]


def test_a_session_runs_at_most_so_many_background_processes(daemon, client):
    s = client.session_open(daemon.workspace, limits={"pids": 2000})["session"]
    try:
        started = [client.process_start(s, "sleep 1001") for _ in range(MAX_LIVE_PER_SESSION)]
        with pytest.raises(ToolsdError) as e:
            client.process_start(s, "sleep 1001")
        assert e.value.code == "limit_exceeded"
        assert "process.stop" in e.value.message
        client.process_stop(started[0]["id"])
        client.process_start(s, "sleep 1001")  # room again
    finally:
        client.session_close(s)
    assert wait_gone(daemon.running("sleep 1001"), timeout=10) == []


async def test_start_racing_session_close_says_the_session_closed(daemon):
    results = []
    async with await daemon.async_client() as c, await daemon.async_client() as closer:
        s = (await c.session_open(daemon.workspace))["session"]
        first = trio.Event()

        async def start():
            try:
                results.append((await c.process_start(s, "true"))["id"])
                first.set()
            except ToolsdError as e:
                results.append(e.code)

        async with trio.open_nursery() as nursery:
            for _ in range(30):
                nursery.start_soon(start)
            # The launcher works through the others' spawns one by one: the close meets
            # some of them half way.
            await first.wait()
            nursery.start_soon(closer.session_close, s)
    refused = [r for r in results if not r.startswith("bg")]
    assert refused and set(refused) <= {"session_closed", "not_found"}, results


def test_daemon_sigkill_leaves_no_process(daemon_root):
    d = RunningDaemon(daemon_root).start()
    try:
        with d.client() as c:
            s = c.session_open(d.workspace)["session"]
            start_hard_cases(d, c, s)
        everything = d.tree()
        d.proc.kill()
        d.proc.wait(timeout=60)
        # Nobody is left to stop them: the launcher sees its channel close and bwrap its
        # parent die. "Within a second or so", with room for a slow machine.
        assert_all_gone(everything)
    finally:
        for p in d.tree():
            p.kill()
        d.proc.stdout.close()
        d.log.close()


# ------------------------------------------------------------------ bad input


def test_bad_input_is_refused_with_a_clear_error(client, session):
    bg = client.process_start(session, "sleep 1000")
    cases = [
        (lambda: client.process_output("bg999"), "not_found"),
        (lambda: client.process_stop("bg999"), "not_found"),
        (lambda: client.process_output(bg["id"], until="(unclosed"), "bad_params"),
        (lambda: client.process_output(bg["id"], wait_s=-1), "bad_params"),
        (lambda: client.process_output(bg["id"], since=-5), "bad_params"),
        (lambda: client.process_start(session, ""), "bad_params"),
        (lambda: client.process_start(session, "   \n"), "bad_params"),
        (lambda: client.process_stop(bg["id"], grace_s=-1), "bad_params"),
    ]
    for call, code in cases:
        with pytest.raises(ToolsdError) as e:
            call()
        assert e.value.code == code, e.value.message
        assert e.value.message
    assert client.process_list(session)["processes"][0]["status"] == "running"
    assert client.process_stop(bg["id"])["survivors"] == 0
