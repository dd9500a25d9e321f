"""The launcher, both sides, with real processes: in bwrap and unsandboxed (parametrized)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import textwrap
import time

import psutil
import pytest
import trio
import trio.testing

from _launchers import BWRAP, ENV, PY, bwrap_prefix, read_all, spawn_piped, tree_pids
from conftest import assert_gone
from toolsd.sandbox.launch.channel import Started
from toolsd.sandbox.launch.launcher_client import (
    LAUNCHER_PY,
    Launcher,
    LauncherDied,
    LauncherError,
)
from toolsd.sandbox.launch.spawn_request import SpawnRequest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def read_line(stream: trio.lowlevel.FdStream) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        assert chunk, f"EOF before a full line: {data!r}"
        data += chunk
    return data


async def run(launcher, argv, **kw) -> tuple[bytes, tuple[int | None, int | None]]:
    job, read_fd = await spawn_piped(launcher, argv, **kw)
    output = await read_all(read_fd)
    return output, await job.wait()


# ---------------------------------------------------------------- spawning


async def test_echo_output_is_read_and_exit_code_is_zero(launcher):
    output, status = await run(launcher, ["echo", "hello from the sandbox"])
    assert output == b"hello from the sandbox\n"
    assert status == (0, None)


async def test_failing_command_reports_its_exit_code(launcher):
    output, status = await run(launcher, ["sh", "-c", "echo oops >&2; exit 3"])
    assert output == b"oops\n"
    assert status == (3, None)


async def test_command_killed_by_a_signal_reports_the_signal(launcher):
    _, status = await run(launcher, ["sh", "-c", "kill -TERM $$"])
    assert status == (None, signal.SIGTERM)


async def test_ready_message_names_the_shells(launcher):
    assert launcher.ready.sh is not None
    assert launcher.ready.bash == shutil.which("bash", path=ENV["PATH"])
    assert launcher.host_pid > 0
    cmdline = psutil.Process(launcher.host_pid).cmdline()
    assert LAUNCHER_PY in cmdline


async def test_missing_program_is_a_clear_error_and_launcher_still_works(launcher):
    with pytest.raises(LauncherError, match=r"no such program: 'no-such-program-xyz'.*PATH"):
        await launcher.spawn(SpawnRequest(["no-such-program-xyz", "arg"], cwd="/", env=ENV,
                             stdin=0, stdout=1, stderr=2))
    output, status = await run(launcher, ["echo", "still here"])
    assert (output, status) == (b"still here\n", (0, None))


async def test_missing_cwd_is_a_clear_error_and_launcher_still_works(launcher, tmp_path):
    missing = str(tmp_path / "not-there")
    with pytest.raises(LauncherError, match=r"working directory .*not-there.*No such file"):
        await launcher.spawn(SpawnRequest(["true"], cwd=missing, env=ENV,
                                          stdin=0, stdout=1, stderr=2))
    output, status = await run(launcher, ["echo", "still here"])
    assert (output, status) == (b"still here\n", (0, None))


async def test_cwd_and_env_are_the_commands_own(launcher, tmp_path):
    output, status = await run(launcher, ["sh", "-c", 'pwd; echo "$GREETING"'],
                               cwd=str(tmp_path), env={**ENV, "GREETING": "bonjour"})
    assert output.decode().splitlines() == [str(tmp_path), "bonjour"]
    assert status == (0, None)


async def test_stdin_dev_null_lets_cat_end_at_once(launcher):
    output, status = await run(launcher, ["cat"])
    assert (output, status) == (b"", (0, None))


async def test_stdin_pipe_feeds_the_command(launcher):
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        job, read_fd = await spawn_piped(launcher, ["cat"], stdin=read_end)
    finally:
        os.close(read_end)
    os.write(write_end, b"through the pipe\n")
    os.close(write_end)
    assert await read_all(read_fd) == b"through the pipe\n"
    assert await job.wait() == (0, None)


async def test_command_inherits_only_its_stdio(launcher):
    # listdir holds one fd of its own (3) while it reads the folder; nothing else may be open:
    # not the launcher's socket, not a shim's, not a pidfd.
    code = "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    output, status = await run(launcher, [PY, "-I", "-S", "-c", code])
    assert status == (0, None)
    assert json.loads(output) == [0, 1, 2, 3]


async def test_extra_fds_become_fd_3_and_up(launcher):
    extra_r, extra_w = os.pipe2(os.O_CLOEXEC)
    try:
        job, read_fd = await spawn_piped(
            launcher, ["sh", "-c", "echo on-stdout; echo on-fd-3 >&3"], extra_fds=[extra_w])
    finally:
        os.close(extra_w)
    assert await read_all(extra_r) == b"on-fd-3\n"
    assert await read_all(read_fd) == b"on-stdout\n"
    assert await job.wait() == (0, None)


async def ignored_signals(launcher) -> set[int]:
    """The signals a command of `launcher` starts with ignored. (glibc's posix_spawn leaves
    its own internal signals 32 and 33 ignored; every glibc program installs its handlers
    for those at startup.)"""
    output, status = await run(launcher, ["grep", "SigIgn", "/proc/self/status"])
    assert status == (0, None)
    return {sig for sig in range(1, 65) if int(output.split()[1], 16) & (1 << (sig - 1))} - {
        32, 33}


async def test_ignored_signals_are_reset_for_the_command(launcher):
    # Python ignores SIGPIPE and SIGXFSZ; a command inheriting that would never die of a
    # broken pipe.
    assert await ignored_signals(launcher) == set()


async def test_signals_the_daemon_was_started_ignoring_are_reset_for_the_command(
        nursery, wrapper):
    # A script's `toolsd serve &` (a shell without job control) starts the daemon ignoring
    # SIGINT and SIGQUIT: inherited, no REPL of any session could be interrupted.
    ignoring = ["sh", "-c", 'trap "" INT QUIT; exec "$@"', "sh", *wrapper]
    launcher = await Launcher.start(nursery, wrapper=ignoring, env=ENV)
    pids = tree_pids(launcher)
    try:
        assert await ignored_signals(launcher) == set()
    finally:
        await launcher.aclose()
        assert_gone(pids)


async def test_commands_run_with_the_normal_scheduling_policy(launcher):
    # The launcher forks its spares under the batch policy; a command must not inherit it.
    output, status = await run(launcher, [PY, "-I", "-S", "-c",
                                          "import os; print(os.sched_getscheduler(0))"])
    assert status == (0, None)
    assert int(output) == os.SCHED_OTHER


async def test_rlimits_apply_to_the_command(launcher):
    output, status = await run(launcher, ["sh", "-c", "ulimit -n; ulimit -c"],
                               rlimits={"nofile": (40, 40), "core": (0, 0)})
    assert status == (0, None)
    assert output.decode().split() == ["40", "0"]


async def test_a_shims_limits_never_reach_a_command_asking_others(launcher):
    # Limits are set on the shim before it spawns; a reused shim must not hand them on.
    limited, status = await run(launcher, ["sh", "-c", "ulimit -n"],
                                rlimits={"nofile": (40, 40)})
    assert (limited, status) == (b"40\n", (0, None))
    default = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for _ in range(6):  # every shim there is takes one of them
        output, status = await run(launcher, ["sh", "-c", "ulimit -n"], rlimits={})
        assert (output, status) == (b"%d\n" % default, (0, None))
    output, status = await run(launcher, ["sh", "-c", "ulimit -n"],
                               rlimits={"nofile": (40, 40)})
    assert (output, status) == (b"40\n", (0, None))


async def test_unknown_rlimit_is_a_clear_error(launcher):
    with pytest.raises(LauncherError, match="unknown resource limit 'bogus'"):
        await launcher.spawn(SpawnRequest(["true"], cwd="/", env=ENV, stdin=0, stdout=1, stderr=2,
                             rlimits={"bogus": (1, 1)}))


async def test_job_pid_is_a_host_pid_running_the_command(launcher):
    # posix_spawn returns while exec is still setting up the new image (cmdline may read
    # empty for a moment): the command says when it runs.
    code = "import time; print('running', flush=True); time.sleep(1000)"
    job, read_fd = await spawn_piped(launcher, [PY, "-c", code])
    async with trio.lowlevel.FdStream(read_fd) as out:
        assert await read_line(out) == b"running\n"
    assert psutil.Process(job.pid).cmdline() == [PY, "-c", code]
    shim = psutil.Process(job.shim_pid)
    assert LAUNCHER_PY in shim.cmdline()
    assert psutil.Process(job.pid).ppid() == job.shim_pid
    os.kill(job.pid, signal.SIGKILL)
    assert await job.wait() == (None, signal.SIGKILL)
    await job.done.wait()


async def test_shims_are_reused_once_their_job_is_done(launcher):
    shims = set()
    for _ in range(10):
        job, read_fd = await spawn_piped(launcher, ["true"])
        os.close(read_fd)
        assert await job.wait() == (0, None)
        await job.done.wait()
        shims.add(job.shim_pid)
    # One after the other, ten commands ran under the reader and the standby it swaps with:
    # no fork per command. (A third may appear if a job's release races the next request.)
    assert len(shims) <= 3, shims


async def run_until_shim_reused(launcher, shim_pid):
    """Spawn `sleep 1000`s, keeping each running so that its shim is taken, until one runs
    under `shim_pid` (returns its job) or that shim has retired (returns None: the launcher
    keeps only a few idle shims). The others are killed."""
    others = []
    try:
        for _ in range(30):
            job, read_fd = await spawn_piped(launcher, ["sleep", "1000"])
            os.close(read_fd)
            if job.shim_pid == shim_pid:
                return job
            others.append(job)
            if not psutil.pid_exists(shim_pid):
                return None
        raise AssertionError(f"shim {shim_pid} never took another job")
    finally:
        for job in others:
            os.kill(job.pid, signal.SIGKILL)
            await job.done.wait()


async def test_a_done_jobs_tree_is_never_a_later_jobs_tree(launcher):
    first, read_fd = await spawn_piped(launcher, ["true"])
    os.close(read_fd)
    await first.done.wait()
    second = await run_until_shim_reused(launcher, first.shim_pid)
    assert second is not None
    # What a stop of the first job would kill: nothing, though its shim now runs `sleep`.
    with first.holding_tree() as shim_pid:
        assert shim_pid is None
    with second.holding_tree() as shim_pid:
        assert shim_pid == first.shim_pid
        assert [p.pid for p in psutil.Process(shim_pid).children()] == [second.pid]
    os.kill(second.pid, signal.SIGKILL)
    assert await second.wait() == (None, signal.SIGKILL)


async def test_a_held_tree_keeps_its_shim_from_other_jobs(launcher):
    job, read_fd = await spawn_piped(launcher, ["sleep", "1000"])
    os.close(read_fd)
    with job.holding_tree() as shim_pid:
        assert shim_pid == job.shim_pid
        os.kill(job.pid, signal.SIGKILL)
        await job.done.wait()
        # Done, but held (as while a stop lists and kills the tree): the shim waits.
        await six_jobs_elsewhere(launcher, shim_pid)
    await shim_comes_back(launcher, shim_pid)


async def six_jobs_elsewhere(launcher, shim_pid):
    """Six jobs one after the other, none of them on `shim_pid`."""
    for _ in range(6):
        other, other_fd = await spawn_piped(launcher, ["true"])
        os.close(other_fd)
        assert other.shim_pid != shim_pid
        await other.done.wait()


async def shim_comes_back(launcher, shim_pid):
    """Released, a shim is reused, or retires if enough other shims were idle."""
    reused = await run_until_shim_reused(launcher, shim_pid)
    if reused is None:
        await wait_exited(shim_pid)
    else:
        os.kill(reused.pid, signal.SIGKILL)
        await reused.done.wait()


async def test_a_held_job_keeps_its_shim_until_let_go(launcher):
    # shell.run answers first and lets its shim go after (toolsd/tools/answers.py).
    job, read_fd = await spawn_piped(launcher, ["true"], held=True, want_pid=False)
    os.close(read_fd)
    await job.done.wait()
    await six_jobs_elsewhere(launcher, job.shim_pid)
    job.let_go()
    job.let_go()  # a second time changes nothing
    await shim_comes_back(launcher, job.shim_pid)


async def test_quick_commands_get_their_host_pid_too(launcher):
    # The shim keeps the exited command unreaped until the host has read its pid.
    for _ in range(20):
        job, read_fd = await spawn_piped(launcher, ["true"])
        os.close(read_fd)
        assert job.pid > 0 and job.shim_pid > 0
        assert await job.wait() == (0, None)


async def test_ping_answers(launcher):
    await launcher.ping()
    assert launcher.alive


async def test_sandboxed_code_cannot_read_the_launchers_fds(nursery, tmp_path):
    if BWRAP is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    launcher = await Launcher.start(nursery, wrapper=bwrap_prefix(str(tmp_path)), env=ENV)
    try:
        # Opening /proc/PID/fd/N of the launcher would hand sandboxed code the daemon's socket.
        code = textwrap.dedent(f"""
            import os
            folder = '/proc/{launcher.ready.pid}/fd/'
            for name in os.listdir(folder):
                try:
                    os.close(os.open(folder + name, os.O_RDONLY))
                    print(name, 'opened')
                except PermissionError:
                    print(name, 'denied')
                except OSError as e:  # e.g. ENXIO: reached, but a socket cannot be reopened
                    print(name, 'reached', e.errno)
        """)
        output, status = await run(launcher, [PY, "-I", "-S", "-c", code])
        assert status == (0, None)
        lines = output.decode().splitlines()
        assert len(lines) >= 4  # stdio and the socket at least
        assert all(line.endswith(" denied") for line in lines), lines
    finally:
        await launcher.aclose()


# ---------------------------------------------------------------- failures and ending


async def test_wrapper_failure_reports_its_own_error(nursery):
    if BWRAP is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    with pytest.raises(LauncherError, match="did not start.*--no-such-bwrap-option"):
        await Launcher.start(nursery, wrapper=[BWRAP, "--no-such-bwrap-option", "--"], env=ENV)


async def test_missing_wrapper_program_is_a_clear_error(nursery):
    with pytest.raises(LauncherError, match="cannot start the sandbox launcher"):
        await Launcher.start(nursery, wrapper=["/nonexistent/bwrap", "--"], env=ENV)


async def test_launcher_killed_wakes_every_waiter(launcher):
    sleeper, read_fd = await spawn_piped(launcher, ["sleep", "1000"])
    os.close(read_fd)
    sleeper_pid = sleeper.pid
    # From the host: from inside the sandbox it cannot be killed (the next test).
    os.kill(launcher.host_pid, signal.SIGKILL)
    with trio.fail_after(20):
        with pytest.raises(LauncherDied):
            await sleeper.wait()
        with pytest.raises(LauncherDied):
            await launcher.ping()
        with pytest.raises(LauncherDied):
            await launcher.spawn(SpawnRequest(["true"], cwd="/", env=ENV,
                                              stdin=0, stdout=1, stderr=2))
    assert not launcher.alive
    assert sleeper.lost
    await launcher.aclose()
    assert_gone([sleeper_pid, sleeper.shim_pid])


async def test_the_launcher_is_pid_1_and_no_signal_from_inside_ends_it(nursery, tmp_path):
    if BWRAP is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    launcher = await Launcher.start(nursery, wrapper=bwrap_prefix(str(tmp_path)), env=ENV)
    try:
        assert launcher.ready.pid == 1
        for sig in ("KILL", "STOP", "TERM", "INT", "HUP", "QUIT", "SEGV", "USR1"):
            assert await run(launcher, ["kill", f"-{sig}", "1"]) == (b"", (0, None))
        with trio.fail_after(20):  # a bound, not a speed: a stopped launcher never answers
            await launcher.ping()
        assert psutil.Process(launcher.host_pid).status() != psutil.STATUS_STOPPED
        assert await run(launcher, ["echo", "alive"]) == (b"alive\n", (0, None))
    finally:
        pids = tree_pids(launcher)
        await launcher.aclose()
        assert_gone(pids)


async def test_a_launcher_found_gone_is_dead_for_every_call_at_once(launcher):
    # session.list asks gone_now, which may see the death before the reader task does: the
    # calls after it must meet that death too. No checkpoint between the kill and the
    # checks, so the reader cannot have run; and the kill may not have been acted on yet.
    sleeper, read_fd = await spawn_piped(launcher, ["sleep", "1000"])
    os.close(read_fd)
    os.kill(launcher.host_pid, signal.SIGKILL)
    assert launcher.gone_now()
    assert not launcher.alive and sleeper.lost
    with pytest.raises(LauncherDied):
        await launcher.spawn(SpawnRequest(["true"], cwd="/", env=ENV, stdin=0, stdout=1, stderr=2))


async def test_aclose_leaves_no_process_of_the_sandbox(nursery, wrapper):
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV)
    jobs = []
    # Each says "ready" once its whole tree exists: a spawn returns as the command starts.
    for argv in (["sh", "-c", "echo ready; exec sleep 1000"],
                 ["bash", "-c", "sleep 1000 & echo ready; sleep 1000"],
                 [PY, "-c", "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                            "    if os.fork() == 0:\n        time.sleep(1000)\n    os._exit(0)\n"
                            "os.wait()\nprint('ready', flush=True)\ntime.sleep(1000)"]):
        job, read_fd = await spawn_piped(launcher, argv)
        async with trio.lowlevel.FdStream(read_fd) as stream:
            assert await read_line(stream) == b"ready\n"
        jobs.append(job)
    await launcher.ping()  # answered once the launcher has replaced the shims jobs took
    pids = tree_pids(launcher) | {j.pid for j in jobs} | {j.shim_pid for j in jobs}
    assert len(pids) >= 9  # wrapper, launcher, spare, 3 shims, 3 commands, ...
    await launcher.aclose()
    await launcher.aclose()  # idempotent
    assert not launcher.alive
    assert_gone(pids)
    with pytest.raises(LauncherDied):
        await jobs[0].wait()


DAEMON_SCRIPT = textwrap.dedent("""
    import json, os, sys, trio
    from toolsd.sandbox.launch.launcher_client import Launcher
    from toolsd.sandbox.launch.spawn_request import SpawnRequest

    async def main():
        env = json.loads(sys.argv[2])
        async with trio.open_nursery() as nursery:
            launcher = await Launcher.start(nursery, wrapper=json.loads(sys.argv[1]), env=env)
            devnull = os.open(os.devnull, os.O_RDWR)
            job = await launcher.spawn(SpawnRequest(["sleep", "1000"], cwd="/", env=env,
                                       stdin=devnull, stdout=devnull, stderr=devnull))
            print(json.dumps([launcher.wrapper_pid, launcher.host_pid, job.shim_pid, job.pid]),
                  flush=True)
            await trio.sleep_forever()

    trio.run(main)
