"""The Python driver's interrupts: the host's and SIGINT, as KeyboardInterrupt in user code.

The host's: a request's number on fd 4, then WAKE_SIGNAL. Standard library only.
"""

import os
import signal

from _python_repl_pipes import INTERRUPT_FD

try:
    import _signal  # CPython's; signal.getsignal wraps its answer in an enum
except ImportError:
    _signal = signal

WAKE_SIGNAL = signal.SIGURG


class Interrupts:
    """Turns the host's interrupt of request N (fd 4 and WAKE_SIGNAL), or a SIGINT, into
    KeyboardInterrupt only while user code runs; the host's only while request N runs.

    Why a handler with an `armed` flag rather than blocking SIGINT with pthread_sigmask while
    idle: a mask covers only the driver's thread; threads started by user code keep SIGINT
    unblocked, so the kernel would deliver it to them and Python would still run the handler
    in the main thread, in the middle of the driver loop. A flag checked by the handler works
    whichever thread catches the signal. While disarmed the handler just returns, and the
    interrupted system call (reading fd 3, writing a sentinel) is retried by Python (PEP 475).

    The one window left: a SIGINT whose handler runs after the user's code returned but
    before the driver disarms. It raises inside the same try block, so it ends the same
    request as "interrupted" (the host did ask to interrupt that request) and never leaks
    into the next one.

    User code may install its own SIGINT handler; it stays in force while user code runs (the
    driver's handler calls it), and the driver takes SIGINT back when the request ends.
    """

    def __init__(self):
        self.armed = False
        self.seq = 0  # the request being run (or last run)
        self.asked = 0  # the last request the host asked to interrupt
        self._delivered = 0  # the last request interrupted for the host
        self._unread = b""  # a partial line of fd 4
        self.user_handler = None
        self._handle = self.handle  # one bound method, so that `is` recognises it
        self._wake = self.wake

    def handle(self, signum, frame):
        if not self.armed:
            return
        user = self.user_handler
        if user is signal.SIG_IGN:
            return
        if callable(user):
            return user(signum, frame)
        raise KeyboardInterrupt

    def wake(self, signum, frame):
        self._read_asked()
        self.deliver(frame)

    def deliver(self, frame):
        """Interrupt the running request if the host asked for it and it was not yet done:
        as a SIGINT would, through whatever handles SIGINT now."""
        if not self.armed or self.asked != self.seq or self._delivered == self.seq:
            return
        self._delivered = self.seq
        current = signal.getsignal(signal.SIGINT)
        if current is self._handle:
            return self.handle(signal.SIGINT, frame)
        if current == signal.SIG_IGN:
            return
        if callable(current):
            return current(signal.SIGINT, frame)
        raise KeyboardInterrupt  # SIG_DFL would end the driver: the state is worth more

    def _read_asked(self):
        while True:
            try:
                data = os.read(INTERRUPT_FD, 4096)
            except OSError:  # EAGAIN: all read; or the host has gone
                return
            if not data:
                return
            *lines, self._unread = (self._unread + data).split(b"\n")
            for line in lines:
                try:
                    self.asked = max(self.asked, int(line))
                except ValueError:
                    pass

    def install(self):
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(WAKE_SIGNAL, self._wake)

    def reclaim(self):
        # _signal's getsignal: the enum that signal's own wraps its answer in costs more
        # than a small request's own work.
        if _signal.getsignal(signal.SIGINT) is not self._handle:
            current = signal.getsignal(signal.SIGINT)
            self.user_handler = None if current is signal.default_int_handler else current
            signal.signal(signal.SIGINT, self._handle)
        if _signal.getsignal(WAKE_SIGNAL) is not self._wake:
            signal.signal(WAKE_SIGNAL, self._wake)
