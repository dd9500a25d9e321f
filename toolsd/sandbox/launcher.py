"""Host side of the launcher channel: start `driver/launcher.py` (inside bwrap or bare), spawn
commands through it, learn their host pids and exits.

    LauncherError          a start or spawn failed; the message is for users
     +-- LauncherLimit     a resource limit of the session refused it
     +-- LauncherDied      the launcher is gone; nothing more can be spawned or reported

The wire format is described in driver/launcher.py.
"""

from __future__ import annotations

import array
import contextlib
import errno
import itertools
import logging
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import msgspec
import psutil
import trio

from driver import LAUNCHER_PY
from toolsd.sandbox import proctree
from toolsd.runtime import threads

log = logging.getLogger("toolsd.launcher")

MAX_MSG = 1 << 18  # more than any datagram the default socket buffers let through
MAX_FDS = 4
ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
# Messages read in a row without waiting before the reader lets other tasks run.
RECV_STREAK = 16
# How long aclose lets the launcher end its own tree (it does so on EOF, and reaps what it
# kills, so nothing is left as a zombie) before killing everything from the host.
CLEAN_EXIT_S = 2.0
READY_TIMEOUT_S = 30.0
# Tree kills at once, each in a worker thread of its own (a SIGTERM grace holds its thread).
KILL_THREADS = 256
# A spawn not answered within this time looks for commands stopped before their exec.
SPAWN_STALL_S = 1.0
# The launcher's shims, as `ps` names them (driver/launcher.py).
SHIM_NAME = "toolsd-shim"
# Sends of one spawn request whose shim the session's code killed before it ran the command
# (a `kill -9 -1` racing the spawn): it never ran, so it is sent again.
SPAWN_TRIES = 3
_json_decode = msgspec.json.Decoder().decode
# Runs the launcher from code compiled by the daemon and handed over on stdin: run as a script,
# launcher.py would be compiled afresh by every session start (no .pyc for a script), a third
# of the launcher's start. argv stays [launcher.py, FD, SPAWN_FD], as for the script.
BOOTSTRAP = "import marshal,sys;sys.argv=sys.argv[1:];exec(marshal.loads(sys.stdin.buffer.read()))"
_compiled: dict[tuple[str, int, int], bytes] = {}


def _launcher_code(path: str) -> bytes:
    """The marshalled code of driver/launcher.py, compiled once per version of the file."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    code = _compiled.get(key)
    if code is None:
        with open(path, "rb") as f:
            code = marshal.dumps(compile(f.read(), path, "exec", dont_inherit=True))
        _compiled.clear()
        _compiled[key] = code
    return code


def _code_file(code: bytes) -> int:
    """A memfd holding `code`, at offset 0."""
    fd = os.memfd_create("toolsd-launcher-code", os.MFD_CLOEXEC)
    try:
        os.write(fd, code)  # a memfd takes it all in one write
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class LauncherError(Exception):
    """A start or spawn failed; the message says what happened and what to do."""


class LauncherLimit(LauncherError):
    """A resource limit of the session (its pids, say) refused a spawn."""


class LauncherDied(LauncherError):
    """The launcher's channel closed while waiting (the launcher was killed or exited)."""