""")


def test_daemon_sigkill_leaves_nothing(wrapper):
    daemon = subprocess.Popen([PY, "-c", DAEMON_SCRIPT, json.dumps(wrapper), json.dumps(ENV)],
                              cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        pids = set(json.loads(daemon.stdout.readline()))
        pids.update(p.pid for p in psutil.Process(daemon.pid).children(recursive=True))
        pidfds = [os.pidfd_open(pid) for pid in pids]
    finally:
        daemon.kill()
        daemon.wait()
        daemon.stdout.close()
    try:
        # Wait on the exits themselves (a pidfd polls readable once its process has exited),
        # with a generous bound only so that a failure cannot hang the suite.
        deadline = time.monotonic() + 20
        poller = select.poll()
        for fd in pidfds:
            poller.register(fd, select.POLLIN)
        pending = set(pidfds)
        while pending and time.monotonic() < deadline:
            for fd, _ in poller.poll(1000):
                poller.unregister(fd)
                pending.discard(fd)
    finally:
        for fd in pidfds:
            os.close(fd)
    assert_gone(pids)


# ---------------------------------------------------------------- spares

# Runs in the sandbox: for each line "PID SIGNAL" on stdin, sends the signal, answers "sent".
SIGNALLER = textwrap.dedent("""
    import os, sys
    for line in sys.stdin:
        pid, sig = line.split()
        os.kill(int(pid), int(sig))
        print("sent", flush=True)
