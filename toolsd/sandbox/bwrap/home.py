"""The homes as a session sees them: deny by default.

Inside the sandbox, HOME is the session's own folder in its scratch (writable, removed at
session.close), into which the entries that the host's home had when the session started
are bound back read-only, except the hidden ones: SECRETS, the session's OWN (caches, which
start empty), the daemon's own folders and `toolsd serve --hide` paths. Every other home a
session could read (/root, /home/*, the daemon user's own when HOME points elsewhere) is
shown the same way, read-only. A folder with a hidden entry somewhere below it (~/.config
holds gh, gcloud, git/credentials) is not bound whole: it is made empty and its own entries
are put back one by one, down to the hidden entry's folder. So a secret that the host
creates later, in such a folder or anywhere else in the home, never appears: only what was
listed is there. A list of names can never be complete; a home that shows only what
existed, minus those, fails closed for everything new.

`--hide` of a path that does not exist yet works the same way: its nearest existing folder
is shown entry by entry, so the path can never appear in it.

I/O: listing folders (scandir, lstat, realpath) when a session starts; the listing of one
folder is home_folders.py's. The bwrap argv is policy.py's (policy.Folder).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass

from toolsd.sandbox.bwrap.home_folders import copy_into, inside, relative, show_folder
from toolsd.sandbox.bwrap.policy import GIT_CONFIG, Folder, Policy

log = logging.getLogger("toolsd.home")

# Hidden in every home, whether they exist when the session starts or appear later.
# Relative to the home; docs/sandbox.md lists them with what they hold.
SECRETS: tuple[str, ...] = (
    # keys and cloud credentials
    ".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".config/gcloud", ".oci",
    ".config/doctl", ".s3cfg", ".boto", ".config/rclone", ".pulumi", ".fly", ".wrangler",
    ".vault-token", ".terraform.d/credentials.tfrc.json", ".kaggle", ".huggingface",
    # forges, registries and package managers
    ".config/gh", ".config/hub", ".config/glab-cli", ".git-credentials",
    ".config/git/credentials", ".netrc", ".pgpass", ".npmrc", ".yarnrc", ".yarnrc.yml",
    ".pypirc", ".cargo/credentials", ".cargo/credentials.toml", ".m2/settings.xml",
    ".m2/settings-security.xml", ".gradle/gradle.properties", ".gem/credentials",
    # password stores and keyrings
    ".password-store", ".config/op", ".local/share/keyrings", ".config/sops",
    # AI agents' own logins
    ".claude", ".claude.json", ".codex",
    # browser profiles
    ".mozilla", ".config/google-chrome", ".config/chromium", ".config/BraveSoftware",
    ".config/microsoft-edge",
    # histories: pasted tokens and passwords end up in them
    ".bash_history", ".zsh_history", ".zhistory", ".histfile", ".sh_history",
    ".python_history", ".node_repl_history", ".psql_history", ".mysql_history",
    ".sqlite_history", ".rediscli_history", ".irb_history", ".lesshst", ".viminfo",
    ".local/share/nvim/shada", ".local/share/fish/fish_history",
)

# The session's own, starting empty (not the host's): caches, which tools must be able to
# write (a read-only ~/.cache fails pip, uv and npm) and which hold tokens too
# (~/.cache/huggingface/token).
OWN: tuple[str, ...] = (".cache", ".npm")

# The session's global git config (GIT_CONFIG_GLOBAL), in its home: what `git config
# --global` writes. It includes the host's ~/.gitconfig and ~/.config/git/config, read-only.
# (policy.GIT_CONFIG, imported above.)

# Folders in the home that their tools rewrite as they go: version managers' shims, which
# `pyenv rehash` (run by pip after every install), `rbenv rehash` and `asdf reshim` remake,
# and matplotlib's config folder (read-only, it warns on every import). In the session's
# home each is its own folder, with copies of the host's small files: a tool writes there
# and the host's folder is never touched. (Where overlays work, every folder of the home
# is writable that way: overlay.py.)
TOOL_DIRS: tuple[str, ...] = (
    ".pyenv/shims", ".rbenv/shims", ".nodenv/shims", ".goenv/shims", ".jenv/shims",
    ".plenv/shims", ".asdf/shims", ".config/matplotlib",
)


# Folders that are never shown entry by entry: the sandbox makes its own /proc and /dev.
_SYSTEM = ("/proc", "/dev")


class CannotHide(ValueError):
    """A path the sandbox cannot hide; the message says why and what to do."""


@dataclass(frozen=True)
class View:
    """What a session's sandbox makes of the homes and the hidden paths: the folders shown
    entry by entry, and the paths covered where they are (a tmpfs over a folder, /dev/null
    over anything else) because no folder shows them."""

    folders: tuple[Folder, ...]
    hidden_dirs: tuple[str, ...]
    hidden_files: tuple[str, ...]
    home_is_own: bool  # the session has a home folder of its own (False: it is in the workspace)


def hidden_names(shown: Iterable[str] = ()) -> tuple[str, ...]:
    """SECRETS and OWN, less the ones `toolsd serve --show` lets back in (relative paths)."""
    let_in = set(shown)
    return tuple(n for n in (*SECRETS, *OWN) if n not in let_in)


def other_homes(own_home: str) -> list[str]:
    """The homes other than `own_home` that a session could read by default: /root, every
    folder in /home, and the daemon user's home in the password database (when HOME points
    elsewhere). Resolved; only existing folders."""
    candidates = ["/root"]
    try:
        candidates.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    try:
        with os.scandir("/home") as it:
            candidates += sorted(e.path for e in it)
    except OSError:
        pass
    found: list[str] = []
    for c in candidates:
        real = os.path.realpath(c)
        if real not in found and real != own_home and real != "/" and os.path.isdir(real):
            found.append(real)
    return found


def nearest_existing(path: str) -> str:
    """The deepest existing folder that `path` (absolute, normalised) lies in or is."""
    while not os.path.isdir(path):
        path = os.path.dirname(path)
    return path


def check_hideable(path: str) -> None:
    """CannotHide if `--hide path` could never work, whatever workspace a session opens:
    `/`, the sandbox's own /proc and /dev, and a path that does not exist in a folder that
    cannot be shown entry by entry (/). Run at daemon start."""
    if path == "/":
        raise CannotHide("/ cannot be hidden: it would hide the whole system")
    for system in _SYSTEM:
        if inside(path, system):
            raise CannotHide(f"{path} lies in {system}, which every sandbox replaces with its "
                             f"own; there is nothing of the host's to hide there")
    if not os.path.lexists(path) and nearest_existing(path) == "/":
        raise CannotHide(f"{path} does not exist, and its nearest existing folder is /, which "
                         f"cannot be shown entry by entry; create {path} (or its folder) "
                         f"first, then start toolsd")


def shown_entry(path: str, home: str) -> str:
    """The entry of SECRETS or OWN that `toolsd serve --show path` names, relative to the
    home (`home` resolved); ValueError saying what can be shown otherwise."""
    real = os.path.realpath(path)
    for base in (home, os.path.abspath(os.path.expanduser("~"))):
        for candidate in (os.path.abspath(path), real):
            if inside(candidate, base) and candidate != base:
                rel = relative(candidate, base)
                if rel in SECRETS or rel in OWN:
                    return rel
    raise ValueError(f"--show {path}: not one of the entries that toolsd hides in the home "
                     f"folder {home}; --show lets one of those back in (docs/sandbox.md lists "
                     f"them: {', '.join(SECRETS[:4])}, ...), and everything else of the home "
                     f"is shown already")


def plan(*, home: str, workspace: str, hidden: Iterable[str], shown: Iterable[str] = (),
         keep: Iterable[str] = (), overlay: bool = False) -> View:
    """The homes and hidden paths of one session's sandbox.

    `home`: the session's HOME, resolved. `hidden`: absolute paths, existing or not (the
    daemon's folders, /run, --hide). `shown`: entries of SECRETS and OWN to let back into
    the session's home (not into other homes), relative to it. `keep`: toolsd's own files
    (the drivers, the interpreter), bound even under a hidden path. `overlay`: the folders
    of the session's own home are shown writable, their writes kept in the sandbox
    (home_folders.show_folder; sandbox/bwrap/overlay.py says where it can be). Raises
    CannotHide for a hidden path that does not exist and could only be kept from appearing
    by changing the workspace."""
    ws = workspace
    homes: list[tuple[str, bool]] = []  # (home, the session's own)
    own_home = os.path.isdir(home) and home != "/" and not inside(home, ws)
    if own_home:
        homes.append((home, True))
    elif os.path.isdir(home):
        homes.append((home, False))  # in the workspace (or /): covered where they are
    homes += [(h, False) for h in other_homes(home)]

    shown_as_folder: dict[str, set[str]] = {}  # folder -> hidden paths in it (relative)
    writable: dict[str, bool] = {}
    covered_dirs: list[str] = []
    covered_files: list[str] = []

    def cover(full: str) -> None:
        """Hide an existing path where it is (it is in no folder shown entry by entry)."""
        if os.path.lexists(full):
            real = os.path.realpath(full)
            (covered_dirs if os.path.isdir(real) else covered_files).append(real)

    for h, is_own in homes:
        names = hidden_names(shown if h == home else ())
        if inside(h, ws) or not os.access(h, os.R_OK):
            # In the workspace: the session was opened on it, and sees it as it is, less
            # what exists of the hidden names. Not listable (but perhaps searchable): the
            # names that exist are covered one by one.
            for n in names:
                cover(os.path.join(h, n))
            continue
        shown_as_folder[h] = set(names) | ({GIT_CONFIG} if is_own else set())
        writable[h] = is_own

    for path in hidden:
        path = os.path.normpath(path)
        if inside(path, "/tmp") and not inside(path, ws):
            continue  # the session's /tmp is its own: the host's is out of sight already
        folder = next((f for f in sorted(shown_as_folder, key=len, reverse=True)
                       if inside(path, f) and f != path), None)
        if folder is not None:
            shown_as_folder[folder].add(relative(path, folder))
        elif os.path.lexists(path):
            cover(path)
        else:
            check_hideable(path)
            parent = nearest_existing(path)
            if inside(parent, ws):
                raise CannotHide(
                    f"{path} (toolsd serve --hide) does not exist yet and would appear in "
                    f"the workspace {ws}, where toolsd cannot keep it from appearing; create "
                    f"it first (it is then hidden), or open the session on another folder")
            shown_as_folder.setdefault(parent, set()).add(relative(path, parent))
            writable.setdefault(parent, False)

    folders: list[Folder] = []
    for folder, omit in sorted(shown_as_folder.items()):
        keep_here = [relative(k, folder) for k in keep if inside(k, folder) and k != folder]
        # What --show lets back in stays read-only: bound, never a copy.
        shown_folder, outside = show_folder(folder, omit, keep=keep_here,
                                            own_dirs=TOOL_DIRS if folder == home else (),
                                            overlay=overlay and folder == home,
                                            writable=writable[folder],
                                            bound=shown if folder == home else (),
                                            cover_in=ws if inside(ws, folder) else "")
        if folder == home and own_home:
            # The session's own caches exist from the start, empty: tools write into them.
            made = tuple(os.path.join(home, n) for n in OWN if n in names)
            shown_folder = dataclasses.replace(shown_folder, dirs=made + shown_folder.dirs)
        folders.append(shown_folder)
        for target in outside:
            cover(target)
    return View(folders=tuple(folders), hidden_dirs=tuple(dict.fromkeys(covered_dirs)),
                hidden_files=tuple(dict.fromkeys(covered_files)), home_is_own=own_home)


def make_home(policy: Policy, home_dir: str, home_path: str) -> None:
    """A session's home folder as the sandbox binds it at HOME (`home_path`): the host's
    small files that `policy`'s writable folder copies, and the session's own git config."""
    os.makedirs(home_dir, mode=0o700, exist_ok=True)
    for folder in policy.folders:
        if folder.writable:
            copy_into(folder, home_dir)
    with open(os.path.join(home_dir, GIT_CONFIG), "w") as f:
        f.write(git_config_text(home_path))


def git_config_text(home: str) -> str:
    """The session's GIT_CONFIG_GLOBAL file: the host's global config files, read as they
    are (git skips a missing include), then whatever `git config --global` adds."""
    return ("# The session's own global git config (GIT_CONFIG_GLOBAL), in its home: `git config\n"
            "# --global` writes here. The host's global config files are read as they are.\n"
            "[include]\n"
            f"\tpath = {_git_quote(os.path.join(home, '.config', 'git', 'config'))}\n"
            f"\tpath = {_git_quote(os.path.join(home, '.gitconfig'))}\n")


def _git_quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
