import io
import random
import os
import struct
import zlib

import psutil
import pytest
from PIL import Image, ImageDraw, PngImagePlugin

from toolsd.tools.images import MIN_MAX_BYTES, ImageTooLarge, NotAnImage, fit_image
from toolsd.tools.images.plain_png import sent_as_is
from toolsd.tools.images.sniff import SMALL_BYTES, SMALL_PIXELS, kept_as_is

from _crafted_images import jpeg_of_many_scans, jpeg_read_two_ways, png_of_many_chunks


def encode(im: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    return buf.getvalue()


def decode(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def diagram(size=(300, 200)) -> Image.Image:
    """A flat picture with few colours, as a screenshot or chart is."""
    im = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(im)
    w, h = size
    draw.rectangle([w // 10, h // 10, w // 2, h // 2], fill=(30, 90, 200))
    draw.line([(0, h - 1), (w - 1, 0)], fill="black", width=max(1, w // 100))
    return im


def photo(size=(300, 200)) -> Image.Image:
    """Many colours everywhere, as a photo has: random pixels over smooth gradients."""
    w, h = size
    gradient = Image.linear_gradient("L").resize(size)
    noise = Image.frombytes("L", size, os.urandom(w * h))
    reverse = gradient.transpose(Image.Transpose.ROTATE_180)
    return Image.merge("RGB", [gradient, reverse, noise])


def assert_aspect_kept(fitted, w, h):
    # Rounding each side to whole pixels moves it by up to half a pixel, and the ratio by
    # up to ratio * (0.5/width + 0.5/height); one pixel a side leaves room for float error.
    ratio = w / h
    slack = ratio * (1 / fitted.width + 1 / fitted.height)
    assert abs(fitted.width / fitted.height - ratio) <= slack


# --- kept as they are ---------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, media_type",
    [
        ("PNG", "image/png"),
        ("JPEG", "image/jpeg"),
        ("GIF", "image/gif"),
        ("WEBP", "image/webp"),
    ],
)
def test_small_image_of_a_sendable_format_is_sent_as_is(fmt, media_type):
    data = encode(diagram(), fmt)
    fitted = fit_image(data)
    assert fitted.data == data
    assert fitted.media_type == media_type
    assert (fitted.width, fitted.height) == (300, 200)
    assert not fitted.resized
    assert (fitted.original_format, fitted.original_bytes) == (fmt, len(data))


def animation(size=(60, 40), frames=3) -> bytes:
    images = [Image.new("RGB", size, colour) for colour in ("red", "green", "blue")[:frames]]
    return encode(images[0], "GIF", save_all=True, append_images=images[1:], duration=100)


def test_animated_gif_that_fits_keeps_every_frame():
    data = animation()
    fitted = fit_image(data)
    assert fitted.data == data and fitted.media_type == "image/gif"
    assert decode(fitted.data).n_frames == 3


def test_animated_gif_too_large_becomes_its_first_frame():
    fitted = fit_image(animation(size=(600, 400)), max_dim=150)
    assert fitted.media_type == "image/png"
    out = decode(fitted.data)
    assert getattr(out, "n_frames", 1) == 1
    assert (fitted.width, fitted.height) == (150, 100)
    assert out.convert("RGB").getpixel((75, 50)) == (255, 0, 0)


def test_animation_with_a_damaged_later_frame_is_not_sent_as_is():
    data = animation()
    damaged = data[: len(data) - 12]
    fitted = fit_image(damaged)
    assert fitted.data != damaged
    assert fitted.media_type == "image/png"
    assert decode(fitted.data).convert("RGB").getpixel((0, 0)) == (255, 0, 0)


# --- converted ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["BMP", "TIFF"])
def test_bmp_and_tiff_are_converted_flat_to_png_photo_to_jpeg(fmt):
    flat = fit_image(encode(diagram(), fmt))
    assert flat.media_type == "image/png"
    assert decode(flat.data).format == "PNG"
    assert (flat.width, flat.height, flat.resized) == (300, 200, False)
    assert flat.original_format == fmt
    assert decode(flat.data).convert("RGB").getpixel((100, 50)) == (30, 90, 200)

    shot = fit_image(encode(photo(), fmt))
    assert shot.media_type == "image/jpeg"
    assert decode(shot.data).format == "JPEG"
    assert (shot.width, shot.height) == (300, 200)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's, > 89 Mpx
def test_huge_image_fits_max_dim_and_max_bytes_with_aspect_kept():
    # A 12000x9000 (108 Mpx) JPEG: over the default 100 Mpx limit, so the caller raises it.
    im = Image.new("L", (12000, 9000), 255)
    draw = ImageDraw.Draw(im)
    for x in range(0, 12000, 500):
        draw.line([(x, 0), (12000 - x, 9000)], fill=0, width=20)
    data = encode(im, "JPEG", quality=80)
    del im
    with pytest.raises(ImageTooLarge):
        fit_image(data)
    fitted = fit_image(data, max_pixels=120_000_000, max_bytes=300_000)
    assert max(fitted.width, fitted.height) == 1568
    assert len(fitted.data) <= 300_000
    assert_aspect_kept(fitted, 12000, 9000)
    assert fitted.resized
    assert (fitted.original_width, fitted.original_height) == (12000, 9000)
    assert decode(fitted.data).size == (fitted.width, fitted.height)


def test_large_png_screenshot_is_downscaled_to_png():
    fitted = fit_image(encode(diagram((4000, 2500)), "PNG"), max_dim=1000)
    assert fitted.media_type == "image/png"
    assert (fitted.width, fitted.height) == (1000, 625)


def test_photo_shrinks_until_under_max_bytes():
    data = encode(photo((1500, 1000)), "PNG")
    fitted = fit_image(data, max_bytes=40_000)
    assert len(fitted.data) <= 40_000
    assert fitted.media_type == "image/jpeg"
    assert fitted.resized and fitted.width < 1500
    assert_aspect_kept(fitted, 1500, 1000)
    assert decode(fitted.data).size == (fitted.width, fitted.height)


def test_exif_orientation_6_swaps_width_and_height():
    im = Image.new("RGB", (60, 30), "blue")
    im.paste((255, 0, 0), (0, 0, 30, 30))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: show turned 90 degrees clockwise
    data = encode(im, "JPEG", exif=exif.tobytes(), quality=95)
    fitted = fit_image(data)
    assert (fitted.width, fitted.height) == (30, 60)
    assert (fitted.original_width, fitted.original_height) == (30, 60)
    assert fitted.data != data
    shown = decode(fitted.data).convert("RGB")
    r, g, b = shown.getpixel((15, 10))  # the left edge turned to the top
    assert r > 200 and b < 60
    r, g, b = shown.getpixel((15, 50))
    assert b > 200 and r < 60


def test_transparency_gives_png_with_alpha():
    im = photo((2000, 1000)).convert("RGBA")
    im.paste((0, 0, 0, 0), (0, 0, 1000, 1000))  # left half transparent
    fitted = fit_image(encode(im, "PNG"), max_dim=400)
    assert fitted.media_type == "image/png"
    out = decode(fitted.data)
    assert out.mode == "RGBA" and (fitted.width, fitted.height) == (400, 200)
    assert out.getpixel((50, 100))[3] == 0
    assert out.getpixel((350, 100))[3] == 255


def test_alpha_that_hides_nothing_does_not_force_png():
    im = photo((2000, 1000)).convert("RGBA")
    fitted = fit_image(encode(im, "PNG"), max_dim=400)
    assert fitted.media_type == "image/jpeg"


def test_screenshot_too_big_as_png_goes_jpeg_before_losing_pixels():
    im = diagram((1000, 1000))
    im.paste(photo((600, 500)), (300, 450))  # a photo inside a page: 30% of the area
    data = encode(im, "BMP")
    fitted = fit_image(data, max_bytes=300_000)
    assert fitted.media_type == "image/jpeg" and len(fitted.data) <= 300_000
    assert (fitted.width, fitted.height, fitted.resized) == (1000, 1000, False)
    assert fit_image(data).media_type == "image/png"  # with room, it stays PNG


def test_palette_image_with_transparent_index_keeps_its_transparency():
    im = Image.new("P", (100, 100), 0)
    im.putpalette([255, 255, 255, 200, 0, 0])
    im.paste(1, (50, 0, 100, 100))
    fitted = fit_image(encode(im, "GIF", transparency=0), max_dim=50)
    out = decode(fitted.data).convert("RGBA")
    assert fitted.media_type == "image/png"
    assert out.getpixel((5, 25))[3] == 0
    assert out.getpixel((45, 25)) == (200, 0, 0, 255)


def test_colour_key_transparency_of_an_rgb_png_is_kept():
    im = diagram((800, 400))
    fitted = fit_image(encode(im, "PNG", transparency=(255, 255, 255)), max_dim=400)
    out = decode(fitted.data).convert("RGBA")
    assert fitted.media_type == "image/png"
    assert out.getpixel((350, 180))[3] == 0  # the white background is see-through
    assert out.getpixel((60, 50)) == (30, 90, 200, 255)


def test_cmyk_jpeg_is_converted_to_rgb():
    data = encode(Image.new("CMYK", (80, 60), (0, 255, 255, 0)), "JPEG")
    fitted = fit_image(data)
    assert fitted.data != data
    out = decode(fitted.data)
    assert out.mode == "RGB"
    r, g, b = out.getpixel((40, 30))
    assert r > 200 and g < 60 and b < 60


def test_16_bit_greyscale_is_scaled_not_clipped():
    im = Image.new("I;16", (256, 10))
    im.putdata([x * 257 for x in range(256)] * 10)
    fitted = fit_image(encode(im, "TIFF"))
    out = decode(fitted.data).convert("L")
    assert abs(out.getpixel((128, 5)) - 128) <= 4
    assert out.getpixel((0, 5)) <= 4 and out.getpixel((255, 5)) >= 250


# --- refused ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello, this is a text file\n" * 20,
        # A C header in X bitmap form: Pillow would decode it, we take only real formats.
        b"#define icon_width 8\n#define icon_height 2\n"
        b"static char icon_bits[] = {\n0xff, 0x00};\n",
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n",  # EPS would run Ghostscript
        os.urandom(4096),
    ],
    ids=["empty", "text", "xbm-header", "eps", "random"],
)
def test_non_images_are_refused(data):
    with pytest.raises(NotAnImage):
        fit_image(data)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF"])
def test_truncated_image_is_refused(fmt):
    data = encode(photo(), fmt)
    with pytest.raises(NotAnImage, match="truncated"):
        fit_image(data[: len(data) // 2])


def png_declaring(width: int, height: int) -> bytes:
    """A real 1x1 PNG whose IHDR (CRC fixed) claims another size: cheap to make, huge to
    decode if anyone believed it."""
    data = bytearray(encode(Image.new("RGB", (1, 1)), "PNG"))
    ihdr = bytearray(data[12:29])  # chunk type + 13 bytes of fields
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    return bytes(data)


def gif_bomb() -> bytes:
    screen = struct.pack("<HHBBB", 65535, 65535, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = b"," + struct.pack("<HHHHB", 0, 0, 65535, 65535, 0) + b"\x02\x02\x4c\x01\x00"
    return b"GIF89a" + screen + frame + b";"


@pytest.mark.parametrize(
    "data", [png_declaring(100_000, 100_000), gif_bomb()], ids=["png", "gif"]
)
def test_decompression_bomb_is_refused_with_memory_flat(data):
    process = psutil.Process()
    before = process.memory_info().rss
    with pytest.raises(ImageTooLarge):
        fit_image(data)
    # Decoding 10 or 4 Gpx would take gigabytes; the header check takes nothing.
    assert process.memory_info().rss - before < 50 * 1024 * 1024


def test_own_pixel_limit_applies_below_pillows_global_limit():
    data = encode(diagram((2000, 2000)), "PNG")
    assert fit_image(data, max_pixels=4_000_000).width == 1568
    with pytest.raises(ImageTooLarge, match="2000x2000"):
        fit_image(data, max_pixels=3_999_999)


def test_declared_size_is_checked_before_decoding():
    # Over the limit and truncated: the size check must win, before any pixel is read.
    with pytest.raises(ImageTooLarge):
        fit_image(png_declaring(3000, 3000), max_pixels=1_000_000)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"max_dim": 0}, "max_dim"), ({"max_bytes": MIN_MAX_BYTES - 1}, "max_bytes"),
     ({"max_pixels": 0}, "max_pixels")],
)  # fmt: skip
def test_impossible_budgets_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=field):
        fit_image(encode(diagram(), "PNG"), **kwargs)


def test_smallest_budget_still_fits_a_photo():
    fitted = fit_image(encode(photo((800, 600)), "PNG"), max_bytes=MIN_MAX_BYTES, max_dim=1)
    assert len(fitted.data) <= MIN_MAX_BYTES
    assert (fitted.width, fitted.height) == (1, 1)


# --- fitted in the event loop (kept_as_is) --------------------------------------------


def png_with(text: str = "", compressed: bool = False, size=(16, 16), **options) -> bytes:
    info = PngImagePlugin.PngInfo()
    if text:
        info.add_text("Comment", text, zip=compressed)
    return encode(Image.new("RGB", size, (200, 30, 30)), "PNG", pnginfo=info, **options)


def exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(photo((16, 12)), "JPEG", exif=exif.tobytes())


def mpo() -> bytes:
    frames = [Image.new("RGB", (16, 16), c) for c in ("red", "blue")]
    return encode(frames[0], "MPO", save_all=True, append_images=frames[1:])


SMALL_AS_THEY_ARE = {
    "png 1x1": encode(Image.new("RGB", (1, 1)), "PNG"),
    "png at the pixel limit": encode(Image.new("RGBA", (128, 128)), "PNG"),
    "png palette, transparent": encode(Image.new("P", (10, 10)), "PNG", transparency=0),
    "png 16-bit grey": encode(Image.new("I;16", (10, 10)), "PNG"),
    "png with plain text": png_with("made by a test"),
    "jpeg": encode(photo((64, 48)), "JPEG"),
    "jpeg grey": encode(Image.new("L", (64, 48)), "JPEG"),
}
NOT_VOUCHED_FOR = {
    "png over the pixel limit": encode(Image.new("RGB", (129, 128)), "PNG"),
    "png with compressed text": png_with("x" * 1000, compressed=True),
    "png with a colour profile": png_with(icc_profile=b"\0" * 200),
    "png without its end": encode(Image.new("RGB", (1, 1)), "PNG")[:-12],
    "animated png": encode(Image.new("RGB", (8, 8)), "PNG", save_all=True,
                           append_images=[Image.new("RGB", (8, 8), "blue")]),
    "jpeg progressive": encode(photo((64, 48)), "JPEG", progressive=True),
    "jpeg cmyk": encode(Image.new("CMYK", (16, 16)), "JPEG"),
    "jpeg exif rotated": exif_rotated(),
    "mpo": mpo(),
    "gif": encode(Image.new("P", (8, 8)), "GIF"),
    "webp": encode(Image.new("RGB", (8, 8)), "WEBP"),
    "png declaring a huge size": png_declaring(100_000, 100_000),
    "text": b"\x89PNG\r\n\x1a\n but not really",
}


@pytest.mark.parametrize("name", sorted(SMALL_AS_THEY_ARE))
def test_small_plain_png_or_jpeg_that_fits_is_kept_as_is(name):
    data = SMALL_AS_THEY_ARE[name]
    assert kept_as_is(data, 1568, 3_750_000)
    fitted = fit_image(data)
    assert fitted.data == data and not fitted.resized


@pytest.mark.parametrize("name", sorted(NOT_VOUCHED_FOR))
def test_what_decoding_could_spend_time_on_is_not_vouched_for(name):
    assert not kept_as_is(NOT_VOUCHED_FOR[name], 1568, 3_750_000)


def test_kept_as_is_asks_the_picture_to_fit_the_callers_budget():
    data = encode(photo((64, 48)), "JPEG")
    assert kept_as_is(data, 64, len(data))
    assert not kept_as_is(data, 63, len(data))
    assert not kept_as_is(data, 64, len(data) - 1)
    assert SMALL_PIXELS >= 64 * 48


# ------------------------------------------------------------------ files that cost more than their size


def test_a_jpeg_read_two_ways_is_not_vouched_for():
    # 10 KB that Pillow reads as 8192x8192 progressive: kept_as_is once read it as 1x1, and
    # image.read then decoded 1000 scans of it in the event loop, every session waiting.
    data = jpeg_read_two_ways(8192, 8192, scans=1000)
    assert Image.open(io.BytesIO(data)).size == (8192, 8192)
    assert not kept_as_is(data, 1568, 3_750_000)


def test_a_small_jpeg_of_many_scans_is_not_vouched_for():
    data = jpeg_of_many_scans(1000)
    assert Image.open(io.BytesIO(data)).size == (128, 128)
    assert not kept_as_is(data, 1568, 3_750_000)
    assert kept_as_is(jpeg_of_many_scans(1), 1568, 3_750_000)  # its three scans: fine


def test_a_png_of_many_chunks_is_not_vouched_for():
    data = png_of_many_chunks(10_000)
    assert Image.open(io.BytesIO(data)).size == (1, 1)
    assert not kept_as_is(data, 1568, 3_750_000)
    assert kept_as_is(png_of_many_chunks(10), 1568, 3_750_000)


def test_what_is_vouched_for_is_small_in_bytes_too():
    big = encode(Image.new("L", (16, 16)), "PNG") + b"\0" * SMALL_BYTES
    assert Image.open(io.BytesIO(big)).size == (16, 16)
    assert not kept_as_is(big, 1568, 16_000_000)


def test_a_jpeg_of_a_thousand_scans_is_refused_before_its_pixels():
    with pytest.raises(ImageTooLarge, match="1001 scans, over the limit of 100"):
        fit_image(jpeg_read_two_ways(8192, 8192, scans=1000))
    with pytest.raises(ImageTooLarge, match="scans"):
        fit_image(jpeg_of_many_scans(1000))


# ------------------------------------------------------------------ sent without a decode (plain_png)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(
        ">I", zlib.crc32(body, zlib.crc32(kind)))