""")


def pid_in_sandbox(host_pid: int) -> int:
    """The pid the sandbox sees for a host pid (the innermost of NSpid)."""
    with open(f"/proc/{host_pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    raise AssertionError(f"no NSpid line for {host_pid}")


async def wait_exited(pid: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def test_spares_stopped_from_inside_are_resumed_and_killed_ones_replaced(launcher):
    stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
    # A generous bound, only so that a lost request fails the test instead of hanging it.
    with trio.fail_after(30):
        try:
            signaller, out_fd = await spawn_piped(launcher, [PY, "-I", "-S", "-c", SIGNALLER],
                                                  stdin=stdin_r)
        finally:
            os.close(stdin_r)
        # Two jobs overlap, so the launcher forks a reader for the second when it reads that
        # shim's "took"; the second's shim, its job done, stays as a standby. The second job
        # waits until that fork: one that ended before the launcher read its "took" would
        # leave its shim idle at once, to be made the reader again, and no third shim.
        def shims() -> set[int]:
            return {child.pid for child in psutil.Process(launcher.host_pid).children()}

        hold_r, hold_w = os.pipe2(os.O_CLOEXEC)
        try:
            quick, quick_out = await spawn_piped(launcher, ["head", "-c", "1"], stdin=hold_r)
        finally:
            os.close(hold_r)
        os.close(quick_out)
        while len(shims()) < 3:
            await trio.sleep(0.01)
        os.close(hold_w)  # its head reads the end and exits
        await quick.done.wait()
        spares = shims() - {signaller.shim_pid}
        assert len(spares) == 2, (spares, signaller.shim_pid)  # the reader and a standby
        async with trio.lowlevel.FdStream(out_fd) as signaller_out:
            async def signal_from_inside(sig):
                for spare in spares:
                    os.write(stdin_w, b"%d %d\n" % (pid_in_sandbox(spare), sig))
                    assert await read_line(signaller_out) == b"sent\n"

            await signal_from_inside(signal.SIGSTOP)
            for spare in spares:
                while psutil.Process(spare).status() == psutil.STATUS_STOPPED:
                    await trio.sleep(0.05)  # until the launcher has resumed it
            assert await run(launcher, ["echo", "after the stop"]) == (b"after the stop\n",
                                                                       (0, None))
            await signal_from_inside(signal.SIGKILL)
            assert await run(launcher, ["echo", "after the spares died"]) == (
                b"after the spares died\n", (0, None))
            for spare in spares:
                await wait_exited(spare)
            assert_gone(spares)
            os.close(stdin_w)
            assert await signaller.wait() == (0, None)


def start_command_wrapped(folder, name: str, code: str) -> str:
    """A launcher script whose shims start commands through `wrapped(req, *args)`, defined
    by `code`, which may call `original(req, *args)` (os, signal and time are imported)."""
    script = folder / f"{name}.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {os.path.dirname(LAUNCHER_PY)!r})
        import launcher
        original = launcher.start_command
    """) + textwrap.dedent(code) + textwrap.dedent("""
        launcher.start_command = wrapped
        sys.exit(launcher.main())
    """))
    return str(script)


