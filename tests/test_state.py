"""The state folder's id counters: never a value twice, across clean stops and crashes."""

from __future__ import annotations

import os
import subprocess
import sys

from toolsd.daemon.state_folder import ID_BLOCK, StateDir


def take_ids(folder: str, name: str, count: int, *, clean: bool) -> list[int]:
    """Ids taken by another process (a daemon) that then stops cleanly or dies."""
    code = (f"import os, sys; sys.path.insert(0, {os.getcwd()!r})\n"
            f"from toolsd.daemon.state_folder import StateDir\n"
            f"s = StateDir({folder!r})\n"
            f"print(*[s.next_id({name!r}) for _ in range({count})], flush=True)\n"
            f"{'s.close()' if clean else 'os._exit(0)  # SIGKILL, power loss'}\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return [int(n) for n in out.split()]


def test_numbering_goes_on_without_a_gap_after_a_clean_stop(tmp_path):
    folder = str(tmp_path / "state")
    assert take_ids(folder, "session", 3, clean=True) == [1, 2, 3]
    assert take_ids(folder, "session", 2, clean=True) == [4, 5]


def test_a_crashed_daemon_ids_are_never_handed_out_again(tmp_path):
    folder = str(tmp_path / "state")
    count = ID_BLOCK + 5  # past one reserved block
    assert take_ids(folder, "process", count, clean=False) == list(range(1, count + 1))
    after = take_ids(folder, "process", 1, clean=False)[0]
    assert after > count


def test_counters_are_separate(tmp_path):
    state = StateDir(str(tmp_path / "state"))
    assert state.next_id("session") == 1
    assert state.next_id("process") == 1
    assert state.next_id("session") == 2
