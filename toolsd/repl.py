"""repl.exec: one persistent interpreter per (session, turn, language), inside the sandbox.

The interpreter is a driver (driver/python_repl.py, driver/node_repl.js) started by the
session's launcher on first use: stdin /dev/null, stdout and stderr one pipe, the command pipe
as fd 3. Each request is one JSON line on fd 3; its answer is everything the driver writes up
to the sentinel of that request (toolsd/sentinel.py), so printed text can never shift the
answers of later calls.

Behaviour a caller sees:
- Requests on one REPL run one after the other. Requests sent together, without waiting for
  an answer, may run in either order (each request has its own task, and trio runs a batch
  of ready tasks in either order): wait for the answer before sending code that needs it.
- Timeout: SIGINT to the interpreter; if its sentinel comes within GRACE_S, status "timeout"
  and the state stays; if not, its whole tree is killed, status "timeout", `state_lost: true`,
  and the next call starts a fresh interpreter (`fresh: true`).
- Crash (the interpreter exits or closes its output before the sentinel: os._exit, a
  segfault, process.exit in node): status "crashed", `state_lost: true`, next call fresh.
- A cancelled request (the client went away, or `cancel`) is interrupted as on timeout, so
  the REPL is in sync for the next call.
- Output that arrives after a request's sentinel (a thread or a child of the user's code
  printing later) is kept and comes at the start of the next request's output, the last
  LATE_BYTES of it at most.
- A notice line for timeout and crash ends the output (within max_output_chars).

Resource handling: a Repl belongs to its Turn; `aclose()` (turn.end, session.close) kills the
interpreter's tree and ends its output pump, which runs in the session's nursery. The
daemon's end of every pipe belongs to the running `_Interpreter`, and is closed when its pump
ends (output) or when it is killed (commands).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
import uuid as uuidlib

import msgspec
import trio

from . import answer as answers
from .output import HeadTail, Ring
from .protocol import BAD_PARAMS, NOT_FOUND, ReplExecParams, ReplExecResult, ToolsdError
from .sentinel import Sentinel, SentinelScanner
from .session import DRIVER_DIR
from .shell import end_tree, pump, signal_name, spawn_with_pipe

__all__ = ["Repl", "execute", "GRACE_S", "LATE_BYTES"]

# How long an interpreter may take to answer SIGINT before it is killed with its tree.
GRACE_S = 2.0
# After the interpreter exits without a sentinel, how long we read the rest of its output
# (the sentinel may still be in the pipe) before killing whatever holds the pipe open.
DRAIN_S = 0.5
# Output printed between requests, kept for the next one (the most recent part).
LATE_BYTES = 64 * 1024

DRIVERS = {
    "python": os.path.join(DRIVER_DIR, "python_repl.py"),
    "node": os.path.join(DRIVER_DIR, "node_repl.js"),
}


async def execute(session, p: ReplExecParams) -> ReplExecResult:
    """Run `p.code` on the REPL of (session, p.turn, p.language), starting it if needed."""
    session.check_open()
    turn = session.turn(p.turn)
    repl = turn.repls.get(p.language)
    if repl is None:
        argv = interpreter_argv(session.launcher.info, p.language)
        if p.language == "python" and session.launcher.info.get("python3"):
            argv[0] = await python_executable(session, argv[0])
        repl = turn.repls.get(p.language)  # another call may have made it meanwhile
        if repl is None:
            repl = turn.repls[p.language] = Repl(p.language, argv, turn.id)
    return await repl.execute(session, p)


async def python_executable(session, python3: str) -> str:
    """The real interpreter behind the sandbox's `python3`, asked once per session. It is
    often a wrapper script (a pyenv shim costs some 0.2 s of bash per start), and every turn
    starts a fresh interpreter. Asked in the workspace, as version files there may pick it."""
    if session.python_exe is None:
        job, read_fd = await spawn_with_pipe(
            session, [python3, "-c", "import sys; print(sys.executable)"],
            cwd=session.workspace, env=session.env)
        out = bytearray()
        with trio.move_on_after(30):
            await pump(read_fd, out.extend)
            await job.exited.wait()
        if not job.exited.is_set():
            await end_tree(job, 0)
        path = out.decode(errors="replace").strip()
        ok = job.exit_code == 0 and os.path.isabs(path) and "\n" not in path
        session.python_exe = path if ok else python3
    return session.python_exe


def interpreter_argv(info: dict, language: str) -> list[str]:
    """The driver's command line: python on the sandbox's python3 (the user's packages are
    there), else the daemon's own interpreter; node only where the sandbox has one."""
    if language == "python":
        return [info.get("python3") or sys.executable, DRIVERS["python"]]
    if language == "node":
        node = info.get("node")
        if not node:
            raise ToolsdError(BAD_PARAMS, "language 'node' is not available: there is no node "
                              "on this session's PATH; install Node.js or use language "
                              "'python'")
        return [node, DRIVERS["node"]]
    raise ToolsdError(BAD_PARAMS, f"unknown language {language!r}; use 'python' or 'node'")