class Job:
    """One command spawned by the launcher. pid / shim_pid are HOST pids (-1 if the process
    was already gone when its pid was read, which the hold pipe makes rare).

    `exited` is set when the command exits, and also when the launcher dies (nothing more will
    be reported then: exit_code and signal stay None and `lost` is True); `done` when the shim
    has reaped every process of the tree and left, or the launcher died. `wait()` tells the
    two apart by raising LauncherDied."""

    def __init__(self, job: int, argv: list[str], want_pid: bool = True, held: bool = False):
        self.job = job
        self.want_pid = want_pid
        self.argv = argv
        self.pid = -1
        self.shim_pid = -1
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.lost = False
        self.exited = trio.Event()
        self.done = trio.Event()
        self._reported = False  # exited came from the shim, not from the launcher's death
        self._answered = trio.Event()  # started, error, or death
        self._error: str | None = None
        self._error_limit = False  # the error was a resource limit's
        self._unstarted = False  # the error was its shim's death before running it
        self._abandoned = False  # the spawn call was cancelled: kill it when it starts
        self._started_at = 0.0
        # Our end of the shim's hold pipe (see driver/launcher.py): while it is open the shim
        # takes no other job, so everything below it is this job's tree.
        self._hold_fd = -1
        self._holds = int(held)  # holding_tree() blocks in use, and the caller's hold
        self._held = held

    async def wait(self) -> tuple[int | None, int | None]:
        """(exit_code, signal) once the command has exited; LauncherDied if it never will be
        reported."""
        await self.exited.wait()
        if not self._reported:
            raise LauncherDied(f"the sandbox launcher died before {self.argv[0]!r} exited; "
                               f"close the session and open a new one")
        return self.exit_code, self.signal

    @contextlib.contextmanager
    def holding_tree(self):
        """The host pid of the shim at the top of this job's tree, every process below it
        being the job's, or None once there is no such tree any more (the job is done and its
        shim released for another job, or the shim died). Use the pid only inside the `with`:
        the shim is not released meanwhile."""
        self._holds += 1
        try:
            yield self._tree_root()
        finally:
            self._holds -= 1
            self._maybe_release()

    def _tree_root(self) -> int | None:
        if self._hold_fd == -1 or self.shim_pid <= 0:
            return None
        try:
            # A shim killed by its own command leaves a pid that anyone's new process may
            # take: ours was created before the job started.
            if psutil.Process(self.shim_pid).create_time() <= self._started_at + 0.05:
                return self.shim_pid
        except psutil.Error:
            pass
        return None

    def let_go(self) -> None:
        """End the hold that a `held` spawn gave its caller; idempotent."""
        if self._held:
            self._held = False
            self._holds -= 1
            self._maybe_release()

    def _maybe_release(self) -> None:
        """Let the shim take another job, once this one is done and nobody holds its tree."""
        if self.done.is_set() and self._holds == 0 and self._hold_fd != -1:
            os.close(self._hold_fd)
            self._hold_fd = -1

    def __repr__(self) -> str:
        return f"<Job {self.job} pid={self.pid} shim={self.shim_pid} argv={self.argv!r}>"


