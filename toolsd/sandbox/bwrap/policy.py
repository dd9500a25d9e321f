"""A session's sandbox policy and the bubblewrap argv that enforces it.

Pure: nothing here touches the filesystem or spawns anything. The caller resolves paths
(realpath), filters hidden paths for existence, lists the folders shown entry by entry
(sandbox/bwrap/home.py), and appends the launcher command to the argv prefix that `bwrap_argv`
returns. The same clean environment (`sandbox_env`) is used when a session runs unsandboxed.

Mount order (each later mount lands on top of earlier ones):

    --ro-bind / /              the host, read-only
    --bind SCRATCH /tmp        before the workspace: a workspace may live under /tmp
    --dev /dev, --proc /proc
    extra read-only binds
    hidden dirs that CONTAIN the workspace (outermost first)
    folders shown entry by entry (homes, outermost first): the session's home (HOME bound
                               at its path) or a tmpfs, its entries bound read-only into it,
                               then (tmpfs) --remount-ro; before the workspace, which may
                               lie in one
    the workspace              --bind, or --ro-bind when not writable
    protected paths            --ro-bind inside the workspace (.git/hooks, .git/config)
    hiding mounts              --tmpfs DIR, --ro-bind /dev/null FILE: last, so that no
                               later mount can uncover them

No seccomp filter: see DESIGN.md ("One sandbox per session").
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from plumbum.machines.local import LocalCommand

from toolsd.sandbox.bwrap.mount_plan import PlannedFolder, plan_mounts

NETWORKS = ("none", "host")


@dataclass(frozen=True)
class Limits:
    """Resource limits of a session (server defaults; session.open may override each). Where
    the session has a memory cgroup, memory_mb is its total; otherwise each process's
    RLIMIT_AS. pids: a pids cgroup where there is one, and RLIMIT_NPROC."""

    memory_mb: int = 4096
    pids: int = 512  # RLIMIT_NPROC: per user, and never enforced for root (see docs/sandbox.md)
    cpu_s: int = 3600  # RLIMIT_CPU, per process
    file_mb: int = 1024  # RLIMIT_FSIZE
    nofile: int = 1024  # RLIMIT_NOFILE

    def __post_init__(self) -> None:
        for name in ("memory_mb", "pids", "cpu_s", "file_mb", "nofile"):
            value = getattr(self, name)
            # bool is an int to Python but `pids: true` is a client bug, not a limit of 1.
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"limit {name} must be a positive integer, got {value!r}")

    def rlimits(self, *, address_space: bool = True) -> dict[str, tuple[int, int]]:
        """{resource name: (soft, hard)}, names as in the `resource` module. Soft equals hard
        so sandboxed code cannot raise its own limit back. `address_space=False` leaves out
        RLIMIT_AS, for a session whose memory a cgroup limits: an address-space limit breaks
        runtimes that reserve more than they use (docs/sandbox.md, "Limits")."""
        mib = 1024 * 1024
        pairs = {
            **({"RLIMIT_AS": self.memory_mb * mib} if address_space else {}),
            "RLIMIT_NPROC": self.pids,
            "RLIMIT_CPU": self.cpu_s,
            "RLIMIT_FSIZE": self.file_mb * mib,
            "RLIMIT_NOFILE": self.nofile,
            "RLIMIT_CORE": 0,
        }
        return {name: (value, value) for name, value in pairs.items()}


@dataclass(frozen=True)
class Folder:
    """A host folder shown as it was when the session started, minus what it hides: an empty
    folder into which the entries listed are put back one by one, read-only. What the host
    adds to the folder later never appears in it, nor does anything not listed; a listed
    folder hides nothing, so one with a hidden entry somewhere below it is listed in `dirs`
    and its own entries are listed in turn (docs/sandbox.md, "The home folder").

    The empty folder is the session's own home (`writable`: Policy.home, bound at `path`,
    so what the session writes there lands in its scratch) or else a tmpfs, made read-only
    once filled. In the session's home, small files are copied rather than bound (`copies`:
    the caller copies them into Policy.home before the sandbox starts): bwrap reads the
    whole mount table again for every bind, so each mount costs more than the one before.
    Every path is absolute and inside `path`."""

    path: str
    writable: bool = False
    dirs: tuple[str, ...] = ()  # made empty, parents first
    binds: tuple[str, ...] = ()  # host paths bound read-only at their own path
    symlinks: tuple[tuple[str, str], ...] = ()  # (target, path): made as the host has them
    copies: tuple[str, ...] = ()  # host files copied into Policy.home (writable only)
    # Of `binds`, the folders shown writable through an overlay whose writes stay in the
    # sandbox (bwrap --overlay-src + --tmp-overlay; the session's home only, where bwrap
    # and the kernel allow it: sandbox/bwrap/overlay.py).
    overlays: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    """What one session's sandbox shows and allows. Every path is absolute and already
    resolved by the caller (symlinks in them would be followed inside the new root).
    Construction validates: an invalid policy raises ValueError and never exists."""

    workspace: str  # host folder, bound at the same path
    scratch: str  # host folder bound at /tmp (per session)
    writable: bool = True
    network: str = "none"  # "none" | "host"
    hidden_dirs: tuple[str, ...] = ()  # tmpfs over each (existing ones: the caller filters)
    hidden_files: tuple[str, ...] = ()  # /dev/null bound read-only over each
    protected: tuple[str, ...] = ()  # paths inside the workspace re-bound read-only
    env: Mapping[str, str] = field(default_factory=dict)  # the complete environment inside
    extra_ro_binds: tuple[str, ...] = ()  # e.g. the driver folder when /tmp would hide it
    pinned: tuple[str, ...] = ()  # workspace folders bound onto themselves (e.g. ws/.git)
    proc_read_only: tuple[str, ...] = ("/proc/sys",)  # see PROC_READ_ONLY
    folders: tuple[Folder, ...] = ()  # shown entry by entry (the homes)
    home: str = ""  # host folder (per session) bound at the writable Folder's path
    # Egress (sandbox/egress/): a host file bound read-only over /etc/resolv.conf, last of
    # all mounts, and the one capability the launcher needs to listen on port 53 (it drops
    # it once it has; see driver/launcher.py, listen_inside).
    resolv_conf: str = ""
    resolv_conf_at: str = ""  # the host's /etc/resolv.conf resolved; "": that path
    listens: bool = False

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {self.network!r}")
        if self.listens and self.network != "none":
            raise ValueError("the egress proxy listens in a network namespace of its own: "
                             "network must be none")
        if not isinstance(self.writable, bool):
            raise ValueError(f"writable must be true or false, got {self.writable!r}")
        check_env_size(validate_env(self.env))
        plan_mounts(self)  # raises on conflicting paths, so a Policy that exists can be mounted


# Kernel knobs under /proc made read-only in every session (those of them the host has).
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")


def bwrap_argv(policy: Policy, bwrap: str = "bwrap") -> list[str]:
    """argv prefix ending with '--'; the caller appends the launcher command.

    `bwrap` is used as argv[0] as given (a bare name is looked up in PATH at exec time,
    not here)."""
    plan = plan_mounts(policy)
    ws = plan.workspace
    args: list[str] = ["--ro-bind", "/", "/", "--bind", plan.scratch, "/tmp",
                       "--dev", "/dev", "--proc", "/proc"]
    # The kernel lets the host's uid 0 write kernel settings under /proc/sys whatever its
    # capabilities (and a session of a root daemon is host uid 0): core_pattern there would
    # run a payload as real root. bwrap skips these because the folders themselves are not
    # writable; bind them read-only ourselves. (/proc/sys/net still shows the session's own
    # network: those files answer for the reader's namespace.)
    for path in policy.proc_read_only:
        args += ["--ro-bind", path, path]
    for path in plan.extra_ro_binds:
        args += ["--ro-bind", path, path]
    for path in plan.outer_hidden_dirs:
        args += ["--tmpfs", path]
    for folder in plan.folders:
        args += _folder_args(folder, plan.home)
    args += ["--bind" if policy.writable else "--ro-bind", ws, ws]
    for path in plan.pinned:
        # A mount point cannot be renamed or removed: `mv .git .git-old` and a fresh .git
        # with a hostile core.fsmonitor would otherwise walk around the read-only hooks.
        args += ["--bind", path, path]
    for path in plan.protected:
        args += ["--ro-bind", path, path]
    for path in plan.hidden_dirs:
        args += ["--tmpfs", path]
    for path in plan.hidden_files:
        args += ["--ro-bind", "/dev/null", path]
    if policy.resolv_conf:
        # Where the host's /etc/resolv.conf leads (systemd-resolved's symlink into /run,
        # hidden above): bound there, its folder made first in the hidden tmpfs.
        at = policy.resolv_conf_at or "/etc/resolv.conf"
        if at != "/etc/resolv.conf":
            args += ["--dir", posixpath.dirname(at)]
        args += ["--ro-bind", policy.resolv_conf, at]
    args += ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try"]
    if policy.network == "none":
        args.append("--unshare-net")
    # --as-pid-1: the launcher itself is pid 1 of the pid namespace, which the kernel spares
    # every signal from inside that it does not handle (bwrap's own init would be a pid 1 of
    # no use, with the launcher a killable pid 2). Its end ends every process in there.
    args += ["--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
             *(["--cap-add", "CAP_NET_BIND_SERVICE"] if policy.listens else []), "--clearenv"]
    for key, value in policy.env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", ws, "--"]
    # LocalCommand on the name itself rather than local[...]: local[] resolves the program
    # against PATH and the current directory, which is I/O (and fails when the daemon's
    # cwd was removed); formulate() of a bound command is plain list building.
    return LocalCommand(bwrap)[args].formulate()


def _folder_args(folder: PlannedFolder, home: str) -> list[str]:
    """One folder shown entry by entry: the empty folder, what is made in it, the entries
    bound back (`-try`: an entry the host removed since it was listed is left out rather
    than failing the start), then read-only unless it is the session's home."""
    path = folder.path
    args = ["--bind", home, path] if folder.writable else ["--tmpfs", path]
    for d in folder.dirs:
        args += ["--dir", d]
    for target, link in folder.symlinks:
        args += ["--symlink", target, link]
    for entry in folder.binds:
        if entry in folder.overlays:
            args += ["--overlay-src", entry, "--tmp-overlay", entry]
        else:
            args += ["--ro-bind-try", entry, entry]
    if not folder.writable:
        args += ["--remount-ro", path]
    return args


