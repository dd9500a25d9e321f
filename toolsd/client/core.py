"""The clients' logic without I/O, shared by the blocking and the async client: request ids
and frames, reading replies, mapping error replies to exceptions, the connect-retry steps, and
the contract's named calls."""

from __future__ import annotations

import collections
import logging
import socket
import time
from collections.abc import Generator
from typing import Any

import msgspec

from toolsd.wire.events import Event
from toolsd.wire.framing import FrameReader, encode_frame
from toolsd.wire.protocol import DEFAULT_MAX_FRAME, ToolsdError

log = logging.getLogger("toolsd.client")

# How long a connect keeps trying while the daemon's queue of waiting connections is full.
CONNECT_WAIT_S = 5.0
# Pauses between those tries: doubling from the first to the last.
_RETRY_FIRST_S = 0.001
_RETRY_MAX_S = 0.05


class ConnectionLost(ToolsdError):
    def __init__(self, message: str):
        super().__init__("connection_lost", message)


class _Reply(msgspec.Struct):
    """A reply, or an event of a streaming request (protocol 1.1: `event` and `data`)."""

    id: int
    result: Any = None
    error: dict | None = None
    event: str | None = None
    data: Any = None
    kind: str | None = None  # a file event's (1.2 "watch")
    path: str | None = None
    to: str | None = None


# At most this per read: more costs an mmap and a munmap per read in some processes (see
# toolsd/runtime/fdio.py; not imported from there, as the clients do without trio).
RECV_SIZE = 64 * 1024
# How long a cancelled call may wait to send its `cancel` (the daemon not reading).
CANCEL_SEND_S = 5.0
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Reply)


class ClientCore:
    """Frames out, replies and events in; no I/O.

    The events of a streaming request wait in `events[id]`, in order, until its caller takes
    them (`take_events`), in its own task: a task reading for another call never runs the
    caller's code. Events for a request that did not ask, or was abandoned, are dropped."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME):
        self._next_id = 0
        self.reader = FrameReader(max_frame)
        self.replies: dict[int, _Reply] = {}
        self.events: dict[int, collections.deque[Event]] = {}
        self._abandoned: set[int] = set()  # ids whose replies nobody waits for

    def request(self, method: str, params: dict, stream: bool = False) -> tuple[int, bytes]:
        """A request's id and frame; with `stream`, it asks for events and keeps them."""
        self._next_id += 1
        if stream:
            params = {**params, "stream": True}
            self.events[self._next_id] = collections.deque()
        body = _encoder.encode({"id": self._next_id, "method": method, "params": params})
        return self._next_id, encode_frame(body)

    def ready(self, request_id: int) -> bool:
        """Its reply is in, or an event of it waits."""
        return request_id in self.replies or bool(self.events.get(request_id))

    def take_events(self, request_id: int) -> list[Event]:
        queue = self.events.get(request_id)
        if not queue:
            return []
        taken = list(queue)
        queue.clear()
        return taken

    def feed(self, data: bytes) -> None:
        if not data:
            raise ConnectionLost("toolsd closed the connection")
        for frame in self.reader.feed(data):
            reply = _decoder.decode(frame)
            if reply.event is not None:
                queue = self.events.get(reply.id)
                if queue is not None:
                    queue.append(Event(reply.id, reply.event, reply.data or "",
                                       reply.kind, reply.path, reply.to))
                continue
            if reply.id == 0 and reply.error is not None:
                # A connection-level refusal (bad_frame, frame_too_large): the daemon closes.
                raise _to_error(reply.error)
            if reply.id in self._abandoned:
                self._abandoned.discard(reply.id)
                continue
            self.replies[reply.id] = reply

    def abandon(self, request_id: int) -> bytes | None:
        """The caller gave up waiting for `request_id`: its reply will be dropped. Returns the
        frame of a `cancel` for it (itself abandoned), or None if its reply was already in."""
        self.events.pop(request_id, None)
        if self.replies.pop(request_id, None) is not None:
            return None
        self._abandoned.add(request_id)
        cancel_id, frame = self.request("cancel", {"request": request_id})
        self._abandoned.add(cancel_id)
        return frame

    def take(self, request_id: int) -> Any:
        self.events.pop(request_id, None)
        reply = self.replies.pop(request_id)
        if reply.error is not None:
            raise _to_error(reply.error)
        return reply.result


