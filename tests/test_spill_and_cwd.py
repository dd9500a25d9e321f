"""Protocol 1.1 "spill" and "cwd" through a real daemon: the whole output kept in a file when the
answer cuts it, and the shell's folder reported in a way its output cannot forge."""

from __future__ import annotations

import hashlib
import os

import pytest

from conftest import RunningDaemon, needs_bwrap
from test_no_sandbox import path_without_bwrap
from toolsd.client import ToolsdError
from toolsd.tools.spill import MAX_FILES

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

# Output that no small budget holds, with bytes that are not UTF-8 in it.
BINARY = "import sys; sys.stdout.buffer.write(bytes(range(256)) * 4000)"
BINARY_BYTES = bytes(range(256)) * 4000


@pytest.fixture
def workspace(daemon):
    return daemon.workspace


def sha256_in_session(client, session, path: str) -> str:
    return client.shell_run(session, f"sha256sum {path}")["output"].split()[0]


def test_hello_lists_the_features_built(client):
    assert client.hello()["features"] == ["spill", "cwd", "figures", "tty", "stdin", "stream",
                                          "ports", "tcp", "tenants", "egress", "files", "watch"]


def test_a_cut_output_is_kept_whole_in_a_file(client, session):
    r = client.shell_run(session, f"python3 -c '{BINARY}'", max_output_chars=500, spill=True)
    assert r["truncated"] and len(r["output"]) <= 500
    assert r["output_bytes"] == len(BINARY_BYTES)
    assert r["output_file"].startswith("/tmp/")  # the session's scratch, as it sees it
    assert sha256_in_session(client, session, r["output_file"]) == \
        hashlib.sha256(BINARY_BYTES).hexdigest()


def test_repl_output_cut_is_kept_whole_too(client, session):
    turn = client.turn_begin(session)["turn"]
    r = client.repl_exec(session, turn, BINARY.replace("; ", "; _ = "), max_output_chars=300,
                         spill=True)
    assert r["status"] == "ok" and r["truncated"]
    assert sha256_in_session(client, session, r["output_file"]) == \
        hashlib.sha256(BINARY_BYTES).hexdigest()
    client.turn_end(session, turn)


# The spill files' names. A checkout under /tmp is in the sandbox's /tmp too (the driver's
# folder is reached through it), so other entries may be there.
SPILLED = "toolsd-output-"


def test_output_that_fits_leaves_no_file(client, session):
    r = client.shell_run(session, "seq 1 1000", spill=True)
    assert not r["truncated"] and "output_file" not in r
    # Nearly fits: more bytes than characters of budget (multi-byte text), and still whole.
    r = client.shell_run(session, "python3 -c 'print(\"é\" * 300)'", max_output_chars=301,
                         spill=True)
    assert not r["truncated"] and "output_file" not in r
    assert client.shell_run(session, f"ls -A /tmp | grep {SPILLED}")["output"] == ""
    # Without `spill`, a cut output names no file either.
    r = client.shell_run(session, "seq 1 100000", max_output_chars=100)
    assert r["truncated"] and "output_file" not in r


def test_the_file_stops_at_the_session_file_size_limit(client, workspace):
    s = client.session_open(workspace, limits={"file_mb": 1})["session"]
    try:
        r = client.shell_run(s, "head -c 3000000 /dev/zero | tr '\\0' x", max_output_chars=100,
                             spill=True)
        assert r["output_bytes"] == 3_000_000
        tail = client.shell_run(s, f"tail -c 300 {r['output_file']}; "
                                   f"head -c {1 << 20} {r['output_file']} | tr -d x | wc -c")
        assert "file size limit" in tail["output"] and "1951424 more bytes were not kept" \
            in tail["output"]
        assert tail["output"].endswith("0\n")  # the first MiB is all output
    finally:
        client.session_close(s)


