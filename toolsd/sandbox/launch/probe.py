"""Can sessions be sandboxed here: one real bwrap run with the namespaces they use."""

from __future__ import annotations

import shutil
import subprocess


def probe_bwrap() -> tuple[str | None, str]:
    """(path to bwrap or None, why not). Runs bwrap once with the namespaces sessions use:
    present is not enough (user namespaces may be off, or a container may forbid them)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap (bwrap) is not installed; apt-get install bubblewrap"
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--as-pid-1", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--", "/bin/true"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"bwrap could not run: {e}"
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip() or f"exit code {proc.returncode}"
        return None, f"bwrap cannot create a sandbox here: {err}"
    return bwrap, ""
