"""One client's connection: read frames, run each request in its own task (or none, for a
method that can: tools.answers.Detached, and a row that says `instant` or has its answer
`now`, answered at once), answer through one send lock per connection.

Resource handling: serve.py's `serve()` owns the listening socket and every connection; a
connection owns its in-flight requests (its RequestTable, requests.py, where the invariant
of their slots is), which are cancelled when it closes: their tasks directly, and those
without a task by handing them one (a closing connection never ends a session: sessions
belong to the Supervisor).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Callable, Final

import msgspec
import trio

from toolsd.daemon import dispatch
from toolsd.daemon.requests import Entry, RequestTable, State
from toolsd.daemon.tenants import LOCAL
from toolsd.runtime.fdio import READ_SIZE, FdReader, write_all
from toolsd.sandbox.errors import SandboxError
from toolsd.tools.wire_errors import as_wire
from toolsd.wire.events import encode_event
from toolsd.wire.framing import FrameReader, FrameTooLarge, encode_frame
from toolsd.wire.protocol import (
    BAD_FRAME,
    BAD_PARAMS,
    CANCELLED,
    FRAME_TOO_LARGE,
    INTERNAL,
    LIMIT_EXCEEDED,
    NOT_FOUND,
    UNKNOWN_METHOD,
    ErrorBody,
    Reply,
    Request,
    ToolsdError,
    encode_reply,
    request_decoder,
)

if TYPE_CHECKING:
    from toolsd.daemon.supervisor import Supervisor

log = logging.getLogger("toolsd.server")

# Requests one connection may have running at once. Past that, a request is answered at once
# with limit_exceeded (a `cancel` is still carried out), so memory stays bounded and a client
# can always cancel; a client that does not read its answers is slowed by its socket.
MAX_IN_FLIGHT = 256
# Frames of one read handled before the connection lets other tasks run.
FRAMES_PER_TURN = 4


class Connection:
    def __init__(self, stream: trio.SocketStream, supervisor: Supervisor, max_frame: int,
                 tenant: str = LOCAL):
        self.stream = stream
        self.supervisor = supervisor
        self.max_frame = max_frame
        self.tenant = tenant  # whose ids it may name (daemon/tenants.py)
        self._call_now = dispatch.Call(supervisor, None, tenant)  # see _answer_now
        self.fd = stream.socket.fileno()
        self.send_lock = trio.Lock()
        self.requests = RequestTable(MAX_IN_FLIGHT, start_task=self._start_task,
                                     deliver=self._deliver, send_event=self.send_event)
        # The rest of an answer that the socket did not take at once: it goes out before
        # anything else (see _write_now).
        self._unsent = b""

    async def send(self, reply: Reply) -> None:
        await self._write(self._encode(reply))

    def _encode(self, reply: Reply) -> bytes:
        try:
            frame = encode_frame(encode_reply(reply), self.max_frame)
        except FrameTooLarge as e:
            reply = Reply(id=reply.id, error=ErrorBody(INTERNAL, f"the reply was too large: {e}"))
            frame = encode_frame(encode_reply(reply))
        except Exception as e:  # e.g. a str that is not valid UTF-8 (a surrogate from a path)
            log.exception("could not encode the reply to request %s", reply.id)
            reply = Reply(id=reply.id, error=ErrorBody(INTERNAL, f"the reply could not be "
                                                                 f"encoded: {e}"))
            frame = encode_frame(encode_reply(reply))
        return frame

    async def _write(self, frame: bytes, then: Callable[[], None] | None = None) -> None:
        """Write `frame` whole. `then()` runs as soon as the frame has started out (its first
        write), or at once if it must wait behind another frame: work that should not delay
        the answer, nor wait on a client that reads slowly or not at all."""
        # The socket directly (see fdio), and the lock without a yield when nobody holds it:
        # each pass through the scheduler costs more than the rest of a small request.
        if self.send_lock.locked():
            if then is not None:
                then()
                then = None
            await self.send_lock.acquire()
        else:
            self.send_lock.acquire_nowait()
        try:
            if self._unsent:
                frame, self._unsent = self._unsent + frame, b""
            await write_all(self.fd, frame, started=then)
        except (OSError, trio.ClosedResourceError):
            pass  # the client went away; its requests are being cancelled
        finally:
            self.send_lock.release()

    async def send_event(self, request_id: int, data: str | bytes) -> None:
        """Write one event frame of a streaming request (answers.Answer.emit), returning once
        it is out: the socket is the flow control, so a request has at most one event on its
        way and a client that does not read holds the tool that emits. Cancelled (its
        request, or the connection) before its first byte, it sends nothing; after, the rest
        of the frame waits in `_unsent`, which goes out before any other frame."""
        # bytes: an event body encoded by its tool (a file.watch's, wire/files.py).
        frame = encode_frame(data if isinstance(data, bytes) else encode_event(request_id, data))
        await self.send_lock.acquire()
        view = memoryview(self._unsent + frame if self._unsent else frame)
        begun = bool(self._unsent)  # another frame's rest comes first: it must end whole
        self._unsent = b""
        try:
            while view:
                try:
                    view = view[os.write(self.fd, view):]
                    begun = True
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.fd)
        except (OSError, trio.ClosedResourceError):
            pass  # the client went away; its requests are being cancelled
        except BaseException:
            if begun:
                self._unsent = bytes(view)
            raise
        finally:
            self.send_lock.release()

    async def refuse(self, code: str, message: str) -> None:
        """A frame we cannot trust: answer with id 0 and close (PROTOCOL.md)."""
        log.info("closing a connection: %s: %s", code, message)
        await self.send(Reply(id=0, error=ErrorBody(code, message)))

    async def serve(self) -> None:
        self._frames = FrameReader(self.max_frame)
        self._socket_reader = FdReader(self.fd, yield_later=True)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._read_requests()

    async def _read_requests(self) -> None:
        """Read frames and start their requests until the peer goes (or breaks the framing);
        then its requests die with it.

        A read that brings a single request, the usual case of a client waiting for each
        answer, runs it in this very task after starting another task to go on reading: the
        request starts at once instead of a pass of the scheduler later, and reading resumes
        as soon as the request waits."""
        handed_over = False
        try:
            while True:
                try:
                    data = await self._socket_reader.read(READ_SIZE)
                except (OSError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                try:
                    frames = self._frames.feed(data)
                except FrameTooLarge as e:
                    await self.refuse(FRAME_TOO_LARGE, f"{e}; send smaller frames")
                    return
                for n, body in enumerate(frames):
                    if n and not n % FRAMES_PER_TURN:
                        # A client pipelining many cheap requests would otherwise start
                        # them all before anyone else gets a turn.
                        await trio.lowlevel.checkpoint()
                    try:
                        request = request_decoder.decode(body)
                    except _NOT_A_REQUEST as e:
                        await self.refuse(BAD_FRAME, _not_a_request(e))
                        return
                    method = dispatch.METHODS.get(request.method)
                    params = self._answer_now(request, method)
                    if params is _ANSWERED:
                        continue
                    entry = self.requests.admit(request)
                    if entry is None:
                        # Answered here, in order: a client that does not read them
                        # stops our reading when its socket fills.
                        await self.send(self.refuse_busy(request))
                        continue
                    entry.method, entry.params = method, params
                    # A client waiting for this answer sends nothing before it: the next
                    # read would find nothing, and costs a system call and an exception.
                    self._socket_reader.wait_next()
                    if entry.registered and self._start_detached(entry):
                        continue
                    if len(frames) == 1:
                        self._nursery.start_soon(self._read_requests)
                        handed_over = True
                        await self.handle(entry)
                        return
                    self._nursery.start_soon(self.handle, entry)
        finally:
            if not handed_over:
                self._cancel_all()

    def _cancel_all(self) -> None:
        """The connection is closing: every request in flight is cancelled; those without a
        task get one, which undoes what they started (tools.answers.Detached)."""
        self._nursery.cancel_scope.cancel()
        self.requests.cancel_all()

    def _start_detached(self, entry: Entry) -> bool:
        """Start a request without a task, if its method can (its row's `detached`) and it
        is in a state to; False to run it the usual way, which also answers any error."""
        request, method = entry.request, entry.method
        if method is None or method.detached is None:
            return False
        self.requests.detach(entry)
        try:
            if entry.params is None:  # else admitted already, by a `now` that said LATER
                entry.params = method.admit(self.supervisor, request, self.tenant)
            if method.detached(self.supervisor, entry.params, entry):
                return True
        except (ToolsdError, SandboxError):
            pass  # said again, and answered, the usual way
        except Exception:
            log.exception("could not start %s without a task", request.method)
        if entry.state is not State.DETACHED:
            return True  # handed to a task before the error: that task answers
        self.requests.undetach(entry)
        return False

    def _answer_now(self, request: Request, method: dispatch.Method | None) -> object:
        """Answer here, in the task that read it, a request that cannot wait: a `cancel`, one
        whose row says `instant`, or one whose row's `now` has its answer at once. No task,
        no cancel scope, no entry in the table unless its answer waits to be written: each
        costs more than such a request. _ANSWERED once answered; else None, or the params a
        `now` admitted before it said LATER. One the table would refuse goes the usual way."""
        if not self.requests.would_admit(request):
            return None
        if request.method == "cancel":
            reply = self.cancel(request)
        elif method is None or not (method.instant or method.now is not None):
            return None
        else:
            try:
                params = method.admit(self.supervisor, request, self.tenant)
                result = method.call_now(params, self._call_now)
                if result is dispatch.LATER:
                    return params
                reply = Reply(id=request.id, result=result)
            except (ToolsdError, SandboxError) as e:
                reply = _refused(request.id, e)
            except Exception:
                log.exception("internal error in %s", request.method)
                reply = _error(request.id, INTERNAL, f"{request.method} failed inside toolsd; "
                                                     f"the daemon log has the trace")
        rest = self._write_reply(reply)
        if rest is not None:  # it holds a slot until its answer is out, as any request
            entry = self.requests.admit(request)
            self.requests.answered(entry)
            self._nursery.start_soon(self._write_later, entry, rest)
        return _ANSWERED

    def _start_task(self, entry: Entry) -> None:
        self._nursery.start_soon(self.handle, entry)

    def _deliver(self, entry: Entry, result: object) -> None:
        """Answer a request that has no task: at once if nobody else is writing, else from a
        task that waits its turn. Never raises."""
        rest = self._write_reply(Reply(id=entry.request.id, result=result))
        if rest is None:
            self.requests.release(entry)
        else:
            self._nursery.start_soon(self._write_later, entry, rest)

    async def _write_later(self, entry: Entry, frame: bytes) -> None:
        # The request keeps its slot until its answer is out: a client that does not read
        # its answers runs out of slots, so we stop reading it, and its socket fills.
        try:
            await self._write(frame)
        finally:
            self.requests.release(entry)

    def refuse_busy(self, request: Request) -> Reply:
        if request.method == "cancel":
            return self.cancel(request)
        return _error(request.id, LIMIT_EXCEEDED,
                      f"{MAX_IN_FLIGHT} requests are already in flight on this connection; "
                      f"wait for some answers (or cancel some) before sending more, or open "
                      f"another connection")

    async def handle(self, entry: Entry) -> None:
        """Run a request in this task (for a detached one handed over, its `rest`), answer
        it, and release it."""
        try:
            reply = await self.run(entry)
            await self._write(self._encode(reply), then=entry.run_after)
        finally:
            entry.run_after()
            self.requests.release(entry)

    def _write_reply(self, reply: Reply) -> bytes | None:
        """_write_now of the reply of a request without a task; None too (nothing left to
        write) once the connection is closing, as nobody reads answers any more."""
        if self._nursery.cancel_scope.cancel_called:
            return None
        return self._write_now(self._encode(reply))

    def _write_now(self, frame: bytes) -> bytes | None:
        """Write `frame` if that takes no waiting for another writer. None once it is out
        whole (or the client is gone); else what _write_later has to write: the frame, if
        someone else is writing, or b"" (the rest waits in `_unsent`, first out)."""
        if self.send_lock.locked() or self._unsent:
            return frame
        try:
            written = os.write(self.fd, frame)
        except BlockingIOError:
            written = 0
        except OSError:
            return None  # the client went away; its requests are being cancelled
        if written == len(frame):
            return None
        self._unsent = frame[written:]
        return b""

    async def run(self, entry: Entry) -> Reply:
        """The reply to a request; it is `answered` (no longer found by `cancel`) once its
        handler is over, before the reply is written."""
        request = entry.request
        if entry.scope is None:
            self.requests.answered(entry)
            return _error(request.id, BAD_PARAMS,
                          f"request id {request.id} is already in flight on this connection")
        try:
            with entry.scope:
                call = entry.rest() if entry.rest is not None else self._dispatch(entry)
                return Reply(id=request.id, result=await call)
        except (ToolsdError, SandboxError) as e:
            return _refused(request.id, e)
        except Exception:
            log.exception("internal error in %s", request.method)
            return _error(request.id, INTERNAL,
                          f"{request.method} failed inside toolsd; the daemon log has the trace")
        finally:
            self.requests.answered(entry)
        # Only reached when our scope swallowed a cancellation, i.e. a `cancel` request.
        return _error(request.id, CANCELLED, f"request {request.id} was cancelled")

    async def _dispatch(self, entry: Entry) -> object:
        """The result of a request from its method's handler."""
        request, method = entry.request, entry.method
        if method is None:
            raise ToolsdError(UNKNOWN_METHOD, f"unknown method {request.method!r}; known: "
                              f"{', '.join(sorted(dispatch.METHODS) + ['cancel'])}")
        params = entry.params
        if params is None:  # else admitted already, for a detached start it declined
            params = method.admit(self.supervisor, request, self.tenant)
        return await method.call(self.supervisor, params, entry, self.tenant)

    def cancel(self, request: Request) -> Reply:
        try:
            params = dispatch.decode(dispatch.CancelParams, request)
        except ToolsdError as e:
            return _error(request.id, e.code, e.message)
        entry = self.requests.find(params.request)
        if entry is None:
            return _error(request.id, NOT_FOUND,
                          f"no request {params.request} is in flight on this connection")
        entry.scope.cancel()
        entry.escalate()  # if it has no task: its task, already cancelled, undoes what it started
        return Reply(id=request.id, result={})


_ANSWERED: Final = object()  # what _answer_now returns for a request it answered

# What decoding a frame that is not a request raises (RecursionError: a tiny frame of 1,000
# nested arrays).
_NOT_A_REQUEST = (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError)


def _not_a_request(e: Exception) -> str:
    return (f"a frame must be a msgpack map with an integer id, a string method and a params "
            f"map ({e})")


def _error(id: int, code: str, message: str) -> Reply:
    return Reply(id=id, error=ErrorBody(code, message))


def _refused(id: int, error: ToolsdError | SandboxError) -> Reply:
    """The error reply for what a handler raised: a sandbox's errors by their fault."""
    error = as_wire(error)
    return _error(id, error.code, error.message)
