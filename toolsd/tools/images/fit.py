"""Fit an image file into a model's image budget: decode safely, orient, downscale,
re-encode.

Pure core: bytes in, bytes out, no file or network access. Decoding is CPU-bound and can
take a second on a large photo, so the caller runs `fit_image` in a worker thread; it
touches no global state (Pillow's MAX_IMAGE_PIXELS and LOAD_TRUNCATED_IMAGES are left as
they are), so concurrent calls are safe.

Exceptions::

    Exception
     +-- NotAnImage      the bytes are not a decodable image of an accepted format
     +-- ImageTooLarge   the declared size is over the pixel limit (decompression bomb), or
                         a JPEG has more scans than MAX_JPEG_SCANS

The I/O part, image.read, is read.py's.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

from PIL import Image, ImageOps

__all__ = ["Fitted", "ImageTooLarge", "NotAnImage", "fit_image", "MIN_MAX_BYTES"]


# Scans of a JPEG we decode: libjpeg passes over every block of the picture once a scan, so
# a few bytes a scan buy seconds of decode. Progressive encoders write about ten; a count
# also takes in an EXIF thumbnail's.
MAX_JPEG_SCANS = 100


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
        # decodes at 2000x1500, faster and with a quarter of the memory.
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
    if im.format in ("JPEG", "MPO") and (scans := data.count(b"\xff\xda")) > MAX_JPEG_SCANS:
        raise ImageTooLarge(
            f"the JPEG has {scans} scans, over the limit of {MAX_JPEG_SCANS} (each decodes "
            f"the whole picture again); save it again as a plain JPEG or a PNG")
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