def _host_pid(pidfd: int) -> int:
    """The pid a pidfd refers to, in the host's pid namespace (fdinfo is rendered for the
    namespace of the procfs we read, and ours is the host's)."""
    # Raw os calls: this runs on every spawn's critical path, and a text file costs 3x more.
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


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Launcher:
    """Resource handling: owns the wrapper process (bwrap or the bare launcher), the channel to
    the launcher and the reader tasks it runs in the nursery given to `start`. `aclose()` ends
    every process of the sandbox, waits for them, and closes all of that; call it exactly as
    you would close a file (it is idempotent and shielded from cancellation).

    The fds given to `spawn` stay the caller's: close your copies of the child's ends once
    `spawn` returns, so that you see EOF when the command's tree is done with them."""

    def __init__(self, sock: trio.socket.SocketType, spawn_sock: trio.socket.SocketType,
                 proc: subprocess.Popen, errfile, wrapper_fd: int, launcher_py: str):
        self._sock = sock  # control channel: the launcher and every shim write to us here
        self._spawn_sock = spawn_sock  # spawn channel: read by the launcher's spare shim only
        self._launcher_py = launcher_py
        self._proc = proc
        self._errfile = errfile
        self._wrapper_fd = wrapper_fd
        self._launcher_fd = -1
        self._between_fds: list[int] = []  # e.g. bwrap's init in the pid namespace
        self._tasks: trio.Nursery | None = None  # our reader's, for kills of abandoned jobs
        self.info: dict = {}
        self.host_pid = -1
        self.wrapper_pid = proc.pid
        self.alive = True
        self._death: str | None = None
        self._jobs: dict[int, Job] = {}
        self._numbers = itertools.count(1)
        self._pongs: dict[int, trio.Event] = {}
        self._send_lock = trio.Lock()
        self._streak = 0  # messages read in a row without waiting (see _recv)
        self._spawn_lock = trio.Lock()
        self._scope = trio.CancelScope()
        self._tasks_done = trio.Event()
        self._closing = False
        self._closed = trio.Event()

    # ------------------------------------------------------------ start

    @classmethod
    async def start(cls, nursery: trio.Nursery, *, wrapper: list[str], env: dict[str, str],
                    python: str = sys.executable, cwd: str = "/",
                    launcher_py: str = LAUNCHER_PY) -> Launcher:
        """Start `wrapper + [python, -I, -S, launcher_py, FD, SPAWN_FD]` (see BOOTSTRAP for how,
        when `python` is ours) and wait until the
        launcher says it is ready. Raises LauncherError with the wrapper's own error text if it
        never does. `launcher_py` is for tests that wrap the launcher to inject faults."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spawn_ours, spawn_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        errfile = tempfile.TemporaryFile(prefix="toolsd-launcher-", suffix=".err")
        stdin = subprocess.DEVNULL
        if python == sys.executable and launcher_py == LAUNCHER_PY:
            # Our own interpreter, so our own marshal format.
            stdin = _code_file(_launcher_code(launcher_py))
            argv = [*wrapper, python, "-I", "-S", "-c", BOOTSTRAP, launcher_py]
        else:
            argv = [*wrapper, python, "-I", "-S", launcher_py]
        argv += [str(theirs.fileno()), str(spawn_theirs.fileno())]
        try:
            # Popen from the trio thread, not trio.lowlevel.open_process: bwrap's
            # --die-with-parent fires when the *thread* that forked it exits, and trio's
            # worker threads are retired when idle.
            proc = subprocess.Popen(
                argv, pass_fds=(theirs.fileno(), spawn_theirs.fileno()), start_new_session=True,
                env=env, cwd=cwd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=errfile)
        except OSError as e:
            ours.close()
            spawn_ours.close()
            errfile.close()
            raise LauncherError(f"cannot start the sandbox launcher ({argv[0]}): {e.strerror}; "
                                f"check that it is installed and the cwd {cwd!r} exists") from None
        finally:
            # The launcher's side holds the only copies: its exit gives us EOF.
            theirs.close()
            spawn_theirs.close()
            if stdin != subprocess.DEVNULL:
                os.close(stdin)
        self = cls(trio.socket.from_stdlib_socket(ours),
                   trio.socket.from_stdlib_socket(spawn_ours), proc, errfile,
                   os.pidfd_open(proc.pid), launcher_py)
        # The same sockets, now non-blocking, for calls made directly (see _recv and _send).
        self._raw, self._spawn_raw = ours, spawn_ours
        try:
            with trio.fail_after(READY_TIMEOUT_S):
                await self._receive_ready()
        except trio.TooSlowError:
            with trio.CancelScope(shield=True):
                await self._force_end()
                self._release()
            raise LauncherError(f"the sandbox launcher did not say ready within "
                                f"{READY_TIMEOUT_S:.0f} s; it was killed") from None
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._force_end()
                self._release()
            raise
        nursery.start_soon(self._run)
        return self

    async def _receive_ready(self) -> None:
        msg, fds = await self._recv()
        try:
            if msg is None or msg.get("op") != "ready" or not fds:
                await self._wait_exits(CLEAN_EXIT_S)
                raise LauncherError("the sandbox launcher did not start: " + self._stderr_text())
            self.info = msg
            self.host_pid = _host_pid(fds[0])
            if self.host_pid == -1:
                raise LauncherError("the sandbox launcher exited right after starting: "
                                    + self._stderr_text())
            self._launcher_fd = fds.pop(0)
            self._between_fds = _pidfds_between(self.wrapper_pid, self.host_pid)
        finally:
            _close_all(fds)

    def _stderr_text(self) -> str:
        try:
            self._errfile.seek(0)
            text = self._errfile.read()[-4000:].decode(errors="replace").strip()
        except (OSError, ValueError):
            text = ""
        code = self._proc.poll()
        status = "still running" if code is None else f"exit status {code}"
        return f"{text} ({status})" if text else f"no error output ({status})"

    # ------------------------------------------------------------ channel

    async def _recv(self) -> tuple[dict | None, list[int]]:
        # The socket directly, waiting only when nothing is there: trio's recvmsg passes
        # through the scheduler on every call (see fdio), and every spawn waits for two
        # messages. Messages that keep coming without a wait get a yield now and then.
        while True:
            try:
                data, anc, flags, _ = self._raw.recvmsg(MAX_MSG, ANC_SIZE,
                                                        socket.MSG_CMSG_CLOEXEC)
                break
            except BlockingIOError:
                self._streak = 0
                await trio.lowlevel.wait_readable(self._raw)
        self._streak += 1
        if self._streak > RECV_STREAK:
            self._streak = 0
            await trio.lowlevel.cancel_shielded_checkpoint()  # the fds received stay ours
        fds: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
                fds.extend(arr)
        if not data:
            _close_all(fds)
            return None, []
        try:
            msg = _json_decode(data)
        except (msgspec.DecodeError, RecursionError):
            msg = None
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or not isinstance(msg, dict):
            _close_all(fds)
            return {"op": "unreadable"}, []  # dropped; the launcher never sends such things
        return msg, fds

    async def _send(self, msg: dict, fds: Sequence[int] = (), *, spawn: bool = False) -> None:
        # marshal to the launcher, whose start cannot afford the json module (see its
        # imports); JSON back from it, since what leaves a sandbox is not to be trusted.
        data = marshal.dumps(msg)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        sock, lock = (self._spawn_raw, self._spawn_lock) if spawn else (self._raw,
                                                                         self._send_lock)
        await trio.lowlevel.checkpoint_if_cancelled()
        # Straight to the socket, as in _recv; the lock without a yield when it is free.
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            while True:
                try:
                    sock.sendmsg([data], anc)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sock)
        except (OSError, trio.ClosedResourceError) as e:
            if getattr(e, "errno", None) == errno.EMSGSIZE:
                raise LauncherError(f"the command and its environment are too large to "
                                    f"send ({len(data)} bytes); shorten them") from None
            self._mark_dead(f"the sandbox launcher's channel failed: {e}")
            raise LauncherDied(self._death) from None
        finally:
            lock.release()

    async def _run(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    self._tasks = nursery
                    nursery.start_soon(self._watch_launcher)
                    await self._read_loop()
                    nursery.cancel_scope.cancel()
        finally:
            # Whatever ended the reader (aclose, the caller's nursery being cancelled), nobody
            # will answer waiters any more: wake them with LauncherDied.
            self._mark_dead("the sandbox launcher's channel is no longer read; close the "
                            "session and open a new one")
            self._tasks_done.set()

    async def _watch_launcher(self) -> None:
        # Unsandboxed, shims outlive a killed launcher and keep our socket open: its pidfd,
        # not EOF, is what says it is gone. Its wrapper's too: once bwrap is gone its launcher
        # is being killed (--die-with-parent), and as pid 1 of the sandbox that launcher
        # exits only after every other process in it.
        async with trio.open_nursery() as nursery:
            async def wait_exit(fd: int) -> None:
                await trio.lowlevel.wait_readable(fd)
                nursery.cancel_scope.cancel()

            for fd in {self._launcher_fd, self._wrapper_fd}:
                nursery.start_soon(wait_exit, fd)
        self._mark_dead("the sandbox launcher exited (killed from the host or by the kernel, "
                        "or unsandboxed by a command?); close the session and open a new one")

    async def _read_loop(self) -> None:
        while True:
            try:
                msg, fds = await self._recv()
            except (OSError, trio.ClosedResourceError) as e:
                self._mark_dead(f"the sandbox launcher's channel failed: {e}")
                return
            if msg is None:
                self._mark_dead("the sandbox launcher exited; close the session and open a new "
                                "one")
                return
            try:
                self._dispatch(msg, fds)
            finally:
                _close_all(fds)

    def _dispatch(self, msg: dict, fds: list[int]) -> None:
        op = msg.get("op")
        if op == "pong":
            event = self._pongs.pop(msg.get("n"), None)
            if event is not None:
                event.set()
            return
        job = self._jobs.get(msg.get("job"))
        if job is None:
            return  # e.g. the launcher's second word on a shim that already reported
        if op == "started" and len(fds) >= 3 and not job._answered.is_set():
            job.shim_pid = _host_pid(fds[1])
            job._started_at = time.time()
            # Closing the hold pipe (see Job._maybe_release) frees the shim for other jobs.
            job._hold_fd = fds.pop(2)
            if job.want_pid:
                job.pid = _host_pid(fds[0])
                # A byte tells the shim that we have read the command's host pid: it may reap
                # the command now. (A wakeup of the shim we spare jobs that do not need it.)
                try:
                    os.write(job._hold_fd, b"!")
                except OSError:
                    pass  # the shim is gone
            if job._abandoned:
                try:
                    signal.pidfd_send_signal(fds[0], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                # And whatever it started meanwhile: nobody will ever ask for it.
                self._tasks.start_soon(self._end_abandoned, job)
            job._answered.set()
        elif op == "error" and not job._answered.is_set():
            job._error = str(msg.get("message") or "the launcher could not start the command")
            job._error_limit = bool(msg.get("limit"))
            job._unstarted = bool(msg.get("unstarted"))
            del self._jobs[job.job]
            job._answered.set()
        elif op == "exited" and not job._answered.is_set():
            # The shim died (or was killed, stopped by its command) between starting the
            # command and saying so; the launcher ended what it had started and reports it.
            # The call gets the command's end, without its pids.
            job.exit_code = msg.get("code")
            job.signal = msg.get("signal")
            job._reported = True
            job.exited.set()
            del self._jobs[job.job]
            job.done.set()
            job._answered.set()
        elif op == "exited":
            job.exit_code = msg.get("code")
            job.signal = msg.get("signal")
            job._reported = True
            job.lost = False
            job.exited.set()
            if msg.get("done"):
                del self._jobs[job.job]
                job.done.set()
                job._maybe_release()
        elif op == "done":
            del self._jobs[job.job]
            job.done.set()
            job._maybe_release()

    async def _end_abandoned(self, job: Job) -> None:
        with trio.CancelScope(shield=True), job.holding_tree() as shim_pid:
            if shim_pid is not None:
                await trio.to_thread.run_sync(
                    lambda: proctree.kill_tree(shim_pid, grace_s=0, include_root=False),
                    limiter=threads.limiter("kill", KILL_THREADS))

    def _mark_dead(self, reason: str) -> None:
        if self._death is not None:
            return
        if not self._closing:
            log.warning("the sandbox launcher (pid %s) is gone: %s; its last words: %s",
                        self.host_pid, reason, self.death_reason())
        self._death = reason
        self.alive = False
        for job in self._jobs.values():
            if not job.exited.is_set():
                job.lost = True
                job.exited.set()
            job.done.set()
            job._maybe_release()
            job._answered.set()
        for event in self._pongs.values():
            event.set()

    def gone_now(self) -> bool:
        """Whether the launcher or its wrapper has exited or is exiting, asked now: the reader
        task, which sets `alive`, may not have run since. Once this says so, `alive` says so
        too, so that every call of the session meets the death that session.list showed."""
        if self.alive and self._exiting():
            self._mark_dead("the sandbox launcher or its wrapper exited or was killed; close "
                            "the session and open a new one")
        return not self.alive

    def _exiting(self) -> bool:
        """The pidfds say so once a process has ended; a process killed a moment ago may not
        have run since (on a busy machine it waits for a CPU), and then only its pending
        SIGKILL says so; one that has run since is exiting, and has already let go of its
        namespaces (while its pidfd says alive, its pid is still its own)."""
        fds = [fd for fd in (self._launcher_fd, self._wrapper_fd) if fd != -1]
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

    def death_reason(self) -> str:
        """Why the launcher is gone: the last line it wrote to stderr, if any."""
        try:
            self._errfile.seek(0)
            lines = self._errfile.read()[-4000:].decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            lines = []
        return lines[-1] if lines else (self._death or "the sandbox launcher is gone")

    def _check_alive(self) -> None:
        if self._death is not None:
            raise LauncherDied(self._death)

    # ------------------------------------------------------------ requests

    async def spawn(self, argv: list[str], *, cwd: str, env: dict[str, str],
                    stdin: int, stdout: int, stderr: int,
                    rlimits: dict[str, tuple[int, int]] | None = None,
                    extra_fds: Sequence[int] = (), want_pid: bool = True,
                    held: bool = False) -> Job:
        """Start `argv` in the sandbox, in its own session, with stdin/stdout/stderr and then
        extra_fds as its fds 0, 1, 2, 3, ...; `argv[0]` is looked up on env's PATH. Returns
        once the command runs. LauncherError says why it could not start. With
        `want_pid=False` job.pid stays -1 (the command and its tree are still reached through
        the shim), which spares the shim a wakeup on the spawn's path. With `held=True` the
        shim stays this job's until `job.let_go()`, even once the job is done: a caller can
        answer first, and wake the shim for its next job after."""
        if not argv:
            raise LauncherError("empty command: give at least the program to run")
        fds = [stdin, stdout, stderr, *extra_fds]
        tries = 1
        while (job := await self._spawn_once(argv, cwd, env, fds, rlimits, want_pid, held,
                                             last_try=tries == SPAWN_TRIES)) is None:
            tries += 1
        return job

    async def _spawn_once(self, argv: list[str], cwd: str, env: dict[str, str],
                          fds: list[int], rlimits: dict[str, tuple[int, int]] | None,
                          want_pid: bool, held: bool, *, last_try: bool) -> Job | None:
        """One spawn request; None if the sandbox's code killed the shim that took it before
        it ran the command (and this is not the `last_try`): it may be sent again."""
        self._check_alive()
        job = Job(next(self._numbers), [str(a) for a in argv], want_pid, held)
        self._jobs[job.job] = job
        msg = {"op": "spawn", "job": job.job, "argv": job.argv, "cwd": cwd, "env": dict(env),
               "rlimits": {name: list(pair) for name, pair in (rlimits or {}).items()},
               "ack": want_pid}
        try:
            await self._send(msg, fds, spawn=True)
        except BaseException:
            del self._jobs[job.job]  # never sent: nothing will answer for it
            raise
        try:
            # A command may stop the shim that started it before that says `started`, or
            # the reader before it takes the request: the launcher resumes its shims. Not
            # a command between its fork and its exec, which its shim waits for.
            while True:
                with trio.move_on_after(SPAWN_STALL_S):
                    await job._answered.wait()
                if job._answered.is_set():
                    break
                await trio.to_thread.run_sync(self._resume_stopped_spawns)
        except BaseException:
            # Cancelled after the request went out: the command may start anyway, with nobody
            # left to stop it, so it is killed as soon as it does (see _dispatch); if it has
            # started already, now.
            job._abandoned = True
            job.let_go()
            if job._answered.is_set() and job._error is None and self._tasks is not None:
                self._tasks.start_soon(self._end_abandoned, job)
            raise
        if job._error is not None or (job.shim_pid == -1 and not self.alive):
            job.let_go()  # nobody gets the job to let it go later
        if job._unstarted and not last_try:
            return None
        if job._error is not None:
            raise (LauncherLimit if job._error_limit else LauncherError)(job._error)
        if job.shim_pid == -1 and not self.alive:
            job._abandoned = True
            raise LauncherDied(self._death or "the sandbox launcher died")
        return job

    def _resume_stopped_spawns(self) -> None:
        """SIGCONT what the session's code stopped (kill -STOP -1) while a shim started it:
        a child of a shim still bearing the shim's name has not reached its exec yet, and
        the shim waits in posix_spawn for that exec. A command that runs has its own name,
        and stays stopped if it was stopped."""
        try:
            shims = psutil.Process(self.host_pid).children()
        except psutil.Error:
            return
        for shim in shims:
            try:
                children = shim.children()
            except psutil.Error:
                continue
            for child in children:
                try:
                    if (child.status() == psutil.STATUS_STOPPED
                            and child.name() == shim.name() == SHIM_NAME):
                        child.resume()
                except psutil.Error:
                    pass

    async def ping(self) -> None:
        """Round trip to the launcher; LauncherDied if it is gone."""
        self._check_alive()
        n = next(self._numbers)
        event = self._pongs[n] = trio.Event()
        try:
            await self._send({"op": "ping", "n": n})
            await event.wait()
        finally:
            self._pongs.pop(n, None)
        self._check_alive()

    # ------------------------------------------------------------ closing

    async def aclose(self) -> None:
        """End every process of the sandbox and release everything; idempotent, shielded."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        with trio.CancelScope(shield=True):
            try:
                died_before = self._death is not None
                self._mark_dead("the sandbox launcher was closed")
                self._scope.cancel()
                await self._tasks_done.wait()
                # EOF tells the launcher to kill its whole tree, reap it and exit: the clean
                # way, which leaves no zombie for the host's init to collect.
                self._spawn_sock.close()
                self._sock.close()
                if not await self._wait_exits(CLEAN_EXIT_S):
                    await self._force_end()
                leftovers = self._orphaned_shims() if died_before else []
                if leftovers:
                    await trio.to_thread.run_sync(_kill_shims, leftovers)
            finally:
                self._release()
                self._closed.set()

    async def _wait_exits(self, timeout_s: float) -> bool:
        """Wait until the wrapper, the launcher and whatever runs between them (bwrap's init
        of the pid namespace, which exits only once the namespace is empty) have exited."""
        with trio.move_on_after(timeout_s):
            for fd in (self._wrapper_fd, self._launcher_fd, *self._between_fds):
                if fd != -1:
                    await trio.lowlevel.wait_readable(fd)
            self._proc.wait()
            return True
        return False

    async def _force_end(self) -> None:
        """The launcher did not end by itself (stopped, or hung): kill from the host. Its tree
        first, while it is still alive to adopt orphans, then the wrapper, which takes the pid
        namespace with it."""
        if self._launcher_fd != -1:
            await trio.to_thread.run_sync(
                lambda: proctree.kill_tree(self.host_pid, grace_s=0, include_root=False))
            try:
                signal.pidfd_send_signal(self._launcher_fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self._proc.kill()
        except ProcessLookupError:
            pass
        for fd in self._between_fds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Bounded only so that a process stuck in uninterruptible sleep cannot hang us.
        await self._wait_exits(10.0)

    def _orphaned_shims(self) -> list[int]:
        """Shims of unfinished jobs that outlived the launcher (possible only unsandboxed,
        where no pid namespace ends with it). A pid counts only if its process is a launcher
        copy that existed when the job started, so a reused pid is never taken for a shim."""
        shims = []
        for job in self._jobs.values():
            if job.shim_pid <= 0:
                continue
            try:
                proc = psutil.Process(job.shim_pid)
                if (self._launcher_py in proc.cmdline()
                        and proc.create_time() <= job._started_at + 0.05):
                    shims.append(job.shim_pid)
            except psutil.Error:
                pass
        return shims

    def _release(self) -> None:
        self._sock.close()
        self._spawn_sock.close()
        for fd in (self._launcher_fd, self._wrapper_fd, *self._between_fds):
            if fd != -1:
                trio.lowlevel.notify_closing(fd)
                os.close(fd)
        self._launcher_fd = self._wrapper_fd = -1
        self._between_fds = []
        self._errfile.close()


def _kill_shims(shims: list[int]) -> None:
    for shim in shims:
        # A shim exits by itself once its tree is gone; kill it too in case it is stopped.
        proctree.kill_tree(shim, grace_s=0, include_root=False)
        proctree.kill_tree(shim, grace_s=0, include_root=True)