def faulty_launcher(folder, function: str, after: bool) -> str:
    """A launcher whose first call of `function` in a spare SIGKILLs that spare (before or
    after the call): a spare dying at exactly that point of taking a job."""
    script = folder / "faulty_launcher.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(LAUNCHER_PY)!r})
        import launcher

        def first_time():
            try:
                os.close(os.open({str(folder / "fault-done")!r},
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                return True
            except FileExistsError:
                return False

        original = launcher.{function}

        def faulty(*args):
            if not {after!r} and first_time():
                os.kill(os.getpid(), signal.SIGKILL)
            result = original(*args)
            if {after!r} and first_time():
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        launcher.{function} = faulty
        sys.exit(launcher.main())
    """))
    return str(script)


@pytest.mark.parametrize("fault", [
    pytest.param(("claim", True), id="killed-after-claiming-before-receiving"),
    pytest.param(("start_command", False), id="killed-after-receiving"),
])
async def test_spare_killed_while_taking_a_job_runs_it_once_on_another(
        nursery, wrapper, tmp_path, fault):
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV,
                                    launcher_py=faulty_launcher(tmp_path, *fault))
    pids = tree_pids(launcher)
    try:
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        try:
            with trio.fail_after(20):  # a lost request would hang here forever
                # The request never ran: it is sent again, and runs on another shim.
                victim = await launcher.spawn(SpawnRequest(["echo", "victim"], cwd="/", env=ENV,
                                              stdin=write_fd, stdout=write_fd,
                                              stderr=write_fd))
                survivor = await launcher.spawn(SpawnRequest(["echo", "survivor"], cwd="/", env=ENV,
                                                stdin=write_fd, stdout=write_fd,
                                                stderr=write_fd))
        finally:
            os.close(write_fd)
        # EOF comes once every copy of the pipe is closed, including the first request's
        # (dropped or gone with the spare): had it run too, its output would be here twice.
        # Two commands started one after the other may write in either order.
        assert sorted((await read_all(read_fd)).splitlines()) == [b"survivor", b"victim"]
        assert await victim.wait() == (0, None)
        assert await survivor.wait() == (0, None)
        assert (tmp_path / "fault-done").exists()
    finally:
        pids |= tree_pids(launcher)
        await launcher.aclose()
        assert_gone(pids)


async def test_spares_that_keep_dying_fail_the_request_clearly(nursery, wrapper, tmp_path):
    script = tmp_path / "spares_die.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(LAUNCHER_PY)!r})
        import launcher
        launcher.take_job = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(launcher.main())
    """))
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV, launcher_py=str(script))
    pids = tree_pids(launcher)
    try:
        with trio.fail_after(20):  # without a limit the launcher would fork forever
            with pytest.raises(LauncherError, match="shims were killed before they could start"):
                await launcher.spawn(SpawnRequest(["true"], cwd="/", env=ENV,
                                                  stdin=0, stdout=1, stderr=2))
            await launcher.ping()
    finally:
        await launcher.aclose()
        assert_gone(pids)


