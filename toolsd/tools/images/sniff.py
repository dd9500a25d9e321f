"""Which pictures fit_image (fit.py) would send as they are after one short decode, read from
their bytes alone, without Pillow: image.read fits those in the event loop, where that
decode costs less than the hop to a worker thread and back, and any other in a thread.

Pure, and cautious: it vouches only for a plain PNG or baseline JPEG of few pixels, and
says False for anything it does not know, which then simply goes the usual way.
"""

from __future__ import annotations

import struct

__all__ = ["SMALL_PIXELS", "SMALL_BYTES", "kept_as_is"]

# A picture of at most this many pixels decodes in less time than a hop to a worker thread
# and back.
SMALL_PIXELS = 128 * 128
# Nor more bytes than such a picture needs (16-bit RGBA stored flat, plus room): what bounds
# the work of a decoder that goes chunk by chunk or scan by scan, whatever the header says.
SMALL_BYTES = SMALL_PIXELS * 8 + 64 * 1024
# Chunks of a PNG vouched for: Pillow reads each in Python; a small picture needs few.
_PNG_MAX_CHUNKS = 64
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG chunks whose reading is bounded by their own size: no compressed text or colour
# profile (a few bytes of zTXt may inflate to megabytes), no EXIF (a rotation means
# re-encoding), no animation.
_PLAIN_PNG_CHUNKS = {b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND", b"gAMA", b"cHRM", b"sRGB",
                     b"sBIT", b"pHYs", b"bKGD", b"tEXt", b"tIME"}
_JPEG_BASELINE = (0xC0, 0xC1)  # SOF0, SOF1: one scan per component, unlike progressive
# Segments read the same way by us, Pillow and libjpeg: nothing that one of them takes as
# padding or as a marker without a length (FF00, FFFF, SOI, EOI, RSTn, TEM), which would
# let a file be read two ways (a small frame for us, a large progressive one for them).
_JPEG_KNOWN = {0xC0, 0xC1, 0xC4, 0xDB, 0xDD, 0xFE, *range(0xE0, 0xF0)}
_JPEG_SCAN = 0xDA


def kept_as_is(data: bytes, max_dim: int, max_bytes: int) -> bool:
    """True if `fit_image` would send `data` as it is, after one short decode: a plain PNG
    or baseline JPEG of at most SMALL_PIXELS that fits max_dim and max_bytes, without
    EXIF, animation or anything else that decoding could spend its time on. Read from the
    bytes alone, without Pillow; False for anything it does not vouch for."""
    if len(data) > min(max_bytes, SMALL_BYTES):
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
    """(width, height) of a PNG made only of _PLAIN_PNG_CHUNKS, at most _PNG_MAX_CHUNKS of
    them, through IEND; else None."""
    at = len(_PNG_SIGNATURE)
    size = None
    for _ in range(_PNG_MAX_CHUNKS):
        if at + 8 > len(data):
            return None
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
    its pixels carry no EXIF and no second picture (MPO), with no more scans than
    components (a scan is a pass over every block); else None."""
    at = 2
    size, components = None, 0
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == _JPEG_SCAN:
            # Pillow reads no further as it opens the file. In the coded data a 0xFF byte
            # is always followed by 0x00, so this counts the scans (and maybe more).
            return size if data.count(b"\xff\xda", at) <= components else None
        if marker not in _JPEG_KNOWN:
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
        elif marker == 0xE1 and body.startswith(b"Exif") or \
                marker == 0xE2 and body.startswith(b"MPF"):
            return None
        at += 2 + length
    return None
