"""Toolchains in the home that write as they go work in a session, and their writes stay in
it: pyenv's rehash after `pip install` (its shims folder is the session's own), and `npm
install -g` (its prefix is in the session's home)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import needs_bwrap

REAL_PYENV = os.path.join(os.path.expanduser("~"), ".pyenv")


def pyenv_copy(home: str) -> str:
    """The host's pyenv, copied into `home` without its Pythons (a link to them) and its shims
    made again for the copy, as `pyenv rehash` makes them."""
    root = os.path.join(home, ".pyenv")
    shutil.copytree(REAL_PYENV, root, symlinks=True,
                    ignore=lambda d, names: ["versions", ".git", "shims"] if d == REAL_PYENV
                    else [])
    os.symlink(os.path.join(REAL_PYENV, "versions"), os.path.join(root, "versions"))
    env = {**os.environ, "PYENV_ROOT": root}
    subprocess.run([os.path.join(root, "bin", "pyenv"), "rehash"], check=True, env=env,
                   capture_output=True, timeout=120)
    return root


def host_state(folder: str) -> dict[str, tuple[int, int]]:
    return {e.name: (e.stat(follow_symlinks=False).st_ino,
                     e.stat(follow_symlinks=False).st_mtime_ns) for e in os.scandir(folder)}


def pyenv_in_home(d) -> None:
    """The daemon's PATH finds the copy of the host's pyenv in its HOME (if the host has one)."""
    path = [p for p in os.environ["PATH"].split(":") if not p.startswith(REAL_PYENV)]
    if os.path.isdir(REAL_PYENV):
        d.pyenv = pyenv_copy(d.home)
        path = [os.path.join(d.pyenv, "shims"), os.path.join(d.pyenv, "bin"), *path]
    else:
        d.pyenv = None
    d.env["PATH"] = ":".join(path)
    d.env.pop("PYENV_ROOT", None)
    d.env.pop("PYENV_VERSION", None)


pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True, prepare=pyenv_in_home)]


@pytest.fixture
def session(daemon):
    with daemon.client() as c:
        s = c.session_open(daemon.workspace)["session"]
        yield c, s
        c.session_close(s)


def test_pip_under_pyenv_rehashes_in_the_session_and_the_chain_goes_on(daemon, session):
    if daemon.pyenv is None:
        pytest.skip(f"pyenv is not installed here ({REAL_PYENV})")
    c, s = session
    shims = os.path.join(daemon.pyenv, "shims")
    before = host_state(shims)
    # pip's uninstall of nothing succeeds, so pyenv's pip hook runs `pyenv rehash`, which
    # writes into the shims folder: read-only, it failed the chain with exit code 1.
    r = c.shell_run(s, "command -v pip; pip uninstall -y toolsd-not-installed 2>&1 "
                       "&& echo the chain goes on")
    assert r["output"].startswith(f"{shims}/pip\n"), r["output"]
    assert r["exit_code"] == 0 and r["output"].endswith("the chain goes on\n"), r["output"]
    assert "cannot rehash" not in r["output"]
    r = c.shell_run(s, "pyenv rehash && touch ~/.pyenv/shims/made-in-session && echo ok")
    assert r["output"] == "ok\n", r["output"]
    assert host_state(shims) == before  # the host's shims are untouched


def test_npm_install_global_lands_in_the_sessions_home(daemon, session):
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed here")
    c, s = session
    pkg = os.path.join(daemon.workspace, "hello-pkg")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "package.json"), "w") as f:
        f.write('{"name": "toolsd-hello", "version": "1.0.0", '
                '"bin": {"toolsd-hello": "hello.js"}}\n')
    with open(os.path.join(pkg, "hello.js"), "w") as f:
        f.write('#!/usr/bin/env node\nconsole.log("hello from a global install")\n')
    r = c.shell_run(s, "npm install -g --offline --no-audit --no-fund ./hello-pkg >/dev/null "
                       "&& toolsd-hello && npm root -g", timeout_s=120)
    assert r["exit_code"] == 0, r["output"]
    assert r["output"] == (f"hello from a global install\n"
                           f"{daemon.home}/.npm/global/lib/node_modules\n"), r["output"]
    host_root = subprocess.run(["npm", "root", "-g"], capture_output=True, text=True,
                               env={**os.environ, "HOME": daemon.home}, timeout=60).stdout.strip()
    assert not os.path.exists(os.path.join(host_root, "toolsd-hello"))
    assert not os.path.exists(os.path.join(daemon.home, ".npm", "global"))


def test_npm_init_with_no_input_and_no_network_ends_at_once(daemon, session):
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed here")
    c, s = session
    os.makedirs(os.path.join(daemon.workspace, "fresh"), exist_ok=True)
    # Its questions get end-of-file; npm's background check for a newer npm then kept node
    # alive on its registry retries (10 s, then 60 s) until the call's timeout.
    r = c.shell_run(s, "npm init; echo rc=$?", cwd="fresh", timeout_s=60)
    assert not r["timed_out"] and r["output"].endswith("rc=1\n"), r
    assert "package name:" in r["output"]
    # Any registry request fails at once in a session without network.
    r = c.shell_run(s, "npm view toolsd-not-a-package version", cwd="fresh", timeout_s=60)
    assert not r["timed_out"] and r["exit_code"] != 0, r


def test_matplotlib_finds_its_config_folder_writable(daemon, session):
    c, s = session
    config = os.path.join(daemon.home, ".config", "matplotlib")
    # Made after the daemon started, before the session: what a session shows is the home
    # as it is at open.
    os.makedirs(config, exist_ok=True)
    with open(os.path.join(config, "matplotlibrc"), "w") as f:
        f.write("figure.dpi: 42\n")
    s2 = c.session_open(daemon.workspace)["session"]
    r = c.shell_run(s2, f"{sys.executable} -c 'import matplotlib as m; print(m.get_configdir(), "
                        f"m.rcParams[\"figure.dpi\"])'; ls {config}")
    c.session_close(s2)
    assert r["output"] == f"{config} 42.0\nmatplotlibrc\n", r["output"]
    assert os.listdir(config) == ["matplotlibrc"]
