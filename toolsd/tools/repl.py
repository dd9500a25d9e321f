"""repl.exec: one persistent interpreter per (session, turn, language), inside the sandbox.

The interpreter is a driver (driver/python_repl.py, driver/node_repl.js) started by the
session's launcher on first use: stdin /dev/null, stdout and stderr one pipe, the command pipe
as fd 3, the interrupt pipe as fd 4. Each request is one JSON line on fd 3; its answer is
everything the driver writes up to the sentinel of that request (tools/sentinel.py), so
printed text can never shift the answers of later calls.

Interrupts are addressed to a request: its number, as a line on fd 4, then WAKE_SIGNAL
(interpreter.py) to the driver, which acts only on an interrupt for the request it is running
(or is about to run), and ignores one for a request that has already ended. A bare SIGINT cannot be: it may land
after the request it was meant for ended (node ends itself on a SIGINT that lands just after
vm's breakOnSigint has ended), and C's system() ignores it while it waits.

Behaviour a caller sees:
- Requests on one REPL run one after the other. Requests sent together, without waiting for
  an answer, may run in either order (those that wait have a task each, and trio runs a
  batch of ready tasks in either order): wait for the answer before sending code that needs
  it.
- Timeout: the request is interrupted (above), and the processes it started get SIGINT, as
  a terminal's ^C reaches its foreground job (what the code waits on: os.system's shell, a
  subprocess); those still there after GRACE_S - ESCALATE_S are ended. If its sentinel comes
  within GRACE_S, status "timeout" and the state stays, and whatever the request started
  that still runs is ended (proctree.end_since) and counted (`processes_ended`); processes
  started by earlier requests are left alone. If not, its whole tree is killed, status
  "timeout", `state_lost: true`, and the next call starts a fresh interpreter
  (`fresh: true`).
- Crash (the interpreter exits or closes its output before the sentinel: os._exit, a
  segfault, process.exit in node): status "crashed", `state_lost: true`, next call fresh.
- A cancelled request (the client went away, or `cancel`) is interrupted and its processes
  ended as on timeout, so the REPL is in sync for the next call.
- A call that finds the interpreter dead says `state_lost: true` unless an answer already
  said so (one cut short by a cancel could not).
- Output that arrives after a request's sentinel (a thread or a child of the user's code
  printing later) is kept and comes at the start of the next request's output, the last
  LATE_BYTES of it at most.
- A notice line for timeout and crash ends the output (within max_output_chars).
- `images` (1.1 "figures"): the pictures the driver listed with the request's sentinel,
  saved in FIGURES_FOLDER of the session's scratch (driver/python_figures.py).

How a request runs: with a task of its own (`Repl.execute`) when it must wait for the REPL or
start its interpreter; without one (`start_detached`, tools.calls.Detached) when the REPL is
running and idle, the usual case. Then the task that read the request writes its code and
goes back to reading, and the task reading the interpreter's output answers it on the
sentinel. Its deadline is kept by the interpreter's watch task, whose one alarm moves only
when a request's deadline comes sooner; a timeout, a cancel or the interpreter's end hands
the rest of the request to a task (`Run.finish`, repl_run.py), which ends it as `execute`
would.

Resource handling: a Repl belongs to its turn (repl_turns.py); `aclose()` (turn.end,
session.close) kills the interpreter's tree and ends its output pump and watch task, which
run in the session's nursery. The daemon's end of every pipe belongs to the running
`Interpreter` (interpreter.py), and is closed when its pump ends (output) or when it is
killed (commands). A request's lock on its REPL is owned by its Run from `_begin` and
released in `end_run`, when the Run is answered (repl_run.RunState).
"""

from __future__ import annotations

import functools
import os
import posixpath
import sys
import time
from typing import TYPE_CHECKING, Callable

import trio

from driver import NODE_REPL, PYTHON_REPL
from toolsd.sandbox.launch import proctree
from toolsd.sandbox.launch.channel import Ready
from toolsd.sandbox.launch.spawning import end_tree, pump, spawn_with_pipe
from toolsd.tools.interpreter import START_SLOT_S, Interpreter, Sending
from toolsd.tools.output import Ring
from toolsd.tools.repl_memory import limit_interpreter
from toolsd.tools.repl_run import Run, RunState
from toolsd.wire.protocol import BAD_PARAMS, NOT_FOUND, ReplExecParams, ReplExecResult, ToolsdError

