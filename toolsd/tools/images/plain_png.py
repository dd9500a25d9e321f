"""What fit_image (fit.py) answers for a small plain PNG it sends as it is, found without
Pillow: every chunk and every row of pixels checked here, so that image.read need not
decode the picture to learn that it decodes.

Pure, and stricter than Pillow: it answers only for a picture it has checked whole (each
chunk's CRC, the known chunks' lengths, the pixel data inflated to exactly the rows the
header declares, each row with a known filter), and None for anything else, which then
goes through fit_image, whose answer (or error) it always was. Whatever it answers for is
one that Pillow opens, decodes and keeps as it is: a size and a colour type Pillow knows,
no interlacing, no text or EXIF (both can carry an orientation), no animation.
"""

from __future__ import annotations

import struct
import zlib

from toolsd.tools.images.fit import MIN_MAX_BYTES, Fitted
from toolsd.tools.images.sniff import SMALL_BYTES, SMALL_PIXELS

__all__ = ["sent_as_is"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MOST_CHUNKS = 64
# Colour type -> samples a pixel, with the bit depths Pillow decodes it at (PngImagePlugin's
# _MODES); any other pair Pillow refuses or reads otherwise.
_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# Ancillary chunks whose only effect in Pillow is a field of `info` (or none), each with
# the least length its reader needs: no text (an orientation may hide in it), no colour
# profile (compressed), no EXIF.
_INFO_CHUNKS = {b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9, b"sBIT": 1, b"bKGD": 1,
                b"tIME": 7}
_PALETTE = 3
_FILTERS = 5  # none, sub, up, average, Paeth


def sent_as_is(data: bytes, max_dim: int, max_bytes: int, max_pixels: int) -> Fitted | None:
    """fit_image(data, max_dim=..., max_bytes=..., max_pixels=...)'s answer if `data` is a
    small plain PNG that it sends as it is; None if this cannot vouch for that (fit_image
    may then answer the same, refuse the budget, or find the picture damaged)."""
    if max_bytes < MIN_MAX_BYTES or len(data) > min(max_bytes, SMALL_BYTES) \
            or not data.startswith(_SIGNATURE):
        return None
    size = _checked_size(data)
    if size is None:
        return None
    width, height = size
    if max(width, height) > max_dim or width * height > max_pixels:
        return None
    return Fitted(media_type="image/png", width=width, height=height, data=data,
                  resized=False, original_format="PNG", original_width=width,
                  original_height=height, original_bytes=len(data))


def _checked_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG that decodes whole, as laid out in the module's docstring."""
    at = len(_SIGNATURE)
    header = None
    palette = 0
    transparency = None
    pixels: list[bytes] = []
    idat_ended = False
    for _ in range(_MOST_CHUNKS):
        if at + 12 > len(data):
            return None
        length, kind = struct.unpack_from(">I4s", data, at)
        end = at + 8 + length
        if end + 4 > len(data):
            return None
        body = data[at + 8:end]
        (crc,) = struct.unpack_from(">I", data, end)
        if zlib.crc32(body, zlib.crc32(kind)) != crc:
            return None
        at = end + 4
        if header is None:
            if kind != b"IHDR" or length != 13:
                return None
            header = struct.unpack(">IIBBBBB", body)
            continue
        if kind == b"IDAT":
            if idat_ended:
                return None  # Pillow stops at the first chunk that is not IDAT
            pixels.append(body)
            continue
        if pixels:
            idat_ended = True
        if kind == b"IEND":
            if at != len(data) or not pixels:
                return None
            return _rows_check(header, palette, transparency, b"".join(pixels))
        if kind == b"PLTE":
            if pixels or palette or length % 3 or not 3 <= length <= 768:
                return None
            palette = length // 3
        elif kind == b"tRNS":
            if pixels or transparency is not None:
                return None
            transparency = length
        elif kind not in _INFO_CHUNKS or length < _INFO_CHUNKS[kind]:
            return None
    return None


def _rows_check(header: tuple, palette: int, transparency: int | None,
                compressed: bytes) -> tuple[int, int] | None:
    width, height, depth, colour, method, filtering, interlace = header
    if not 1 <= width * height <= SMALL_PIXELS:
        return None
    if depth not in _DEPTHS.get(colour, ()) or method or filtering or interlace:
        return None
    if colour == _PALETTE:
        if not palette or (transparency is not None and not 1 <= transparency <= palette):
            return None
    elif transparency is not None and transparency != {0: 2, 2: 6}.get(colour):
        return None
    stride = 1 + (width * depth * _SAMPLES[colour] + 7) // 8
    want = stride * height
    inflate = zlib.decompressobj()
    try:
        rows = inflate.decompress(compressed, want + 1)
    except zlib.error:
        return None
    if len(rows) != want or not inflate.eof or inflate.unused_data or inflate.unconsumed_tail:
        return None
    if any(rows[y] >= _FILTERS for y in range(0, want, stride)):
        return None
    return width, height
