"""toolsd Python REPL driver: runs an agent's code in one persistent namespace.

Runs inside the sandbox on the session's own python3, standard library only (the user's
site-packages must stay importable, so no -I). The host starts it with:

    fd 0 = /dev/null, fd 1 = fd 2 = the output pipe, fd 3 = the command pipe (host writes),
    fd 4 = the interrupt pipe (host writes)

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

import ast
import builtins
import codecs
import io
import json
import linecache
import os
import signal
import sys
import traceback
import types

try:
    import _signal  # CPython's; signal.getsignal wraps its answer in an enum
except ImportError:
    _signal = signal

COMMAND_FD = 3
INTERRUPT_FD = 4
WAKE_SIGNAL = signal.SIGURG
MARKER_PREFIX = b"\x1eTOOLSD-"
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect at startup
_DRIVER_FILE = os.path.abspath(__file__)
_FIGURES_FILE = os.path.join(os.path.dirname(_DRIVER_FILE), "python_figures.py")
_FIGURES_MODULE = "_toolsd_figures"  # python_figures.MODULE_NAME, without loading it
_ERRORS = "toolsd.surrogates"
_STATUS = {s: json.dumps({"status": s}).encode() for s in ("ok", "error", "interrupted")}
# The host reads a sentinel's status up to 4096 bytes (toolsd/tools/sentinel.py): a longer one would
# not end the request.
_MAX_STATUS_BYTES = 4000


def _encode_surrogates(exc):
    """Encoding error handler: never let a print crash the driver.

    Lone surrogates in U+DC80..U+DCFF come from bytes decoded with surrogateescape (file
    names from os.listdir, for instance): they are written back as those original bytes.
    Anything else unencodable is written as a backslash escape.
    """
    if isinstance(exc, UnicodeEncodeError):
        chunk = exc.object[exc.start : exc.end]
        if all(0xDC80 <= ord(c) <= 0xDCFF for c in chunk):
            return bytes(ord(c) - 0xDC00 for c in chunk), exc.end
        return codecs.backslashreplace_errors(exc)
    raise exc


class _FdWriter(io.RawIOBase):
    """Unbuffered writer to one fd that always writes everything it is given.

    Raw FileIO (what python -u uses) drops the rest of a write that a signal cut short; this
    loops instead. No buffer means print output, os.write(1, ...) and subprocess output land
    in the pipe in the order they were produced.
    """

    def __init__(self, fd):
        super().__init__()
        self._fd = fd

    def fileno(self):
        return self._fd

    def writable(self):
        return True

    def isatty(self):
        return False

    def write(self, data):
        view = memoryview(data).cast("B")
        total = len(view)
        done = 0
        while done < total:
            done += os.write(self._fd, view[done:])
        return total


def _open_text_stream(fd):
    return io.TextIOWrapper(
        _FdWriter(fd), encoding="utf-8", errors=_ERRORS, write_through=True, line_buffering=False
    )


class _Interrupts:
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


class _Driver:
    def __init__(self, uuid, out_fd, figures_folder=None):
        self._sentinel_head = MARKER_PREFIX + uuid + b":"
        # A private copy of fd 1: user code that closes or redirects fd 1 cannot lose the
        # sentinel (and with it every later answer).
        self._out = _FdWriter(out_fd)
        self._pid = os.getpid()
        self._interrupts = _Interrupts()
        self._loop = None  # asyncio loop for top-level await, made on first use
        self._libc_fflush = _find_fflush()
        self.namespace = {}
        self._figures_folder = figures_folder
        self._figures = None  # python_figures.Figures, once loaded

    def setup(self):
        codecs.register_error(_ERRORS, _encode_surrogates)
        sys.stdout = sys.__stdout__ = _open_text_stream(1)
        sys.stderr = sys.__stderr__ = _open_text_stream(2)
        # The user's namespace is a real __main__ module, so pickle and multiprocessing find
        # classes defined in it; the driver's own globals stay in the original module.
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        self.namespace = main.__dict__
        sys.argv = [""]
        # As at an interactive prompt: the current folder first, not the driver's folder
        # (which holds launcher.py and would shadow a user's module of that name).
        if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(_DRIVER_FILE):
            sys.path[0] = ""
        self._interrupts.install()
        os.register_at_fork(after_in_child=_forget_command_pipe)
        if self._figures_folder:
            sys.displayhook = self._displayhook
            sys.meta_path.insert(0, _MatplotlibHook(self._matplotlib_imported))

    def run(self, seq, source):
        """Run one request; returns its status and the pictures it made (or None)."""
        filename = f"<repl-{seq}>"
        source = _dedent(source)
        lines = source.splitlines(keepends=True)
        # mtime None: linecache.checkcache never drops it, so tracebacks show the source.
        linecache.cache[filename] = (len(source), None, lines, filename)
        interrupts = self._interrupts
        interrupts.seq = seq
        status = "ok"
        try:
            try:
                codes = _compile(source, filename)
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
            self._leave_if_forked(_exit_code(exc.code))
            self._report(exc)
        except BaseException as exc:
            status = "error"
            self._report(exc)  # a forked child reports its error as `python -c` would
            self._leave_if_forked(1)
        self._leave_if_forked(0)
        images = self._take_figures()
        interrupts.reclaim()
        self._restore_stdin()
        self._flush()
        return status, images

    def _run_cell(self, codes):
        try:
            if any(code.co_flags & _CO_COROUTINE for code in codes):
                self._run_awaiting(codes)
            else:
                for code in codes:
                    eval(code, self.namespace)
        except Exception:
            self._show_figures()  # what the code drew before it failed
            raise
        self._show_figures()

    def _run_awaiting(self, codes):
        """A cell with top-level await: all of it as one task on the interpreter's loop, so
        that tasks it creates before its await run during it (and during later awaits)."""
        loop = self._event_loop()
        task = loop.create_task(self._cell(codes))
        try:
            loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                # Interrupted while the loop waited: the cell's code must not go on in a
                # later cell's await. One pass of the loop delivers the cancellation; the
                # other tasks stay.
                task.cancel()
                loop.call_soon(loop.stop)
                loop.run_forever()
            if task.done() and not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it again later
            raise

    async def _cell(self, codes):
        for code in codes:
            result = eval(code, self.namespace)
            if code.co_flags & _CO_COROUTINE:
                await result

    def _event_loop(self):
        import asyncio

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        # Current, so that asyncio.get_event_loop() in a cell without await finds it (an
        # asyncio.run() meanwhile sets the current loop to None when it ends).
        asyncio.set_event_loop(self._loop)
        return self._loop

    # ------------------------------------------------------------ figures

    def _load_figures(self):
        """driver/python_figures.py, loaded on first need."""
        if self._figures is None:
            import importlib.util

            spec = importlib.util.spec_from_file_location(_FIGURES_MODULE, _FIGURES_FILE)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[_FIGURES_MODULE] = module  # matplotlib imports it as its backend
            self._figures = module.configure(self._figures_folder, self._note)
        return self._figures

    def _matplotlib_imported(self, matplotlib):
        if os.environ.get("MPLBACKEND"):
            return  # the user's choice
        self._load_figures()
        matplotlib.rcParams["backend"] = "module://" + _FIGURES_MODULE

    def _displayhook(self, value):
        sys.__displayhook__(value)
        if value is not None and _may_be_picture(value):
            self._load_figures().add_value(value)

    def _show_figures(self):
        if os.getpid() != self._pid:
            return  # a forked child: its copies of the figures are the parent's to show
        if self._figures is not None and "matplotlib.pyplot" in sys.modules:
            try:
                self._figures.show_open()
            except Exception as exc:
                self._note(f"the open figures could not be saved: {type(exc).__name__}: {exc}")

    def _take_figures(self):
        if self._figures is None:
            return None
        try:
            self._figures.close_open()  # left by an interrupt or exit(): not kept for later
        except Exception:
            pass
        return self._figures.take()

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
        text = "".join(_format_user_exception(exc))
        stream = sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except Exception:
            sys.__stderr__.write(text)

    def _restore_stdin(self):
        # exit() closes sys.stdin before raising SystemExit; input() must keep seeing EOF.
        if sys.stdin is None or sys.stdin.closed:
            sys.stdin = sys.__stdin__ = open(0, closefd=False, encoding="utf-8", errors=_ERRORS)

    def _flush(self):
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
        if self._libc_fflush is not None:
            self._libc_fflush(None)  # printf output of C extensions

    def write_sentinel(self, seq, status, images=None):
        body = _STATUS[status]
        if images:
            body, left_out = _status_with_images(status, images)
            if left_out:
                self._note(f"{left_out} picture(s) left out of the answer: the list was too long")
                self._flush()
        self._out.write(self._sentinel_head + b"%d:%s\n" % (seq, body))


class _MatplotlibHook:
    """A meta path finder that sees matplotlib's first import and then calls `imported(it)`
    (which sets toolsd's figure backend). The driver itself never imports matplotlib: a call
    that does not plot pays nothing for figures, and an interpreter without matplotlib
    works as before."""

    def __init__(self, imported):
        self._imported = imported
        self._finding = False

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib" or self._finding:
            return None
        self._finding = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None) if finder is not self else None
                spec = find(name, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._finding = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenCall(spec.loader, self._imported)
        return spec


class _ThenCall:
    """A module's own loader, and then `after(module)` once the module has run."""

    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._after(module)
        except Exception:
            pass  # no figures then; the user's import still works

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _may_be_picture(value):
    """Whether a displayed value may be a picture, without importing anything."""
    kind = type(value)
    module = getattr(kind, "__module__", None)
    if isinstance(module, str) and module.startswith(("PIL.", "matplotlib.")):
        return True
    try:
        return callable(getattr(kind, "_repr_png_", None))
    except Exception:
        return False


def _status_with_images(status, images):
    """The sentinel's JSON with `images`, as many as fit the host's bound on a sentinel;
    and how many did not fit."""
    kept = list(images)
    while True:
        body = json.dumps({"status": status, "images": kept}).encode()
        if len(body) <= _MAX_STATUS_BYTES or not kept:
            return body, len(images) - len(kept)
        kept.pop()


def _dedent(source):
    """An indented cell, dedented (models send them); one whose first line is not indented,
    as it is."""
    if source.lstrip("\r\n")[:1] not in (" ", "\t"):
        return source
    import textwrap

    return textwrap.dedent(source)


def _compile(source, filename):
    """Code objects for one request: the body, then a last expression in "single" mode."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return [compile(tree, filename, "exec", flags, dont_inherit=True)]
    body = ast.Module(body=tree.body[:-1], type_ignores=[])
    last = ast.Interactive(body=tree.body[-1:])
    return [
        compile(body, filename, "exec", flags, dont_inherit=True),
        compile(last, filename, "single", flags, dont_inherit=True),
    ]


def _format_user_exception(exc):
    """The traceback without the driver's frames (nor asyncio's, ahead of the user's)."""
    te = traceback.TracebackException.from_exception(exc)
    seen = set()
    pending = [te]
    while pending:
        item = pending.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        frames = [f for f in item.stack if f.filename != _DRIVER_FILE]
        first_user = next(
            (i for i, f in enumerate(frames) if f.filename.startswith("<repl-")), None
        )
        if first_user is None:
            # No frame of the user's. An interrupt that came while the asyncio loop waited
            # has only the loop's frames: none of them helps the user.
            first_user = len(frames) if item.exc_type is KeyboardInterrupt else 0
        item.stack = traceback.StackSummary.from_list(frames[first_user:])
        pending += [item.__cause__, item.__context__, *(item.exceptions or ())]
    return te.format()


def _exit_code(code):
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _forget_command_pipe():
    # A forked child keeps no way to read the host's commands or interrupts: fds 3 and 4
    # become /dev/null (not closed, so a file the child opens later cannot land on them by
    # chance).
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        for fd in (COMMAND_FD, INTERRUPT_FD):
            os.dup2(null, fd, inheritable=False)
        os.close(null)
    except OSError:
        pass


def _find_fflush():
    try:
        import ctypes

        return ctypes.CDLL(None).fflush
    except Exception:
        return None


def _read_lines(fd):
    """Lines from the command pipe; a partial last line at EOF is dropped (host went away)."""
    reader = open(fd, "rb", closefd=False)
    while True:
        line = reader.readline()
        if not line.endswith(b"\n"):
            return
        yield line


def main():
    os.set_inheritable(COMMAND_FD, False)
    try:
        os.set_inheritable(INTERRUPT_FD, False)
        os.set_blocking(INTERRUPT_FD, False)
    except OSError:
        pass  # started without one: only SIGINT interrupts
    out_fd = os.dup(1)  # non-inheritable by default (PEP 446)
    lines = _read_lines(COMMAND_FD)
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
