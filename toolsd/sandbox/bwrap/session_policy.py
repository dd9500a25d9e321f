"""A session's sandbox policy from its parameters and the host: the workspace checked, the
homes and hidden paths planned (home.py), toolsd's own files bound back; and a call's folder
and environment checked against it. I/O: realpath, isdir and exists on the host."""

from __future__ import annotations

import functools
import logging
import os
import site
import sys

import toolsd
from driver import DRIVER_DIR
from toolsd.sandbox.bwrap import home, overlay, workspace_rules
from toolsd.sandbox.errors import Fault, SandboxError
from toolsd.sandbox.bwrap.policy import PROC_READ_ONLY, Policy, check_env_size, validate_env

log = logging.getLogger("toolsd.session")


def check_workspace(path: str) -> str:
    if not os.path.isabs(path):
        raise SandboxError(Fault.REFUSED, f"workspace must be an absolute path, got {path!r}")
    if not os.path.exists(path):
        raise SandboxError(Fault.REFUSED,
                           f"workspace {path} does not exist; create the folder first")
    if not os.path.isdir(path):
        raise SandboxError(Fault.REFUSED, f"workspace {path} is not a folder")
    real = os.path.realpath(path)
    if real == "/":
        raise SandboxError(Fault.REFUSED,
                           "workspace cannot be / (the whole machine); pick a folder")
    try:
        real.encode("utf-8")
    except UnicodeEncodeError:
        raise SandboxError(Fault.REFUSED, f"workspace {real!r} is not valid UTF-8; toolsd reports "
                           f"paths as text: rename the folder") from None
    return real


RUNTIME_DIRS = ("/run",)


@functools.cache
def own_files() -> tuple[str, ...]:
    """toolsd's own files that the sandbox needs: the drivers, and the interpreter the
    launcher runs on (its prefix, the venv's and the base installation's)."""
    return tuple(sorted({os.path.realpath(DRIVER_DIR), os.path.realpath(sys.prefix),
                         os.path.realpath(sys.base_prefix),
                         os.path.dirname(os.path.abspath(sys.executable))}))


@functools.cache
def own_programs() -> dict[str, str]:
    """{folder: what it is} of the code the daemon (on the host) and every sandbox run:
    toolsd's package and drivers, the interpreter and its site-packages. A session must never
    write them: a changed driver would run in every later session (any tenant's), a changed
    module in the unsandboxed daemon. A workspace in one is refused; one inside a workspace is
    bound read-only there."""
    package = os.path.dirname(toolsd.__file__)
    # agent/ (`toolsd agent`, run on the host) is installed beside toolsd/ (pyproject.toml).
    agent = os.path.join(os.path.dirname(package), "agent")
    found = {os.path.realpath(p): "toolsd's own program files (the daemon and every "
             "sandbox run them)" for p in (*own_files(), package, agent)
             if p != agent or os.path.isfile(os.path.join(agent, "__init__.py"))}
    for p in (*site.getsitepackages(), site.getusersitepackages()):
        if os.path.isdir(p):
            found.setdefault(os.path.realpath(p), "the site-packages the daemon imports from")
    return found


def own_programs_in(workspace: str) -> tuple[str, ...]:
    return tuple(p for p in own_programs() if p != workspace and p.startswith(workspace + "/")
                 and os.path.isdir(p))


def own_files_under_tmp() -> tuple[str, ...]:
    """own_files() under /tmp: a session's /tmp is its private scratch folder, so without
    binding them back, a checkout under /tmp could not start a single session. (In a home
    folder they are listed there: home.plan's `keep`.)"""
    return tuple(p for p in own_files() if p == "/tmp" or p.startswith("/tmp/"))



def plan_view(*, home_path: str, workspace: str, hidden_paths, shown,
              bwrap: str | None = None, made: bool = False) -> home.View:
    """The homes and hidden paths as a session's sandbox shows them (home.plan), after
    check_outside. `hidden_paths`: {path: what it is, in words}. `bwrap`: the sandbox's,
    which may show the home's folders writable (overlay.py). `made`: the daemon made the
    workspace in its work root, one of the hidden paths, so it is not checked."""
    if not made:
        check_outside(workspace, own_home=home_path, shown=shown, own_folders={
            **hidden_paths, **{d: "the host's service sockets, hidden from every session"
                               for d in RUNTIME_DIRS}, **own_programs()})
    real_home = os.path.realpath(home_path)
    with_overlay = bwrap is not None and os.path.isdir(real_home) and \
        not overlay.why_no_overlay(bwrap, real_home)
    # Resolved: a symlinked folder must be covered where it really is.
    # /run holds the host's service sockets (D-Bus, docker, agents, $XDG_RUNTIME_DIR):
    # a read-only mount does not stop connect(), so they are hidden, not just read-only.
    hidden = [os.path.realpath(p) for p in (*hidden_paths, *RUNTIME_DIRS)]
    try:
        return home.plan(home=real_home, workspace=workspace, hidden=hidden, shown=shown,
                         keep=own_files(), overlay=with_overlay)
    except home.CannotHide as e:
        raise SandboxError(Fault.REFUSED, f"session.open: {e}") from None


