"""A session's sandbox policy and the bubblewrap argv that enforces it.

Pure: nothing here touches the filesystem or spawns anything. The caller resolves paths
(realpath), filters hidden paths for existence, lists the folders shown entry by entry
(toolsd/home.py), and appends the launcher command to the argv prefix that `bwrap_argv`
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

import os.path
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from plumbum.machines.local import LocalCommand

NETWORKS = ("none", "host")

# bwrap mounts its own /dev and /proc; a workspace bound over them would put the host's
# devices or processes back (and writable), so no workspace may live there.
_SYSTEM_MOUNTS = ("/dev", "/proc")


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

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {self.network!r}")
        if not isinstance(self.writable, bool):
            raise ValueError(f"writable must be true or false, got {self.writable!r}")
        check_env_size(validate_env(self.env))
        _plan(self)  # raises on conflicting paths, so a Policy that exists can be mounted


# Kernel knobs under /proc made read-only in every session (those of them the host has).
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")


def bwrap_argv(policy: Policy, bwrap: str = "bwrap") -> list[str]:
    """argv prefix ending with '--'; the caller appends the launcher command.

    `bwrap` is used as argv[0] as given (a bare name is looked up in PATH at exec time,
    not here)."""
    plan = _plan(policy)
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
    args += ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try"]
    if policy.network == "none":
        args.append("--unshare-net")
    # --as-pid-1: the launcher itself is pid 1 of the pid namespace, which the kernel spares
    # every signal from inside that it does not handle (bwrap's own init would be a pid 1 of
    # no use, with the launcher a killable pid 2). Its end ends every process in there.
    args += ["--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
             "--clearenv"]
    for key, value in policy.env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", ws, "--"]
    # LocalCommand on the name itself rather than local[...]: local[] resolves the program
    # against PATH and the current directory, which is I/O (and fails when the daemon's
    # cwd was removed); formulate() of a bound command is plain list building.
    return LocalCommand(bwrap)[args].formulate()


def _folder_args(folder: _PlannedFolder, home: str) -> list[str]:
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
        args += ["--ro-bind-try", entry, entry]
    if not folder.writable:
        args += ["--remount-ro", path]
    return args


def sandbox_env(*, home: str, path: str, lang: str, extra: Mapping[str, str],
                git_config_global: str | None = None) -> dict[str, str]:
    """The clean environment of a session: fixed values for tools that would otherwise page,
    colour or buffer their output, then the session's own env on top (it may override any).
    `git_config_global`: the session's own git config file in its home, where `git config
    --global` writes (docs/sandbox.md, "Git")."""
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
    }
    if git_config_global:
        env["GIT_CONFIG_GLOBAL"] = git_config_global
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
    plan = _plan(policy)
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


# ---------------------------------------------------------------- the mount plan


@dataclass(frozen=True)
class _PlannedFolder:
    path: str
    writable: bool
    dirs: tuple[str, ...]  # the Folder's, then those the workspace needs in a read-only one
    binds: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Plan:
    workspace: str
    scratch: str
    home: str
    extra_ro_binds: tuple[str, ...]
    outer_hidden_dirs: tuple[str, ...]  # contain the workspace: mounted before it
    folders: tuple[_PlannedFolder, ...]  # outermost first
    pinned: tuple[str, ...]
    protected: tuple[str, ...]
    hidden_dirs: tuple[str, ...]  # the rest: mounted last
    hidden_files: tuple[str, ...]


def _plan(policy: Policy) -> _Plan:
    """Normalise, deduplicate and order every path of the policy; ValueError on conflicts."""
    ws = _abs_path("workspace", policy.workspace)
    if ws == "/":
        raise ValueError("the workspace cannot be / (it would make the whole host writable); "
                         "open the session on a project folder")
    for system in _SYSTEM_MOUNTS:
        if _inside(ws, system):
            raise ValueError(f"the workspace {ws} lies in {system}, which the sandbox replaces "
                             "with its own; open the session on a project folder")
    scratch = _abs_path("scratch", policy.scratch)
    if scratch == "/":
        raise ValueError("the scratch folder cannot be /; give each session its own folder")

    protected = _paths("protected", policy.protected)
    for path in protected:
        if not _inside(path, ws):
            raise ValueError(f"protected path {path} is not inside the workspace {ws}; "
                             "only workspace paths can be re-bound read-only")
    pinned = _paths("pinned", policy.pinned)
    for path in pinned:
        if not _inside(path, ws) or path == ws:
            raise ValueError(f"pinned path {path} is not inside the workspace {ws}")
    if not policy.writable:
        protected = []  # the whole workspace is read-only already
        pinned = []

    dirs = _paths("hidden_dirs", policy.hidden_dirs)
    files = _paths("hidden_files", policy.hidden_files)
    for path in (*dirs, *files):
        if path == "/":
            raise ValueError("/ cannot be hidden: it would hide the whole system")
        if path == ws:
            raise ValueError(f"the workspace {ws} is itself a hidden path; hiding it would "
                             "make the session useless and showing it would expose what is "
                             "hidden: open the session on a folder inside it or elsewhere")
    # An extra bind inside the workspace would add nothing the workspace does not show.
    extras = [e for e in _paths("extra_ro_binds", policy.extra_ro_binds) if not _inside(e, ws)]

    # Inside the sandbox /tmp is the session's scratch, so host paths under /tmp are out of
    # sight already; a tmpfs there would only plant empty mount points in the scratch. The
    # exceptions are what the workspace or an extra bind brings back from the host's /tmp.
    def in_sight(path: str) -> bool:
        return not _inside(path, "/tmp") or any(_inside(path, r) for r in (ws, *extras))

    dirs = [d for d in dirs if in_sight(d)]
    files = [f for f in files if in_sight(f)]

    def covered(path: str, *, equal_too: bool) -> bool:
        # A hidden path under another hidden dir is hidden by that tmpfs already, except a
        # path in the workspace under a dir that contains the workspace: the workspace is
        # bound again on top of that tmpfs, so the inner path needs its own mount.
        for d in dirs:
            if d == path and not equal_too:
                continue
            if _inside(path, d) and not (_inside(ws, d) and _inside(path, ws)):
                return True
        return False

    # A hidden dir that contains the workspace (ws = ~/.docker/proj, hidden ~/.docker):
    # mount the tmpfs first and the workspace on top. The user chose that folder, so it stays
    # usable, and everything else in the hidden dir stays hidden.
    outer = sorted((d for d in dirs if _inside(ws, d) and not covered(d, equal_too=False)),
                   key=lambda d: d.count("/"))
    inner = [d for d in dirs if not _inside(ws, d) and not covered(d, equal_too=False)]
    # A hidden dir INSIDE the workspace (ws = $HOME, hidden ~/.ssh) is simply mounted after
    # the workspace, like every other hiding mount: the workspace bind can never uncover it.
    files = [f for f in files if not covered(f, equal_too=True)]

    for e in extras:
        for d in dirs:
            if _inside(e, d):
                raise ValueError(f"extra read-only bind {e} lies inside hidden folder {d}; "
                                 "hidden paths stay hidden, so move it or stop hiding that folder")
    folders = _plan_folders(policy, ws, dirs)
    for e in extras:
        for f in folders:
            if _inside(e, f.path) and not any(_inside(e, b) for b in f.binds):
                raise ValueError(f"extra read-only bind {e} lies inside {f.path}, which shows "
                                 f"only the entries it lists; list it there instead")

    def seen(path: str) -> bool:
        # Inside a folder only its entries (and the workspace, mounted on top) can be seen:
        # a hiding mount elsewhere in it would hide nothing, and its mount point could not
        # even be made in a read-only one.
        return _inside(path, ws) or all(
            not _inside(path, f.path) or any(_inside(path, b) for b in f.binds)
            for f in folders)

    return _Plan(workspace=ws, scratch=scratch, home=policy.home,
                 extra_ro_binds=tuple(extras),
                 outer_hidden_dirs=tuple(outer), folders=folders, pinned=tuple(pinned),
                 protected=tuple(protected),
                 hidden_dirs=tuple(d for d in inner if seen(d)),
                 hidden_files=tuple(f for f in files if seen(f)))


def _plan_folders(policy: Policy, ws: str, hidden_dirs: list[str]) -> tuple[_PlannedFolder, ...]:
    """Validate and order the policy's folders; ValueError on a folder that cannot be shown.
    A folder that a hidden dir covers, or that lies in another folder but in none of its
    entries, is hidden already and dropped."""
    if not isinstance(policy.folders, tuple):
        raise ValueError("folders must be a tuple of Folder")
    writable = [f for f in policy.folders if f.writable]
    if len(writable) > 1:
        raise ValueError("only one folder (the session's home) can be writable")
    if writable and not policy.home:
        raise ValueError("a writable folder needs Policy.home, the host folder bound there")
    home = _abs_path("home", policy.home) if policy.home else ""
    checked = []
    for folder in policy.folders:
        path = _abs_path("folder", folder.path)
        if path == "/":
            raise ValueError("/ cannot be shown entry by entry; name a folder below it")
        for system in _SYSTEM_MOUNTS:
            if _inside(path, system):
                raise ValueError(f"folder {path} lies in {system}, which the sandbox replaces")
        if _inside(path, ws):
            raise ValueError(f"folder {path} is inside the workspace {ws}, which shows it "
                             f"as it is; the workspace cannot also show it entry by entry")
        entries = {
            "dirs": _paths("folder dirs", folder.dirs),
            "binds": _paths("folder binds", folder.binds),
            "symlinks": _paths("folder symlinks", (link for _t, link in folder.symlinks)),
            "copies": _paths("folder copies", folder.copies),
        }
        if entries["copies"] and not folder.writable:
            raise ValueError(f"folder {path}: only the session's home (writable) can hold "
                             f"copies; bind the files instead")
        for what, paths in entries.items():
            for entry in paths:
                if entry == path or not _inside(entry, path):
                    raise ValueError(f"folder {path}: {what} entry {entry} is not inside it")
        for target, _link in folder.symlinks:
            if not isinstance(target, str) or not target or "\0" in target:
                raise ValueError(f"folder {path}: symlink target {target!r} is not a path")
        checked.append((path, folder, entries))
    checked.sort(key=lambda c: c[0].count("/"))
    planned: list[_PlannedFolder] = []
    for path, folder, entries in checked:
        if any(_inside(path, d) for d in hidden_dirs):
            continue
        outer = [f for f in planned if _inside(path, f.path) and f.path != path]
        if any(not f.writable and not any(_inside(path, b) for b in f.binds) for f in outer):
            continue
        if any(f.path == path for f in planned):
            raise ValueError(f"folder {path} is listed twice")
        made = list(entries["dirs"])
        if not folder.writable and _inside(ws, path) and not any(
                _inside(ws, b) for b in entries["binds"]):
            # The workspace is mounted after this folder is read-only: its mount point (and
            # the folders on the way) must be made while it can still be written.
            step = path
            for part in os.path.relpath(ws, path).split("/"):
                step = os.path.join(step, part)
                if step not in made:
                    made.append(step)
        planned.append(_PlannedFolder(
            path=path, writable=folder.writable, dirs=tuple(sorted(made, key=_depth)),
            binds=tuple(entries["binds"]),
            symlinks=tuple((t, _abs_path("symlink", link)) for t, link in folder.symlinks)))
    if home and _inside(home, ws):
        raise ValueError(f"the home folder {home} lies in the workspace {ws}")
    return tuple(planned)


def _depth(path: str) -> int:
    return path.count("/")


def _abs_path(what: str, path: object) -> str:
    if not isinstance(path, str) or not os.path.isabs(path):
        raise ValueError(f"{what} must be an absolute path, got {path!r}")
    if "\0" in path:
        raise ValueError(f"{what} {path!r} contains a NUL byte, which no path can hold")
    # normpath is string work only; it makes "/a/b/" and "/a//b" compare equal to "/a/b".
    # POSIX keeps a leading "//" as is; fold it, bwrap treats it as "/".
    norm = os.path.normpath(path)
    return "/" + norm.lstrip("/")


def _paths(what: str, paths: Iterable[str]) -> list[str]:
    """Normalised, duplicates dropped, first occurrence's order kept."""
    if isinstance(paths, (str, bytes)):
        raise ValueError(f"{what} must be a list of paths, not one string")
    seen: dict[str, None] = {}
    for path in paths:
        seen.setdefault(_abs_path(f"{what} entry", path), None)
    return list(seen)


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder` or lies beneath it (normalised absolute paths, no I/O)."""
    return path == folder or folder == "/" or path.startswith(folder + "/")
