"""Copy a file the session made (a figure, a spilled output) out to a host folder, through
the session's own view: it is read by a command in the sandbox, so a path the session cannot
read cannot be copied either, and the daemon's own folders are never named.

The bytes come back base64-encoded in a shell.run's output, CHUNK_BYTES at a time (so each
answer stays well within a frame and the output budget), and are written as they arrive."""

from __future__ import annotations

import base64
import binascii
import shlex

from toolsd.client import ConnectionLost, ToolsdError
from toolsd.wire.protocol import MAX_OUTPUT_CHARS

# A stretch of the file per shell.run: base64 makes 4/3 of it, within MAX_OUTPUT_CHARS.
CHUNK_BYTES = 1 << 20
COPY_TIMEOUT_S = 120.0


class CopyFailed(Exception):
    """The file could not be read in the session; the message says why."""


def copy_out(client, session: str, path: str, dest: str) -> int:
    """Write the session's file `path` to the host file `dest`; the bytes copied."""
    quoted = shlex.quote(path)
    offset = 0
    with open(dest, "wb") as f:
        while True:
            try:
                r = client.shell_run(
                    session,
                    # pipefail where the shell has it (bash; not sh where there is no bash).
                    f"(set -o pipefail) 2>/dev/null && set -o pipefail; "
                    f"[ -f {quoted} ] && [ -r {quoted} ] || {{ echo 'no such file'; exit 3; }}; "
                    f"tail -c +{offset + 1} -- {quoted} | head -c {CHUNK_BYTES} | base64 -w0",
                    timeout_s=COPY_TIMEOUT_S, max_output_chars=MAX_OUTPUT_CHARS)
            except ConnectionLost:
                raise
            except ToolsdError as e:
                raise CopyFailed(f"{path}: {e.code}: {e.message}") from None
            if r["exit_code"] != 0 or r["truncated"]:
                raise CopyFailed(f"{path}: {r['output'].strip()[-300:] or 'could not be read'}")
            try:
                data = base64.b64decode(r["output"], validate=True)
            except binascii.Error:
                raise CopyFailed(f"{path}: the copy came back garbled") from None
            f.write(data)
            offset += len(data)
            if len(data) < CHUNK_BYTES:
                return offset