if TYPE_CHECKING:
    from toolsd.tools.session_view import SessionView
    from toolsd.tools.answers import Answer, Detached
    from toolsd.tools.spill import Spills

__all__ = ["Repl", "execute", "start_detached", "GRACE_S", "LATE_BYTES"]

# How long an interrupted interpreter may take to answer before it is killed with its tree.
GRACE_S = 2.0
# The last part of GRACE_S: the processes the call started that are still there then (they
# ignore SIGINT, and the code may be waiting on one) are ended for it to come back.
ESCALATE_S = 1.0
# Output printed between requests, kept for the next one (the most recent part).
LATE_BYTES = 64 * 1024

DRIVERS = {
    "python": PYTHON_REPL,
    "node": NODE_REPL,
}
# In the session's scratch: where the Python driver saves the pictures of its calls (1.1
# "figures"; driver/python_figures.py bounds their number and size).
FIGURES_FOLDER = "toolsd-figures"


async def execute(session: SessionView, p: ReplExecParams,
                  answer: Answer | None = None) -> ReplExecResult:
    """Run `p.code` on the REPL of (session, p.turn, p.language), starting it if needed.
    `answer`: the request's, for its output events (`p.stream`)."""
    session.check_open()
    turn = session.turns.get(p.turn, session.id)
    repl = turn.repl(p.language)
    if repl is None:
        argv = interpreter_argv(session.sandbox.launcher.ready, p.language)
        if p.language == "python":
            argv.append(posixpath.join(session.spills.visible, FIGURES_FOLDER))
            if session.sandbox.launcher.ready.python3:
                argv[0] = await python_executable(session, argv[0])
        # Another call may have made it meanwhile: then that one is the turn's.
        repl = turn.repl_for(p.language,
                             lambda: Repl(p.language, argv, turn.id, session.spills))
    return await repl.execute(session, p, answer)


def start_detached(session: SessionView, p: ReplExecParams, detached: Detached) -> bool:
    """repl.exec without a task of its own (tools.calls.Detached), when its REPL is running and
    idle: the code goes to the interpreter now, and the task reading the interpreter's output
    answers. False when it needs a task (the turn's first call, a busy REPL)."""
    session.check_open()
    repl = session.turns.get(p.turn, session.id).repl(p.language)
    return repl is not None and repl.start_detached(p, detached, session)


async def python_executable(session: SessionView, python3: str) -> str:
    """The real interpreter behind the sandbox's `python3`, asked once per session: it is
    often a wrapper script (a pyenv shim runs bash on every start), and every turn starts a
    fresh interpreter. Asked in the workspace (version files there may pick it), with -S
    (the site's imports cannot change the answer, and cost more than the rest); bounded and
    lowered as the driver's start (interpreter.py, repl_priority.py): `python3` if not
    answered within START_SLOT_S."""
    if session.python_exe is not None:
        return session.python_exe
    async with session.host.interpreter_starts:
        if session.python_exe is not None:
            return session.python_exe  # asked by another call while this one waited
        job, read_fd = await spawn_with_pipe(
            session.sandbox, [python3, "-S", "-c", "import sys; print(sys.executable)"],
            cwd=session.workspace, env=session.env)
        out = bytearray()
        with trio.move_on_after(START_SLOT_S):
            await session.host.start_priority.while_starting(
                job.pid, functools.partial(pump, read_fd, out.extend))
            await job.exited.wait()
        if not job.exited.is_set():
            await end_tree(job, 0)
        path = out.decode(errors="replace").strip()
        ok = job.exit_code == 0 and os.path.isabs(path) and "\n" not in path
        session.remember_python(path if ok else python3)
    return session.python_exe


def interpreter_argv(ready: Ready, language: str) -> list[str]:
    """The driver's command line: python on the sandbox's python3 (the user's packages are
    there), else the daemon's own interpreter; node only where the sandbox has one."""
    if language == "python":
        return [ready.python3 or sys.executable, DRIVERS["python"]]
    if language == "node":
        node = ready.node
        if not node:
            raise ToolsdError(BAD_PARAMS, "language 'node' is not available: there is no node "
                              "on this session's PATH; install Node.js or use language "
                              "'python'")
        # --expose-internals: node's own REPL transform for top-level await
        # (internal/repl/await), which the driver uses (see its header).
        return [node, "--expose-internals", DRIVERS["node"]]
    raise ToolsdError(BAD_PARAMS, f"unknown language {language!r}; use 'python' or 'node'")


