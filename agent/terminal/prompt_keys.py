"""Ctrl-C at `toolsd agent`'s prompt: it ends the line being typed instead of sending SIGINT,
so that the agent knows whether there was anything on it (a shell's habit: Ctrl-C clears
what was typed; on an empty line, it exits).

While the prompt is read, the terminal's interrupt key is switched off and Ctrl-C (byte 3)
made an end-of-line key (VEOL): the kernel's line editing (erase, kill, UTF-8) stays as it
is, the line comes to the reader with byte 3 at its end, and the kernel echoes it as `^C`.
The settings are put back as soon as the line is read, so that during a turn Ctrl-C is the
signal that cancels it. Only where the descriptor is a terminal; elsewhere nothing changes.

Resource handling: `ctrl_c_ends_line` puts the terminal's settings back on the way out,
whatever ends the read (a signal's cancel included).
"""

from __future__ import annotations

import contextlib
import os
import termios

__all__ = ["CTRL_C", "ExitKey", "ctrl_c_ends_line"]

CTRL_C = b"\x03"
_DISABLED = b"\x00"  # _POSIX_VDISABLE on Linux


class ExitKey(Exception):
    """Ctrl-C on an empty prompt line: the person asks to exit."""


@contextlib.contextmanager
def ctrl_c_ends_line(fd: int):
    """Yields whether Ctrl-C ends the line meanwhile (only on a terminal that took it)."""
    try:
        saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    except termios.error:
        saved = None
    if saved is None:
        yield False
        return
    changed = [list(part) if isinstance(part, list) else part for part in saved]
    cc = changed[6]
    cc[termios.VINTR] = _DISABLED
    cc[termios.VEOL] = CTRL_C
    try:
        termios.tcsetattr(fd, termios.TCSANOW, changed)
    except termios.error:
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSANOW, saved)