def png_of(rows: bytes, *, ihdr: bytes = struct.pack(">IIBBBBB", 2, 2, 8, 0, 0, 0, 0),
           split: int | None = None, between: bytes = b"", cut: int = 0) -> bytes:
    """A greyscale PNG whose raw rows (each a filter byte and its pixels) are given, CRCs
    right: damaged only where a test damages it. `split`: the deflated rows in two IDAT
    chunks at that byte, with `between` (whole chunks) between them; `cut`: bytes taken off
    the end of the deflated rows."""
    z = zlib.compress(rows)
    z = z[:len(z) - cut]
    cut = len(z) if split is None else split
    idat = png_chunk(b"IDAT", z[:cut]) + between + (png_chunk(b"IDAT", z[cut:]) if
                                                    split is not None else b"")
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + idat
            + png_chunk(b"IEND", b""))


SENT_WITHOUT_A_DECODE = {
    **{f"png {mode}": encode(Image.effect_noise((7, 5), 60).convert(mode), "PNG")
       for mode in ("1", "L", "LA", "P", "RGB", "RGBA")},
    "png 16-bit grey": encode(Image.new("I;16", (10, 10), 300), "PNG"),
    "png 2-bit palette, transparent": encode(Image.new("P", (9, 3)), "PNG", bits=2,
                                             transparency=0),
    "png colour key and dpi": encode(Image.new("RGB", (9, 3)), "PNG", transparency=(1, 2, 3),
                                     dpi=(72, 72)),
    "png at the pixel limit": SMALL_AS_THEY_ARE["png at the pixel limit"],
    "png in two IDAT chunks": png_of(b"\0\1\2\0\3\4", split=4),
}
DECODED_TO_BE_SURE = {
    "a row's filter unknown": png_of(b"\0\1\2\5\3\4"),
    "rows missing": png_of(b"\0\1\2"),
    "rows too many": png_of(b"\0\1\2\0\3\4\0\5\6"),
    "deflate cut short": png_of(b"\0\1\2\0\3\4", cut=6),
    "a chunk between its IDATs": png_of(b"\0\1\2\0\3\4", split=4,
                                        between=png_chunk(b"gAMA", b"\0\0\0\1")),
    "interlaced": png_of(b"\0\1\0\2\0\3\4", ihdr=struct.pack(">IIBBBBB", 2, 2, 8, 0, 0, 0, 1)),
    "a bad CRC": encode(Image.new("L", (2, 2)), "PNG")[:-20] + b"\0" * 4
                 + encode(Image.new("L", (2, 2)), "PNG")[-16:],
    "a depth Pillow does not know": png_of(b"\0\1\2\0\3\4",
                                           ihdr=struct.pack(">IIBBBBB", 2, 2, 3, 0, 0, 0, 0)),
    "a palette without PLTE": png_of(b"\0\1\2\0\3\4",
                                     ihdr=struct.pack(">IIBBBBB", 2, 2, 8, 3, 0, 0, 0)),
    "text (may say an orientation)": SMALL_AS_THEY_ARE["png with plain text"],
    "a JPEG": SMALL_AS_THEY_ARE["jpeg"],
}


