"""The wire contract (../shared/PROTOCOL.md, version 1, its additive 1.1 and 1.2) as Structs.

Every request's params and every result is a Struct here (process.write's and process.resize's
in process_input.py); the decoders are built once at import. New fields always get defaults:
that is how the protocol grows without breaking clients. Unknown extra params are ignored."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from toolsd.wire.process_input import TerminalSide

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
# The 1.1 features this daemon has built, as `hello` lists them. A request that uses one of
# the others is refused (UNBUILT below), never half-served.
FEATURES = ("spill", "cwd", "figures", "tty", "stdin", "stream", "tcp", "tenants", "files",
            "watch")

# Error codes (the complete list of the contract).
BAD_FRAME = "bad_frame"
FRAME_TOO_LARGE = "frame_too_large"
UNKNOWN_METHOD = "unknown_method"
BAD_PARAMS = "bad_params"
NOT_FOUND = "not_found"
SESSION_CLOSED = "session_closed"
CANCELLED = "cancelled"
SANDBOX_UNAVAILABLE = "sandbox_unavailable"
LIMIT_EXCEEDED = "limit_exceeded"
NOT_AN_IMAGE = "not_an_image"
IMAGE_TOO_LARGE = "image_too_large"
IO_ERROR = "io_error"
INTERNAL = "internal"
UNAUTHORIZED = "unauthorized"  # 1.2: a TCP connection's first frame did not authenticate


class ToolsdError(Exception):
    """An error reply: `code` is one of the contract's codes, `message` says what to do.

    The daemon raises it from handlers; the client raises it for every error reply.
    """

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


Seconds = Annotated[float, Meta(gt=0)]
NonNegSeconds = Annotated[float, Meta(ge=0)]
# Output is held in memory up to about twice this, and must fit in one reply frame.
MAX_OUTPUT_CHARS = 2_000_000
Chars = Annotated[int, Meta(ge=0, le=MAX_OUTPUT_CHARS)]
# A stop holds a worker thread for its grace period: bounded, so stops cannot starve the pool.
MAX_GRACE_S = 300.0
Env = dict[str, str]
Network = Literal["none", "host"]
# 1.1, in every result of a call on a session: the hooks and git settings that the session
# added to repositories of its workspace and that the host's git would execute
# (docs/sandbox.md, "What the host would execute"). Left out while there are none.
HostExec = list[str] | UnsetType
Language = Literal["python", "node"]


# ---------------------------------------------------------------- envelopes


class Request(Struct):
    id: Annotated[int, Meta(ge=0)]
    method: str
    params: msgspec.Raw = msgspec.Raw(b"\x80")  # an empty map


class ErrorBody(Struct):
    code: str
    message: str


class Reply(Struct, omit_defaults=True):
    """What the daemon sends: exactly one of result / error is set."""

    id: int
    result: object = None
    error: ErrorBody | None = None


# ---------------------------------------------------------------- methods


class HelloParams(Struct):
    client: str = ""
    token: str = ""  # 1.2 "tcp": the first frame of a TCP connection authenticates with it


class HelloResult(Struct):
    protocol: int
    server: str
    sandbox: Literal["bwrap", "none"]
    shells: list[str]
    languages: list[str]
    max_frame: int
    features: list[str]
    tenant: str = "local"  # 1.2 "tenants": whose sessions this connection sees


class SessionLimits(Struct, frozen=True):
    memory_mb: Annotated[int, Meta(ge=16, le=1 << 24)] | None = None
    pids: Annotated[int, Meta(ge=8, le=1 << 22)] | None = None
    cpu_s: Annotated[int, Meta(gt=0, le=1 << 31)] | None = None
    file_mb: Annotated[int, Meta(gt=0, le=1 << 30)] | None = None


class SessionOpenParams(Struct):
    workspace: str | None = None  # 1.2: None: a new folder of the daemon's, gone at close
    network: Network = "none"
    writable: bool = True
    env: Env = {}
    limits: SessionLimits = SessionLimits()


class SessionOpenResult(Struct):
    session: str
    sandbox: Literal["bwrap", "none"]
    workspace: str


class SessionParams(Struct):
    session: str


class SessionCloseResult(Struct):
    processes_stopped: int
    repls_stopped: int
    host_exec: HostExec = UNSET


class SessionListParams(Struct):
    pass


class SessionInfo(Struct):
    session: str
    workspace: str
    sandbox: str
    network: str
    writable: bool
    processes: int
    repls: int
    opened_at: float
    alive: bool = True  # 1.1: false once the session's sandbox died
    host_exec: HostExec = UNSET  # as of the session's last call
    tenant: str = "local"  # 1.2 "tenants": who opened it


class SessionListResult(Struct):
    sessions: list[SessionInfo]


class TurnBeginResult(Struct):
    turn: str
    host_exec: HostExec = UNSET


class TurnEndParams(Struct):
    session: str
    turn: str


class TurnEndResult(Struct):
    repls_stopped: int
    host_exec: HostExec = UNSET


class ShellRunParams(Struct):
    session: str
    command: str
    cwd: str | None = None
    timeout_s: Seconds = 120.0
    env: Env = {}
    max_output_chars: Chars = 30000
    spill: bool = False
    report_cwd: bool = False
    stream: bool = False  # 1.1 "stream": output events before the reply (wire/events.py)


class ShellRunResult(Struct, omit_defaults=True):
    exit_code: int | None
    signal: str | None
    timed_out: bool
    output: str
    output_bytes: int
    truncated: bool
    shell: str
    duration_s: float
    orphans_ended: int
    output_file: str | None = None  # with `spill`, when the output was cut
    cwd_after: str | None = None  # with `report_cwd`, unless the shell was killed
    host_exec: HostExec = UNSET


class ReplExecParams(Struct):
    session: str
    turn: str
    code: str
    language: Language = "python"
    timeout_s: Seconds = 60.0
    max_output_chars: Chars = 30000
    spill: bool = False
    stream: bool = False  # 1.1 "stream": output events before the reply (wire/events.py)


class ReplImage(Struct, frozen=True):
    """A picture a repl.exec made (1.1 "figures"): a file in the session's scratch."""

    path: str  # as the session sees it: image.read reads it
    media_type: str
    width: int
    height: int


