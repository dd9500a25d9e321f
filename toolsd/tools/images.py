"""Fit an image file into a model's image budget: decode safely, orient, downscale,
re-encode.

Pure core: bytes in, bytes out, no file or network access. Decoding is CPU-bound and can
take a second on a large photo, so the caller runs `fit_image` in a worker thread; it
touches no global state (Pillow's MAX_IMAGE_PIXELS and LOAD_TRUNCATED_IMAGES are left as
they are), so concurrent calls are safe.

Exceptions::

    Exception
     +-- NotAnImage      the bytes are not a decodable image of an accepted format
     +-- ImageTooLarge   the declared size is over the pixel limit (decompression bomb)

The I/O part, `read(session, params)`, serves `image.read`: it reads the file inside the
session's sandbox (so the call sees exactly what the session's commands see) and runs
`fit_image` in a worker thread, at most DECODE_SLOTS at a time.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass

import trio
from PIL import Image, ImageOps

from toolsd.sandbox import jobs
from toolsd.runtime import threads
from toolsd.runtime.fdio import READ_SIZE
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

__all__ = [
    "Fitted", "ImageTooLarge", "NotAnImage", "fit_image", "MIN_MAX_BYTES",
    "read", "READ_CAP", "READ_TIMEOUT_S", "MAX_PIXELS", "DECODE_SLOTS",
]  # fmt: skip


class NotAnImage(Exception):
    """Truncated, unknown format, empty, text: nothing we can decode."""


class ImageTooLarge(Exception):
    """The image declares more pixels than the decompression-bomb limit."""


@dataclass
class Fitted:
    """An image ready to send. width/height are those of `data`; the original_* fields
    describe the input file, with width/height as displayed (after EXIF orientation), so
    original_width / width is the scale factor of the fitting."""

    media_type: str
    width: int
    height: int
    data: bytes
    resized: bool
    original_format: str
    original_width: int
    original_height: int
    original_bytes: int


# Formats we agree to decode. Each is recognised by a magic number and decoded inside
# Pillow: this leaves out EPS (Pillow runs Ghostscript on it), XBM/XPM (a C header with
# "#define x_width 8" would decode as an image) and formats without a signature (TGA), so
# text or random bytes are never mistaken for a picture.
_DECODABLE = (
    "PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF", "ICO", "PPM", "AVIF",
    "JPEG2000", "QOI",
)  # fmt: skip

# Formats that every model API accepts as they are. MPO (what many cameras write) is a
# JPEG with extra pictures appended, readable by any JPEG decoder.
_SENDABLE = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",
    "GIF": "image/gif",
    "WEBP": "image/webp",
}
# Modes a sendable file may be kept in: a CMYK JPEG, say, shows wrongly in many decoders.
_SENDABLE_MODES = {"1", "L", "LA", "P", "PA", "RGB", "RGBA", "I;16", "I;16B", "I;16L", "I"}

_ORIENTATION = 0x0112
_SWAPS_AXES = {5, 6, 7, 8}

# A 1x1 JPEG with its standard tables is about 650 bytes; below this no picture fits.
MIN_MAX_BYTES = 1024

_JPEG_QUALITIES = (85, 75, 60)
# Colour statistics are taken on a nearest-neighbour sample: exact colours, little work.
_SAMPLE_SIDE = 400


def fit_image(
    data: bytes,
    *,
    max_dim: int = 1568,
    max_bytes: int = 3_750_000,
    max_pixels: int = 100_000_000,
) -> Fitted:
    """Decode `data` and return it fitted within max_dim (both sides) and max_bytes.

    The original bytes are sent as they are when they already fit, need no EXIF rotation
    and are PNG, JPEG, GIF or WebP (animated ones included, if every frame decodes).
    Otherwise the first frame is oriented, downscaled (aspect kept) and re-encoded: PNG
    for transparency and flat images (screenshots, diagrams), JPEG for photos, smaller
    until it fits.

    Raises NotAnImage, ImageTooLarge (declared width*height over max_pixels, checked before
    any pixel is decoded), ValueError for a budget no image can meet.
    """
    if max_dim < 1:
        raise ValueError(f"max_dim must be at least 1 pixel, got {max_dim}")
    if max_bytes < MIN_MAX_BYTES:
        raise ValueError(
            f"max_bytes must be at least {MIN_MAX_BYTES} (no image encodes smaller), "
            f"got {max_bytes}"
        )
    if max_pixels < 1:
        raise ValueError(f"max_pixels must be at least 1, got {max_pixels}")
    if not data:
        raise NotAnImage("the file is empty")

    im = _open(data, max_pixels)
    fmt = im.format or "unknown"
    stored_w, stored_h = im.size
    fits = max(stored_w, stored_h) <= max_dim and len(data) <= max_bytes
    keep_candidate = fits and fmt in _SENDABLE and im.mode in _SENDABLE_MODES

    scale = min(1.0, max_dim / max(stored_w, stored_h))
    target = (max(1, round(stored_w * scale)), max(1, round(stored_h * scale)))
    if fmt in ("JPEG", "MPO") and not keep_candidate:
        # Let libjpeg decode at 1/2, 1/4 or 1/8 scale: a 4000x3000 photo bound for 1568 px
        # decodes at 2000x1500, several times faster and with a quarter of the memory.
        im.draft("RGB", target)
    try:
        frames = getattr(im, "n_frames", 1)
    except Exception:
        # Frames that cannot even be counted cannot be vouched for: not sent as is.
        frames = 0
    _load(im)

    orientation = _orientation(im)
    swapped = orientation in _SWAPS_AXES
    original_w, original_h = (stored_h, stored_w) if swapped else (stored_w, stored_h)
    if swapped:
        target = (target[1], target[0])
    public_format = "JPEG" if fmt == "MPO" else fmt

    if (
        keep_candidate
        and orientation == 1
        and (frames == 1 or (frames > 1 and _all_frames_decode(data, max_pixels)))
    ):
        return Fitted(
            media_type=_SENDABLE[fmt],
            width=stored_w,
            height=stored_h,
            data=data,
            resized=False,
            original_format=public_format,
            original_width=original_w,
            original_height=original_h,
            original_bytes=len(data),
        )

    if orientation != 1:
        im = ImageOps.exif_transpose(im)
    im = _normalize_mode(im)
    if im.size != target:
        im = im.resize(target, Image.Resampling.LANCZOS, reducing_gap=3.0)
    if im.mode in ("LA", "RGBA") and im.getchannel("A").getextrema()[0] == 255:
        # Alpha that hides nothing: drop it, so the picture may go out as JPEG.
        im = im.convert(im.mode[:-1])
    media_type, encoded, im = _encode_within(im, max_bytes)
    return Fitted(
        media_type=media_type,
        width=im.width,
        height=im.height,
        data=encoded,
        resized=im.size != (original_w, original_h),
        original_format=public_format,
        original_width=original_w,
        original_height=original_h,
        original_bytes=len(data),
    )


def _open(data: bytes, max_pixels: int) -> Image.Image:
    """Identify the image without decoding pixels, and refuse a bomb by its declared size."""
    try:
        im = Image.open(io.BytesIO(data), formats=_DECODABLE)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's own global limit (possibly lower than ours) fired first.
        raise ImageTooLarge(f"the image is too large to decode safely: {exc}") from None
    except Image.UnidentifiedImageError:
        raise NotAnImage(
            "not an image in a known format (accepted: "
            + ", ".join(_DECODABLE)
            + ")"
        ) from None
    except MemoryError:
        raise ImageTooLarge("the image header asks for more memory than there is") from None
    except Exception as exc:
        raise NotAnImage(f"the image header is damaged ({exc})") from None
    w, h = im.size
    if w < 1 or h < 1:
        raise NotAnImage(f"the image declares an empty size {w}x{h}")
    if w * h > max_pixels:
        raise ImageTooLarge(
            f"the image declares {w}x{h} = {w * h} pixels, over the limit of {max_pixels}; "
            "use a smaller image"
        )
    return im


def _load(im: Image.Image) -> None:
    """Decode every pixel of the current frame; a truncated file is not an image."""
    try:
        im.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLarge(f"the image is too large to decode safely: {exc}") from None
    except MemoryError:
        raise ImageTooLarge(
            "decoding the image ran out of memory; use a smaller image"
        ) from None
    except Exception as exc:
        raise NotAnImage(f"the image data is truncated or damaged ({exc})") from None


def _orientation(im: Image.Image) -> int:
    try:
        value = im.getexif().get(_ORIENTATION, 1)
    except Exception:
        # Damaged EXIF: show the pixels as stored rather than refuse the picture.
        return 1
    return value if value in range(1, 9) else 1


def _all_frames_decode(data: bytes, max_pixels: int) -> bool:
    """True if every frame of an animated file decodes, in max_pixels pixels in all: a
    damaged later frame would make the model API reject the whole request."""
    try:
        im = Image.open(io.BytesIO(data), formats=_DECODABLE)
        total = 0
        for index in range(im.n_frames):
            im.seek(index)
            total += im.width * im.height
            if total > max_pixels:
                return False
            im.load()
        return True
    except Exception:
        return False


def _normalize_mode(im: Image.Image) -> Image.Image:
    """Convert to L, LA, RGB or RGBA: what LANCZOS resizing and the encoders handle."""
    mode = im.mode
    try:
        if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
            return _to_grey(im)
        if mode == "1":
            im = im.convert("L")
        elif mode in ("P", "PA", "RGBa", "RGBA"):
            im = im.convert("RGBA")
        elif mode in ("La", "LA"):
            im = im.convert("LA")
        elif mode in ("L", "RGB"):
            if "transparency" in im.info:
                im = im.convert(mode + "A")
        else:
            # CMYK, YCbCr, LAB, HSV, RGBX: colour without alpha.
            im = im.convert("RGB")
    except ValueError as exc:
        raise NotAnImage(f"the image's colour mode {mode} is not supported ({exc})") from None
    return im


def _to_grey(im: Image.Image) -> Image.Image:
    """Deep greyscale to 8 bits by scaling, not clipping (clipping turns most of a 16-bit
    picture white). 16-bit data keeps its range; 32-bit and float data are stretched from
    their own minimum to maximum."""
    if im.mode.startswith("I;16"):
        lo, hi = 0.0, 65535.0
        im = im.convert("I")
    else:
        lo, hi = im.getextrema()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            lo, hi = 0.0, 1.0
    wide = im.convert("F")
    if hi <= lo:
        return Image.new("L", im.size, max(0, min(255, round(lo))))
    factor = 255.0 / (hi - lo)
    return wide.point(lambda v: v * factor - lo * factor).convert("L")


def _looks_flat(im: Image.Image) -> bool:
    """Screenshots and diagrams (few colours, or large areas of a few colours) stay sharp
    and small as PNG; photos are far smaller as JPEG."""
    sample = im
    if max(im.size) > _SAMPLE_SIDE:
        factor = _SAMPLE_SIDE / max(im.size)
        size = (max(1, round(im.width * factor)), max(1, round(im.height * factor)))
        sample = im.resize(size, Image.Resampling.NEAREST)
    pixels = sample.width * sample.height
    colours = sample.getcolors(pixels)
    assert colours is not None
    if im.mode in ("RGB", "RGBA") and len(colours) <= 256:
        return True
    top = sorted((count for count, _ in colours), reverse=True)[:16]
    return sum(top) >= 0.6 * pixels


def _encode_within(im: Image.Image, max_bytes: int) -> tuple[str, bytes, Image.Image]:
    """Encode `im` within max_bytes, shrinking it as needed; returns (media type, bytes,
    the image as encoded)."""
    transparent = im.mode in ("LA", "RGBA")
    prefer_png = transparent or _looks_flat(im)
    while True:
        size = 0
        if prefer_png:
            encoded = _save(im, "PNG")
            if len(encoded) <= max_bytes:
                return "image/png", encoded, im
            size = len(encoded)
        if not transparent:
            for quality in _JPEG_QUALITIES:
                encoded = _save(im, "JPEG", quality=quality)
                if len(encoded) <= max_bytes:
                    return "image/jpeg", encoded, im
            size = len(encoded)
        if im.size == (1, 1):
            # Unreachable with max_bytes >= MIN_MAX_BYTES; a loop guard, not a path.
            raise ValueError(f"even a 1x1 image does not fit in {max_bytes} bytes")
        # Bytes scale roughly with the pixel count, so shrink both sides by the square
        # root of the overshoot, a little more to land under it, in bounded steps.
        factor = min(0.85, max(0.25, math.sqrt(max_bytes / size) * 0.9))
        new = (max(1, int(im.width * factor)), max(1, int(im.height * factor)))
        im = im.resize(new, Image.Resampling.LANCZOS, reducing_gap=3.0)


def _save(im: Image.Image, fmt: str, **options: int) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    return buf.getvalue()


# ---------------------------------------------------------------- image.read (I/O)

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

async def read(session, p: ImageReadParams) -> ImageReadResult:
    """image.read: the file at `p.path` (relative paths from the workspace), as the session
    sees it, fitted within p.max_dim and p.max_bytes."""
    session.check_open()
    if not p.path or "\0" in p.path:
        raise ToolsdError(BAD_PARAMS, "path must be a non-empty file path without NUL bytes")
    max_frame = session.supervisor.config.max_frame
    if p.max_bytes > max_frame - _REPLY_OVERHEAD:
        raise ToolsdError(
            BAD_PARAMS,
            f"max_bytes {p.max_bytes} would not fit in a reply frame of this daemon "
            f"(--max-frame {max_frame}); ask for at most {max_frame - _REPLY_OVERHEAD}",
        )
    # The slot covers the read too: 20 concurrent reads of a 60 MB file once held 1.2 GB of
    # file bytes while waiting for a decode slot.
    try:
        async with threads.limiter("image_decode", DECODE_SLOTS):
            data = await _read_in_sandbox(session, p.path)
            fitted = await trio.to_thread.run_sync(
                lambda: fit_image(data, max_dim=p.max_dim, max_bytes=p.max_bytes,
                                  max_pixels=MAX_PIXELS))
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


async def _read_in_sandbox(session, path: str) -> bytes:
    """The bytes of `path` read by `head` inside the session's sandbox, at most READ_CAP.
    stdout and stderr get separate pipes, so an error text is never taken for file data."""
    info = session.launcher.info
    sh = info.get("sh") or info.get("bash")
    if not sh:
        raise ToolsdError(SANDBOX_UNAVAILABLE, "the sandbox has no sh to read files with")
    env = {**session.env, "LC_ALL": "C"}
    if not path.startswith("/"):
        path = "./" + path  # so that "-" is a file named "-", not head's standard input
    argv = [sh, "-c", _READ_SCRIPT, "toolsd-image-read", str(READ_CAP + 1), path]
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    devnull = jobs.open_devnull()
    try:
        job = await jobs.spawn(session, argv, cwd=session.workspace, env=env, stdin=devnull,
                               stdout=out_w, stderr=err_w, want_pid=False,
                               what=f"a reader for {path}", error_code=IO_ERROR)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        # The child holds the only copies of its ends now: its exit gives us EOF.
        os.close(out_w)
        os.close(err_w)
        os.close(devnull)

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
                await jobs.end_tree(job, 0)
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
    how = (f"killed by {jobs.signal_name(signal)}" if exit_code is None
           else f"exit status {exit_code}")
    return ToolsdError(IO_ERROR, f"reading {path} failed ({how}): {text or 'no error text'}")
