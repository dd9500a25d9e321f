"""image.read: the file read inside the session's sandbox (so the call sees exactly what the
session's commands see: by its file helper once that runs, helper_read.py), fitted by fit.py
in a worker thread, at most DECODE_SLOTS at a time; a small picture that goes out as it is
(sniff.kept_as_is) is fitted in the event loop, where its one short decode costs less than
the hop to a thread and back, and a small plain PNG checked whole (plain_png.sent_as_is)
is not decoded at all."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import trio

from toolsd.runtime import threads
from toolsd.runtime.child_fds import ChildFds
from toolsd.runtime.fdio import READ_SIZE
from toolsd.sandbox.launch import spawning
from toolsd.sandbox.errors import Fault
from toolsd.sandbox.launch.spawn_request import SpawnRequest
from toolsd.tools.images import helper_read
from toolsd.tools.images.fit import ImageTooLarge, NotAnImage, fit_image
from toolsd.tools.images.plain_png import sent_as_is
from toolsd.tools.images.sniff import kept_as_is
from toolsd.wire.protocol import (
    BAD_PARAMS,
    IMAGE_TOO_LARGE,
    IO_ERROR,
    LIMIT_EXCEEDED,
    NOT_AN_IMAGE,
    NOT_FOUND,
    SANDBOX_UNAVAILABLE,
    SESSION_CLOSED,
    ImageOriginal,
    ImageReadParams,
    ImageReadResult,
    ToolsdError,
)

if TYPE_CHECKING:
    from toolsd.tools.session_view import SessionView

__all__ = ["read", "READ_CAP", "READ_TIMEOUT_S", "MAX_PIXELS", "DECODE_SLOTS"]

# The largest file we read. A camera's 108 Mpx JPEG is 20 to 40 MB; beyond this the file is
# not a picture meant for a model (or not a file at all: /dev/zero).
READ_CAP = 64 * 1024 * 1024
# A slow device or network mount must not hold the call forever.
READ_TIMEOUT_S = 30.0
# 120 Mpx: phones with 108 Mpx sensors write 12000x9000 photos, and those must work. Phones'
# opt-in 200 Mpx mode (16320x12240) is refused: Pillow's own bomb check raises above ~179 Mpx
# and we leave its process-wide limit alone; and at 4 bytes a pixel a non-JPEG of 200 Mpx
# would take 800 MB per decode. At 120 Mpx the worst decode is ~480 MB (RGBA) plus the resize.
MAX_PIXELS = 120_000_000
# Decodes of big images at once: each may hold hundreds of MB, and the machine has few cores.
DECODE_SLOTS = 2
# Room in a reply frame for everything but the image bytes.
_REPLY_OVERHEAD = 4096
_STDERR_KEEP = 4096

# Run by the sandbox's sh with $1 = bytes to read, $2 = path. A FIFO or socket is refused up
# front: `head` would block on opening a FIFO until the timeout. The exit codes 3 and 4 are
# ours (head itself exits 0 or 1).
_READ_SCRIPT = """\
if [ -d "$2" ]; then exit 3; fi
if [ -p "$2" ] || [ -S "$2" ]; then exit 4; fi
exec head -c "$1" -- "$2"
"""
_EXIT_FOLDER = 3
_EXIT_NOT_A_FILE = 4

# head's error texts (LC_ALL=C: strerror's English) that mean "the session cannot see or
# reach this file": the same answer whether it is missing, hidden under a tmpfs, or behind
# a symlink pointing out of the sandbox.
_NOT_FOUND_REASONS = {
    "No such file or directory",
    "Not a directory",
    "Too many levels of symbolic links",
    "Permission denied",
}

async def read(session: SessionView, p: ImageReadParams) -> ImageReadResult:
    """image.read: the file at `p.path` (relative paths from the workspace), as the session
    sees it, fitted within p.max_dim and p.max_bytes."""
    session.check_open()
    if not p.path or "\0" in p.path:
        raise ToolsdError(BAD_PARAMS, "path must be a non-empty file path without NUL bytes")
    max_frame = session.host.max_frame
    if p.max_bytes > max_frame - _REPLY_OVERHEAD:
        raise ToolsdError(
            BAD_PARAMS,
            f"max_bytes {p.max_bytes} would not fit in a reply frame of this daemon "
            f"(--max-frame {max_frame}); ask for at most {max_frame - _REPLY_OVERHEAD}",
        )
    # The slot covers the read too: else concurrent reads would hold their whole files
    # while waiting for a decode slot.
    try:
        async with threads.held(threads.limiter("image_decode", DECODE_SLOTS)) as waited:
            data = await helper_read.read(session, p.path, checked=not waited)
            if data is None:
                data = await _read_in_sandbox(session, p.path)

            def fit():
                return fit_image(data, max_dim=p.max_dim, max_bytes=p.max_bytes,
                                 max_pixels=MAX_PIXELS)

            fitted = sent_as_is(data, p.max_dim, p.max_bytes, MAX_PIXELS)
            if fitted is None:
                if kept_as_is(data, p.max_dim, p.max_bytes):
                    fitted = fit()
                else:
                    fitted = await trio.to_thread.run_sync(fit)
    except NotAnImage as e:
        raise ToolsdError(NOT_AN_IMAGE, f"{p.path}: {e}") from None
    except ImageTooLarge as e:
        raise ToolsdError(IMAGE_TOO_LARGE, f"{p.path}: {e}") from None
    except ValueError as e:
        raise ToolsdError(BAD_PARAMS, str(e)) from None
    return ImageReadResult(
        media_type=fitted.media_type,
        width=fitted.width,
        height=fitted.height,
        data=fitted.data,
        resized=fitted.resized,
        original=ImageOriginal(
            format=fitted.original_format,
            width=fitted.original_width,
            height=fitted.original_height,
            bytes=fitted.original_bytes,
        ),
    )


async def _read_in_sandbox(session: SessionView, path: str) -> bytes:
    """The bytes of `path` read by `head` inside the session's sandbox, at most READ_CAP.
    stdout and stderr get separate pipes, so an error text is never taken for file data."""
    ready = session.sandbox.launcher.ready
    sh = ready.sh or ready.bash
    if not sh:
        raise ToolsdError(SANDBOX_UNAVAILABLE, "the sandbox has no sh to read files with")
    env = {**session.env, "LC_ALL": "C"}
    if not path.startswith("/"):
        path = "./" + path  # so that "-" is a file named "-", not head's standard input
    argv = [sh, "-c", _READ_SCRIPT, "toolsd-image-read", str(READ_CAP + 1), path]
    with ChildFds() as fds:  # the child holds the only copies of its ends: EOF at its exit
        out_r, out_w = fds.pipe()
        err_r, err_w = fds.pipe()
        job = await session.sandbox.spawn(
            SpawnRequest(argv, session.workspace, env, stdin=session.sandbox.devnull,
                         stdout=out_w, stderr=err_w, want_pid=False),
            what=f"a reader for {path}", fault=Fault.IO)

    out = trio.lowlevel.FdStream(out_r)
    err = trio.lowlevel.FdStream(err_r)
    chunks: list[bytes] = []
    size = 0
    errors = bytearray()

    async def collect_out() -> None:
        nonlocal size
        while True:
            data = await out.receive_some(READ_SIZE)
            if not data:
                return
            size += len(data)
            if size > READ_CAP:
                chunks.clear()  # no use keeping 64 MiB we will not decode
                return
            chunks.append(data)

    async def collect_err() -> None:
        while data := await err.receive_some(READ_SIZE):
            errors.extend(data[: _STDERR_KEEP - len(errors)])

    try:
        with trio.move_on_after(READ_TIMEOUT_S) as deadline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect_out)
                nursery.start_soon(collect_err)
            if size <= READ_CAP:
                await job.exited.wait()
    finally:
        with trio.CancelScope(shield=True):
            if not job.exited.is_set():
                # Timed out, over the cap, or the request was cancelled: nothing of the
                # reader may outlive the call.
                await spawning.end_tree(job, 0)
            await out.aclose()
            await err.aclose()

    if size > READ_CAP:
        raise ToolsdError(LIMIT_EXCEEDED, f"{path} is larger than {READ_CAP // (1024 * 1024)} "
                          f"MiB, the most image.read reads; shrink or convert it first")
    if deadline.cancelled_caught:
        raise ToolsdError(LIMIT_EXCEEDED, f"reading {path} took longer than "
                          f"{READ_TIMEOUT_S:g} s (a device, or a file on a stuck mount?); "
                          f"copy it into the workspace first")
    if job.lost:
        raise ToolsdError(SESSION_CLOSED, f"session {session.id}'s sandbox died while reading "
                          f"{path}; open a new session")
    if job.exit_code == 0:
        return b"".join(chunks)
    raise _read_error(path, job.exit_code, job.signal, bytes(errors))


def _read_error(path: str, exit_code: int | None, signal: int | None,
                stderr: bytes) -> ToolsdError:
    """Why the in-sandbox read failed, as the error a caller can act on. Pure."""
    if exit_code == _EXIT_FOLDER:
        return ToolsdError(BAD_PARAMS, f"{path} is a folder; give the path of an image file")
    if exit_code == _EXIT_NOT_A_FILE:
        return ToolsdError(BAD_PARAMS, f"{path} is a FIFO or socket, not a file; give the path "
                           f"of an image file")
    lines = stderr.decode(errors="replace").strip().splitlines()
    text = lines[-1] if lines else ""
    # strerror's texts have no ": " in them, while the path quoted before them may.
    reason = text.rsplit(": ", 1)[-1]
    if reason in _NOT_FOUND_REASONS:
        return ToolsdError(NOT_FOUND, f"{path}: {reason} (as the session's own commands see "
                           f"it); check the path")
    if reason == "Is a directory":
        return ToolsdError(BAD_PARAMS, f"{path} is a folder; give the path of an image file")
    if reason == "File name too long":
        return ToolsdError(BAD_PARAMS, f"{path}: file name too long")
    if exit_code == 127:
        return ToolsdError(IO_ERROR, f"cannot read {path}: the sandbox has no `head` ({text})")
    how = (f"killed by {spawning.signal_name(signal)}" if exit_code is None
           else f"exit status {exit_code}")
    return ToolsdError(IO_ERROR, f"reading {path} failed ({how}): {text or 'no error text'}")
