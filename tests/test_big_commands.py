"""Commands too big for one argv string (Linux caps one at 128 KiB): an agent writing a
generated file with a heredoc. Any command that fits the frame runs, and runs as a small one
does: the same $0 and $@, set -e, exit codes, shell, stdin and inherited descriptors."""

from __future__ import annotations

import os

import pytest

from conftest import daemon_without_bash, needs_bwrap
from toolsd.client import ToolsdError
from toolsd.sandbox.launch.shell_argv import INLINE_MAX

pytestmark = pytest.mark.daemon(shared=True)

# Over the kernel's 128 KiB for one argument, and over INLINE_MAX.
BIG = 140_000

# What a command sees of itself. Run once as it is and once behind a comment line that makes
# it big: both must print the same. Line 2 is `echo line=$LINENO`.
PROBE = """\
{padding}
echo line=$LINENO
echo "0=$0 #=$# @=$@"
echo shell=${{BASH_VERSION:+bash}}
echo stdin=$(readlink /proc/$$/fd/0)
printf fd3=; readlink /proc/$$/fd/3 || echo closed
sh -c 'printf child-fd3=; readlink /proc/$$/fd/3 || echo closed'
set -e
echo before
false
echo not reached
"""


def padding(size: int) -> str:
    return "#" + "x" * (size - 1)


def probe(size: int) -> str:
    return PROBE.format(padding=padding(size))


def expected_probe(shell_path: str, shell: str) -> str:
    return (f"line=2\n0={shell_path} #=0 @=\nshell={'bash' if shell == 'bash' else ''}\n"
            f"stdin=/dev/null\nfd3=closed\nchild-fd3=closed\nbefore\n")


def shell_path(client, s: str) -> str:
    return client.shell_run(s, 'echo "$0"')["output"].strip()


def test_a_heredoc_of_140_kb_writes_its_file(daemon, client, session):
    body = "".join(f"line {i}: {'y' * 60}\n" for i in range(BIG // 70 + 1))
    assert len(body) > BIG
    command = f"cat > generated.txt <<'EOF'\n{body}EOF\nwc -c < generated.txt"
    r = client.shell_run(session, command)
    assert (r["exit_code"], r["output"]) == (0, f"{len(body)}\n")
    with open(os.path.join(daemon.workspace, "generated.txt")) as f:
        assert f.read() == body


@pytest.mark.parametrize("size", [1, INLINE_MAX - 400, INLINE_MAX + 1, BIG, 4 << 20])
def test_a_command_of_any_size_sees_what_a_small_one_does(client, session, size):
    command = probe(size)
    r = client.shell_run(session, command)
    assert (r["exit_code"], r["shell"]) == (1, "bash")
    assert r["output"] == expected_probe(shell_path(client, session), "bash")


@pytest.mark.parametrize("size", [1, BIG])
def test_exit_status_and_arguments_of_a_big_command(client, session, size):
    r = client.shell_run(session, f'{padding(size)}\nset -- a b; echo "$#:$2"; exit 7')
    assert (r["exit_code"], r["output"]) == (7, "2:b\n")
    r = client.shell_run(session, f"{padding(size)}\nkill -TERM $$")
    assert (r["exit_code"], r["signal"]) == (None, "SIGTERM")


def test_a_big_background_process_runs_as_a_small_one(client, session):
    for size in (1, BIG):
        started = client.process_start(session, probe(size))
        r = client.process_output(started["id"], wait_s=60, until="before\n")
        while r["status"] == "running":
            r = client.process_output(started["id"], wait_s=60)
        assert r["exit_code"] == 1
        # process.output with since: null reads from the mark: all of it, in these two reads.
        everything = client.process_output(started["id"], since=0)["output"]
        assert everything == expected_probe(shell_path(client, session), "bash")


def test_a_big_command_that_cannot_be_read_says_so(client, session):
    # No `cat` on the command's PATH: the shell says so and exits 127, as for any missing
    # command, instead of running nothing with success.
    r = client.shell_run(session, probe(BIG), env={"PATH": "/nonexistent"})
    assert r["exit_code"] == 127
    assert "cat" in r["output"] and "not found" in r["output"]


def test_a_command_with_a_nul_byte_is_refused(client, session):
    for size in (1, BIG):
        with pytest.raises(ToolsdError) as e:
            client.shell_run(session, padding(size) + "\necho a\0b")
        assert e.value.code == "bad_params"
        assert "NUL" in e.value.message


@needs_bwrap
def test_a_big_command_runs_in_sh_where_the_sandbox_has_no_bash(daemon_root):
    d = daemon_without_bash(daemon_root, tools=("sh", "cat", "readlink", "python3", "bwrap"))
    d.start()
    try:
        with d.client() as c:
            s = c.session_open(d.workspace)["session"]
            small, big = c.shell_run(s, probe(1)), c.shell_run(s, probe(BIG))
            assert (small["exit_code"], small["shell"]) == (big["exit_code"], big["shell"]) == (
                1, "sh")
            # dash has no $LINENO: the rest is as bash shows it.
            assert small["output"] == big["output"] == expected_probe(
                shell_path(c, s), "sh").replace("line=2", "line=")
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("size", [1, BIG])
def test_a_big_command_reports_its_folder_as_a_small_one(daemon, client, session, size):
    os.makedirs(os.path.join(daemon.workspace, "sub"), exist_ok=True)
    # With report_cwd fd 3 is the folder's pipe: a big command's text comes on fd 4, closed
    # before the command runs.
    r = client.shell_run(session, f"{padding(size)}\ncd sub; readlink /proc/$$/fd/4 || echo closed",
                         report_cwd=True)
    assert (r["exit_code"], r["output"]) == (0, "closed\n")
    assert r["cwd_after"] == os.path.join(daemon.workspace, "sub")


def test_process_list_shows_big_commands_cut_and_still_fits_a_frame(client, session):
    # Two commands of 9 MiB: listed whole, they would make a reply over the 16 MiB frame.
    ids = [client.process_start(session, f"{padding(9 << 20)}\necho {i}; exec sleep 1000")["id"]
           for i in range(2)]
    listed = {p["id"]: p for p in client.process_list(session)["processes"]}
    for i, process_id in enumerate(ids):
        command = listed[process_id]["command"]
        assert len(command) <= 4096
        assert command.startswith("#xxx") and command.endswith(f"echo {i}; exec sleep 1000")
        assert "bytes left out" in command
        client.process_stop(process_id)