# In a session's own home: its global git config (GIT_CONFIG_GLOBAL), which includes the
# host's, and the prefix of `npm install -g` (in ~/.npm, the session's own and empty: npm's
# own prefix, /usr or /usr/local, is read-only in the sandbox).
GIT_CONFIG = ".gitconfig.toolsd"
NPM_PREFIX = ".npm/global"


def sandbox_env(*, home: str, path: str, lang: str, extra: Mapping[str, str],
                own_home: bool = False, no_network: bool = False) -> dict[str, str]:
    """The clean environment of a session: fixed values for tools that would otherwise page,
    colour or buffer their output, then the session's own env on top (it may override any).
    `own_home`: the session has a home of its own, where `git config --global` and `npm
    install -g` write (docs/sandbox.md, "The home folder", "Toolchains"). `no_network`: the
    session has none, so npm fails a registry request at once instead of retrying it for
    a minute and more (docs/sandbox.md, "Environment")."""
    env = {
        "PATH": path,
        "HOME": home,
        "LANG": lang,
        "TERM": "dumb",
        "NO_COLOR": "1",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": "/tmp",
        # npm's check for a newer npm runs behind every command and keeps node alive until
        # its request ends: `npm init` with no input and no network waited on its retries.
        "NPM_CONFIG_UPDATE_NOTIFIER": "false",
    }
    if no_network:
        env["NPM_CONFIG_FETCH_RETRIES"] = "0"
    if own_home:
        prefix = f"{home.rstrip('/')}/{NPM_PREFIX}"
        env["GIT_CONFIG_GLOBAL"] = f"{home.rstrip('/')}/{GIT_CONFIG}"
        env["NPM_CONFIG_PREFIX"] = prefix
        env["PATH"] = f"{prefix}/bin:{path}"
    env.update(validate_env(extra))
    return env