class Repl:
    """The REPL of one (turn, language): serialises its requests and keeps one interpreter
    running, starting a new one when the last died or was killed."""

    def __init__(self, language: str, argv: list[str], turn_id: str = ""):
        self.language = language
        self.argv = argv
        self.turn_id = turn_id
        self.closed = False
        self._lock = trio.Lock()
        self._interp: _Interpreter | None = None
        self._late: Ring | None = None  # output printed while no request was in flight

    # The running interpreter's framing state (None before the first start).
    @property
    def uuid(self) -> str | None:
        return self._interp.uuid if self._interp else None

    @property
    def seq(self) -> int:
        return self._interp.seq if self._interp else 0

    @property
    def pid(self) -> int | None:
        """Host pid of the running interpreter."""
        return self._interp.job.pid if self._interp else None

    async def execute(self, session, p: ReplExecParams) -> ReplExecResult:
        started = time.monotonic()
        # An uncontended lock is taken without a trip through trio's scheduler (about 10 us
        # on a slow machine, against some 200 us for the whole driver round trip).
        if self._lock.locked():
            await self._lock.acquire()
        else:
            self._lock.acquire_nowait()
        try:
            if self.closed:
                raise ToolsdError(NOT_FOUND, f"turn {self.turn_id} has ended; start a new one "
                                  f"with turn.begin")
            interp = self._interp
            fresh = interp is None or interp.gone
            if fresh:
                if interp is not None:
                    await interp.kill()  # what its children may have left running
                session.check_open()
                interp = self._interp = await _Interpreter.start(session, self.argv,
                                                                 self._late_feed)
                if self.closed:
                    # The turn ended while the interpreter started: aclose did not see it.
                    await interp.kill()
                    raise ToolsdError(NOT_FOUND, f"turn {self.turn_id} ended while its "
                                      f"interpreter started; start a new turn")
            out = HeadTail(p.max_output_chars)
            late_dropped = self._take_late(out)
            result = functools.partial(_result, out, late_dropped, fresh, started)
            answer = answers.current()
            sent = None
            on_sentinel = None
            if answer is not None:
                # Sent by the task that reads the sentinel, a scheduler pass sooner.
                def on_sentinel(ok: bool) -> None:
                    nonlocal sent
                    done = result("ok" if ok else "error", False, "")
                    if answer.send(done):
                        sent = done
            status, state_lost, notice = await self._run(interp, p, out, on_sentinel)
        finally:
            self._lock.release()
        return sent or result(status, state_lost, notice)

    async def _run(self, interp: _Interpreter, p: ReplExecParams, out: HeadTail,
                   on_sentinel=None):
        """(status, state_lost, notice) of one request. `on_sentinel(ok)` is called by the
        reading task if the sentinel comes in time."""
        finished = False
        try:
            with trio.move_on_after(p.timeout_s) as deadline:
                interp.on_sentinel = on_sentinel
                await interp.send(p.code, out.feed)
                await interp.settled()
            interp.on_sentinel = None  # a sentinel after SIGINT is not the answer
            if deadline.cancelled_caught:
                result = await self._interrupt(interp, p.timeout_s)
            else:
                result = await self._answer(interp)
            finished = True
            return result
        finally:
            interp.on_sentinel = None
            if not finished:
                # Cancelled: the request's answer is not wanted, but the interpreter must
                # be back in sync (or gone) before the next request takes the lock.
                with trio.CancelScope(shield=True):
                    await self._interrupt(interp, None)

    async def _answer(self, interp: _Interpreter):
        if interp.sentinel is None:
            await interp.drain()
        if interp.sentinel is not None:
            # "interrupted" without our SIGINT: the code raised KeyboardInterrupt itself.
            return ("ok" if interp.sentinel.ok else "error"), False, ""
        await interp.kill()
        return "crashed", True, (f"[the {self.language} interpreter died ({interp.how_it_ended()})"
                                 f"; its state is lost and the next call starts a fresh one]")

    async def _interrupt(self, interp: _Interpreter, timeout_s: float | None):
        """SIGINT, then the tree if it does not answer within GRACE_S."""
        why = f"timed out after {timeout_s:g} s" if timeout_s is not None else "cancelled"
        if interp.sentinel is None and interp.sent == "all" and not interp.gone:
            interp.send_signal(signal.SIGINT)
            with trio.move_on_after(GRACE_S):
                await interp.settled()
            if interp.sentinel is None and interp.gone:
                await interp.drain()
        if interp.sentinel is not None:
            return "timeout", False, f"[{why}: interrupted; the state is kept]"
        if interp.sent == "none" and not interp.gone:
            # The request never reached the interpreter: nothing to undo.
            return "timeout", False, f"[{why} before the code was sent]"
        await interp.kill()
        return "timeout", True, (f"[{why}: the interpreter did not stop within {GRACE_S:g} s of "
                                 f"SIGINT and was killed; its state is lost and the next call "
                                 f"starts a fresh one]")

    def _late_feed(self, data: bytes) -> None:
        if self._late is None:
            self._late = Ring(LATE_BYTES)
        self._late.append(data)

    def _take_late(self, out: HeadTail) -> int:
        """Put output printed between requests at the head of `out`; returns the bytes of it
        that were not kept."""
        late, self._late = self._late, None
        if late is None:
            return 0
        data, _next, dropped = late.read(0, LATE_BYTES)
        out.feed(data)
        return dropped

    async def aclose(self) -> bool:
        """Kill the interpreter's tree; True if it was running. Later requests are refused."""
        self.closed = True
        interp = self._interp
        if interp is None:
            return False
        with trio.CancelScope(shield=True):
            alive = not interp.job.exited.is_set()
            await interp.kill()
        return alive