def connect_steps(path: str, wait_s: float) -> Generator[float, None, socket.socket]:
    """Connect a non-blocking socket to `path`: yields the pauses to make (the caller sleeps,
    blocking or awaiting) while the daemon's queue is full, returns the connected socket, and
    raises ConnectionLost when it cannot connect. Closing the generator closes the socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    deadline = time.monotonic() + wait_s
    pause = _RETRY_FIRST_S
    try:
        while True:
            try:
                # A Unix socket connects at once or not at all: no EINPROGRESS to wait out.
                sock.connect(path)
                return sock
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConnectionLost(
                        f"toolsd at {path} accepted no connection for {wait_s:g} s: its queue "
                        f"of connections waiting to be accepted stayed full (too many clients "
                        f"connecting at once, or the daemon is stuck); try again later, or "
                        f"check it with `toolsd status`") from None
                if pause == _RETRY_FIRST_S:
                    log.info("toolsd at %s has a full queue of connections; trying again for "
                             "up to %g s", path, wait_s)
                yield min(pause, left)
                pause = min(pause * 2, _RETRY_MAX_S)
    except OSError as e:
        sock.close()
        raise ConnectionLost(f"cannot reach toolsd at {path} ({e.strerror}); is it running? "
                             f"start it with `toolsd serve`") from None
    except BaseException:
        sock.close()
        raise


def _to_error(error: dict) -> ToolsdError:
    return ToolsdError(str(error.get("code", "internal")), str(error.get("message", "")))


def _params(**params: Any) -> dict:
    return {k: v for k, v in params.items() if v is not None}


class Methods:
    """The contract's methods by name; `call` is the shell's (blocking or awaitable)."""

    def call(self, method: str, **params: Any):  # pragma: no cover - overridden
        raise NotImplementedError

    def hello(self, client: str = "toolsd-client"):
        return self.call("hello", client=client)

    def session_open(self, workspace: str | None = None, **options: Any):
        """Without `workspace` (protocol 1.2): the daemon makes a fresh folder for the
        session, removed at its close; the result's `workspace` names it."""
        return self.call("session.open", **_params(workspace=workspace), **options)

    def session_close(self, session: str):
        return self.call("session.close", session=session)

    def session_list(self):
        return self.call("session.list")

    def turn_begin(self, session: str):
        return self.call("turn.begin", session=session)

    def turn_end(self, session: str, turn: str):
        return self.call("turn.end", session=session, turn=turn)

    def shell_run(self, session: str, command: str, **options: Any):
        return self.call("shell.run", session=session, command=command, **options)

    def repl_exec(self, session: str, turn: str, code: str, **options: Any):
        return self.call("repl.exec", session=session, turn=turn, code=code, **options)

    def process_start(self, session: str, command: str, **options: Any):
        return self.call("process.start", session=session, command=command, **options)

    def process_output(self, id: str, **options: Any):
        return self.call("process.output", id=id, **options)

    def process_stop(self, id: str, **options: Any):
        return self.call("process.stop", id=id, **options)

    def process_list(self, session: str | None = None):
        return self.call("process.list", **_params(session=session))

    def image_read(self, session: str, path: str, **options: Any):
        return self.call("image.read", session=session, path=path, **options)

    def process_write(self, id: str, data: str = "", **options: Any):
        return self.call("process.write", id=id, data=data, **options)

    def process_resize(self, id: str, cols: int, rows: int):
        return self.call("process.resize", id=id, cols=cols, rows=rows)

    # 1.2 "files", "watch" (copying whole folders: client/copy.py)

    def file_read(self, session: str, path: str, **options: Any):
        return self.call("file.read", session=session, path=path, **options)

    def file_write(self, session: str, path: str, data: bytes, **options: Any):
        return self.call("file.write", session=session, path=path, data=data, **options)

    def file_list(self, session: str, path: str, **options: Any):
        return self.call("file.list", session=session, path=path, **options)

    def file_stat(self, session: str, path: str):
        return self.call("file.stat", session=session, path=path)

    def file_mkdir(self, session: str, path: str, **options: Any):
        return self.call("file.mkdir", session=session, path=path, **options)

    def file_remove(self, session: str, path: str, **options: Any):
        return self.call("file.remove", session=session, path=path, **options)

    def file_rename(self, session: str, path: str, to: str, **options: Any):
        return self.call("file.rename", session=session, path=path, to=to, **options)

    def file_watch(self, session: str, path: str, on_event, **options: Any):
        """Until cancelled (or the folder goes): `on_event(event)` for each change."""
        return self.call("file.watch", on_event=on_event, session=session, path=path,
                         **options)
