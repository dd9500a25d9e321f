"""The contract's error codes and the exception that carries one (re-exported by
protocol.py, where callers import them from)."""

from __future__ import annotations

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
