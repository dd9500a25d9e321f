"""`toolsd image PATH`: read an image as a model would get it, print what came back, and
optionally save it, so a person can see exactly what the agent is shown."""

from __future__ import annotations

import os
import sys

from toolsd.cli.common import connect

_EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif",
               "image/webp": ".webp"}


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "image", parents=[common],
        help="read an image through a session, as an agent's read_image would",
        description="Open a session on the workspace, read PATH with the session's view of "
                    "the files (hidden paths stay hidden), fit it to the budget, print what "
                    "a model would get, and close the session.")
    p.add_argument("path", metavar="PATH",
                   help="the image; a relative path is taken from the workspace")
    p.add_argument("--workspace", default=None,
                   help="the session's workspace folder (default: the current folder)")
    p.add_argument("--out", metavar="FILE",
                   help="save the bytes a model would see to FILE (default: not saved)")
    p.add_argument("--max-dim", type=int, default=1568, metavar="N",
                   help="longest side in pixels (default: 1568)")
    p.add_argument("--max-bytes", type=int, default=3_750_000, metavar="N",
                   help="largest encoded size in bytes (default: 3750000)")
    p.set_defaults(func=cmd_image)


def cmd_image(args) -> int:
    workspace = os.path.abspath(args.workspace or os.getcwd())
    with connect(args) as c:
        session = c.session_open(workspace)["session"]
        try:
            result = c.image_read(session, args.path, max_dim=args.max_dim,
                                  max_bytes=args.max_bytes)
        finally:
            c.session_close(session)
    original = result["original"]
    print(f"{args.path}: {original['format']} {original['width']}x{original['height']}, "
          f"{original['bytes']} bytes")
    if result["resized"]:
        change = "downscaled"
    elif len(result["data"]) != original["bytes"]:
        change = "re-encoded at the same size"
    else:
        change = "the file as it is"
    print(f"model gets: {result['media_type']} {result['width']}x{result['height']}, "
          f"{len(result['data'])} bytes ({change})")
    if args.out:
        try:
            with open(args.out, "wb") as f:
                f.write(result["data"])
        except OSError as e:
            print(f"toolsd image: cannot write {args.out}: {e.strerror}", file=sys.stderr)
            return 1
        print(f"saved to {args.out}")
        wanted = _EXTENSIONS.get(result["media_type"])
        if wanted and not args.out.lower().endswith(
                (wanted, ".jpeg") if wanted == ".jpg" else wanted):
            print(f"toolsd image: note: the data is {result['media_type']}; {args.out} does "
                  f"not end in {wanted}", file=sys.stderr)
    return 0