@pytest.mark.parametrize("name", sorted(SENT_WITHOUT_A_DECODE))
def test_a_plain_png_is_answered_as_fit_image_answers_without_a_decode(name):
    data = SENT_WITHOUT_A_DECODE[name]
    fitted = sent_as_is(data, 1568, 3_750_000, 100_000_000)
    assert fitted is not None and fitted.data == data
    assert fitted == fit_image(data)


@pytest.mark.parametrize("name", sorted(DECODED_TO_BE_SURE))
def test_a_png_not_checked_whole_is_left_to_fit_image(name):
    assert sent_as_is(DECODED_TO_BE_SURE[name], 1568, 3_750_000, 100_000_000) is None


@pytest.mark.parametrize("name", ["a row's filter unknown", "a chunk between its IDATs",
                                  "deflate cut short", "a bad CRC"])
def test_the_damaged_pngs_left_to_fit_image_are_refused_by_it(name):
    # What sent_as_is leaves alone keeps fit_image's answer: for these, that they are damaged.
    with pytest.raises(NotAnImage):
        fit_image(DECODED_TO_BE_SURE[name])


def test_a_plain_png_is_answered_within_the_callers_budget_only():
    data = encode(Image.effect_noise((30, 20), 60).convert("RGB"), "PNG")
    assert len(data) > MIN_MAX_BYTES
    assert sent_as_is(data, 30, len(data), 600) is not None
    assert sent_as_is(data, 29, len(data), 600) is None
    assert sent_as_is(data, 30, len(data), 599) is None
    assert sent_as_is(data, 30, len(data) - 1, 600) is None
    small = SENT_WITHOUT_A_DECODE["png RGB"]
    with pytest.raises(ValueError):
        fit_image(small, max_bytes=MIN_MAX_BYTES - 1)
    assert sent_as_is(small, 1568, MIN_MAX_BYTES - 1, 100_000_000) is None


def test_whatever_plain_png_vouches_for_fit_image_answers_the_same():
    # Damage of every kind, CRCs kept right so that it reaches the pixels.
    rng = random.Random(23)
    bases = list(SENT_WITHOUT_A_DECODE.values())
    vouched = 0
    for _ in range(3000):
        data = bytearray(rng.choice(bases))
        at = 8
        while at + 12 <= len(data):
            length = struct.unpack_from(">I", data, at)[0]
            if at + 12 + length > len(data):
                break
            if length and rng.random() < 0.3:
                data[at + 8 + rng.randrange(length)] = rng.randrange(256)
                body = bytes(data[at + 4:at + 8 + length])
                data[at + 8 + length:at + 12 + length] = struct.pack(">I", zlib.crc32(body))
            at += 12 + length
        if rng.random() < 0.2:
            data = data[:rng.randrange(len(data))]
        fitted = sent_as_is(bytes(data), 1568, 3_750_000, 100_000_000)
        if fitted is not None:
            vouched += 1
            assert fitted == fit_image(bytes(data))
    assert vouched > 100
