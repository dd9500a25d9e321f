"""The Python driver's ends of the host's pipes: requests in; output and sentinels out.

Standard library only, like the driver (python_repl.py's header has the contract).
"""

import codecs
import io
import json
import os

COMMAND_FD = 3
INTERRUPT_FD = 4
MARKER_PREFIX = b"\x1eTOOLSD-"
ERRORS = "toolsd.surrogates"
_STATUS = {s: json.dumps({"status": s}).encode() for s in ("ok", "error", "interrupted")}
# The host reads a sentinel's status up to 4096 bytes (toolsd/tools/sentinel.py): a longer one would
# not end the request.
_MAX_STATUS_BYTES = 4000


def encode_surrogates(exc):
    """Encoding error handler: never let a print crash the driver.

    Lone surrogates in U+DC80..U+DCFF come from bytes decoded with surrogateescape (file
    names from os.listdir, for instance): they are written back as those original bytes.
    Anything else unencodable is written as a backslash escape.
    """
    if isinstance(exc, UnicodeEncodeError):
        chunk = exc.object[exc.start : exc.end]
        if all(0xDC80 <= ord(c) <= 0xDCFF for c in chunk):
            return bytes(ord(c) - 0xDC00 for c in chunk), exc.end
        return codecs.backslashreplace_errors(exc)
    raise exc


class FdWriter(io.RawIOBase):
    """Unbuffered writer to one fd that always writes everything it is given.

    Raw FileIO (what python -u uses) drops the rest of a write that a signal cut short; this
    loops instead. No buffer means print output, os.write(1, ...) and subprocess output land
    in the pipe in the order they were produced.
    """

    def __init__(self, fd):
        super().__init__()
        self._fd = fd

    def fileno(self):
        return self._fd

    def writable(self):
        return True

    def isatty(self):
        return False

    def write(self, data):
        view = memoryview(data).cast("B")
        total = len(view)
        done = 0
        while done < total:
            done += os.write(self._fd, view[done:])
        return total


def open_text_stream(fd):
    return io.TextIOWrapper(
        FdWriter(fd), encoding="utf-8", errors=ERRORS, write_through=True, line_buffering=False
    )


def read_lines(fd):
    """Lines from the command pipe; a partial last line at EOF is dropped (host went away)."""
    reader = open(fd, "rb", closefd=False)
    while True:
        line = reader.readline()
        if not line.endswith(b"\n"):
            return
        yield line


def sentinel(head, seq, status, images=None):
    """The bytes that end request `seq` (`head`: the marker and the session's UUID), and how
    many of `images` did not fit in them."""
    body, left_out = _STATUS[status], 0
    if images:
        body, left_out = _status_with_images(status, images)
    return head + b"%d:%s\n" % (seq, body), left_out


def _status_with_images(status, images):
    """The sentinel's JSON with `images`, as many as fit the host's bound on a sentinel;
    and how many did not fit."""
    kept = list(images)
    while True:
        body = json.dumps({"status": status, "images": kept}).encode()
        if len(body) <= _MAX_STATUS_BYTES or not kept:
            return body, len(images) - len(kept)
        kept.pop()


def forget_command_pipe():
    # A forked child keeps no way to read the host's commands or interrupts: fds 3 and 4
    # become /dev/null (not closed, so a file the child opens later cannot land on them by
    # chance).
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        for fd in (COMMAND_FD, INTERRUPT_FD):
            os.dup2(null, fd, inheritable=False)
        os.close(null)
    except OSError:
        pass
