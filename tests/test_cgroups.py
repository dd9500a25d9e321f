"""The pure parts of toolsd/sandbox/launch/cgroups.py: where our cgroup is, what is written,
how the OOM killer's count is read, and the prefix that moves the sandbox into its cgroups."""

from __future__ import annotations

import os
import subprocess

from toolsd.sandbox.launch.cgroups import (
    Place,
    join_argv,
    limit_files,
    oom_kill_count,
    own_v1_path,
)

PROC_SELF_CGROUP = """\
12:pids:/
11:cpu,cpuacct:/system.slice/x.service
4:memory:/process_api/3b31
1:name=systemd:/init.scope
0::/user.slice
"""


def test_own_v1_path_per_controller():
    assert own_v1_path(PROC_SELF_CGROUP, "memory") == "/process_api/3b31"
    assert own_v1_path(PROC_SELF_CGROUP, "pids") == "/"
    assert own_v1_path(PROC_SELF_CGROUP, "cpu") == "/system.slice/x.service"
    # The v2 line (id 0) names no controller; a missing hierarchy is None.
    assert own_v1_path(PROC_SELF_CGROUP, "io") is None
    assert own_v1_path("0::/user.slice\n", "memory") is None


def test_limit_files_make_memory_mb_the_total_with_swap():
    mib = str(300 * 2**20)
    assert limit_files(Place("memory", "/x", 1), pids=9, memory_mb=300) == [
        ("memory.limit_in_bytes", mib), ("memory.memsw.limit_in_bytes", mib)]
    assert limit_files(Place("memory", "/x", 2), pids=9, memory_mb=300) == [
        ("memory.max", mib), ("memory.swap.max", "0")]
    assert limit_files(Place("pids", "/x", 1), pids=9, memory_mb=300) == [("pids.max", "9")]


def test_oom_kill_count_from_v1_and_v2_files():
    assert oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3
    assert oom_kill_count("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n") == 2
    assert oom_kill_count("oom_kill_disable 0\nunder_oom 0\n") is None  # before Linux 4.13


def test_join_prefix_enters_every_folder_then_runs_the_command(tmp_path):
    folders = [tmp_path / "a b", tmp_path / "c"]  # a space in a path stays one argument
    for folder in folders:
        folder.mkdir()
        (folder / "cgroup.procs").write_text("")
    argv = join_argv([str(f) for f in folders]) + ["sh", "-c", 'echo "ran $$ $1"', "-", "arg"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    # The prefix wrote its own pid, which the command then has (exec, not a child).
    assert out == f"ran {proc.pid} arg\n"
    for folder in folders:
        assert (folder / "cgroup.procs").read_text() == f"{proc.pid}\n"


def test_join_prefix_does_not_run_the_command_outside_its_cgroup(tmp_path):
    missing = os.path.join(tmp_path, "gone")
    proc = subprocess.run(join_argv([missing]) + ["sh", "-c", "echo ran"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 125
    assert "ran" not in proc.stdout
