"""A workspace is checked by its resolved path, and bwrap resolves that path again when it
mounts it: a folder on the way swapped for a symlink in between (say by another session, in
its own workspace) would lead elsewhere. Opening checks the path again once the session is
made, and the sandbox's guard finds a workspace mount that landed at another path."""

from __future__ import annotations

import os
import shutil
import subprocess

import psutil
import pytest

from conftest import needs_bwrap, short_tempdir, wait_for
from toolsd.sandbox.errors import SandboxError
from toolsd.sandbox.bwrap.guards import MountGuard
from toolsd.sandbox.bwrap.policy import Policy, bwrap_argv

pytestmark = needs_bwrap


@pytest.fixture
def place():
    root = short_tempdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def sandbox_pid(proc: subprocess.Popen) -> int:
    """The first process inside the sandbox (bwrap's child, pid 1 there), once its mounts are
    made: once it runs the command."""
    def running() -> bool:
        try:
            return any(c.cmdline()[:1] == ["sleep"] for c in psutil.Process(proc.pid).children())
        except psutil.Error:
            return False
    wait_for(running)
    return next(c.pid for c in psutil.Process(proc.pid).children()
                if c.cmdline()[:1] == ["sleep"])


def test_a_workspace_swapped_for_a_symlink_before_the_mount_is_caught(place):
    ws, keys = os.path.join(place, "proj", "sub"), os.path.join(place, "keys")
    os.makedirs(ws)
    os.makedirs(keys)
    scratch = os.path.join(place, "scratch")
    os.makedirs(scratch)
    policy = Policy(workspace=ws, scratch=scratch)
    guard = MountGuard(policy)  # the workspace as it was checked
    argv = bwrap_argv(policy, bwrap=shutil.which("bwrap")) + ["sleep", "60"]
    # Between the check and the mount, `proj` becomes a symlink to a folder with `sub` in it.
    os.makedirs(os.path.join(keys, "sub"))
    os.rename(os.path.join(place, "proj"), os.path.join(place, "proj-old"))
    os.symlink("keys", os.path.join(place, "proj"))  # relative: it resolves in the sandbox too
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        assert ws in guard.open(sandbox_pid(proc))  # the session would end at once
    finally:
        guard.close()
        proc.kill()
        proc.wait()
    # Asked again now, opening refuses at once: the path no longer leads where it did.
    with pytest.raises(SandboxError, match="changed while the session opened"):
        MountGuard(policy)


def test_an_unchanged_workspace_passes(place):
    ws, scratch = os.path.join(place, "ws"), os.path.join(place, "scratch")
    os.makedirs(ws)
    os.makedirs(scratch)
    policy = Policy(workspace=ws, scratch=scratch)
    guard = MountGuard(policy)
    proc = subprocess.Popen(bwrap_argv(policy, bwrap=shutil.which("bwrap")) + ["sleep", "60"],
                            stdin=subprocess.DEVNULL)
    try:
        assert guard.open(sandbox_pid(proc)) == []
    finally:
        guard.close()
        proc.kill()
        proc.wait()
