"""image.read through a real daemon: formats, fitting, bad files, bombs, hidden paths, odd
files, the CLI."""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import sys
import zlib

import psutil
import pytest
from PIL import Image

from _crafted_images import jpeg_read_two_ways
from conftest import RunningDaemon, needs_bwrap, short_tempdir
from toolsd.client import ToolsdError

# One daemon for the module; each test its own workspace and session.
pytestmark = pytest.mark.daemon(shared=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def encode(im: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **options)
    return buf.getvalue()


def picture(size=(320, 200)) -> Image.Image:
    """A photo-like RGB picture: gradients and noise, so no encoder finds it trivial."""
    w, h = size
    ramp = Image.linear_gradient("L").resize((w, h))
    return Image.merge("RGB", (ramp, ramp.transpose(Image.Transpose.ROTATE_90).resize((w, h)),
                               Image.effect_noise((w, h), 40)))


def write(folder: str, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def decoded(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def error_of(call) -> ToolsdError:
    with pytest.raises(ToolsdError) as e:
        call()
    return e.value


@pytest.fixture
def workspace(daemon):
    return daemon.workspace


@pytest.fixture
def session(daemon, client, workspace):
    session = client.session_open(workspace)["session"]
    yield session
    client.session_close(session)
    # Whatever image.read ran inside the sandbox went with the session, if not before.
    assert not daemon.tree(), daemon.tree()


def peak_rss(pid: int) -> int:
    """The process's high-water mark of resident memory (VmHWM), in bytes: a decode that
    allocated and freed hundreds of MB between two samples still shows here."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


# ------------------------------------------------------------------ formats


SENT_AS_IS = [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("GIF", "image/gif"),
              ("WEBP", "image/webp")]


@pytest.mark.parametrize("fmt,media_type", SENT_AS_IS, ids=[f for f, _ in SENT_AS_IS])
def test_accepted_format_comes_back_as_the_file(workspace, client, session, fmt, media_type):
    data = encode(picture(), fmt)
    write(workspace, f"pic.{fmt.lower()}", data)
    r = client.image_read(session, os.path.join(workspace, f"pic.{fmt.lower()}"))
    assert r["media_type"] == media_type
    assert (r["width"], r["height"]) == (320, 200)
    assert r["data"] == data and r["resized"] is False
    assert r["original"] == {"format": fmt, "width": 320, "height": 200, "bytes": len(data)}


@pytest.mark.parametrize("fmt", ["BMP", "TIFF"])
def test_format_models_do_not_take_is_converted(workspace, client, session, fmt):
    data = encode(picture(), fmt)
    path = write(workspace, f"pic.{fmt.lower()}", data)
    r = client.image_read(session, path)
    assert r["media_type"] in ("image/png", "image/jpeg")
    im = decoded(r["data"])
    assert im.format == r["media_type"].split("/")[1].upper()
    assert im.size == (r["width"], r["height"]) == (320, 200)
    assert r["original"] == {"format": fmt, "width": 320, "height": 200, "bytes": len(data)}


def test_108_megapixel_photo_fits_budget_with_aspect_kept(workspace, client, session):
    big = picture((1200, 900)).resize((12000, 9000), Image.Resampling.NEAREST)
    data = encode(big, "JPEG", quality=80)
    del big
    path = write(workspace, "phone.jpg", data)
    r = client.image_read(session, path, max_bytes=300_000)
    assert r["resized"] is True
    assert (r["width"], r["height"]) == (1568, 1176)  # 12000:9000 is 4:3
    assert len(r["data"]) <= 300_000
    assert decoded(r["data"]).size == (1568, 1176)
    assert r["original"] == {"format": "JPEG", "width": 12000, "height": 9000,
                             "bytes": len(data)}


def test_relative_path_is_taken_from_the_workspace(workspace, client, session):
    data = encode(picture((40, 30)), "PNG")
    write(workspace, "shots/a.png", data)
    r = client.image_read(session, "shots/a.png")
    assert r["data"] == data and (r["width"], r["height"]) == (40, 30)


def test_a_file_named_dash_is_a_file_not_standard_input(workspace, client, session):
    data = encode(picture((20, 10)), "PNG")
    write(workspace, "-", data)
    r = client.image_read(session, "-")
    assert r["data"] == data and (r["width"], r["height"]) == (20, 10)


# ------------------------------------------------------------------ bad files


def truncated_png() -> bytes:
    data = encode(picture(), "PNG")
    return data[: len(data) // 2]


@pytest.mark.parametrize("content", [truncated_png(), b"just some text\n" * 20, b""],
                         ids=["truncated-png", "text", "empty"])
def test_not_an_image(workspace, client, session, content):
    path = write(workspace, "broken.png", content)
    e = error_of(lambda: client.image_read(session, path))
    assert e.code == "not_an_image"
    assert "broken.png" in e.message


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_small_picture_with_damaged_pixels_is_refused_as_a_large_one_is(workspace, client,
                                                                         session):
    """A small plain PNG is fitted in the event loop (tools/images/sniff.py): sound chunks
    around pixels that do not inflate must still be not_an_image, and the daemon goes on."""
    ihdr = struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0)
    damaged = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
               + png_chunk(b"IDAT", b"not zlib data at all") + png_chunk(b"IEND", b""))
    write(workspace, "damaged.png", damaged)
    for _ in range(2):  # the second read goes through the session's file helper
        e = error_of(lambda: client.image_read(session, "damaged.png"))
        assert e.code == "not_an_image" and "damaged.png" in e.message
    fine = encode(picture((8, 8)), "PNG")
    write(workspace, "fine.png", fine)
    assert client.image_read(session, "fine.png")["data"] == fine


def png_bomb(width: int, height: int) -> bytes:
    """A valid 1-bit PNG of width x height black pixels: a few KB on disk, one byte per pixel
    once Pillow decodes it."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body))

    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def test_decompression_bomb_is_refused_with_memory_flat(daemon, workspace, client, session):
    # 144 Mpx: over our limit, yet under the ~179 Mpx where Pillow itself would refuse, so
    # only toolsd's own limit stands between this file and 144 MB of pixels.
    data = png_bomb(12000, 12000)
    assert len(data) < 100_000
    path = write(workspace, "bomb.png", data)
    before = peak_rss(daemon.proc.pid)
    e = error_of(lambda: client.image_read(session, path))
    assert e.code == "image_too_large"
    assert "12000x12000" in e.message
    assert peak_rss(daemon.proc.pid) - before < 64 * 1024 * 1024


def test_a_jpeg_of_a_thousand_empty_scans_is_refused(workspace, client, session):
    # 10 KB a session can write: libjpeg would pass over 64 Mpx a thousand times, seconds of a
    # decode slot (and, once vouched for as 1x1, of the event loop every session shares).
    path = write(workspace, "scans.jpg", jpeg_read_two_ways(8192, 8192, scans=1000))
    e = error_of(lambda: client.image_read(session, path))
    assert e.code == "image_too_large"
    assert "1001 scans" in e.message and "PNG" in e.message
    assert client.shell_run(session, "echo still here")["output"] == "still here\n"


# ------------------------------------------------------------------ what the session sees


@pytest.fixture
def home_in_workspace():
    """A daemon whose HOME lies inside the session's workspace, so that the home is visible to
    the session and only the credential hiding keeps ~/.ssh out. (The shared fixture's HOME
    is under /tmp, which the session's own scratch /tmp covers whole: a refusal there would
    prove nothing about ~/.ssh.)"""
    root = short_tempdir()
    workspace = os.path.join(root, "ws")
    home = os.path.join(workspace, "home")
    os.makedirs(os.path.join(home, ".ssh"))
    d = RunningDaemon(root, env={"HOME": home}).start()
    try:
        yield d, home
    finally:
        assert d.stop() == 0, d.read_log()
        shutil.rmtree(root, ignore_errors=True)


@needs_bwrap
def test_hidden_ssh_folder_and_symlink_into_it_are_not_found(home_in_workspace):
    daemon, home = home_in_workspace
    data = encode(picture((64, 48)), "PNG")
    visible = write(home, "visible.png", data)
    hidden = write(home, ".ssh/hidden.png", data)
    os.symlink(hidden, os.path.join(daemon.workspace, "link.png"))
    with daemon.client() as client:
        session = client.session_open(daemon.workspace)["session"]
        # The home itself is in view: what refuses the next two is the hiding of ~/.ssh.
        assert client.image_read(session, visible)["data"] == data
        for path in (hidden, "link.png"):
            shell = client.shell_run(session, f"cat {path} > /dev/null")
            assert shell["exit_code"] != 0 and "No such file" in shell["output"]
            e = error_of(lambda: client.image_read(session, path))
            assert e.code == "not_found", e.message
            assert "No such file" in e.message


def test_file_deleted_before_the_call_is_not_found(workspace, client, session):
    path = write(workspace, "gone.png", encode(picture((8, 8)), "PNG"))
    os.remove(path)
    e = error_of(lambda: client.image_read(session, path))
    assert e.code == "not_found" and "gone.png" in e.message


def test_folder_is_bad_params(workspace, client, session):
    os.makedirs(os.path.join(workspace, "pics.png"))
    e = error_of(lambda: client.image_read(session, "pics.png"))
    assert e.code == "bad_params" and "folder" in e.message


def test_fifo_is_refused_without_waiting_for_a_writer(daemon, workspace, client, session):
    os.mkfifo(os.path.join(workspace, "pipe.png"))
    e = error_of(lambda: client.image_read(session, "pipe.png"))
    assert e.code == "bad_params" and "FIFO" in e.message
    assert not daemon.running("head -c")


def test_endless_device_stops_at_the_size_cap(daemon, client, session):
    e = error_of(lambda: client.image_read(session, "/dev/zero"))
    assert e.code == "limit_exceeded" and "64 MiB" in e.message
    # The reader inside the sandbox is gone, and the daemon did not keep the 64 MiB.
    assert not daemon.running("head -c")
    assert psutil.Process(daemon.proc.pid).memory_info().rss < 400 * 1024 * 1024


def test_budget_larger_than_a_reply_frame_is_bad_params(workspace, client, session):
    path = write(workspace, "a.png", encode(picture((8, 8)), "PNG"))
    e = error_of(lambda: client.image_read(session, path, max_bytes=64 * 1024 * 1024))
    assert e.code == "bad_params" and "max-frame" in e.message


# ------------------------------------------------------------------ CLI


def test_cli_prints_metadata_and_saves_what_the_model_sees(daemon, workspace, tmp_path):
    write(workspace, "scan.bmp", encode(picture((2000, 1000)), "BMP"))
    out = tmp_path / "seen"
    run = subprocess.run(
        [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "image", "scan.bmp",
         "--workspace", workspace, "--out", str(out), "--max-dim", "500"],
        capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "BMP 2000x1000" in run.stdout
    assert "500x250" in run.stdout and "downscaled" in run.stdout
    im = decoded(out.read_bytes())
    assert im.size == (500, 250)
    # The session the CLI opened is closed again.
    with daemon.client() as c:
        assert c.session_list()["sessions"] == []


def test_cli_reports_a_missing_file(daemon, workspace):
    run = subprocess.run(
        [sys.executable, "-m", "toolsd", "--socket", daemon.socket, "image", "nope.png",
         "--workspace", workspace],
        capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert run.returncode == 1
    assert "not_found" in run.stderr and "nope.png" in run.stderr


# ------------------------------------------------------------------ error texts (pure)


def test_read_error_takes_the_reason_after_a_path_with_colons():
    from toolsd.tools.images.read import _read_error

    e = _read_error("a: b.png", 1, None,
                    b"head: cannot open 'a: b.png' for reading: No such file or directory\n")
    assert e.code == "not_found" and "a: b.png" in e.message
    e = _read_error("x.png", 1, None, b"head: error reading 'x.png': Input/output error\n")
    assert e.code == "io_error" and "Input/output error" in e.message
    e = _read_error("x.png", None, 9, b"")
    assert e.code == "io_error" and "SIGKILL" in e.message


def test_reads_once_the_file_helper_runs_answer_as_before(workspace, client, session):
    """Once the session's file helper runs (a file.* call starts it), image.read reads
    through it: the same pictures, the file as it is now, and the same errors."""
    client.file_stat(session, ".")
    first = encode(picture((40, 30)), "PNG")
    write(workspace, "pic.png", first)
    assert client.image_read(session, "pic.png")["data"] == first
    second = encode(picture((30, 40)), "PNG")
    write(workspace, "pic.png", second)
    assert client.image_read(session, "pic.png")["data"] == second
    big = encode(picture((800, 600)), "PNG")  # over the helper's inline size: its fd
    assert len(big) > 256 * 1024
    write(workspace, "big.png", big)
    assert client.image_read(session, "big.png")["data"] == big
    write(workspace, "text.png", b"not a picture")
    assert error_of(lambda: client.image_read(session, "text.png")).code == "not_an_image"
    os.remove(os.path.join(workspace, "pic.png"))
    e = error_of(lambda: client.image_read(session, "pic.png"))
    assert e.code == "not_found" and "pic.png" in e.message
    os.makedirs(os.path.join(workspace, "pics.png"))
    e = error_of(lambda: client.image_read(session, "pics.png"))
    assert e.code == "bad_params" and "folder" in e.message
    os.mkfifo(os.path.join(workspace, "pipe.png"))
    e = error_of(lambda: client.image_read(session, "pipe.png"))
    assert e.code == "bad_params" and "FIFO" in e.message