async def test_killed_shims_are_replaced_when_the_channels_numbers_pass_fd_setsize(
        nursery, wrapper):
    """A daemon with many sessions holds more than FD_SETSIZE (1024) descriptors, and a
    sandbox keeps its channels' numbers: the launcher must look at them with poll, not
    select, or a reader killed from inside (kill -9 -1) ends the launcher and the session."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"RLIMIT_NOFILE's hard limit ({hard}) leaves no room above 1024")
    if soft != resource.RLIM_INFINITY and soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    try:
        # Taken so that the channel's sockets land above 1024; freed once it started.
        fillers = []
        while (fd := os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)) < 1100:
            fillers.append(fd)
        fillers.append(fd)
        try:
            launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV)
        finally:
            for fd in fillers:
                os.close(fd)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    pids = tree_pids(launcher)
    try:
        with trio.fail_after(30):
            assert await run(launcher, ["echo", "before"]) == (b"before\n", (0, None))
            await launcher.ping()
            shims = [child for child in psutil.Process(launcher.host_pid).children()
                     if child.name() == "toolsd-shim"]
            assert shims
            for shim in shims:  # the reader among them
                shim.kill()
            for shim in shims:
                await wait_exited(shim.pid)
            assert await run(launcher, ["echo", "after"]) == (b"after\n", (0, None))
            assert launcher.alive
    finally:
        pids |= tree_pids(launcher)
        await launcher.aclose()
        assert_gone(pids)


async def test_a_cancelled_spawn_ends_the_whole_tree_it_started(nursery, wrapper, tmp_path):
    # The shim takes its time to say `started` (as under load), so the command has forked
    # when the daemon learns of it: killing the command alone would leave its children.
    script = start_command_wrapped(tmp_path, "slow_started", """
        def wrapped(req, *args):
            pid = original(req, *args)
            time.sleep(1.0)
            return pid
    """)
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV, launcher_py=script)
    pids = tree_pids(launcher)
    try:
        with trio.move_on_after(0.1) as waited:
            await launcher.spawn(SpawnRequest(["sh", "-c", "sleep 1000 & sleep 1000"], cwd="/",
                                              env=ENV,
                                 stdin=0, stdout=1, stderr=2))
        assert waited.cancelled_caught  # abandoned: nobody will ever stop what it started

        def sleeps():
            return [p for p in psutil.Process(launcher.host_pid).children(recursive=True)
                    if "sleep" in name_of(p)]

        with trio.fail_after(20):  # a bound, not a speed: without the fix they stay for good
            while not sleeps():
                await trio.sleep(0.05)  # the command starts after its spawn was given up
            while sleeps():
                await trio.sleep(0.05)
        pids |= tree_pids(launcher)
    finally:
        await launcher.aclose()
        assert_gone(pids)


async def test_a_shim_retires_before_its_own_cpu_time_reaches_the_cpu_limit(
        nursery, wrapper, tmp_path):
    # A shim sets the session's RLIMIT_CPU on itself (for its commands) and counts its own CPU
    # time against it across jobs. Here each spawn costs the shim 0.3 s of CPU, so a shim that
    # stayed would be killed by the kernel in the middle of its fourth job.
    script = start_command_wrapped(tmp_path, "costly_shim", """
        def wrapped(req, *args):
            spent = time.process_time() + 0.3
            while time.process_time() < spent:
                pass
            return original(req, *args)
    """)
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV, launcher_py=script)
    pids = tree_pids(launcher)
    try:
        for _ in range(8):
            output, status = await run(launcher, ["echo", "ok"], rlimits={"cpu": (1, 1)})
            assert (output, status) == (b"ok\n", (0, None))
        pids |= tree_pids(launcher)
    finally:
        await launcher.aclose()
        assert_gone(pids)


async def test_a_spawn_cancelled_as_its_start_is_reported_ends_the_tree(launcher):
    # The cancel lands after `started` was read but before the spawning task runs again: the
    # call raises Cancelled, and what it started must not go on unsupervised.
    scope = trio.CancelScope()
    dispatch = launcher._dispatch

    def cancel_then_dispatch(msg, fds):
        if isinstance(msg, Started):
            scope.cancel()  # the spawning task is woken with Cancelled, not yet run
        dispatch(msg, fds)

    launcher._dispatch = cancel_then_dispatch
    with scope:
        await launcher.spawn(SpawnRequest(["sh", "-c", "sleep 1000 & sleep 1000"], cwd="/", env=ENV,
                             stdin=0, stdout=1, stderr=2, want_pid=False))
    assert scope.cancelled_caught
    launcher._dispatch = dispatch

    def sleeps():
        return [p for p in psutil.Process(launcher.host_pid).children(recursive=True)
                if name_of(p) in ("sh", "sleep") and not has_exited(p)]

    with trio.fail_after(20):  # a bound, not a speed: without the fix they stay for good
        while sleeps():
            await trio.sleep(0.05)


def name_of(proc: psutil.Process) -> str:
    """The process's name, or "" once it is gone: a child listed a moment ago may have exited."""
    try:
        return proc.name()
    except psutil.NoSuchProcess:
        return ""


