"""The session's home is deny-by-default: a secret is never read, whether it existed when the
session opened or was made on the host afterwards, and whatever reads it (a shell command,
grep -r, find, image.read, the REPL's open()); what the session writes in its home stays in
its scratch; toolchains in the home still run."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import pytest
from PIL import Image

from conftest import RunningDaemon, needs_bwrap
from toolsd.sandbox.bwrap import home as home_module
from toolsd.sandbox.bwrap.overlay import why_no_overlay
from toolsd.client import ToolsdError

# Entries of the list that hold a folder of files where tools make them; the rest are files.
FOLDERS = {
    ".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".config/gcloud", ".oci",
    ".config/doctl", ".config/rclone", ".pulumi", ".fly", ".wrangler", ".kaggle",
    ".huggingface", ".config/gh", ".config/hub", ".config/glab-cli", ".password-store",
    ".config/op", ".local/share/keyrings", ".config/sops", ".claude", ".codex", ".mozilla",
    ".config/google-chrome", ".config/chromium", ".config/BraveSoftware",
    ".config/microsoft-edge", ".local/share/nvim/shada", ".cache", ".npm",
}
SECRET_ENTRIES = (*home_module.SECRETS, *home_module.OWN)


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(out, "PNG")
    return out.getvalue()


def plant_secrets(home: str, tag: str) -> dict[str, str]:
    """Every entry of the list in `home`, each holding its own token and a picture; returns
    {entry: the file to read}."""
    planted = {}
    for i, rel in enumerate(SECRET_ENTRIES):
        path = os.path.join(home, rel)
        token = f"{tag}-TOKEN-{i}"
        if rel in FOLDERS:
            os.makedirs(path, exist_ok=True)
            target = os.path.join(path, "token")
            with open(os.path.join(path, "shot.png"), "wb") as f:
                f.write(png_bytes())
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            target = path
        with open(target, "w") as f:
            f.write(f"{token}\n")
        planted[rel] = target
    return planted


def host_tree(home: str) -> dict[str, bytes | None]:
    """Every path under `home` with its content (None for a folder)."""
    tree = {}
    for folder, dirs, files in os.walk(home):
        for d in dirs:
            tree[os.path.join(folder, d)] = None
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                tree[path] = f.read()
    return tree


def toolchain_and_secrets(d) -> None:
    """The daemon's HOME holds a toolchain, a git config, ordinary files and every secret of
    the list, all there before any session opens."""
    bin_dir = os.path.join(d.home, ".local", "bin")
    d.env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "mytool"), "w") as f:
        f.write("#!/bin/sh\necho mytool ran from the home\n")
    os.chmod(os.path.join(bin_dir, "mytool"), 0o755)
    with open(os.path.join(d.home, ".gitconfig"), "w") as f:
        f.write("[user]\n\tname = Host Person\n\temail = host@example.com\n")
    os.makedirs(os.path.join(d.home, ".config", "pip"))
    with open(os.path.join(d.home, ".config", "pip", "pip.conf"), "w") as f:
        f.write("[global]\ntimeout = 60\n")
    lib = os.path.join(d.home, ".pyenv", "versions", "3.12", "lib")  # a toolchain: bound
    os.makedirs(lib)
    with open(os.path.join(lib, "mod.py"), "w") as f:
        f.write("x = 1\n")
    d.planted = plant_secrets(d.home, "OPEN")


pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True, prepare=toolchain_and_secrets)]


def assert_nothing_read(client, session, home: str, planted: dict[str, str], tag: str) -> None:
    """No way in reads a token: cat, grep -r, find, image.read, the REPL's open()."""
    paths = " ".join(f"'{p}'" for p in planted.values())
    r = client.shell_run(session, f"cat {paths} 2>&1; grep -r {tag}-TOKEN ~ 2>&1; "
                                  f"find ~ 2>&1", max_output_chars=200_000)
    assert f"{tag}-TOKEN" not in r["output"]
    for rel, target in planted.items():
        # (~/.cache and ~/.npm are there, the session's own and empty.)
        assert target + "\n" not in r["output"], f"find shows {rel}"
    for rel in planted:
        if rel in FOLDERS:
            with pytest.raises(ToolsdError) as e:
                client.image_read(session, os.path.join(home, rel, "shot.png"))
            assert e.value.code == "not_found", rel
    turn = client.turn_begin(session)["turn"]
    code = ("found = []\n"
            f"for p in {list(planted.values())!r}:\n"
            "    try:\n"
            "        found.append(open(p).read())\n"
            "    except OSError:\n"
            "        pass\n"
            "print('read', len(found), ''.join(found))\n")
    r = client.repl_exec(session, turn, code)
    assert r["output"] == "read 0 \n", r["output"]
    client.turn_end(session, turn)


def test_no_secret_that_existed_at_open_is_read(daemon, client, session):
    assert_nothing_read(client, session, daemon.home, daemon.planted, "OPEN")
    # The home itself is there: what is not a secret reads as on the host.
    r = client.shell_run(session, "cat ~/notes.txt ~/.config/pip/pip.conf")
    assert r["output"] == "PUBLIC-NOTE\n[global]\ntimeout = 60\n"