class _Interpreter:
    """One driver process: its job, the command pipe, the framing state and the pump task."""

    def __init__(self, job, cmd_fd: int, idle_sink):
        self.job = job
        self.uuid = uuidlib.uuid4().hex
        self.scanner = SentinelScanner(self.uuid)
        self.seq = 0
        self.sentinel: Sentinel | None = None
        self.sent = "all"  # of the request in flight: "none", "some" or "all"
        self.eof = trio.Event()
        self._cmd_fd = cmd_fd
        self._idle_sink = idle_sink
        self._sink = idle_sink
        self._wake = trio.Event()
        self._pump_scope = trio.CancelScope()
        self._killing = False
        self._killed = trio.Event()
        # Called (with whether the code ran without error) by the task that reads the
        # sentinel of the request in flight, once; it must not raise.
        self.on_sentinel = None

    @classmethod
    async def start(cls, session, argv: list[str], idle_sink) -> _Interpreter:
        cmd_r, cmd_w = os.pipe2(os.O_CLOEXEC)
        try:
            job, read_fd = await spawn_with_pipe(session, argv, cwd=session.workspace,
                                                 env=session.env, extra_fds=[cmd_r])
        except BaseException:
            os.close(cmd_w)
            raise
        finally:
            os.close(cmd_r)  # the interpreter holds the only copy: its exit gives EPIPE
        self = cls(job, cmd_w, idle_sink)
        os.set_blocking(cmd_w, False)
        session.nursery.start_soon(self._pump, read_fd)
        session.nursery.start_soon(self._watch_exit)
        try:
            await self._write(self.uuid.encode() + b"\n")
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.kill()
            raise
        return self

    @property
    def gone(self) -> bool:
        """The interpreter exited, or closed its output (it can answer nothing more)."""
        return self.job.exited.is_set() or self.eof.is_set() or self._killing

    def how_it_ended(self) -> str:
        if self.job.lost:
            return "the sandbox's launcher went away"
        if self.job.signal is not None:
            return f"killed by {signal_name(self.job.signal)}"
        if self.job.exit_code is not None:
            return f"exit code {self.job.exit_code}"
        return "it closed its output"

    # ------------------------------------------------------------ requests

    async def send(self, code: str, sink) -> None:
        """Send one request; its output goes to `sink` until its sentinel."""
        line = msgspec.json.encode(code) + b"\n"
        self.sentinel = None
        self._wake = trio.Event()
        self.sent = "none"
        await self._write(line)
        # Only now is the request numbered: the driver counts the lines it received, so a
        # request cancelled before its first byte went out must not take a number. No
        # checkpoint lies between the write and these lines, and the driver cannot answer a
        # request before reading all of it.
        self.seq += 1
        self.scanner.expect(self.seq)
        self._sink = sink

    async def settled(self) -> None:
        """Until the request in flight is answered or the interpreter is gone."""
        while self.sentinel is None and not self.gone:
            await self._wake.wait()
            self._wake = trio.Event()

    def send_signal(self, sig: int) -> None:
        if self.job.pid > 0 and not self.job.exited.is_set():
            try:
                os.kill(self.job.pid, sig)
            except ProcessLookupError:
                pass

    async def drain(self) -> None:
        """The interpreter is gone: read the rest of its output, killing whatever it left
        holding the pipe if the rest does not come soon."""
        with trio.move_on_after(DRAIN_S):
            await self.eof.wait()
        if not self.eof.is_set():
            await self.kill()

    async def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._cmd_fd < 0:
                return  # killed meanwhile
            try:
                n = os.write(self._cmd_fd, view)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_writable(self._cmd_fd)
                except trio.ClosedResourceError:
                    return  # killed meanwhile
                continue
            except OSError:
                return  # the interpreter is gone (EPIPE): settled() sees it
            view = view[n:]
            self.sent = "some"
        self.sent = "all"

    # ------------------------------------------------------------ output

    async def _pump(self, read_fd: int) -> None:
        try:
            with self._pump_scope:
                await pump(read_fd, self._on_data)
        finally:
            rest = self.scanner.flush()
            if rest:
                self._sink(rest)
            self.eof.set()
            self._wake.set()

    def _on_data(self, data: bytes) -> None:
        while True:
            out, sentinel = self.scanner.feed(data)
            if out:
                self._sink(out)
            if sentinel is None:
                return
            # Set synchronously with the sentinel: whatever follows it is late output.
            self.sentinel = sentinel
            self._sink = self._idle_sink
            self._wake.set()
            answered, self.on_sentinel = self.on_sentinel, None
            if answered is not None:
                answered(sentinel.ok)
            data = b""

    async def _watch_exit(self) -> None:
        await self.job.exited.wait()
        self._wake.set()

    # ------------------------------------------------------------ ending

    async def kill(self) -> None:
        """End the interpreter's whole tree and its pump; idempotent, shielded."""
        with trio.CancelScope(shield=True):
            if self._killing:
                await self._killed.wait()
                return
            self._killing = True
            self._wake.set()
            try:
                fd, self._cmd_fd = self._cmd_fd, -1
                trio.lowlevel.notify_closing(fd)
                os.close(fd)
                await end_tree(self.job, 0)
                # Every writer is dead: the pipe's rest is there to read at once, unless a
                # descriptor escaped the tree; then we stop reading anyway.
                with trio.move_on_after(DRAIN_S):
                    await self.eof.wait()
                self._pump_scope.cancel()
            finally:
                self._killed.set()


def _result(out: HeadTail, late_dropped: int, fresh: bool, started: float, status: str,
            state_lost: bool, notice: str) -> ReplExecResult:
    output, truncated = _render(out, notice)
    return ReplExecResult(
        status=status,
        output=output,
        output_bytes=out.total + late_dropped,
        truncated=truncated or late_dropped > 0,
        fresh=fresh,
        state_lost=state_lost,
        duration_s=round(time.monotonic() - started, 6),
    )


def _render(out: HeadTail, notice: str) -> tuple[str, bool]:
    """The output within max_output_chars, the notice line (if any, and if it fits) last."""
    if not notice:
        return out.result()
    budget = out.max_chars - len(notice) - 1
    if budget < 0:
        return out.result()
    out.max_chars = budget  # HeadTail keeps enough bytes for any smaller budget
    text, truncated = out.result()
    if text and not text.endswith("\n"):
        text += "\n"  # budget kept room for it
    return text + notice, truncated