def has_exited(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_shim_stopped_before_it_reports_the_start_is_resumed_and_reports(
        nursery, wrapper, tmp_path):
    # A command can stop its shim (kill -STOP $PPID) before the shim says `started`: the
    # request would wait for ever, and the launcher with it, for a reader that never reads.
    # The launcher sees the stop (its child) and resumes it.
    script = start_command_wrapped(tmp_path, "stopped_shim", """
        def wrapped(req, *args):
            pid = original(req, *args)
            if req["argv"][-1] == "stop-me":
                os.kill(os.getpid(), signal.SIGSTOP)
            return pid
    """)
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV, launcher_py=script)
    pids = tree_pids(launcher)
    try:
        with trio.fail_after(20):  # a bound, not a speed: without the fix it waits for ever
            # Resumed, not killed (the daemon kills a shim it finds stopped a second later).
            assert await run(launcher, ["sh", "-c", "echo ran", "stop-me"],
                             want_pid=False) == (b"ran\n", (0, None))
            assert await run(launcher, ["echo", "after"]) == (b"after\n", (0, None))
        pids |= tree_pids(launcher)
    finally:
        await launcher.aclose()
        assert_gone(pids)


async def test_a_command_spawned_with_resume_stopped_goes_on_when_it_stops(launcher):
    # A REPL's interpreter is spawned so: its shim, which waits on it anyway, resumes it
    # when it stops, so that no request ever reaches it stopped.
    argv = ["sh", "-c", "kill -STOP $$; echo went on"]
    with trio.fail_after(20):  # a bound, not a speed: without the resume it waits for ever
        assert await run(launcher, argv, resume_stopped=True) == (b"went on\n", (0, None))