def test_spill_files_of_a_session_are_bounded_in_number_and_size(client, workspace):
    s = client.session_open(workspace, limits={"file_mb": 1})["session"]
    try:
        for _ in range(MAX_FILES + 20):
            r = client.shell_run(s, "echo spilled", max_output_chars=0, spill=True)
            assert r["output_file"]
        listed = client.shell_run(s, f"ls /tmp | grep -c {SPILLED}")["output"]
        assert int(listed) == MAX_FILES
        # A big one pushes out the others: together they stay within the file size limit.
        r = client.shell_run(s, "head -c 1048576 /dev/zero", max_output_chars=10, spill=True)
        left = client.shell_run(s, f"ls /tmp | grep {SPILLED}; du -cb /tmp/{SPILLED}* | tail -1"
                                )["output"].split()
        assert left[0] == os.path.basename(r["output_file"])
        assert int(left[-2]) <= 1 << 20
    finally:
        client.session_close(s)


def test_a_planted_name_is_never_written_through(client, session, workspace):
    # Sandboxed code knows the next name; a symlink there must not be followed.
    target = os.path.join(workspace, "victim.txt")
    with open(target, "w") as f:
        f.write("unchanged\n")
    client.shell_run(session, f"ln -s {target} /tmp/toolsd-output-1.txt; "
                              f"mkfifo /tmp/toolsd-output-2.txt")
    r = client.shell_run(session, "seq 1 100000", max_output_chars=100, spill=True)
    assert r["output_file"] == "/tmp/toolsd-output-3.txt"
    with open(target) as f:
        assert f.read() == "unchanged\n"


def test_cd_is_reported(client, session, workspace):
    os.makedirs(os.path.join(workspace, "sub dir"))
    r = client.shell_run(session, "cd 'sub dir' && echo in", report_cwd=True)
    assert r["cwd_after"] == os.path.join(os.path.realpath(workspace), "sub dir")
    # The next call can start there.
    r = client.shell_run(session, "pwd", cwd=r["cwd_after"], report_cwd=True)
    assert r["output"] == r["cwd_after"] + "\n"
    # An exit with a code is not a kill: the folder is known.
    r = client.shell_run(session, "cd /; exit 4", report_cwd=True)
    assert r["exit_code"] == 4 and r["cwd_after"] == "/"
    # Asked for nothing, told nothing.
    assert "cwd_after" not in client.shell_run(session, "cd /")


def test_a_killed_shell_reports_no_folder(client, session):
    r = client.shell_run(session, "cd /; kill -9 $$", report_cwd=True)
    assert r["signal"] == "SIGKILL" and "cwd_after" not in r
    r = client.shell_run(session, "cd /; sleep 30", report_cwd=True, timeout_s=0.5)
    assert r["timed_out"] and "cwd_after" not in r


def test_printing_cannot_forge_the_folder(client, session, workspace):
    here = os.path.realpath(workspace)
    forged = "echo /etc; echo /etc >&2; printf '/etc\\n/etc\\n'; pwd() { echo /etc; }"
    r = client.shell_run(session, forged, report_cwd=True)
    assert r["cwd_after"] == here
    # Removing the trap makes the folder unknown, never wrong.
    r = client.shell_run(session, "trap - EXIT; cd /; echo /etc", report_cwd=True)
    assert "cwd_after" not in r
    # What the command itself writes before the trap is overwritten by the trap's line.
    r = client.shell_run(session, "echo /etc >&3; cd /usr", report_cwd=True)
    assert r["cwd_after"] == "/usr"


def test_unsandboxed_spill_names_the_host_path(daemon_root):
    d = RunningDaemon(daemon_root)
    d.env["PATH"] = path_without_bwrap(daemon_root)
    d.start()
    try:
        with d.client() as c:
            s = c.session_open(d.workspace)["session"]
            r = c.shell_run(s, "echo; head -c 100000 /dev/zero", max_output_chars=100,
                            spill=True)
            assert r["output_file"].startswith(os.path.join(d.state_dir, "scratch"))
            assert os.path.getsize(r["output_file"]) == 100001
            c.session_close(s)
    finally:
        assert d.stop() == 0
