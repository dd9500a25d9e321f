"""What `toolsd repl` shows a person at a terminal (pexpect): output as it comes, figures
saved where asked, a long output kept whole in a file, and a daemon that went away."""

from __future__ import annotations

import os
import signal
import struct
import zlib

import pexpect
import pytest

from _cli import toolsd_at_terminal
from conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

# A picture with no package at all: an object with _repr_png_ (IPython's protocol), its PNG
# made by hand. One line, so that the prompt takes it as one input.
PNG_CLASS = (
    "exec(\"import struct, zlib\\n"
    "def _chunk(t, d): return struct.pack('>I', len(d)) + t + d + "
    "struct.pack('>I', zlib.crc32(t + d))\\n"
    "class Red:\\n"
    "    def _repr_png_(self):\\n"
    "        raw = b''.join(b'\\\\x00' + b'\\\\xff\\\\x00\\\\x00' * 7 for _ in range(5))\\n"
    "        return (b'\\\\x89PNG\\\\r\\\\n\\\\x1a\\\\n' + _chunk(b'IHDR', struct.pack('>IIBBBBB', "
    "7, 5, 8, 2, 0, 0, 0)) + _chunk(b'IDAT', zlib.compress(raw)) + _chunk(b'IEND', b''))\\n\")")


def red_png() -> bytes:
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * 7 for _ in range(5))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 7, 5, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def end(child) -> int:
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def test_output_shows_while_the_input_still_runs(daemon):
    gate = os.path.join(daemon.workspace, "gate")
    os.mkfifo(gate)
    child = toolsd_at_terminal(daemon, "repl")
    try:
        child.expect_exact(">>> ")
        child.sendline("print('before the gate', flush=True); open('gate').read(); "
                       "print('after')")
        # Shown before the input ends: it ends only once the test opens the gate.
        child.expect_exact("before the gate")
        with open(gate, "w") as f:
            f.write("go")
        child.expect_exact("after\r\n>>> ")
        assert end(child) == 0
    finally:
        child.close(force=True)


def test_figures_are_saved_to_the_folder_named_and_their_paths_printed(daemon, tmp_path):
    child = toolsd_at_terminal(daemon, "repl", "--figures", str(tmp_path))
    try:
        child.expect_exact(">>> ")
        child.sendline(PNG_CLASS)
        child.expect_exact(">>> ")
        (tmp_path / "figure-1.png").write_bytes(b"the person's own")
        child.sendline("Red()")
        saved = tmp_path / "figure-2.png"  # never over a file already there
        child.expect_exact(f"figure 7x5 saved to {saved}")
        child.expect_exact(">>> ")
        assert end(child) == 0
    finally:
        child.close(force=True)
    assert saved.read_bytes() == red_png()
    assert (tmp_path / "figure-1.png").read_bytes() == b"the person's own"


def test_without_a_figures_folder_it_says_how_to_save_them(daemon):
    child = toolsd_at_terminal(daemon, "repl")
    try:
        child.expect_exact(">>> ")
        child.sendline(PNG_CLASS)
        child.expect_exact(">>> ")
        child.sendline("Red()")
        child.expect_exact("in the session; --figures DIR saves them")
        # ^D only once the prompt reads again: sent earlier, readline may drop it.
        child.expect_exact(">>> ")
        assert end(child) == 0
    finally:
        child.close(force=True)
    missing = toolsd_at_terminal(daemon, "repl", "--figures", "/nonexistent/folder")
    missing.expect(pexpect.EOF)
    missing.close()
    assert missing.exitstatus == 2 and "no such folder" in missing.before


def test_a_long_output_is_kept_whole_in_a_file_and_its_path_printed(daemon, tmp_path):
    child = toolsd_at_terminal(daemon, "repl", "--figures", str(tmp_path))
    try:
        child.expect_exact(">>> ")
        child.sendline("for i in range(20000): print('line', i)")
        child.sendline("")
        child.expect(r"the whole output \((\d+) bytes\) is in (\S+)\]")
        size, path = int(child.match.group(1)), child.match.group(2)
        child.expect_exact(">>> ")
        assert end(child) == 0
    finally:
        child.close(force=True)
    expected = "".join(f"line {i}\n" for i in range(20000))
    assert path == str(tmp_path / "output-1.txt")
    with open(path) as f:
        assert f.read() == expected
    assert size == len(expected)


@pytest.mark.daemon(shared=False)  # it stops the daemon
def test_after_the_daemon_is_gone_it_says_the_session_is_lost(daemon):
    child = toolsd_at_terminal(daemon, "repl")
    try:
        child.expect_exact(">>> ")
        child.sendline("x = 41")
        child.expect_exact(">>> ")
        assert daemon.stop(signal.SIGTERM) == 0
        child.sendline("x + 1")
        child.expect_exact("is lost, and with it the REPL's state")
        child.expect(pexpect.EOF)
        child.close()
    finally:
        child.close(force=True)
    assert child.exitstatus == 1