# The environment of any command of a session, at most: names, values, and an `=` and a NUL
# byte each, as the kernel counts them. Every spawn request carries it, in one datagram of the
# launcher's channel next to a command of up to shell_argv.INLINE_MAX bytes.
ENV_MAX_BYTES = 64 * 1024


def check_env_size(env: Mapping[str, str]) -> None:
    """ValueError naming the size, the largest entry and the limit if `env` (the complete
    environment of a command) is over ENV_MAX_BYTES."""
    def size(text: str) -> int:
        # surrogatepass: a path decoded with surrogateescape (HOME, say) may hold surrogates.
        return len(text.encode(errors="surrogatepass"))

    sizes = {key: size(key) + size(value) + 2 for key, value in env.items()}
    total = sum(sizes.values())
    if total > ENV_MAX_BYTES:
        largest = max(sizes, key=sizes.__getitem__)
        raise ValueError(f"the environment would be {total:,} bytes (env {largest!r} alone "
                         f"{sizes[largest]:,}), over the limit of {ENV_MAX_BYTES:,} bytes for "
                         f"all of it; pass large data in a file instead")


def validate_env(env: object) -> dict[str, str]:
    """A copy of `env` as a plain dict of str to str, or ValueError naming the bad key."""
    if not isinstance(env, Mapping):
        raise ValueError(f"env must be a map of names to strings, got {type(env).__name__}")
    clean: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"env key {key!r} is not a name: use a non-empty string")
        if "=" in key or "\0" in key:
            raise ValueError(f"env key {key!r} contains '=' or a NUL byte, which no "
                             "environment can hold; rename it")
        if not isinstance(value, str):
            raise ValueError(f"env value of {key!r} must be a string, got {type(value).__name__}")
        if "\0" in value:
            raise ValueError(f"env value of {key!r} contains a NUL byte, which no environment "
                             "can hold; remove it")
        clean[key] = value
    return clean


def guarding_mounts(policy: Policy) -> tuple[str, ...]:
    """The mount points that hide or protect something in this policy's sandbox: the
    workspace, and every hidden, protected and pinned path. A mount goes away in every mount
    namespace when the host removes or replaces the path it sits on (the kernel detaches
    it), so a sandbox that has run for a while may no longer have them all."""
    plan = plan_mounts(policy)
    return (*plan.outer_hidden_dirs, *(f.path for f in plan.folders), plan.workspace,
            *plan.pinned, *plan.protected, *plan.hidden_dirs, *plan.hidden_files)


def mount_points(mountinfo: bytes) -> set[str]:
    """The mount points listed in a /proc/PID/mountinfo text (the fifth field, with the
    kernel's octal escapes of space, tab, newline and backslash undone)."""
    points = set()
    for line in mountinfo.split(b"\n"):
        fields = line.split(b" ")
        if len(fields) > 4:
            points.add(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]),
                              fields[4]).decode("utf-8", "surrogateescape"))
    return points
