"""Small files crafted to make a decoder work far beyond their size (for test_images and
test_image_read): each is what a hostile session could leave for image.read."""

from __future__ import annotations

import struct
import zlib


def segment(marker: int, body: bytes) -> bytes:
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(body) + 2) + body


_DQT = segment(0xDB, b"\x00" + bytes([1] * 64))
_DHT = (segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")
        + segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\x00"))


def jpeg_read_two_ways(width: int, height: int, scans: int) -> bytes:
    """A JPEG that a careless parser reads as a 1x1 baseline picture and Pillow and libjpeg
    read as a width x height progressive one of `scans` empty scans (each a pass over every
    block). "FF 00" is padding to Pillow and libjpeg, a segment with a length to the careless
    parser; its SOF0 lies inside what they read as a comment."""
    sof_big = segment(0xC2, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    sof_small = segment(0xC0, struct.pack(">BHHB", 8, 1, 1, 1) + b"\x01\x11\x00")
    hidden = _DQT + sof_big + _DHT + b"\xff\xfe" + struct.pack(">H", 2 + len(sof_small))
    head = b"\xff\xd8\xff\x00" + struct.pack(">H", len(hidden) + 2) + hidden + sof_small
    dc = segment(0xDA, b"\x01\x01\x00\x00\x00\x00")
    ac = segment(0xDA, b"\x01\x01\x00\x01\x3f\x00")
    return head + dc + ac * scans + b"\xff\xd9"


def jpeg_of_many_scans(scans: int) -> bytes:
    """An honest 128x128 baseline JPEG whose three components come in separate scans,
    repeated `scans` times: libjpeg decodes every one."""
    sof = segment(0xC0, struct.pack(">BHHB", 8, 128, 128, 3)
                  + b"".join(bytes([i + 1, 0x11, 0]) for i in range(3)))
    one = b"".join(segment(0xDA, bytes([1, i + 1, 0, 0, 63, 0])) for i in range(3))
    return b"\xff\xd8" + _DQT + sof + _DHT + one * scans + b"\xff\xd9"


def png_of_many_chunks(chunks: int) -> bytes:
    """A 1x1 PNG with `chunks` empty tEXt chunks: Pillow reads each in Python."""
    def chunk(kind: bytes, body: bytes = b"") -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))
    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    return (b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"tEXt") * chunks
            + chunk(b"IDAT", zlib.compress(b"\0\0")) + chunk(b"IEND"))
