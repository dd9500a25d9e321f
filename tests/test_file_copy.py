"""Moving whole files and folders: a 1 GiB file in parts through file.write and file.read, and
`toolsd cp` of a 20,000-file tree both ways, compared by a hash of the trees."""

from __future__ import annotations

import hashlib
import os
import random
import stat
import subprocess
import sys

import pytest

from toolsd.client import ToolsdError

pytestmark = pytest.mark.daemon(shared=True)

MiB = 1 << 20


def tree_hash(root: str) -> tuple[str, int]:
    """(hash, entries) of everything below `root`: names, types, permission bits, contents
    and link targets; never following a symlink."""
    digest = hashlib.sha256()
    count = 0
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(folder, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            count += 1
            if stat.S_ISLNK(st.st_mode):
                digest.update(f"L {rel} -> {os.readlink(path)}\n".encode())
            elif stat.S_ISDIR(st.st_mode):
                digest.update(f"D {rel}\n".encode())
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    body = hashlib.sha256(f.read()).hexdigest()
                digest.update(f"F {rel} {stat.S_IMODE(st.st_mode):o} {body}\n".encode())
            else:
                digest.update(f"S {rel}\n".encode())
    return digest.hexdigest(), count


def test_a_1_gib_file_round_trips_in_parts_byte_identical(daemon, client, session):
    """Written in 4 MiB parts generated on the fly (nothing of it held whole anywhere), read
    back in 8 MiB parts: the same bytes by SHA-256."""
    part, total = 4 * MiB, 1 << 30
    generator = random.Random(25)
    sent = hashlib.sha256()
    try:
        for offset in range(0, total, part):
            data = generator.randbytes(part)
            sent.update(data)
            assert client.file_write(session, "big.bin", data, offset=offset) == {
                "size": offset + part}
        got = hashlib.sha256()
        offset = 0
        while True:
            reply = client.file_read(session, "big.bin", offset=offset)
            assert len(reply["data"]) <= 8 * MiB
            got.update(reply["data"])
            offset += len(reply["data"])
            if reply["eof"]:
                break
        assert offset == total == reply["size"]
        assert got.hexdigest() == sent.hexdigest()
    finally:
        os.remove(os.path.join(daemon.workspace, "big.bin"))


def make_tree(root: str, files: int) -> None:
    generator = random.Random(20000)
    for i in range(files):
        folder = os.path.join(root, f"pkg{i % 40}", f"mod{i % 9}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"file{i}.py"), "wb") as f:
            f.write(generator.randbytes(generator.randrange(0, 400)))
    with open(os.path.join(root, "large.bin"), "wb") as f:
        f.write(generator.randbytes(9 * MiB + 123))  # three parts of 4 MiB
    os.chmod(os.path.join(root, "pkg0", "mod0", "file0.py"), 0o755)
    os.makedirs(os.path.join(root, "empty", "deeper"))
    os.symlink("pkg1/mod1", os.path.join(root, "inside-link"))
    os.symlink("../../outside/secret", os.path.join(root, "pkg2", "out-link"))
    os.symlink("/etc/passwd", os.path.join(root, "absolute-link"))


def cp(daemon, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOOLSD_SOCKET=daemon.socket)
    return subprocess.run([sys.executable, "-m", "toolsd", "cp", *args], env=env,
                          capture_output=True, text=True, timeout=900)


def test_cp_of_a_20000_file_tree_both_ways_is_identical(daemon, client, session, tmp_path):
    source = str(tmp_path / "src")
    make_tree(source, 20_000)
    os.mkfifo(os.path.join(source, "a-fifo"))
    expected, _count = tree_hash(source)
    os.remove(os.path.join(source, "a-fifo"))
    without_fifo, count = tree_hash(source)
    os.mkfifo(os.path.join(source, "a-fifo"))

    up = cp(daemon, source, f"{session}:copy")
    assert up.returncode == 0, up.stderr
    assert "20001 files" in up.stderr and "1 special files skipped" in up.stderr
    # In the workspace, as the session's commands see it: the links are links, never
    # followed (the one pointing out of the tree dangles there, as it did here).
    remote_root = os.path.join(daemon.workspace, "copy")
    assert tree_hash(remote_root) == (without_fifo, count)
    check = client.shell_run(session, "readlink copy/pkg2/out-link; test -L copy/inside-link "
                             "&& echo is-a-link; test -p copy/a-fifo || echo no-fifo")
    assert check["output"].split() == ["../../outside/secret", "is-a-link", "no-fifo"]

    back = str(tmp_path / "back")
    down = cp(daemon, f"{session}:copy", back)
    assert down.returncode == 0, down.stderr
    assert tree_hash(back) == (without_fifo, count)
    assert expected != without_fifo  # the hash sees a skipped FIFO


def test_cp_into_an_existing_folder_and_single_files(daemon, client, session, tmp_path):
    local = tmp_path / "notes.txt"
    local.write_bytes(b"one file")
    client.file_mkdir(session, "inbox")
    assert cp(daemon, str(local), f"{session}:inbox").returncode == 0
    assert client.file_read(session, "inbox/notes.txt")["data"] == b"one file"
    out = tmp_path / "out"
    out.mkdir()
    assert cp(daemon, f"{session}:inbox/notes.txt", str(out)).returncode == 0
    assert (out / "notes.txt").read_bytes() == b"one file"
    # Bad arguments say what to do.
    both = cp(daemon, str(local), str(out))
    assert both.returncode == 2 and "SESSION:PATH" in both.stderr
    missing = cp(daemon, f"{session}:nothing-here", str(out))
    assert missing.returncode == 1 and "not_found" in missing.stderr


def test_download_never_writes_through_a_local_symlink(daemon, client, session, tmp_path):
    """A file of the session lands where a symlink already is in the local tree: the link is
    refused, never followed to where it points."""
    client.file_write(session, "tree/victim", b"from the session")
    target = tmp_path / "elsewhere"
    target.write_bytes(b"untouched")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "tree").mkdir()
    os.symlink(target, dest / "tree" / "victim")
    with pytest.raises(OSError):
        client.download(session, "tree", str(dest))
    assert target.read_bytes() == b"untouched"


def test_upload_refuses_nothing_it_should_copy(daemon, client, session, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    stats = client.upload(str(tmp_path / "d"), session, "d2")
    assert (stats.files, stats.dirs, stats.skipped) == (1, 1, 0)
    with pytest.raises(ToolsdError) as e:
        client.upload(str(tmp_path / "d"), "s999999", "x")
    assert e.value.code == "not_found"
