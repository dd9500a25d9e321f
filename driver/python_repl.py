"""toolsd Python REPL driver: runs an agent's code in one persistent namespace.

Runs inside the sandbox on the session's own python3, standard library only (the user's
site-packages must stay importable, so no -I). The host starts it with:

    fd 0 = /dev/null, fd 1 = fd 2 = the output pipe, fd 3 = the command pipe (host writes),
    fd 4 = the interrupt pipe (host writes)

This file is the main loop and one request's run; its parts are modules beside it, loaded
from this folder whatever sys.path says: _python_repl_pipes.py (the pipes, the sentinel),
_python_repl_interrupts.py, _python_repl_code.py (compiling a cell, the user's traceback),
_python_repl_await.py (top-level await), _python_repl_capture.py (pictures),
_python_repl_stdlib.py (late imports that a user's module cannot stand in for).

Fd 3 carries the session UUID on its first line, then one JSON-encoded string of source per
line. Requests are numbered 1, 2, 3, ... in the order received. After request N the driver
flushes every output buffer and writes to the output pipe

    b"\\x1eTOOLSD-" + uuid + b":" + N + b":" + {"status": "ok"|"error"|"interrupted"} + b"\\n"

with no newline added before it. The host reads output up to that sentinel (toolsd/tools/sentinel.py).

Behaviour the host relies on:
- The last expression statement is displayed as at an interactive prompt (sys.displayhook,
  `_` set); print output and the displayed value keep their order.
- An exception gives status "error" and a traceback of user frames (source lines included)
  at the end of the output; the namespace is kept.
- Interrupts: the host writes N as a line on fd 4, then sends SIGURG (the wake-up). If
  request N is running, or has been read and not yet begun, it is interrupted as a SIGINT
  would (KeyboardInterrupt, or the user's own SIGINT handler): status "interrupted",
  namespace kept. An interrupt for any other request (one that has ended) does nothing, so
  it can never reach a request it was not meant for. Not SIGINT itself: C's system() ignores
  SIGINT while it waits, so os.system() would never be interrupted; a SIGURG that arrives
  then is handled as soon as system() returns (the host ends what it waits on).
- A SIGINT from elsewhere interrupts the running code the same way; while idle it is ignored.
- SystemExit (exit(), sys.exit(2)) does not end the REPL: it is reported as status "error"
  with a line "SystemExit: 2", and the namespace is kept. A REPL that survives a stray
  exit() keeps the agent's state; os._exit() still ends the process (the host then reports
  "crashed").
- A child forked by user code never runs the driver loop: when it returns into the driver it
  flushes and exits.
- End of file on fd 3 ends the driver at once (os._exit: threads the user left running must
  not keep it alive).
- An indented cell is dedented before it runs (models send them); one whose first line is
  not indented is left as it is.
- Top-level `await`: a cell that awaits runs, the whole of it, as a task on the
  interpreter's one asyncio loop, which is the current event loop. Tasks it creates stay on
  that loop and run whenever a later cell awaits; between calls the loop is idle, so they
  do not run then. A cell without `await` runs as plain Python, with no loop running
  (asyncio.run() works there). An interrupt during an await cancels the cell's task, not
  the others.
- Pictures (driver/python_figures.py): with a folder as argv[1] (the host gives the
  session's scratch), matplotlib figures shown or left open, and a last expression that is
  an image, are saved there as PNG files and listed in the sentinel's status as "images".
  Matplotlib is never imported by the driver: an import hook sets the backend when the
  user's code imports it (unless MPLBACKEND says otherwise).
"""

import builtins
import codecs
import json
import linecache
import os
import sys
import types

_DRIVER_DIR = os.path.dirname(os.path.abspath(__file__))
# The driver's own modules come from its own folder, first on sys.path only while they load:
# no module of the user's (in the current folder, on PYTHONPATH) can stand in for one, and
# PYTHONSAFEPATH (which leaves the script's folder out of sys.path) cannot hide them.
sys.path.insert(0, _DRIVER_DIR)
from _python_repl_await import AwaitRunner  # noqa: E402
from _python_repl_capture import FigureCapture  # noqa: E402
from _python_repl_code import (  # noqa: E402
    awaits, compile_cell, dedent, exit_code, format_user_exception)
from _python_repl_interrupts import Interrupts  # noqa: E402
from _python_repl_stdlib import stdlib_module  # noqa: E402
from _python_repl_pipes import (  # noqa: E402
    COMMAND_FD, ERRORS, INTERRUPT_FD, MARKER_PREFIX, FdWriter, encode_surrogates,
    forget_command_pipe, open_text_stream, read_lines, sentinel)

del sys.path[0]
# The driver's frames, left out of the user's tracebacks.
_DRIVER_FILES = frozenset([os.path.abspath(__file__)] + [
    module.__file__ for name, module in sys.modules.items() if name.startswith("_python_repl_")])


