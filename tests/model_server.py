"""A scripted model server on loopback, for the adapters' tests and for whole agent runs.

Each request the server gets takes the next reply from its script and is recorded (path,
headers, JSON body), so a test says what the "model" answers step by step and then reads what
the agent sent it: the tool results, the image on its user message, the key in the headers.
It runs in a thread of the test process, so it answers an adapter in the test's own trio loop
and a `toolsd agent` subprocess alike.

    with ModelServer() as server:
        server.push(openai_stream(calls=[Call("run_terminal", {"command": "ls"})]),
                    openai_stream(text="Done."))
        ... point the agent at server.openai_url (or server.url for Anthropic) ...
        assert server.requests[1].body["messages"][-1]["role"] == "tool"

A request for which no reply is left gets a 500 that says so (and the adapter's retries then
fail with it), so a script that is too short shows up as a clear error, not a hang.

A GET (an agent's probes: is the endpoint up, what window does it report) takes no step of
the script: it is answered from `gets` (path -> reply; 404 for any other) and recorded in
`probes`. `port` binds a chosen port: a server that comes back where an agent waits.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent.models.transport import HTTPOptions, RetryPolicy

# --- What the server can answer ------------------------------------------------------------


@dataclass
class SSE:
    """A 200 (or `status`) streamed as server-sent events. An item is a dict (one `data:`
    line of JSON), a (name, dict) pair (`event:` and `data:`), or a str (sent as the data
    verbatim, e.g. "[DONE]"). With `cut=True` the connection is closed after the events, with
    no end: a stream that broke. With `hold` set, the server sends the events, then waits for
    `hold` to be set (or the server to close) before it ends the reply: a model still
    streaming while the test cancels. With `drip` set, after the events the server sends
    `drip` (an item as above) every `drip_every` seconds and never ends the reply, until the
    client goes or the server closes: a reply that never ends, yet never goes quiet."""

    events: list[Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    cut: bool = False
    hold: threading.Event | None = None
    drip: Any = None
    drip_every: float = 0.25


@dataclass
class JSONReply:
    """A whole JSON body: an error status, or a server that does not stream."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Reset:
    """The request is read, then the connection is reset before a byte of the reply."""


Reply = SSE | JSONReply | Reset


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


# --- The server ----------------------------------------------------------------------------


class ModelServer:
    """Resource handling: the listening socket and the serving thread are opened by
    `__enter__` and closed (the thread joined) by `__exit__`."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.gets: dict[str, Reply] = {}
        self.probes: list[Recorded] = []
        self._script: list[Reply] = []
        self._holds: list[threading.Event] = []
        self.requests: list[Recorded] = []
        self._lock = threading.Condition()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    @property
    def url(self) -> str:
        """The server's root: the base URL for the Anthropic adapter."""
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def openai_url(self) -> str:
        """The base URL for the OpenAI-compatible adapter (any path is served)."""
        return self.url + "/v1"

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)
            self._holds += [r.hold for r in replies if isinstance(r, SSE) and r.hold]

    def wait_for_requests(self, count: int, timeout: float = 60) -> list[Recorded]:
        """Block until `count` requests came (from a trio test: trio.to_thread.run_sync)."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.requests) >= count, timeout):
                raise TimeoutError(f"the model server got {len(self.requests)} requests, "
                                   f"not {count}")
            return list(self.requests)

    def _take(self, recorded: Recorded) -> Reply:
        if recorded.method == "GET":
            with self._lock:
                self.probes.append(recorded)
            return self.gets.get(recorded.path) or JSONReply(404, {"error": "not found"})
        with self._lock:
            self.requests.append(recorded)
            self._lock.notify_all()
            if self._script:
                return self._script.pop(0)
        return JSONReply(500, {"error": {"message": f"fake model server: no scripted reply "
                                                    f"left for request {len(self.requests)}"}})

    def __enter__(self) -> ModelServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self._answer()

            def do_GET(self) -> None:
                self._answer()

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                reply = server._take(Recorded(self.command, self.path,
                                              {k.lower(): v for k, v in self.headers.items()},
                                              body))
                self.close_connection = True
                if isinstance(reply, Reset):
                    # SO_LINGER 0: close sends RST, as a proxy or a crashed server would.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    return
                if isinstance(reply, JSONReply):
                    data = json.dumps(reply.body).encode()
                    self._head(reply.status, "application/json", reply.headers, len(data))
                    self.wfile.write(data)
                    return
                self._head(reply.status, "text/event-stream", reply.headers, None)
                for item in reply.events:
                    self.wfile.write(_sse(item))
                    self.wfile.flush()
                if reply.hold is not None:
                    reply.hold.wait()
                while reply.drip is not None and not server._closing.wait(reply.drip_every):
                    try:
                        self.wfile.write(_sse(reply.drip))
                        self.wfile.flush()
                    except OSError:
                        return  # the client went away
                if reply.cut:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))

            def _head(self, status: int, ctype: str, headers: dict[str, str],
                      length: int | None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Connection", "close")
                if length is not None:
                    self.send_header("Content-Length", str(length))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = False  # server_close joins every handler

        self._httpd = Server(("127.0.0.1", self.port), Handler)
        # shutdown() is seen at the next poll: a short one keeps each test's end quick.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name="model-server", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._closing.set()
        for hold in self._holds:
            hold.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def _sse(item: Any) -> bytes:
    if isinstance(item, str):
        return f"data: {item}\n\n".encode()
    if isinstance(item, tuple):
        name, data = item
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
    return f"data: {json.dumps(item)}\n\n".encode()


class Sleeps(list):
    """Stands in for trio.sleep in an adapter's retry path: records the waits it asks for and
    waits none, so a test of the retries takes no time and reads what was asked."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


