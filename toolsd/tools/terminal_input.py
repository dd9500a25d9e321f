"""A background process's input: the write end of its stdin pipe, or the master side of its
terminal. Writes never block the daemon: the descriptor is non-blocking, and what the process
does not take is reported as a short count.

Resource handling: a ProcessInput owns one descriptor (for a terminal, a copy of the master
side: the output pump reads and closes its own) and closes it in `close()`, which its
BackgroundProcess calls when the process exits; a write after that is refused.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import termios

from toolsd.runtime.fdio import unread
from toolsd.wire.protocol import BAD_PARAMS, ToolsdError

# What a terminal in canonical mode hands to a reader only at the end of a line (or as a
# signal): a write without any of these does not wake a reader (see wakes_reader).
_LINE_ENDS = (b"\n", b"\r")


class ProcessInput:
    def __init__(self, process_id: str, fd: int, *, terminal: bool):
        self.process_id = process_id
        self.fd = fd
        self.terminal = terminal
        self.closed_by: str | None = None  # why writes are refused: "exited", "eof"
        # Context switches of the terminal's foreground processes just before the last write
        # that should wake one of them (see waiting.is_waiting).
        self.before_write: dict[int, int] | None = None
        # The pids below the command's shim and the machine's last pid when they were found
        # (input_wait.Tree): the same tree while no process has been made since.
        self.tree = None
        os.set_blocking(fd, False)

    @classmethod
    def pipe(cls, process_id: str) -> tuple[ProcessInput, int]:
        """A stdin pipe: the input (our write end) and the read end, the caller's to hand to
        the spawn and then close."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        return cls(process_id, write_fd, terminal=False), read_fd

    @property
    def open(self) -> bool:
        return self.fd != -1

    def write(self, data: bytes, eof: bool) -> int:
        """Write what the process takes of `data` now, then on `eof` (only once all of `data`
        went) close the pipe or type the terminal's end-of-file key. Returns the bytes of
        `data` written. ToolsdError(bad_params) if the process no longer takes input."""
        self._check_open()
        written = self._write(data)
        if eof and written == len(data):
            if self.terminal:
                if not self._write(self._eof_key()):
                    raise ToolsdError(BAD_PARAMS, f"process.write: {self.process_id}'s terminal "
                                      f"is full ({written} bytes of data were written, the "
                                      f"end-of-file key was not): the process does not read "
                                      f"it; send eof again once process.output shows it "
                                      f"reading")
            else:
                self.close("eof")
        return written

    def _write(self, data: bytes) -> int:
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self.fd, view[written:])
        except BlockingIOError:
            pass  # full: the count says how much went
        except OSError as e:
            if e.errno not in (errno.EIO, errno.EPIPE):
                raise
            self.close("closed")
            raise ToolsdError(BAD_PARAMS, f"{self._closed_message()} ({written} bytes were "
                              f"written before it was)") from None
        return written

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size; the kernel tells its foreground group (SIGWINCH)."""
        self._check_open()
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wakes_reader(self, data: bytes) -> bool:
        """Whether writing `data` hands something to a reader: always on a pipe and on a
        terminal in raw mode; in canonical (line) mode only a line end or a control key."""
        if not self.terminal:
            return True
        try:
            attrs = termios.tcgetattr(self.fd)
        except termios.error:
            return True
        if not attrs[3] & termios.ICANON:
            return True
        cc = attrs[6]
        keys = {cc[i] for i in (termios.VEOF, termios.VINTR, termios.VSUSP, termios.VQUIT)
                if isinstance(cc[i], bytes)}
        return any(k in data for k in (*_LINE_ENDS, *keys))

    def pending(self) -> int:
        """Bytes written to a pipe that no reader took yet (a terminal's are not counted by
        the kernel where we can see them: see before_write)."""
        if self.terminal or not self.open:
            return 0
        try:
            return unread(self.fd)
        except OSError:
            return 0

    def _eof_key(self) -> bytes:
        try:
            key = termios.tcgetattr(self.fd)[6][termios.VEOF]
        except termios.error:
            key = b"\x04"
        return key if isinstance(key, bytes) and key != b"\0" else b"\x04"

    def _check_open(self) -> None:
        if self.closed_by is not None:
            raise ToolsdError(BAD_PARAMS, self._closed_message())

    def _closed_message(self) -> str:
        if self.closed_by == "exited":
            return (f"{self.process_id} has exited; it reads no input any more "
                    f"(process.output shows how it ended)")
        if self.closed_by == "eof":
            return (f"{self.process_id}'s stdin was closed by an earlier eof; nothing more "
                    f"can be written")
        what = "terminal" if self.terminal else "stdin"
        return (f"{self.process_id} closed its {what}: no process of it reads it any more; "
                f"process.output shows its status, process.stop ends it")

    def terminal_closed(self) -> None:
        """Every process closed the terminal (its output ended while the process runs): the
        kernel would take writes and drop them, so they are refused instead."""
        if self.terminal and self.open:
            self.close("closed")

    def close(self, why: str = "exited") -> None:
        """Close the descriptor; later writes say `why` (an exit after an eof: the exit)."""
        if self.closed_by is None or why == "exited":
            self.closed_by = why
        if self.fd != -1:
            os.close(self.fd)
            self.fd = -1


def no_input(process_id: str) -> ToolsdError:
    return ToolsdError(BAD_PARAMS, f"process.write: {process_id} was started without input "
                       f"(stdin is /dev/null); start it with stdin: \"pipe\" or tty: true to "
                       f"write to it")


# What a program on a terminal is told it runs on, unless the call or the session chose: the
# session's TERM=dumb keeps pipes free of colours, but a terminal's programs (line editing, a
# pager, a full-screen program) need one they can drive.
TERMINAL_TERM = "xterm-256color"


def terminal_env(env: dict[str, str], asked: dict[str, str]) -> dict[str, str]:
    """The environment of a program on a terminal: `env` (the session's with the call's
    `asked` on top) with a TERM a terminal has, where neither chose one."""
    if "TERM" in asked or env.get("TERM", "dumb") != "dumb":
        return env
    return {**env, "TERM": TERMINAL_TERM}
