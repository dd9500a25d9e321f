"""Which pictures fit_image (fit.py) would send as they are after one short decode, read from
their bytes alone, without Pillow: image.read fits those in the event loop, where that
decode costs less than the hop to a worker thread and back, and any other in a thread.

Pure, and cautious: it vouches only for a plain PNG or baseline JPEG of few pixels, and
says False for anything it does not know, which then simply goes the usual way.
"""

from __future__ import annotations

import struct

__all__ = ["SMALL_PIXELS", "kept_as_is"]

# A picture of at most this many pixels decodes in less time than a hop to a worker thread
# and back.
SMALL_PIXELS = 128 * 128
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG chunks whose reading is bounded by their own size: no compressed text or colour
# profile (a few bytes of zTXt may inflate to megabytes), no EXIF (a rotation means
# re-encoding), no animation.
_PLAIN_PNG_CHUNKS = {b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND", b"gAMA", b"cHRM", b"sRGB",
                     b"sBIT", b"pHYs", b"bKGD", b"tEXt", b"tIME"}
_JPEG_BASELINE = (0xC0, 0xC1)  # SOF0, SOF1: one scan per component, unlike progressive
_JPEG_NO_LENGTH = {0x01, *range(0xD0, 0xD8)}
_JPEG_SCAN = 0xDA


def kept_as_is(data: bytes, max_dim: int, max_bytes: int) -> bool:
    """True if `fit_image` would send `data` as it is, after one short decode: a plain PNG
    or baseline JPEG of at most SMALL_PIXELS that fits max_dim and max_bytes, without
    EXIF, animation or anything else that decoding could spend its time on. Read from the
    bytes alone, without Pillow; False for anything it does not vouch for."""
    if len(data) > max_bytes:
        return False
    if data.startswith(_PNG_SIGNATURE):
        size = _plain_png_size(data)
    elif data.startswith(b"\xff\xd8"):
        size = _baseline_jpeg_size(data)
    else:
        return False
    if size is None:
        return False
    w, h = size
    return 1 <= w * h <= SMALL_PIXELS and max(w, h) <= max_dim


def _plain_png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG made only of _PLAIN_PNG_CHUNKS, through IEND; else None."""
    at = len(_PNG_SIGNATURE)
    size = None
    while at + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        if kind not in _PLAIN_PNG_CHUNKS or at + 12 + length > len(data):
            return None
        if kind == b"IHDR":
            if size is not None or length != 13:
                return None
            size = struct.unpack_from(">II", data, at + 8)
        elif size is None:
            return None  # IHDR comes first
        elif kind == b"IEND":
            return size
        at += 12 + length
    return None


def _baseline_jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a baseline JPEG of one or three components whose segments before
    its pixels carry no EXIF and no second picture (MPO); else None."""
    at = 2
    size = None
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == _JPEG_SCAN:
            return size  # Pillow reads no further as it opens the file
        if marker in _JPEG_NO_LENGTH or marker == 0xFF:
            return None
        (length,) = struct.unpack_from(">H", data, at + 2)
        body = data[at + 4:at + 2 + length]
        if length < 2 or len(body) != length - 2:
            return None
        if marker in _JPEG_BASELINE:
            if size is not None or len(body) < 6:
                return None
            height, width, components = struct.unpack_from(">HHB", body, 1)
            if components not in (1, 3):
                return None
            size = (width, height)
        elif 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xCC):
            return None  # another kind of frame
        elif marker == 0xE1 and body.startswith(b"Exif") or \
                marker == 0xE2 and body.startswith(b"MPF"):
            return None
        at += 2 + length
    return None