def test_no_secret_made_on_the_host_after_open_is_read(daemon_root):
    d = RunningDaemon(daemon_root)
    shutil.rmtree(os.path.join(d.home, ".ssh"))  # nothing of the list exists at open
    d.start()
    try:
        with d.client() as client:
            s = client.session_open(d.workspace)["session"]
            planted = plant_secrets(d.home, "LATER")
            with open(os.path.join(d.home, "later.txt"), "w") as f:
                f.write("LATER-PUBLIC\n")
            assert_nothing_read(client, s, d.home, planted, "LATER")
            # Deny by default: nothing the host adds to its home appears, secret or not.
            r = client.shell_run(s, "cat ~/later.txt; echo rc=$?")
            assert "LATER-PUBLIC" not in r["output"] and "rc=1" in r["output"]
            # A new session sees the new ordinary file, and still none of the secrets.
            s2 = client.session_open(d.workspace)["session"]
            assert client.shell_run(s2, "cat ~/later.txt")["output"] == "LATER-PUBLIC\n"
            assert_nothing_read(client, s2, d.home, planted, "LATER")
    finally:
        assert d.stop() == 0, d.read_log()


def test_the_real_home_is_guarded_too_when_home_points_elsewhere(daemon, client, session):
    # The daemon's HOME is a test folder; its user's own home (the password database's)
    # is readable by default, so its secrets are hidden as well.
    import pwd

    real = os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)
    present = [rel for rel in SECRET_ENTRIES if os.path.lexists(os.path.join(real, rel))]
    if not present or real == os.path.realpath(daemon.home):
        pytest.skip(f"{real} holds none of the hidden entries")
    probe = " ".join(f"test -e '{os.path.join(real, rel)}' && echo 'SEEN {rel}';"
                     for rel in present)
    assert "SEEN" not in client.shell_run(session, probe)["output"]


def test_the_session_writes_its_home_and_the_host_home_is_unchanged(daemon, client, session):
    before = host_tree(daemon.home)
    r = client.shell_run(session, "echo x > ~/.cache/x && cat ~/.cache/x && "
                                  "echo y > ~/.viminfo && mkdir -p ~/.config/newtool && "
                                  "echo z > ~/.config/newtool/rc && echo ok")
    assert r["output"] == "x\nok\n", r["output"]
    # The host's folders are read-only (or overlays, where bwrap can make them: writable,
    # the writes the session's); its small files are the session's copies.
    r = client.shell_run(session, "echo x > ~/.pyenv/versions/new; echo rc=$?; "
                                  "echo more >> ~/notes.txt && cat ~/notes.txt")
    if why_no_overlay(shutil.which("bwrap"), os.path.realpath(daemon.home)):
        assert "Read-only file system" in r["output"] and "rc=1" in r["output"]
        assert r["output"].endswith("rc=1\nPUBLIC-NOTE\nmore\n")
    else:
        assert r["output"] == "rc=0\nPUBLIC-NOTE\nmore\n", r["output"]
    assert host_tree(daemon.home) == before
    # The next session starts from the host's home again.
    s2 = client.session_open(daemon.workspace)["session"]
    r = client.shell_run(s2, "ls -A ~/.cache | wc -l; cat ~/.viminfo; echo rc=$?")
    assert r["output"].startswith("0\n") and r["output"].endswith("rc=1\n")


@pytest.mark.skipif(shutil.which("vim") is None, reason="vim is not installed")
def test_vim_substitute_and_write_exits_at_once(daemon, client, session):
    with open(os.path.join(daemon.workspace, "f.txt"), "w") as f:
        f.write("abc\n")
    r = client.shell_run(session, "vim -c 's/a/b/' -c wq f.txt", timeout_s=60)
    assert not r["timed_out"] and r["exit_code"] == 0, r["output"]
    with open(os.path.join(daemon.workspace, "f.txt")) as f:
        assert f.read() == "bbc\n"


def test_a_toolchain_in_the_home_on_path_still_runs(daemon, client, session):
    r = client.shell_run(session, "mytool; command -v mytool")
    assert r["output"] == ("mytool ran from the home\n"
                           f"{os.path.join(daemon.home, '.local', 'bin', 'mytool')}\n")


def test_git_config_global_is_the_sessions_own_and_reads_the_hosts(daemon, client, session):
    r = client.shell_run(session, "git config --global user.email agent@example.com && "
                                  "git config user.name; git config user.email")
    assert r["output"] == "Host Person\nagent@example.com\n"
    with open(os.path.join(daemon.home, ".gitconfig")) as f:
        assert "agent@" not in f.read()
    assert not os.path.exists(os.path.join(daemon.home, home_module.GIT_CONFIG))