class _Driver:
    def __init__(self, uuid, out_fd, figures_folder=None):
        self._sentinel_head = MARKER_PREFIX + uuid + b":"
        # A private copy of fd 1: user code that closes or redirects fd 1 cannot lose the
        # sentinel (and with it every later answer).
        self._out = FdWriter(out_fd)
        self._pid = os.getpid()
        self._interrupts = Interrupts()
        self._await = AwaitRunner()
        self._libc_fflush = _find_fflush()
        self.namespace = {}
        self._figures = FigureCapture(figures_folder, self._note) if figures_folder else None

    def setup(self):
        codecs.register_error(ERRORS, encode_surrogates)
        sys.stdout = sys.__stdout__ = open_text_stream(1)
        sys.stderr = sys.__stderr__ = open_text_stream(2)
        # The user's namespace is a real __main__ module, so pickle and multiprocessing find
        # classes defined in it; the driver's own globals stay in the original module.
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        self.namespace = main.__dict__
        sys.argv = [""]
        # As at an interactive prompt: the current folder first, not the driver's folder
        # (which holds launcher.py and would shadow a user's module of that name).
        if sys.path and os.path.abspath(sys.path[0] or ".") == _DRIVER_DIR:
            sys.path[0] = ""
        self._interrupts.install()
        os.register_at_fork(after_in_child=forget_command_pipe)
        if self._figures is not None:
            self._figures.install()

    def run(self, seq, source):
        """Run one request; returns its status and the pictures it made (or None)."""
        filename = f"<repl-{seq}>"
        source = dedent(source)
        lines = source.splitlines(keepends=True)
        # mtime None: linecache.checkcache never drops it, so tracebacks show the source.
        linecache.cache[filename] = (len(source), None, lines, filename)
        interrupts = self._interrupts
        interrupts.seq = seq
        status = "ok"
        try:
            try:
                codes = compile_cell(source, filename)
                interrupts.armed = True
                interrupts.deliver(None)  # asked for before it began
                self._run_cell(codes)
            finally:
                interrupts.armed = False
        except KeyboardInterrupt as exc:
            status = "interrupted"
            self._leave_if_forked(1)
            self._report(exc)
        except SystemExit as exc:
            status = "error"
            self._leave_if_forked(exit_code(exc.code))
            self._report(exc)
        except BaseException as exc:
            status = "error"
            self._report(exc)  # a forked child reports its error as `python -c` would
            self._leave_if_forked(1)
        self._leave_if_forked(0)
        images = self._figures.take() if self._figures is not None else None
        interrupts.reclaim()
        self._restore_stdin()
        self._flush()
        return status, images

    def _run_cell(self, codes):
        try:
            if awaits(codes):
                self._await.run(codes, self.namespace)
            else:
                for code in codes:
                    eval(code, self.namespace)
        except Exception:
            self._show_figures()  # what the code drew before it failed
            raise
        self._show_figures()

    def _show_figures(self):
        if self._figures is not None:
            self._figures.show_open()

    def _note(self, text):
        try:
            sys.stderr.write(f"[toolsd: {text}]\n")
        except Exception:
            pass

    def _leave_if_forked(self, code):
        """A child forked by user code must never read commands or write sentinels."""
        if os.getpid() != self._pid:
            self._flush()
            os._exit(code)

    def _report(self, exc):
        text = "".join(format_user_exception(exc, _DRIVER_FILES))
        stream = sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except Exception:
            sys.__stderr__.write(text)

    def _restore_stdin(self):
        # exit() closes sys.stdin before raising SystemExit; input() must keep seeing EOF.
        if sys.stdin is None or sys.stdin.closed:
            sys.stdin = sys.__stdin__ = open(0, closefd=False, encoding="utf-8", errors=ERRORS)

    def _flush(self):
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
        if self._libc_fflush is not None:
            self._libc_fflush(None)  # printf output of C extensions

    def write_sentinel(self, seq, status, images=None):
        data, left_out = sentinel(self._sentinel_head, seq, status, images)
        if left_out:
            self._note(f"{left_out} picture(s) left out of the answer: the list was too long")
            self._flush()
        self._out.write(data)


def _find_fflush():
    try:
        return stdlib_module("ctypes").CDLL(None).fflush
    except Exception:
        return None


def main():
    os.set_inheritable(COMMAND_FD, False)
    try:
        os.set_inheritable(INTERRUPT_FD, False)
        os.set_blocking(INTERRUPT_FD, False)
    except OSError:
        pass  # started without one: only SIGINT interrupts
    out_fd = os.dup(1)  # non-inheritable by default (PEP 446)
    lines = read_lines(COMMAND_FD)
    uuid = next(lines, b"").strip()
    if not uuid:
        os._exit(0)
    driver = _Driver(uuid, out_fd, sys.argv[1] if len(sys.argv) > 1 else None)
    driver.setup()
    seq = 0
    for line in lines:
        seq += 1
        try:
            source = json.loads(line)
            if not isinstance(source, str):
                raise ValueError("not a string")
        except ValueError as exc:
            sys.stderr.write(f"toolsd driver: request {seq} is not a JSON string ({exc}).\n")
            status, images = "error", None
        else:
            status, images = driver.run(seq, source)
        driver.write_sentinel(seq, status, images)
    driver._flush()
    os._exit(0)


if __name__ == "__main__":
    main()
