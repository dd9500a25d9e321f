"""What this machine offers the sandbox, one check at a time, for `toolsd doctor`: user
namespaces, cgroups, bwrap's overlay, inotify's limits. (Whether bwrap runs at all is
probe.py's.) Each check says what it found and what follows for sessions, in a person's
words; none of them changes anything."""

from __future__ import annotations

import dataclasses
import os
import subprocess

from toolsd.sandbox.launch.cgroups import find_places

# Below this, the watches (host_exec's tracker: one per folder of a workspace, shared by
# every program of the user) run out early.
LOW_WATCHES = 65_536


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool  # False: sessions work with less (said in `text`), or not at all
    text: str


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def user_namespaces() -> Check:
    most = _read_int("/proc/sys/user/max_user_namespaces")
    clone = _read_int("/proc/sys/kernel/unprivileged_userns_clone")  # Debian's switch
    apparmor = _read_int("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    if most == 0:
        return Check("user namespaces", False, "off (user.max_user_namespaces = 0): bwrap "
                     "cannot sandbox; sysctl -w user.max_user_namespaces=15000 turns them on")
    notes = []
    if clone == 0:
        notes.append("kernel.unprivileged_userns_clone = 0: only root may make them")
    if apparmor == 1:
        notes.append("AppArmor restricts unprivileged ones: bwrap needs a profile, or run "
                     "as root")
    found = (f"allowed (at most {most} per user)" if most is not None else
             "no user.max_user_namespaces to read; bwrap's line says whether they work")
    # Both switches bind unprivileged users only: root makes them all the same.
    return Check("user namespaces", not notes or os.geteuid() == 0,
                 "; ".join([found, *notes]))


def cgroups() -> list[Check]:
    places, why = find_places()
    checks = []
    fallback = {"memory": "RLIMIT_AS per process instead (breaks node's WebAssembly, Go, the "
                          "JVM)",
                "pids": "RLIMIT_NPROC instead (root is exempt from it)"}
    for controller in ("memory", "pids"):
        place = places.get(controller)
        if place is not None:
            checks.append(Check(f"cgroup {controller}", True,
                                f"a cgroup per session (v{place.version}, under "
                                f"{place.folder})"))
        else:
            checks.append(Check(f"cgroup {controller}", False,
                                f"none: {why.get(controller, 'not offered')}; "
                                f"{fallback[controller]}"))
    return checks


def overlay(bwrap: str | None) -> Check:
    """Whether bwrap can lay a writable overlay (a tmpfs upper) over a folder."""
    if bwrap is None:
        return Check("overlay", False, "not tried: no working bwrap")
    argv = [bwrap, "--unshare-user", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--overlay-src", "/etc", "--tmp-overlay", "/etc", "--", "/bin/true"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check("overlay", False, f"bwrap could not run: {e}")
    if proc.returncode == 0:
        return Check("overlay", True, "bwrap can lay a writable layer (tmpfs) over a folder")
    err = proc.stderr.decode(errors="replace").strip() or f"exit code {proc.returncode}"
    if "Unknown option" in err:
        err = f"this bwrap has no --tmp-overlay ({_bwrap_version(bwrap)}; 0.9.0 and later have it)"
    return Check("overlay", False, f"{err}; the home's folders stay read-only in sessions")


def _bwrap_version(bwrap: str) -> str:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "version unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"


def inotify() -> Check:
    watches = _read_int("/proc/sys/fs/inotify/max_user_watches")
    instances = _read_int("/proc/sys/fs/inotify/max_user_instances")
    if watches is None or instances is None:
        return Check("inotify", False, "no limits readable in /proc/sys/fs/inotify: folders "
                     "the daemon cannot watch are not checked for what the host would execute")
    text = (f"max_user_watches {watches}, max_user_instances {instances} (the daemon uses one "
            f"instance, and a watch per folder of each workspace)")
    if watches < LOW_WATCHES:
        return Check("inotify", False, f"{text}; low: a workspace of more folders is not "
                     f"watched whole (sysctl -w fs.inotify.max_user_watches=524288)")
    return Check("inotify", True, text)