def test_writing_a_protected_git_config_says_what_to_do(daemon, client):
    ws = os.path.join(daemon.root, "repo")
    os.makedirs(ws)
    subprocess.run(["git", "init", "-q", ws], check=True)
    s = client.session_open(ws)["session"]
    r = client.shell_run(s, "git config user.email x@example.com")
    assert r["exit_code"] != 0
    last = r["output"].rstrip("\n").split("\n")[-1]
    assert last.startswith("[toolsd: .git/config is read-only in this sandbox")
    assert "do not delete" in last and "git -c" in last and "GIT_CONFIG_GLOBAL" in last
    # The way it names works.
    r = client.shell_run(s, "git -c user.email=x@example.com config user.email")
    assert r["output"] == "x@example.com\n"
    client.session_close(s)


def test_hide_a_file_and_a_path_that_does_not_exist_yet(daemon_root):
    shelf = os.path.join(daemon_root, "shelf")
    os.makedirs(shelf)
    with open(os.path.join(shelf, "secret.txt"), "w") as f:
        f.write("FILE-SECRET\n")
    with open(os.path.join(shelf, "public.txt"), "w") as f:
        f.write("PUBLIC\n")
    later = os.path.join(shelf, "later", "key")
    in_home = os.path.join(daemon_root, "home", ".myapp", "token")
    d = RunningDaemon(daemon_root, ("--hide", os.path.join(shelf, "secret.txt"),
                                    "--hide", later, "--hide", in_home)).start()
    try:
        with d.client() as client:
            s = client.session_open(d.workspace)["session"]
            r = client.shell_run(s, f"cat {shelf}/secret.txt; cat {shelf}/public.txt")
            assert "FILE-SECRET" not in r["output"] and "PUBLIC\n" in r["output"]
            for path in (later, in_home):
                os.makedirs(os.path.dirname(path))
                with open(path, "w") as f:
                    f.write("MADE-LATER\n")
            r = client.shell_run(s, f"cat {later} {in_home}; echo rc=$?")
            assert "MADE-LATER" not in r["output"] and "rc=1" in r["output"]
            # Also in a session opened once they exist.
            s2 = client.session_open(d.workspace)["session"]
            r = client.shell_run(s2, f"cat {later} {in_home} {shelf}/secret.txt; echo rc=$?")
            assert "MADE-LATER" not in r["output"] and "FILE-SECRET" not in r["output"]
            assert client.shell_run(s2, f"cat {shelf}/public.txt")["output"] == "PUBLIC\n"
    finally:
        assert d.stop() == 0, d.read_log()


def test_show_lets_one_entry_back_in_read_only(daemon_root):
    d = RunningDaemon(daemon_root, ("--show", os.path.join(daemon_root, "home", ".npmrc")))
    with open(os.path.join(d.home, ".npmrc"), "w") as f:
        f.write("registry=https://example.com/\n")
    with open(os.path.join(d.home, ".pypirc"), "w") as f:
        f.write("PYPI-SECRET\n")
    d.start()
    try:
        with d.client() as client:
            s = client.session_open(d.workspace)["session"]
            r = client.shell_run(s, "cat ~/.npmrc ~/.pypirc; echo more >> ~/.npmrc; echo rc=$?")
            assert r["output"].startswith("registry=https://example.com/\n")
            assert "PYPI-SECRET" not in r["output"] and "Read-only file system" in r["output"]
    finally:
        assert d.stop() == 0, d.read_log()


@pytest.mark.parametrize("args,says", [
    (("--hide", "/"), "/ cannot be hidden"),
    (("--hide", "/proc/self/environ"), "lies in /proc"),
    (("--hide", "/toolsd-no-such-top-folder/x"), "nearest existing folder is /"),
    (("--show", "~/.bashrc"), "not one of the entries"),
    (("--show", "~/.npmrc", "--hide", "~/.npmrc"), "both --hide and --show"),
])
def test_what_cannot_be_hidden_or_shown_stops_the_daemon_saying_why(daemon_root, args, says):
    sock = os.path.join(daemon_root, "s.sock")
    proc = subprocess.run([sys.executable, "-m", "toolsd", "serve", "--socket", sock, *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": daemon_root})
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not os.path.exists(sock)


def test_a_workspace_in_the_home_is_writable_and_the_secrets_around_it_stay_hidden(
        daemon, client):
    # Made before the session: the home shows what it had at open, the workspace on top.
    proj = os.path.join(daemon.home, "proj")
    os.makedirs(proj, exist_ok=True)
    s = client.session_open(proj)["session"]
    r = client.shell_run(s, "echo made > made.txt && cat ~/.npmrc ~/.ssh/token; echo rc=$?")
    assert "OPEN-TOKEN" not in r["output"] and r["output"].endswith("rc=1\n")
    with open(os.path.join(proj, "made.txt")) as f:
        assert f.read() == "made\n"
    client.session_close(s)


def test_a_session_opened_on_its_home_sees_it_as_it_is_less_the_secrets(daemon, client):
    s = client.session_open(daemon.home)["session"]
    r = client.shell_run(s, "cat notes.txt; cat .npmrc .ssh/token 2>&1 | grep -c TOKEN; "
                            "echo ${GIT_CONFIG_GLOBAL-none}")
    assert r["output"] == "PUBLIC-NOTE\n0\nnone\n"
    client.session_close(s)