def session_policy(*, workspace: str, scratch: str, writable: bool, network: str,
                   view: home.View, env: dict[str, str], home_dir: str,
                   resolv_conf: str = "", listens: bool = False) -> Policy:
    """The Policy of a session on `workspace`: ValueError if the sandbox cannot mount it."""
    if writable:
        make_hooks_folder(workspace)
    protected = [os.path.join(workspace, ".git", p) for p in ("hooks", "config")]
    protected += own_programs_in(workspace)
    return Policy(
        workspace=workspace,
        scratch=scratch,
        writable=writable,
        network=network,
        hidden_dirs=view.hidden_dirs,
        hidden_files=view.hidden_files,
        protected=tuple(p for p in protected if os.path.exists(p)),
        env=env,
        extra_ro_binds=own_files_under_tmp(),
        pinned=tuple(p for p in [os.path.join(workspace, ".git")] if os.path.isdir(p)),
        proc_read_only=tuple(p for p in PROC_READ_ONLY if os.path.exists(p)),
        folders=view.folders,
        home=home_dir if view.home_is_own else "",
        **resolv_conf_binds(resolv_conf),
        listens=listens,
    )


def resolv_conf_binds(resolv_conf: str) -> dict[str, str]:
    """The Policy's resolv_conf fields: `resolv_conf` (the proxy's; "" for the host's
    network) bound where the host's /etc/resolv.conf leads. That may be a symlink into /run
    (systemd-resolved's), which sessions hide: the host's own file is then bound back at its
    path for the host's network, or the bind would fail for the proxy's."""
    at = os.path.realpath("/etc/resolv.conf")
    if at == "/etc/resolv.conf":
        return {"resolv_conf": resolv_conf}
    if not resolv_conf:
        if not os.path.isfile(at):
            return {}
        resolv_conf = at
    return {"resolv_conf": resolv_conf, "resolv_conf_at": at}


def make_hooks_folder(workspace: str) -> None:
    """An empty hooks folder in the workspace's top-level repository where it has none, as
    `git init` makes one: the sandbox can only make read-only a path that exists when it
    starts, and a hooks folder the host makes later (a hook manager's install, `git init`
    run again) would otherwise be the session's to write (docs/sandbox.md, "A hooks folder
    made after open")."""
    git = os.path.join(workspace, ".git")
    hooks = os.path.join(git, "hooks")
    if os.path.isdir(git) and not os.path.islink(git) and not os.path.lexists(hooks):
        try:
            os.mkdir(hooks, 0o755)
        except OSError as e:
            log.warning("%s: could not make the hooks folder, so one made later is not "
                        "read-only in the session (%s)", hooks, e)


def check_outside(workspace: str, *, own_home: str, shown, own_folders) -> None:
    """Fault.REFUSED if `workspace` is or lies in a hidden path: one of toolsd's own folders
    (`own_folders`, {path: what it is}: its socket's, its state, --hide ones) or an entry
    the homes hide (workspace_rules.py): sessions must never see them."""
    why = workspace_rules.refusal(workspace, own_home=own_home, shown=shown,
                                  own_folders=own_folders)
    if why is not None:
        raise SandboxError(Fault.REFUSED, f"session.open: {why}")


def resolve_cwd(workspace: str, cwd: str | None) -> str:
    """A command's folder: inside `workspace` (relative paths are taken from it)."""
    if cwd is None or cwd == "":
        return workspace
    # Resolved, so a symlink in the workspace cannot point the command (or our isdir
    # check, which runs on the host) somewhere else.
    path = os.path.realpath(os.path.join(workspace, cwd))
    if path != workspace and not path.startswith(workspace + os.sep):
        raise SandboxError(Fault.REFUSED, f"cwd {cwd!r} is outside the workspace "
                           f"{workspace}; give a folder inside it")
    if not os.path.isdir(path):
        raise SandboxError(Fault.REFUSED, f"cwd {cwd!r} is not an existing folder in the "
                           f"workspace")
    return path


def command_env(env: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """A session's environment `env` with a call's `extra`, checked."""
    try:
        merged = {**env, **validate_env(extra)}
        if extra:  # env alone was checked at open
            check_env_size(merged)
    except ValueError as e:
        raise SandboxError(Fault.REFUSED, str(e)) from None
    return merged