class ReplExecResult(Struct, omit_defaults=True):
    status: Literal["ok", "error", "timeout", "crashed"]
    output: str
    output_bytes: int
    truncated: bool
    fresh: bool
    state_lost: bool
    duration_s: float
    images: list[ReplImage]  # 1.1 "figures": always there, often empty
    output_file: str | None = None  # with `spill`, when the output was cut
    # Processes the call started that were ended because it timed out or was cancelled (or,
    # when the interpreter had to be killed, the other processes of its tree).
    processes_ended: int = 0
    host_exec: HostExec = UNSET


class ProcessStartParams(Struct):
    session: str
    command: str
    cwd: str | None = None
    env: Env = {}
    name: str = ""
    tty: bool = False  # 1.1 "tty": on a terminal of its own (see process_input.py)
    cols: TerminalSide = 120
    rows: TerminalSide = 40
    stdin: Literal["null", "pipe"] = "null"  # 1.1 "stdin"; ignored with tty


class ProcessStartResult(Struct):
    id: str
    pid: int
    host_exec: HostExec = UNSET


class ProcessOutputParams(Struct):
    id: str
    since: Annotated[int, Meta(ge=0)] | None = None
    wait_s: NonNegSeconds = 0.0
    until: str | None = None
    max_output_chars: Chars = 30000
    stream: bool = False  # 1.1 "stream": output events before the reply (wire/events.py)
    plain: bool = False  # 1.1 "tty": terminal escape sequences removed


class ProcessOutputResult(Struct):
    id: str
    status: Literal["running", "exited", "stopped"]
    exit_code: int | None
    signal: str | None
    output: str
    next: int
    dropped_bytes: int
    truncated: bool
    waiting_for_input: bool = False  # 1.1 "tty"/"stdin": blocked reading input, none pending
    host_exec: HostExec = UNSET


