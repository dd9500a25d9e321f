#!/usr/bin/env python3
"""image.read's speed: a 4000x3000 photo fitted to 1568 px through the daemon, next to the
floor, the same work by Pillow in this process (read the file, `fit_image`); and what one
small image.read costs in system calls of the daemon and of the session's file helper.

Run alone (`.venv/bin/python scripts/bench_image.py`) or as a section of scripts/bench.py.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

PHOTO_SIZE = (4000, 3000)
MAX_DIM = 1568
ROUNDS = 15
# image.reads counted by strace (call_counts)
COUNTED = 200


def photo_jpeg(size: tuple[int, int]) -> bytes:
    """A photo-like JPEG: smooth gradients under sensor-like noise, about the bytes per
    pixel of a phone's 12 Mpx photo (a flat test card would decode unrealistically fast)."""
    from PIL import Image

    w, h = size
    ramp = Image.linear_gradient("L").resize((w, h))
    across = Image.linear_gradient("L").transpose(Image.Transpose.ROTATE_90).resize((w, h))
    noise = Image.effect_noise((w, h), 24)
    # One noise field, flipped per channel: the channels' noise is uncorrelated, as a
    # sensor's is, for a third of the cost of three fields.
    flips = (noise, noise.transpose(Image.Transpose.ROTATE_180),
             noise.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    bases = (ramp, across, Image.blend(ramp, across, 0.5))
    im = Image.merge("RGB", [Image.blend(b, n, 0.35) for b, n in zip(bases, flips)])
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def tiny_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 1), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def bench_image() -> None:
    import bench
    from bench import ms, on_one_core, report, running_daemon, stats, timed

    from toolsd.client import Client
    from toolsd.tools.images import MAX_PIXELS, fit_image

    with running_daemon() as (sock, root, proc):
        workspace = os.path.join(root, "ws")
        os.makedirs(workspace)
        cases = {"photo.jpg": photo_jpeg(PHOTO_SIZE), "dot.png": tiny_png()}
        for name, data in cases.items():
            with open(os.path.join(workspace, name), "wb") as f:
                f.write(data)

        def in_process(name: str):
            def run():
                with open(os.path.join(workspace, name), "rb") as f:
                    data = f.read()
                return fit_image(data, max_dim=MAX_DIM, max_bytes=3_750_000,
                                 max_pixels=MAX_PIXELS)
            return run

        with Client(sock) as c:
            session = c.session_open(workspace)["session"]
            try:
                result = c.image_read(session, "photo.jpg", max_dim=MAX_DIM)
                assert (result["width"], result["height"]) == (MAX_DIM, 1176), result["width"]
                photo, _ = stats(timed(lambda: c.image_read(session, "photo.jpg",
                                                            max_dim=MAX_DIM), ROUNDS, 2))
                dot, _ = stats(timed(lambda: c.image_read(session, "dot.png"), 200, 20))
                # The same, with every wakeup a switch (bench.on_one_core).
                one_core = on_one_core([lambda: c.image_read(session, "dot.png"),
                                        in_process("dot.png")], rounds=4, n=50, warmup=10)
                counts = call_counts(c, session, proc.pid)
            finally:
                c.session_close(session)
        photo_floor, _ = stats(timed(in_process("photo.jpg"), ROUNDS, 2))
        dot_floor, _ = stats(timed(in_process("dot.png"), 200, 20))

    size_mb = len(cases["photo.jpg"]) / 1e6
    report(f"image.read 4000x3000 JPEG ({size_mb:.1f} MB) -> 1568 px, median", ms(photo),
           anchor=f"Pillow in-process {ms(photo_floor)}", ratio=photo / photo_floor)
    report("image.read 1x1 PNG (fixed cost per call), median", ms(dot),
           anchor=f"Pillow in-process {ms(dot_floor)}", ratio=dot / dot_floor)
    if one_core is not None:
        report("image.read 1x1 PNG, all on one core, median", ms(one_core[0]),
               anchor=f"Pillow in-process {ms(one_core[1])}", ratio=one_core[0] / one_core[1])
    if counts is None:
        print("  (no strace: the counts are left out)")
        return
    hello, daemon, helper = counts
    report("system calls of the daemon per image.read 1x1 PNG", f"{sum(daemon.values()):8.1f}",
           anchor=f"hello {sum(hello.values()):.1f}",
           ratio=sum(daemon.values()) / sum(hello.values()))
    report("scheduler passes of the daemon per image.read 1x1 PNG",
           f"{daemon.get('epoll_wait', 0):8.1f}", anchor=f"hello {hello.get('epoll_wait', 0):.1f}")
    report("system calls of the file helper per image.read 1x1 PNG",
           f"{sum(helper.values()):8.1f}")
    tree = f" ({bench.TREE})" if bench.TREE else ""
    for who, by_name in ((f"daemon{tree}", daemon), (f"file helper{tree}", helper)):
        print(f"  {who}: " + ", ".join(f"{name} {n:.1f}" for name, n in
                                       sorted(by_name.items(), key=lambda kv: -kv[1])))


def call_counts(c, session: str, daemon: int):
    """System calls per image.read of the 1x1 PNG, by name, of the daemon (its threads
    too) and of the session's file helper, with the daemon's for a hello: counts that a
    busy machine does not move. None without strace."""
    if shutil.which("strace") is None:
        return None
    import psutil
    from bench_calls import counted

    helper = [p.pid for p in psutil.Process(daemon).children(recursive=True)
              if p.name() == "toolsd-files"]
    read = lambda: c.image_read(session, "dot.png")  # noqa: E731
    return (counted([daemon], True, c.hello, COUNTED), counted([daemon], True, read, COUNTED),
            counted(helper, False, read, COUNTED))


if __name__ == "__main__":
    started = time.perf_counter()
    bench_image()
    print(f"({time.perf_counter() - started:.1f} s)")
