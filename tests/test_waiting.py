"""The pure parts of interactive processes: the waiting-for-input classifier (from /proc texts
as the kernel writes them, taken from real processes) and the plain-text view of terminal
output."""

from __future__ import annotations

import os
import struct

from toolsd.tools.plain_text import strip_escapes
from toolsd.tools.input_wait_rules import (
    ProcessView,
    blocked_call,
    epoll_read_fds,
    group_of,
    is_waiting,
    last_pid,
    poll_read_fds,
    select_read_fds,
    terminal_of,
    waits_alone,
)

X86 = "x86_64"
SLEEPING_STAT = "776 (bash) S 774 776 776 34816 776 4194304 230 0 0 0"
RUNNING_STAT = "776 (py (x) R) R 774 776 776 34816 776 4194304 230 0 0 0"
STOPPED_STAT = "776 (sleep) T 774 776 776 34816 776 4194304 230 0 0 0"
READ_FD0 = "0 0x0 0x5634df17cf40 0x1000 0x0 0x7f174a8a4c68 0x0 0x7ffd1653f4e8 0x7f174a7c92ad"
READ_FD5 = "0 0x5 0x5634df17cf40 0x1000 0x0 0x7f174a8a4c68 0x0 0x7ffd1653f4e8 0x7f174a7c92ad"
PSELECT = "270 0x1 0x7ffdce1d9270 0x0 0x0 0x0 0x0 0x7ffdce1d9190 0x7f5cc671c954"
EPOLL = "281 0xd 0x7ffca5f16eb0 0x400 0xffffffff 0x0 0x8 0x7ffca5f16150 0x7f9d70326cae"
NANOSLEEP = "230 0x1 0x0 0x7ffc 0x0 0x0 0x0 0x7ffc 0x7f11"


def view(stat=SLEEPING_STAT, syscall=READ_FD0, wchan="wait_woken", inputs=(0, 1, 2),
         watched=None, pid=7, switches=10):
    return ProcessView(pid, stat, syscall, wchan, frozenset(inputs),
                       None if watched is None else frozenset(watched), switches)


def test_a_read_of_the_terminal_is_waiting():
    assert is_waiting([view()], X86)


def test_a_busy_loop_is_never_waiting():
    assert not is_waiting([view(stat=RUNNING_STAT, syscall="running", wchan="0")], X86)
    # Seen asleep a moment ago but running now: the syscall file says so.
    assert not is_waiting([view(syscall="running")], X86)
    assert not is_waiting([view(wchan="0")], X86)


def test_a_read_of_something_else_or_a_sleep_is_not_waiting():
    assert not is_waiting([view(syscall=READ_FD5)], X86)
    assert not is_waiting([view(syscall=NANOSLEEP, wchan="hrtimer_nanosleep")], X86)
    assert not is_waiting([view(inputs=())], X86)
    assert not is_waiting([], X86)


def test_a_stopped_process_is_not_waiting():
    assert not is_waiting([view(stat=STOPPED_STAT, wchan="do_signal_stop")], X86)


def test_select_poll_and_epoll_count_only_when_the_input_is_watched():
    assert blocked_call(PSELECT, X86).kind == "select"
    assert is_waiting([view(syscall=PSELECT, watched={0})], X86)
    assert not is_waiting([view(syscall=PSELECT, watched={4})], X86)
    assert not is_waiting([view(syscall=PSELECT, watched=None)], X86)
    assert blocked_call(EPOLL, X86) == ("epoll", 13, 0)
    assert is_waiting([view(syscall=EPOLL, inputs={17}, watched={17, 5})], X86)


def test_written_input_on_its_way_is_not_waiting():
    assert not is_waiting([view()], X86, pending=4)
    # A reader still at its count from before the write has not been woken by it yet.
    assert not is_waiting([view(switches=10)], X86, before_write={7: 10})
    assert is_waiting([view(switches=11)], X86, before_write={7: 10})


def test_unknown_machines_and_garbage_are_not_waiting():
    assert not is_waiting([view()], "riscv64")
    for text in ("", "running", "-1 0x7ffd 0x7f", "zz 0x0 0x0 0x0", "0 nothex 0x0 0x0"):
        assert blocked_call(text, X86) is None


def test_the_watched_sets_are_read_as_the_kernel_lays_them_out():
    assert select_read_fds(bytes([0b00100001, 0b1]), 9) == {0, 5, 8}
    assert select_read_fds(bytes([0b00100001, 0b1]), 6) == {0, 5}
    pollfds = struct.pack("ihh", 3, 0x4, 0) + struct.pack("ihh", 0, 0x1, 0) + struct.pack(
        "ihh", -1, 0x1, 0)
    assert poll_read_fds(pollfds) == {0}
    fdinfo = ("pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t1057\n"
              "tfd:       17 events:       19 data:               11  pos:0 ino:3 sdev:17\n"
              "tfd:        5 events:        4 data:                5  pos:0 ino:9 sdev:d\n")
    assert epoll_read_fds(fdinfo) == {17}


def test_plain_strips_colours_titles_modes_and_terminal_line_ends():
    raw = ("\x1b[?2004h>>> \x1b[1;31mred\x1b[0m\r\n\x1b]0;title\x07x\x1b(B\x1b=y\r\r\n"
           "50%\r60%\r\n\x07bell\tTab")
    assert strip_escapes(raw) == ">>> red\nxy\n50%\r60%\nbell\tTab"


def test_plain_drops_a_sequence_cut_at_the_end_and_stray_escapes():
    assert strip_escapes("done\x1b[3") == "done"
    assert strip_escapes("done\x1b") == "done"
    assert strip_escapes("a\x1b]unterminated title") == "a"
    assert strip_escapes("a\x9b2Jb") == "ab"


def test_plain_is_linear_on_hostile_input():
    # Thousands of unterminated sequences in a row: each ends at the next ESC.
    assert strip_escapes("\x1b]" * 100_000 + "end") == ""
    assert strip_escapes("\x1b[" * 100_000 + "m") == ""


def test_the_group_and_the_last_pid_are_read_from_kernel_texts():
    assert group_of(RUNNING_STAT) == 776
    assert group_of("garbage") is None
    assert last_pid("0.52 0.58 0.59 2/612 48213\n") == "48213"
    assert last_pid("") == ""


def test_one_reader_alone_shows_the_wait_only_when_no_other_has_a_write_to_see():
    assert waits_alone(view(pid=7), X86)
    assert not waits_alone(view(pid=7, stat=RUNNING_STAT), X86)
    # Its own write seen (the count moved on): waiting, as over every view.
    assert waits_alone(view(pid=7, switches=11), X86, before_write={7: 10})
    assert not waits_alone(view(pid=7, switches=10), X86, before_write={7: 10})
    # Another process has not been looked at: the whole group decides.
    assert not waits_alone(view(pid=7, switches=11), X86, before_write={7: 10, 8: 3})


def test_the_controlling_terminal_is_read_from_the_stat_text():
    # 34816 is pts/0 (136:0) as the kernel writes tty_nr; a name may hold spaces and ")".
    assert terminal_of(SLEEPING_STAT) == os.makedev(136, 0)
    assert terminal_of(RUNNING_STAT) == os.makedev(136, 0)
    assert terminal_of("9 (daemon) S 1 9 9 0 -1") == 0
    for garbage in ("", "9 (x", "9 (x) S 1"):
        assert terminal_of(garbage) is None
