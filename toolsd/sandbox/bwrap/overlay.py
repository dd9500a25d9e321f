"""Whether sessions can see their home's folders writable, the writes kept in the sandbox:
an overlay filesystem on each folder bound from the host's home, the host's folder as its
lower layer and an in-memory upper layer that goes with the sandbox (bwrap's
`--overlay-src` and `--tmp-overlay`, from bubblewrap 0.10; the kernel must allow overlayfs
in a user namespace, as Linux does from 5.11). Otherwise the folders are bound read-only.

Probed once per (bwrap, home), at the daemon's start: the option in `bwrap --help`, then
one real sandbox with an overlay on the home, in which a file is written; the host's home
must not have it afterwards. I/O: runs bwrap.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import uuid

log = logging.getLogger("toolsd.sandbox")


@functools.cache
def why_no_overlay(bwrap: str, home: str) -> str:
    """"" if a session's home folders can be overlays with this bwrap on this kernel, for a
    home on the filesystem of `home` (an existing folder); else why not, in words."""
    try:
        helped = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=20,
                                stdin=subprocess.DEVNULL)
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                                 timeout=20, stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not run: {e}"
    if "--tmp-overlay" not in helped.stdout + helped.stderr:
        return (f"{version or bwrap} has no --tmp-overlay (bubblewrap 0.10 and later have "
                f"it)")
    probe = os.path.join(home, f".toolsd-overlay-probe-{uuid.uuid4().hex}")
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--overlay-src", home, "--tmp-overlay", home, "--unshare-user", "--unshare-pid",
            "--die-with-parent", "--cap-drop", "ALL", "--", "/bin/sh", "-c",
            f': > "$1" && test -f "$1"', "sh", probe]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap could not run: {e}"
    if os.path.lexists(probe):  # never expected: the write reached the host
        os.unlink(probe)
        return "a write in the overlay reached the host's folder"
    if proc.returncode != 0:
        return (f"an overlay on {home} failed here: "
                f"{proc.stderr.strip() or f'exit code {proc.returncode}'}")
    return ""


def report(bwrap: str | None) -> None:
    """Probe once at the daemon's start, and log what sessions' homes will be."""
    home = os.path.realpath(os.path.expanduser("~"))
    if bwrap is None or not os.path.isdir(home):
        return
    why = why_no_overlay(bwrap, home)
    if why:
        log.info("the home's folders are read-only in sessions: %s", why)
    else:
        log.info("the home's folders are writable in sessions, their writes kept in the "
                 "sandbox (overlay)")