class ProcessStopParams(Struct):
    id: str
    grace_s: Annotated[float, Meta(ge=0, le=MAX_GRACE_S)] = 2.0


class ProcessStopResult(Struct):
    id: str
    status: str
    exit_code: int | None
    signal: str | None
    ended: int
    survivors: int
    host_exec: HostExec = UNSET


class ProcessListParams(Struct):
    session: str | None = None


class ProcessInfo(Struct):
    id: str
    session: str
    name: str
    command: str
    pid: int
    status: str
    exit_code: int | None
    started_at: float
    ended_at: float | None
    cpu_percent: float
    rss_bytes: int
    descendants: int
    output_bytes: int


class ProcessListResult(Struct):
    processes: list[ProcessInfo]


class ImageReadParams(Struct):
    session: str
    path: str
    max_dim: Annotated[int, Meta(ge=1, le=100_000)] = 1568
    max_bytes: Annotated[int, Meta(ge=1024)] = 3_750_000


class ImageOriginal(Struct):
    format: str
    width: int
    height: int
    bytes: int


class ImageReadResult(Struct):
    media_type: str
    width: int
    height: int
    data: bytes
    resized: bool
    original: ImageOriginal
    host_exec: HostExec = UNSET


class CancelParams(Struct):
    request: int


# The marker between head and tail of a read that does not fit; `toolsd logs` reads the
# `since=` in it to carry on right after the head.
MARKER = "\n[... {left} bytes left out; process.output with since={since} reads them ...]\n"
MARKER_SINCE = re.compile(r"\n\[\.\.\. \d+ bytes left out; process\.output with since=(\d+) "
                          r"reads them \.\.\.\]\n")


# ---------------------------------------------------------------- codecs

request_decoder = msgspec.msgpack.Decoder(Request)
reply_encoder = msgspec.msgpack.Encoder()

_param_decoders: dict[type, msgspec.msgpack.Decoder] = {}

# Params of 1.1 features not built here: field -> feature, per params Struct. Set to anything
# but its default, such a field is refused with bad_params naming the feature, so a client
# never takes a plain answer for the feature it asked for. A feature that gets built moves
# from here to FEATURES. Every feature of 1.1 is built: none is left today.
UNBUILT: dict[type, dict[str, str]] = {}
_UNBUILT_DEFAULTS = {
    cls: [(f.name, f.default, fields[f.name]) for f in msgspec.structs.fields(cls)
          if f.name in fields]
    for cls, fields in UNBUILT.items()
}


def decode_params(cls: type[Struct], raw: msgspec.Raw, method: str) -> Struct:
    """Decode one request's params, or raise ToolsdError(bad_params) naming the field."""
    decoder = _param_decoders.get(cls)
    if decoder is None:
        decoder = _param_decoders[cls] = msgspec.msgpack.Decoder(cls)
    try:
        params = decoder.decode(raw)
    except msgspec.ValidationError as e:
        raise ToolsdError(BAD_PARAMS, f"{method}: {_field_message(e)}") from None
    except (msgspec.DecodeError, RecursionError) as e:  # params is not even a map
        raise ToolsdError(BAD_PARAMS, f"{method}: params must be a map ({e})") from None
    for name, default, feature in _UNBUILT_DEFAULTS.get(cls, ()):
        if getattr(params, name) != default:
            raise ToolsdError(BAD_PARAMS, f"{method}: params.{name} needs the protocol 1.1 "
                              f"feature {feature!r}, which this daemon does not have (hello "
                              f"lists its features: {', '.join(FEATURES)}); leave it out")
    return params


def _field_message(e: msgspec.ValidationError) -> str:
    # msgspec says "Expected `str`, got `int` - at `$.command`"; say "params.command" instead
    # of "$", which is what a caller recognises.
    return str(e).replace("`$.", "`params.").replace("`$`", "`params`")


def encode_reply(reply: Reply) -> bytes:
    return reply_encoder.encode(reply)
