"""The one place a sandbox's error becomes the contract's error reply: the tools call the
sandbox layer, which knows nothing of the wire, and the server answers with this mapping.
The message is the sandbox's own, unchanged: it already says what to do."""

from __future__ import annotations

from toolsd.sandbox.errors import Fault, SandboxError
from toolsd.wire.protocol import (
    BAD_PARAMS,
    IO_ERROR,
    LIMIT_EXCEEDED,
    NOT_FOUND,
    SANDBOX_UNAVAILABLE,
    SESSION_CLOSED,
    ToolsdError,
)

__all__ = ["CODES", "as_wire"]

CODES = {
    Fault.REFUSED: BAD_PARAMS,
    Fault.NOT_FOUND: NOT_FOUND,
    Fault.LIMIT: LIMIT_EXCEEDED,
    Fault.CLOSED: SESSION_CLOSED,
    Fault.UNAVAILABLE: SANDBOX_UNAVAILABLE,
    Fault.IO: IO_ERROR,
}


def as_wire(error: ToolsdError | SandboxError) -> ToolsdError:
    """The error reply for `error`: a ToolsdError as it is, a SandboxError by its fault."""
    if isinstance(error, SandboxError):
        return ToolsdError(CODES[error.fault], error.message)
    return error
