"""The host processes of one sandbox: the wrapper (bwrap, or the bare launcher), the launcher
in it, and whatever runs between them (bwrap's init of the pid namespace), seen from the host
through pidfds and /proc."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile

import psutil
import trio

from driver import LAUNCHER_PY
from toolsd.runtime.child_fds import ChildFds
from toolsd.sandbox.launch import proctree
from toolsd.sandbox.launch.bootstrap import BOOTSTRAP, code_file, launcher_code
from toolsd.sandbox.errors import LauncherError

# The launcher's shims, as `ps` names them (driver/launcher.py).
SHIM_NAME = "toolsd-shim"


def host_pid_of(pidfd: int) -> int:
    """The pid a pidfd refers to, in the host's pid namespace (fdinfo is rendered for the
    namespace of the procfs we read, and ours is the host's)."""
    # Raw os calls, not a text file: this runs on every spawn's critical path.
    try:
        fd = os.open(f"/proc/self/fdinfo/{pidfd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            info = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return -1
    start = info.find(b"\nPid:")
    if start == -1:
        return -1
    end = info.find(b"\n", start + 5)
    try:
        return int(info[start + 5:end if end != -1 else None])
    except ValueError:
        return -1


def _pidfds_between(top: int, bottom: int) -> list[int]:
    """pidfds of the processes strictly between `top` and its descendant `bottom`."""
    if top == bottom:
        return []
    chain = []
    pid = bottom
    while True:
        pid = _ppid(pid)
        if pid is None:
            return []
        if pid == top:
            break
        if pid <= 1 or len(chain) > 8:
            return []  # `bottom` is not below `top`: nothing there is ours
        chain.append(pid)
    fds = []
    for pid in chain:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass
    return fds


def _ppid(pid: int) -> int | None:
    # /proc directly: psutil reads the same file twice (once for the process's identity),
    # and session.open walks two or three of these.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _killed(pid: int) -> bool:
    """Whether `pid` has a SIGKILL pending (or is gone): the kernel queues it at once, for
    the thread (SigPnd) or the whole process (ShdPnd), however long the process then waits
    for a CPU to act on it."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    for line in status.splitlines():
        name, _, value = line.partition(b":")
        if name in (b"SigPnd", b"ShdPnd") and int(value, 16) & (1 << (signal.SIGKILL - 1)):
            return True
    return False


def kill_shims(shims: list[int]) -> None:
    for shim in shims:
        # A shim exits by itself once its tree is gone; kill it too in case it is stopped.
        proctree.kill_tree(shim, grace_s=0, include_root=False)
        proctree.kill_tree(shim, grace_s=0, include_root=True)


class Wrapper:
    """Resource handling: owns the wrapper's Popen, its stderr file and the pidfds of the
    wrapper, the launcher and the processes between them; `release()` closes them all. It
    ends no process by itself: `force_end()` does, when asked."""

    def __init__(self, proc: subprocess.Popen, errfile, launcher_py: str):
        self.proc = proc
        self.errfile = errfile
        self.launcher_py = launcher_py
        self.wrapper_pid = proc.pid
        self.wrapper_fd = os.pidfd_open(proc.pid)
        self.host_pid = -1
        self.launcher_fd = -1
        self.between_fds: list[int] = []  # e.g. bwrap's init in the pid namespace
        self.launcher_is_init = False

    @classmethod
    def start(cls, wrapper: list[str], *, env: dict[str, str], python: str, cwd: str,
              launcher_py: str, listen: str | None = None
              ) -> tuple[Wrapper, socket.socket, socket.socket]:
        """Start `wrapper + [python, -I, -S, launcher_py, FD, SPAWN_FD]` (see BOOTSTRAP for
        how, when `python` is ours); (the Wrapper, our end of the channel, our end of the
        spawn channel). LauncherError if it cannot be started."""
        with ChildFds() as fds:  # the launcher's side holds the only copies: EOF at its exit
            ours, theirs = fds.socketpair(socket.SOCK_SEQPACKET)
            spawn_ours, spawn_theirs = fds.socketpair(socket.SOCK_SEQPACKET)
            errfile = fds.ours(tempfile.TemporaryFile(prefix="toolsd-launcher-", suffix=".err"))
            stdin = subprocess.DEVNULL
            if python == sys.executable and launcher_py == LAUNCHER_PY:
                # Our own interpreter, so our own marshal format.
                stdin = fds.child(code_file(launcher_code(launcher_py)))
                argv = [*wrapper, python, "-I", "-S", "-c", BOOTSTRAP, launcher_py]
            else:
                argv = [*wrapper, python, "-I", "-S", launcher_py]
            argv += [str(theirs.fileno()), str(spawn_theirs.fileno()),
                     *([listen] if listen else [])]
            try:
                # Popen from the trio thread, not trio.lowlevel.open_process: bwrap's
                # --die-with-parent fires when the *thread* that forked it exits, and trio's
                # worker threads are retired when idle.
                proc = subprocess.Popen(
                    argv, pass_fds=(theirs.fileno(), spawn_theirs.fileno()),
                    start_new_session=True, env=env, cwd=cwd, stdin=stdin,
                    stdout=subprocess.DEVNULL, stderr=errfile)
            except OSError as e:
                raise LauncherError(f"cannot start the sandbox launcher ({argv[0]}): "
                                    f"{e.strerror}; check that it is installed and the cwd "
                                    f"{cwd!r} exists") from None
        self = cls(proc, errfile, launcher_py)
        # bwrap's --as-pid-1 (policy.py): the launcher is the pid namespace's init.
        self.launcher_is_init = "--as-pid-1" in wrapper
        return self, ours, spawn_ours

    def adopt_launcher(self, fds: list[int]) -> bool:
        """Take the launcher's pidfd (fds[0], popped) from its `ready` message; False, and
        nothing taken, if the launcher is already gone."""
        host_pid = host_pid_of(fds[0])
        if host_pid == -1:
            return False
        self.host_pid = host_pid
        self.launcher_fd = fds.pop(0)
        self.between_fds = _pidfds_between(self.wrapper_pid, self.host_pid)
        return True

    def stderr_text(self) -> str:
        try:
            self.errfile.seek(0)
            text = self.errfile.read()[-4000:].decode(errors="replace").strip()
        except (OSError, ValueError):
            text = ""
        code = self.proc.poll()
        status = "still running" if code is None else f"exit status {code}"
        return f"{text} ({status})" if text else f"no error output ({status})"

    def last_words(self) -> str | None:
        """The last line the launcher wrote to stderr, if any."""
        try:
            self.errfile.seek(0)
            lines = self.errfile.read()[-4000:].decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            lines = []
        return lines[-1] if lines else None

    def exiting(self) -> bool:
        """Whether the launcher or the wrapper has exited or is exiting. The pidfds say so
        once a process has ended; a process killed a moment ago may not have run since (on a
        busy machine it waits for a CPU), and then only its pending SIGKILL says so; one that
        has run since is exiting, and has already let go of its namespaces (while its pidfd
        says alive, its pid is still its own)."""
        fds = [fd for fd in (self.launcher_fd, self.wrapper_fd) if fd != -1]
        if not fds:
            return True
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        if poller.poll(0):
            return True
        if _killed(self.host_pid) or _killed(self.wrapper_pid):
            return True
        try:
            os.readlink(f"/proc/{self.host_pid}/ns/mnt")
        except (FileNotFoundError, ProcessLookupError):
            return True
        return False

    async def wait_exits(self, timeout_s: float) -> bool:
        """Wait until the wrapper, the launcher and whatever runs between them (bwrap's init
        of the pid namespace, which exits only once the namespace is empty) have exited."""
        with trio.move_on_after(timeout_s):
            for fd in (self.wrapper_fd, self.launcher_fd, *self.between_fds):
                if fd != -1:
                    await trio.lowlevel.wait_readable(fd)
            self.proc.wait()
            return True
        return False

    def end_namespace(self) -> None:
        """At close, with the launcher the init of the sandbox's pid namespace: SIGKILL it,
        and the kernel ends and reaps every process in there at once, sooner than the
        launcher's own kill of its tree and exit. Nothing without a namespace of its own
        (then the launcher ends its tree itself on EOF)."""
        if self.launcher_is_init and self.launcher_fd != -1:
            try:
                signal.pidfd_send_signal(self.launcher_fd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def force_end(self) -> None:
        """The launcher did not end by itself (stopped, or hung): kill from the host. Its tree
        first, while it is still alive to adopt orphans, then the wrapper, which takes the pid
        namespace with it."""
        if self.launcher_fd != -1:
            await trio.to_thread.run_sync(
                lambda: proctree.kill_tree(self.host_pid, grace_s=0, include_root=False))
            try:
                signal.pidfd_send_signal(self.launcher_fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        for fd in self.between_fds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Bounded only so that a process stuck in uninterruptible sleep cannot hang us.
        await self.wait_exits(10.0)

    def orphaned_shims(self, jobs) -> list[int]:
        """Shims of `jobs` (the unfinished ones) that outlived the launcher (possible only
        unsandboxed, where no pid namespace ends with it). A pid counts only if its process
        is a launcher copy that existed when the job started, so a reused pid is never taken
        for a shim."""
        shims = []
        for job in jobs:
            if job.shim_pid <= 0:
                continue
            try:
                proc = psutil.Process(job.shim_pid)
                if (self.launcher_py in proc.cmdline()
                        and proc.create_time() <= job.started_at + 0.05):
                    shims.append(job.shim_pid)
            except psutil.Error:
                pass
        return shims

    def resume_stopped_spawns(self) -> None:
        """SIGCONT what the session's code stopped (kill -STOP -1) while a shim started it:
        a child of a shim still bearing the shim's name has not reached its exec yet, and
        the shim waits in posix_spawn for that exec. A command that runs has its own name,
        and stays stopped if it was stopped. Reads the launcher's children and theirs only
        (proctree.child_lookup), never the whole /proc: under load every spawn slower than
        SPAWN_STALL_S comes here."""
        tree = proctree.child_lookup()
        for shim_pid in tree.get(self.host_pid, ()):
            try:
                shim = psutil.Process(shim_pid)
                if shim.name() != SHIM_NAME:
                    continue
            except psutil.Error:
                continue
            for child_pid in tree.get(shim_pid, ()):
                try:
                    child = psutil.Process(child_pid)
                    if child.status() == psutil.STATUS_STOPPED and child.name() == SHIM_NAME:
                        child.resume()
                except psutil.Error:
                    pass

    def release(self) -> None:
        """Close the pidfds and the stderr file; idempotent."""
        for fd in (self.launcher_fd, self.wrapper_fd, *self.between_fds):
            if fd != -1:
                trio.lowlevel.notify_closing(fd)
                os.close(fd)
        self.launcher_fd = self.wrapper_fd = -1
        self.between_fds = []
        self.errfile.close()