async def test_a_command_that_changes_its_shim_once_it_runs_is_not_killed_for_it(
        nursery, wrapper, tmp_path):
    # A command may change its own shim (here its OOM score) as soon as it runs, and on a busy
    # machine before the shim checks itself after the spawn: the change came after the
    # command's fork and is not in it, so the command runs on. The changed shim retires.
    script = start_command_wrapped(tmp_path, "changed_after_fork", """
        def wrapped(req, *args):
            pid = original(req, *args)
            if req["argv"][-1] == "change-my-shim":
                deadline = time.monotonic() + 20  # a bound: the command changes us at once
                while (launcher.own_state() == launcher.REFERENCE
                       and time.monotonic() < deadline):
                    time.sleep(0.01)
            return pid
    """)
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV, launcher_py=script)
    pids = tree_pids(launcher)
    try:
        score = ["cat", "/proc/self/oom_score_adj"]
        before = await run(launcher, score)
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        try:
            job, read_fd = await spawn_piped(
                launcher, ["sh", "-c", 'echo 900 > /proc/$PPID/oom_score_adj; read line; '
                                       'echo "$line"', "change-my-shim"], stdin=stdin_r)
        finally:
            os.close(stdin_r)
        with os.fdopen(stdin_w, "wb") as stdin:
            stdin.write(b"ran on\n")
        with trio.fail_after(20):
            assert await read_all(read_fd) == b"ran on\n"
            assert await job.wait() == (0, None)
            for _ in range(6):  # more than the shims there are
                assert await run(launcher, score) == before
        pids |= tree_pids(launcher)
    finally:
        await launcher.aclose()
        assert_gone(pids)


async def test_a_command_forked_from_a_changed_shim_is_killed(nursery, wrapper, tmp_path):
    # Something else in the sandbox may change a shim between its check and the spawn: the
    # command then carries the change, and is killed before it does anything.
    script = start_command_wrapped(tmp_path, "changed_before_fork", """
        def wrapped(req, *args):
            if req["argv"][-1] == "changed-before-fork":
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("901")
            return original(req, *args)
    """)
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV, launcher_py=script)
    pids = tree_pids(launcher)
    try:
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        try:
            job, read_fd = await spawn_piped(
                launcher, ["sh", "-c", 'read line; echo "$line"', "changed-before-fork"],
                stdin=stdin_r)
        finally:
            os.close(stdin_r)
        with trio.fail_after(20):  # without the kill it waits on its stdin for ever
            assert await job.wait() == (None, signal.SIGKILL)
        os.close(stdin_w)
        assert await read_all(read_fd) == b""
        pids |= tree_pids(launcher)
    finally:
        await launcher.aclose()
        assert_gone(pids)