def quick_retries(sleeps: Sleeps | None = None, tries: int = 3) -> HTTPOptions:
    """HTTPOptions for tests: `tries` tries, backoff up to 0.5 s doubling to at most 4 s, each
    wait recorded in `sleeps` instead of waited."""
    return HTTPOptions(policy=RetryPolicy(tries=tries, base_s=0.5, cap_s=4),
                       sleep=sleeps if sleeps is not None else Sleeps())


# --- Scripted replies in each provider's stream --------------------------------------------


@dataclass
class Call:
    """A tool call the scripted model makes; `arguments` as a dict (sent as JSON text) or a
    str (sent verbatim, e.g. malformed)."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None


def _pieces(text: str, n: int = 2) -> list[str]:
    """`text` in `n` fragments, as a server streams it."""
    if not text:
        return []
    step = max(1, -(-len(text) // n))
    return [text[i:i + step] for i in range(0, len(text), step)]


def openai_stream(text: str = "", calls: list[Call] = (), finish: str | None = None,
                  usage: tuple[int, int] | None = (11, 7)) -> SSE:
    """A chat-completions stream as OpenAI sends it: the role, the text in fragments, each
    call's id and name in its first fragment and its arguments over several, the finish
    reason, the usage, [DONE]."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "scripted"}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta,
                                     "finish_reason": finish_reason}]}

    events: list[Any] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _pieces(text)]
    for i, call in enumerate(calls):
        args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        first = {"index": i, "type": "function", "function": {"name": call.name,
                                                               "arguments": ""}}
        if call.id is not None:
            first["id"] = call.id
        events.append(chunk({"tool_calls": [first]}))
        events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                   for piece in _pieces(args, 3)]
    events.append(chunk({}, finish or ("tool_calls" if calls else "stop")))
    if usage is not None:
        events.append({**base, "choices": [],
                       "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                 "total_tokens": sum(usage)}})
    events.append("[DONE]")
    return SSE(events)


def anthropic_stream(text: str = "", calls: list[Call] = (), stop_reason: str | None = None,
                     usage: tuple[int, int] = (25, 9)) -> SSE:
    """A Messages stream as Anthropic sends it: message_start, a text block in deltas, a
    tool_use block per call with its input in input_json_delta fragments, message_delta with
    the stop reason and usage, message_stop."""
    events: list[Any] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "scripted",
        "content": [], "stop_reason": None,
        "usage": {"input_tokens": usage[0], "output_tokens": 1}}})]
    index = 0
    if text:
        events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": {"type": "text", "text": ""}}))
        events.append(("ping", {"type": "ping"}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                            "delta": {"type": "text_delta", "text": piece}})
                   for piece in _pieces(text)]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for n, call in enumerate(calls):
        args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": {
                                                   "type": "tool_use",
                                                   "id": call.id or f"toolu_{n}",
                                                   "name": call.name, "input": {}}}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                            "delta": {"type": "input_json_delta",
                                                      "partial_json": piece}})
                   for piece in _pieces(args, 3)]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": stop_reason or (
                                         "tool_use" if calls else "end_turn"),
                                         "stop_sequence": None},
                                     "usage": {"output_tokens": usage[1]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return SSE(events)


def openai_endless(text: str, token: str, every: float = 0.25) -> SSE:
    """A chat-completions stream that starts with `text` and then sends `token` every `every`
    seconds, never finishing: a model that rambles on, or a server stuck in a loop."""

    def chunk(delta: dict[str, Any]) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "scripted",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}

    return SSE([chunk({"role": "assistant", "content": ""}), chunk({"content": text})],
               drip=chunk({"content": token}), drip_every=every)
