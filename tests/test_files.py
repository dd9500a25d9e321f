"""The file methods (protocol 1.2 "files") through a real daemon: what they read and write is
what the session's own commands see, hidden paths are absent, a read-only session refuses,
whole writes are atomic, big files move in parts."""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import tempfile
import threading

import psutil
import pytest

import test_image_read
from _pipelined import frame, pipelined
from conftest import RunningDaemon, needs_bwrap
from toolsd.client import ToolsdError

pytestmark = pytest.mark.daemon(shared=True)

MiB = 1 << 20


def error_of(call) -> ToolsdError:
    with pytest.raises(ToolsdError) as e:
        call()
    return e.value


def put(folder: str, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def content(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def helpers(daemon) -> list[psutil.Process]:
    return daemon.running("file_helper.py")


# ------------------------------------------------------------------ reading and writing


def test_write_then_read_stat_and_list_as_the_session_sees_them(daemon, client, session):
    ws = daemon.workspace
    assert "files" in client.hello()["features"] and "watch" in client.hello()["features"]
    assert client.file_write(session, "src/a.txt", b"hello\n") == {"size": 6}
    # The session's own commands see the file the call wrote, and the other way round.
    assert client.shell_run(session, "cat src/a.txt")["output"] == "hello\n"
    client.shell_run(session, "printf made-inside > src/b.txt; ln -s a.txt src/link")
    read = client.file_read(session, os.path.join(ws, "src/b.txt"))
    assert read["data"] == b"made-inside" and read["eof"] and read["size"] == 11
    entry = client.file_stat(session, "src/link")
    assert entry["type"] == "symlink" and entry["target"] == "a.txt"
    assert entry["path"] == os.path.join(ws, "src/link")
    listing = client.file_list(session, ".", depth=2)
    assert [(e["path"][len(ws) + 1:], e["type"]) for e in listing["entries"]] == [
        ("src", "dir"), ("src/a.txt", "file"), ("src/b.txt", "file"), ("src/link", "symlink")]
    assert not listing["truncated"]
    assert len(client.file_list(session, ".", depth=2, limit=2)["entries"]) == 2
    assert client.file_list(session, ".", depth=2, limit=2)["truncated"]
    # Through the link, as `cat src/link` would.
    assert client.file_read(session, "src/link")["data"] == b"hello\n"


def test_offsets_append_modes_and_the_umask(daemon, client, session):
    ws = daemon.workspace
    client.file_write(session, "f", b"0123456789")
    assert client.file_write(session, "f", b"AB", offset=4) == {"size": 10}
    assert content(os.path.join(ws, "f")) == b"0123AB6789"
    assert client.file_write(session, "f", b"!", append=True) == {"size": 11}
    part = client.file_read(session, "f", offset=3, length=4)
    assert part["data"] == b"3AB6" and not part["eof"] and part["size"] == 11
    assert client.file_read(session, "f", offset=50)["data"] == b""
    # A whole write replaces the file and keeps its mode; `mode` sets one.
    os.chmod(os.path.join(ws, "f"), 0o751)
    client.file_write(session, "f", b"new")
    assert os.stat(os.path.join(ws, "f")).st_mode & 0o7777 == 0o751
    client.file_write(session, "g", b"x", mode=0o600)
    assert os.stat(os.path.join(ws, "g")).st_mode & 0o7777 == 0o600
    # A new file gets what the session's umask leaves, as `touch` in the session does.
    client.file_write(session, "h", b"x")
    client.shell_run(session, "touch by-shell")
    assert (os.stat(os.path.join(ws, "h")).st_mode & 0o777
            == os.stat(os.path.join(ws, "by-shell")).st_mode & 0o777)
    # Nothing of the temporary files is left.
    assert sorted(os.listdir(ws)) == ["by-shell", "f", "g", "h"]


def test_mkdir_rename_remove(daemon, client, session):
    ws = daemon.workspace
    assert client.file_mkdir(session, "a/b/c") == {}
    assert os.path.isdir(os.path.join(ws, "a/b/c"))
    e = error_of(lambda: client.file_mkdir(session, "x/y", parents=False))
    assert e.code == "not_found"
    client.file_write(session, "a/b/c/f", b"1")
    client.file_write(session, "g", b"2")
    e = error_of(lambda: client.file_rename(session, "g", "a/b/c/f"))
    assert e.code == "io_error" and "overwrite" in e.message
    assert client.file_rename(session, "g", "a/b/c/f", overwrite=True) == {}
    assert content(os.path.join(ws, "a/b/c/f")) == b"2" and not os.path.exists(
        os.path.join(ws, "g"))
    e = error_of(lambda: client.file_remove(session, "a"))
    assert e.code == "io_error" and "recursive" in e.message
    os.symlink(os.path.join(ws, "a"), os.path.join(ws, "a/b/back"))
    # Symlinks are removed, never followed.
    assert client.file_remove(session, "a", recursive=True) == {"removed": 5}
    assert os.listdir(ws) == []
    assert error_of(lambda: client.file_remove(session, "a")).code == "not_found"


def test_reads_come_in_parts_of_at_most_8_mib(daemon, client, session):
    data = os.urandom(MiB) * 20
    put(daemon.workspace, "big", data)
    first = client.file_read(session, "big")
    assert len(first["data"]) == 8 * MiB and not first["eof"] and first["size"] == 20 * MiB
    got, offset = [], 0
    while True:
        part = client.file_read(session, "big", offset=offset)
        got.append(part["data"])
        offset += len(part["data"])
        if part["eof"]:
            break
    assert b"".join(got) == data and len(got) == 3


def test_bad_inputs_say_what_to_do(daemon, client, session):
    put(daemon.workspace, "dir/f", b"x")
    cases = {
        "NUL": lambda: client.file_read(session, "a\0b"),
        "empty": lambda: client.file_read(session, ""),
        "negative": lambda: client.file_read(session, "dir/f", offset=-1),
        "both": lambda: client.file_write(session, "dir/f", b"x", offset=0, append=True),
        "mode": lambda: client.file_write(session, "dir/f", b"x", mode=0o17777),
        "folder read": lambda: client.file_read(session, "dir"),
        "folder write": lambda: client.file_write(session, "dir", b"x"),
        "device": lambda: client.file_read(session, "/dev/zero"),
        "list a file": lambda: client.file_list(session, "dir/f"),
        "watch without stream": lambda: client.call("file.watch", session=session, path="."),
        "no session": lambda: client.file_read("s999999", "dir/f"),
    }
    codes = {name: error_of(call).code for name, call in cases.items()}
    assert codes == {"NUL": "bad_params", "empty": "bad_params", "negative": "bad_params",
                     "both": "bad_params", "mode": "bad_params", "folder read": "io_error",
                     "folder write": "io_error", "device": "io_error", "list a file": "io_error",
                     "watch without stream": "bad_params", "no session": "not_found"}
    # The session is none the worse.
    assert client.file_read(session, "dir/f")["data"] == b"x"


def test_over_the_session_file_size_limit_is_limit_exceeded(daemon, client):
    session = client.session_open(daemon.workspace, limits={"file_mb": 1})["session"]
    put(daemon.workspace, "f", b"old")
    for call in (lambda: client.file_write(session, "f", b"x" * (MiB + 1)),
                 lambda: client.file_write(session, "f", b"x", offset=MiB)):
        e = error_of(call)
        assert e.code == "limit_exceeded" and "file_mb" in e.message
    # An append that would cross it is stopped by the helper, which knows the size.
    client.file_write(session, "g", b"x" * (MiB - 1))
    assert error_of(lambda: client.file_write(session, "g", b"xx", append=True)).code == \
        "limit_exceeded"
    assert content(os.path.join(daemon.workspace, "f")) == b"old"
    assert os.path.getsize(os.path.join(daemon.workspace, "g")) == MiB - 1


# ------------------------------------------------------------------ the session's view


@needs_bwrap
def test_read_only_session_refuses_every_write_and_changes_nothing(daemon, client):
    ws = daemon.workspace
    put(ws, "keep.txt", b"original")
    os.makedirs(os.path.join(ws, "sub"))
    session = client.session_open(ws, writable=False)["session"]
    before = {n: content(os.path.join(ws, n)) for n in ["keep.txt"]}
    calls = [lambda: client.file_write(session, "keep.txt", b"changed"),
             lambda: client.file_write(session, "keep.txt", b"changed", offset=0),
             lambda: client.file_write(session, "new.txt", b"x"),
             lambda: client.file_mkdir(session, "newdir"),
             lambda: client.file_remove(session, "keep.txt"),
             lambda: client.file_rename(session, "keep.txt", "moved.txt")]
    for call in calls:
        e = error_of(call)
        assert e.code == "io_error" and "read-only" in e.message, e.message
    assert sorted(os.listdir(ws)) == ["keep.txt", "sub"]
    assert {n: content(os.path.join(ws, n)) for n in ["keep.txt"]} == before
    assert client.file_read(session, "keep.txt")["data"] == b"original"


# A daemon whose HOME lies inside the workspace: only the hiding keeps ~/.ssh out.
home_in_workspace = test_image_read.home_in_workspace


@needs_bwrap
def test_hidden_paths_and_links_into_them_are_not_found(home_in_workspace):
    daemon, home = home_in_workspace
    secret = put(home, ".ssh/id_test", b"SECRET")
    put(home, "visible.txt", b"seen")
    os.symlink(secret, os.path.join(daemon.workspace, "link"))
    os.symlink(os.path.join(home, ".ssh"), os.path.join(daemon.workspace, "dirlink"))
    with daemon.client() as client:
        session = client.session_open(daemon.workspace)["session"]
        # The home is in view: what refuses the rest is the hiding of ~/.ssh.
        assert client.file_read(session, os.path.join(home, "visible.txt"))["data"] == b"seen"
        for path in (secret, os.path.join(home, ".ssh"), "link", "dirlink", "dirlink/id_test",
                     "home/.ssh/../.ssh/id_test"):
            for name, call in {"read": lambda: client.file_read(session, path),
                               "stat": lambda: client.file_stat(session, path + "/x"),
                               "list": lambda: client.file_list(session, path),
                               "write": lambda: client.file_write(session, path, b"x")}.items():
                e = error_of(call)
                assert e.code == "not_found", (path, name, e.message)
        # Listing the home leaves the hidden folder out; removing it cannot reach it.
        names = [e["path"] for e in client.file_list(session, home)["entries"]]
        assert os.path.join(home, ".ssh") not in names
        assert content(secret) == b"SECRET"
        client.session_close(session)


def test_dotdot_cannot_leave_what_the_session_sees(daemon, client, session):
    # The host's /tmp is out of the session's sight (its /tmp is its own scratch folder).
    outside = tempfile.mkdtemp(prefix="toolsd-outside-", dir="/tmp")
    try:
        put(outside, "secret.txt", b"host only")
        up = "../" * 40
        for path in (up + outside.lstrip("/") + "/secret.txt", outside + "/secret.txt",
                     "/../../" + outside + "/secret.txt"):
            assert error_of(lambda: client.file_read(session, path)).code == "not_found"
            assert error_of(lambda: client.file_stat(session, path)).code == "not_found"
        # The daemon's own folders are hidden, however they are reached.
        state = os.path.relpath(daemon.state_dir, daemon.workspace)
        assert error_of(lambda: client.file_list(session, state)).code == "not_found"
        socket_dir = up + os.path.dirname(daemon.socket).lstrip("/")
        assert error_of(lambda: client.file_list(session, socket_dir)).code == "not_found"
        # `..` past / stays at /: what the session sees there is what its commands read.
        with open("/etc/hostname", "rb") as f:
            assert client.file_read(session, up + "etc/hostname")["data"] == f.read()
        # A write to the host's view is refused by the read-only root.
        e = error_of(lambda: client.file_write(session, up + "etc/toolsd-test", b"x"))
        assert e.code == "io_error" and "read-only" in e.message
    finally:
        shutil.rmtree(outside)


# ------------------------------------------------------------------ atomic replace


def _inotify(folder: str):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    IN_MODIFY, IN_CREATE = 0x2, 0x100
    assert libc.inotify_add_watch(fd, os.fsencode(folder), IN_MODIFY | IN_CREATE) >= 0
    return fd


@needs_bwrap
def test_whole_write_killed_midway_leaves_the_old_file(daemon, client, session):
    """The file helper is killed at the first change it makes in the folder: the file is
    the old one, whole, and never a part of the new one."""
    ws = daemon.workspace
    old, new = b"A" * MiB, os.urandom(12 * MiB)
    target = put(ws, "data.bin", old)
    client.file_stat(session, "data.bin")  # the helper runs
    midway = 0
    for _attempt in range(5):
        [helper] = helpers(daemon)
        watch = _inotify(ws)
        outcome = {}

        def write():
            try:
                with daemon.client() as c:
                    outcome["result"] = c.file_write(session, "data.bin", new)
            except ToolsdError as e:
                outcome["error"] = e

        writer = threading.Thread(target=write)
        writer.start()
        try:
            assert select.select([watch], [], [], 30)[0], "the write changed nothing"
            helper.send_signal(signal.SIGKILL)
        finally:
            writer.join(60)
            os.close(watch)
        data = content(target)
        assert data in (old, new), f"a part of the new file: {len(data)} bytes"
        if "error" in outcome:
            assert outcome["error"].code == "io_error" and data == old
            midway += 1
        else:
            os.remove(target)
            put(ws, "data.bin", old)
        # The next call gets a new helper.
        assert client.file_read(session, "data.bin", length=4)["data"] == old[:4]
    assert midway, "no kill landed before the rename"


def test_helper_killed_from_inside_comes_back(daemon, client, session):
    client.file_write(session, "f", b"1")
    [first] = helpers(daemon)
    # The session's code cannot stop it by name with a catchable signal...
    client.shell_run(session, "pkill -f file_helper.py; killall toolsd-files; true")
    assert first.is_running() and first.status() != psutil.STATUS_ZOMBIE
    # ...only SIGKILL ends it, and the next call starts another.
    client.shell_run(session, "pkill -9 -f file_helper.py")
    psutil.wait_procs([first], timeout=10)
    assert client.file_read(session, "f")["data"] == b"1"
    assert [p.pid for p in helpers(daemon)] != [first.pid]



def test_unsandboxed_session_still_keeps_file_calls_out_of_the_daemons_folders(daemon_root):
    """Without bubblewrap nothing is mounted over the daemon's folders: the helper's own
    check is what keeps file calls out of them (the rest of the host is as visible as to the
    session's commands: docs/sandbox.md, "Without bubblewrap")."""
    from test_no_sandbox import path_without_bwrap

    d = RunningDaemon(daemon_root)
    d.env["PATH"] = path_without_bwrap(daemon_root)
    d.start()
    try:
        with d.client() as client:
            opened = client.session_open(d.workspace)
            assert opened["sandbox"] == "none"
            session = opened["session"]
            assert client.file_write(session, "f", b"plain") == {"size": 5}
            assert content(os.path.join(d.workspace, "f")) == b"plain"
            assert os.listdir(d.state_dir)  # it is there, on the host
            for path in (d.state_dir, os.path.dirname(d.socket)):
                assert error_of(lambda: client.file_list(session, path)).code == "not_found"
                e = error_of(lambda: client.file_write(session, path + "/x", b"x"))
                assert e.code == "not_found"
            client.session_close(session)
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_write_cancelled_right_behind_it_writes_nothing(daemon, client):
    session = client.session_open(daemon.workspace)["session"]
    try:
        client.file_stat(session, ".")  # the session's file helper runs
        replies = pipelined(daemon, frame(1, "file.write", session=session, path="w.txt",
                                          data=b"x"), frame(2, "cancel", request=1))
        by_id = {r["id"]: r for r in replies}
        assert by_id[2].get("result") == {}
        assert by_id[1]["error"]["code"] == "cancelled"
        assert not os.path.exists(os.path.join(daemon.workspace, "w.txt"))
    finally:
        client.session_close(session)