class Repl:
    """The REPL of one (turn, language): serialises its requests and keeps one interpreter
    running, starting a new one when the last died or was killed."""

    def __init__(self, language: str, argv: list[str], turn_id: str = "",
                 spills: Spills | None = None):
        self.language = language
        self.argv = argv
        self.turn_id = turn_id
        self.spills = spills  # the session's, for requests with `spill`
        self.closed = False
        # (code, message) for a request that aclose cut off or that waited behind one, when
        # the session's close ended this REPL (see aclose).
        self._cut_off: tuple[str, str] | None = None
        # One request at a time, in the order they came. A semaphore, not a lock: a request
        # without a task (start_detached) is ended by the task that reads its sentinel.
        self._lock = trio.Semaphore(1)
        self._interp: Interpreter | None = None
        self._late: Ring | None = None  # output printed while no request was in flight

    async def execute(self, session: SessionView, p: ReplExecParams,
                      answer: Answer | None = None) -> ReplExecResult:
        started = time.monotonic()
        # A free lock is taken without a trip through trio's scheduler, a sizeable part of
        # the whole driver round trip.
        if self._lock.value:
            self._lock.acquire_nowait()
        else:
            await self._lock.acquire()
        try:
            if self.closed:
                raise self.ended()
            interp = self._interp
            fresh = interp is None or interp.gone
            lost = fresh and interp is not None and not interp.loss_told
            if fresh:
                if interp is not None:
                    await interp.kill()  # what its children may have left running
                session.check_open()
                # Bounded across sessions, until the driver has started (interpreter.py).
                async with session.host.interpreter_starts:
                    interp = self._interp = await Interpreter.start(session, self.argv,
                                                                     self._late_feed)
                    limit_interpreter(interp.job.pid, self.language, session.limits.memory_mb)
                    if not self.closed:
                        await interp.warm_up(session.host.start_priority)
                if self.closed:
                    # The turn ended while the interpreter started: aclose did not see it.
                    await interp.kill()
                    raise self.ended()
            run = Run(self, interp, p, fresh, started, answer)
        except BaseException:
            self._lock.release()  # no Run took it
            raise
        run.lost_before = lost
        self._begin(run)
        return await run.finish()

    def start_detached(self, p: ReplExecParams, detached: Detached, session: SessionView) -> bool:
        """Send `p` to the running interpreter and return, leaving the answer to the task
        that reads its output (see start_detached); False if the REPL is not idle."""
        interp = self._interp
        if self.closed or not self._lock.value or interp is None or interp.gone or p.stream:
            return False  # a streaming request emits from a task of its own
        # Made before the lock is taken (nothing runs in between): if it raises, the lock
        # stays free.
        run = Run(self, interp, p, False, time.monotonic())
        self._lock.acquire_nowait()
        self._begin(run)
        run.session = session

        async def rest() -> ReplExecResult:
            return await session.reported(await run.finish())

        detached.rest = rest
        run.detach(detached)
        if interp.sent is Sending.ALL:
            interp.wait_detached(run)
        else:
            detached.escalate()  # the pipe is full, or the interpreter gone: a task sees to it
        return True

    def _begin(self, run: Run) -> None:
        """Start sending the request to its interpreter, the lock being ours; from here the
        Run owns it, until `end_run`."""
        run.interp.begin(run.line, run.feed, run.live and run.live.room)

    def end_run(self, run: Run) -> None:
        """`run` is answered (RunState.ANSWERED): the next request may have the REPL. With
        execute's error path before a Run exists, the only place the lock is released."""
        assert run.state is RunState.ANSWERED
        self._lock.release()

    async def carry_out(self, run: Run):
        """(status, state_lost, notice, processes_ended) of a request begun on its
        interpreter: the rest of its code sent, then its sentinel within its deadline, or the
        interrupt."""
        interp = run.interp
        finished = False
        try:
            # A request handed over because it was cancelled must not pass for answered,
            # even when its sentinel came meanwhile.
            await trio.lowlevel.checkpoint_if_cancelled()
            with trio.move_on_at(run.deadline) as deadline:
                await interp.send_rest()
                await interp.settled()
            run.release()  # the interrupt and the drain read on, whatever the client does
            if deadline.cancelled_caught:
                result = await self._interrupt(run, run.p.timeout_s)
            else:
                result = await self._answer(interp)
            finished = True
            return result
        finally:
            if not finished:
                # Cancelled: the request's answer is not wanted, but the interpreter must
                # be back in sync (or gone), and what the request started ended, before the
                # next request takes the lock.
                run.release()
                with trio.CancelScope(shield=True):
                    await self._interrupt(run, None)

    async def _answer(self, interp: Interpreter):
        if interp.sentinel is None:
            await interp.drain()
        if interp.sentinel is not None:
            # "interrupted" without our asking: the code raised KeyboardInterrupt itself.
            return ("ok" if interp.sentinel.ok else "error"), False, "", 0
        others = await interp.kill()
        return "crashed", True, (f"[the {self.language} interpreter died ({interp.how_it_ended()})"
                                 f"; its state is lost and the next call starts a fresh one"
                                 f"{_ended_note(others, 'of its processes')}]"), others

    async def _interrupt(self, run: Run, timeout_s: float | None):
        """Interrupt the request and the processes it started; once the interpreter has
        answered, end what the request started that still runs. The whole tree if the
        interpreter does not answer within GRACE_S."""
        interp = run.interp
        why = f"timed out after {timeout_s:g} s" if timeout_s is not None else "cancelled"
        if interp.sent is Sending.NONE and not interp.gone:
            # The request never reached the interpreter: nothing to undo.
            return "timeout", False, f"[{why} before the code was sent]", 0
        interrupted = interp.sentinel is None and interp.sent is Sending.ALL and not interp.gone
        signalled = frozenset()
        ended = 0
        if interrupted:
            interp.interrupt()
            # What the code waits on (os.system's shell, a subprocess) must end for the code
            # to get back to the interpreter and stop: SIGINT first, as a terminal would, and
            # the end (SIGTERM, SIGKILL) for what ignores it.
            signalled = await run.in_tree(proctree.interrupt_since) or frozenset()
            with trio.move_on_after(GRACE_S - ESCALATE_S):
                await interp.settled()
            if interp.sentinel is None and not interp.gone:
                ended = await run.end_processes(signalled)
                signalled = frozenset()
                with trio.move_on_after(ESCALATE_S):
                    await interp.settled()
            if interp.sentinel is None and interp.gone:
                await interp.drain()
        if interp.sentinel is not None:
            ended += await run.end_processes(signalled)
            return "timeout", False, (f"[{why}: interrupted; the state is kept"
                                      f"{_ended_note(ended, 'it started')}]"), ended
        others = await interp.kill()
        if interrupted:
            how = f"the interpreter did not stop within {GRACE_S:g} s and was killed"
        elif interp.sent is Sending.SOME:
            how = "only part of the code had reached the interpreter, which was killed"
        else:
            how = f"the interpreter died ({interp.how_it_ended()})"
        return "timeout", True, (f"[{why}: {how}; its state is lost and the next call starts a "
                                 f"fresh one{_ended_note(others, 'of its processes')}]"), others

    def _late_feed(self, data: bytes) -> None:
        if self._late is None:
            self._late = Ring(LATE_BYTES)
        self._late.append(data)

    def take_late(self, feed: Callable[[bytes], None]) -> int:
        """Feed output printed between requests first to a request's `feed`; returns the
        bytes of it that were not kept."""
        late, self._late = self._late, None
        if late is None:
            return 0
        data, _next, dropped = late.read(0, LATE_BYTES)
        feed(data)
        return dropped

    @property
    def cut_off(self) -> bool:
        """The session's close ended this REPL (see aclose)."""
        return self._cut_off is not None

    def ended(self) -> ToolsdError:
        """The error for a request on this REPL once it is closed."""
        if self._cut_off is not None:
            return ToolsdError(*self._cut_off)
        return ToolsdError(NOT_FOUND, f"turn {self.turn_id} has ended; start a new one with "
                                      f"turn.begin")

    async def aclose(self, cut_off: ToolsdError | None = None) -> bool:
        """Kill the interpreter's tree; True if it was running. Later requests are refused;
        with `cut_off` (the session is closing), the request it cuts off is answered that
        too, rather than as a crash of its interpreter."""
        self.closed = True
        if cut_off is not None:
            self._cut_off = (cut_off.code, cut_off.message)
        interp = self._interp
        if interp is None:
            return False
        with trio.CancelScope(shield=True):
            alive = not interp.job.exited.is_set()
            await interp.kill()
        return alive


def _ended_note(count: int, whose: str) -> str:
    """The end of a notice that counts ended processes ("" for none)."""
    if not count:
        return ""
    if count == 1:
        return f"; 1 process {whose} was ended"
    return f"; {count} processes {whose} were ended"
