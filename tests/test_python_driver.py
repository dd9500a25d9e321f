"""driver/python_repl.py driven as the host drives it: fd 3 commands, sentinel-framed output."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from _drivers import STUCK_S, DriverProcess, fd_targets
from driver import PYTHON_REPL
from toolsd.tools.sentinel import format_sentinel

DRIVER = Path(PYTHON_REPL)


@pytest.fixture
def repl():
    driver = DriverProcess([sys.executable, str(DRIVER)])
    try:
        yield driver
    finally:
        driver.close()


def test_last_expression_is_displayed_and_sets_underscore(repl):
    assert repl.exec("1+1") == ("ok", b"2\n")
    assert repl.exec("_ * 10") == ("ok", b"20\n")
    assert repl.exec("None") == ("ok", b"")
    assert repl.exec("'a'") == ("ok", b"'a'\n")
    # Only a last *expression* statement is displayed.
    assert repl.exec("y = 5") == ("ok", b"")


def test_syntax_error_is_an_error_and_runs_nothing(repl):
    status, out = repl.exec("print('ran')\nx = = 1")
    assert status == "error"
    assert b"ran" not in out
    assert out.decode().endswith("SyntaxError: invalid syntax\n")
    assert b"<repl-1>" in out
    assert repl.exec("2") == ("ok", b"2\n")


def test_stale_sentinel_printed_by_user_is_dropped_not_a_reply(repl):
    repl.exec("pass")
    stale = format_sentinel(repl.uuid, 1, "ok")
    status, out = repl.exec(f"import os\nos.write(1, {stale!r})\nprint('real')")
    assert (status, out) == ("ok", b"real\n")


def test_output_without_trailing_newline_is_kept_exact(repl):
    assert repl.exec("print('no newline', end='')") == ("ok", b"no newline")
    assert repl.exec("print('x')") == ("ok", b"x\n")


def test_invalid_utf8_and_surrogates_pass_through(repl):
    code = (
        "import sys\n"
        "sys.stdout.buffer.write(b'\\xff\\xfe bad')\n"
        "print('\\udcff|\\ud800|é')\n"
    )
    status, out = repl.exec(code)
    assert status == "ok"
    # surrogateescape'd byte comes back as the byte, a lone surrogate as an escape.
    assert out == b"\xff\xfe bad" + b"\xff|\\ud800|\xc3\xa9\n"


def test_input_sees_end_of_file(repl):
    status, out = repl.exec("input('prompt? ')")
    assert status == "error"
    assert out.decode().endswith("EOFError: EOF when reading a line\n")
    assert repl.exec("import sys\nsys.stdin.read()") == ("ok", b"''\n")


def test_an_interrupt_for_an_ended_request_reaches_no_later_one(repl):
    repl.exec("import time\nkept = 1")
    ended = repl.seq
    repl.send("print('busy', flush=True)\nfor _ in range(30):\n    time.sleep(0.01)\nkept")
    repl.wait_for_output(b"busy\n")
    repl.interrupt(ended)
    assert repl.read_reply() == ("ok", b"1\n")
    assert repl.exec("time.sleep(0.1)\nkept") == ("ok", b"1\n")


def test_an_interrupt_that_comes_before_its_request_began_stops_it_there(repl):
    repl.exec("1")
    repl.interrupt(repl.seq + 1)
    status, out = repl.exec("import time\ntime.sleep(30)")
    assert status == "interrupted"
    assert out.decode().endswith("KeyboardInterrupt\n")
    assert repl.exec("'ok'") == ("ok", b"'ok'\n")


def test_an_interrupt_during_os_system_stops_the_code_once_system_returns(repl):
    # C's system() ignores SIGINT while it waits: the wake-up is kept until it returns,
    # which it does once what it waits on is ended (the host sends that SIGINT).
    repl.send("import os\nos.system('sleep 30')\nprint('after system')")
    deadline = time.monotonic() + STUCK_S
    sleeps = []
    while not sleeps:
        assert time.monotonic() < deadline, "the shell's sleep never started"
        sleeps = [p for p in psutil.Process(repl.proc.pid).children(recursive=True)
                  if p.name() == "sleep"]
    repl.interrupt()
    for child in psutil.Process(repl.proc.pid).children(recursive=True):
        child.send_signal(signal.SIGINT)
    status, out = repl.read_reply()
    assert status == "interrupted"
    assert b"after system" not in out
    assert out.decode().endswith("KeyboardInterrupt\n")


def test_sigint_while_idle_with_user_threads_running(repl):
    # A user thread keeps SIGINT unblocked; the driver must still ignore an idle SIGINT.
    repl.exec("import threading, time\nstop = threading.Event()\n"
              "t = threading.Thread(target=stop.wait, daemon=True)\nt.start()")
    os.kill(repl.proc.pid, signal.SIGINT)
    assert repl.exec("time.sleep(0.2)\n'alive'") == ("ok", b"'alive'\n")
    repl.exec("stop.set()")


def test_system_exit_is_reported_and_repl_survives(repl):
    repl.exec("v = 1")
    status, out = repl.exec("import sys\nsys.exit(2)")
    assert status == "error"
    assert out.startswith(b"Traceback")
    assert out.endswith(b"SystemExit: 2\n")
    status, out = repl.exec("exit()")
    assert status == "error"
    assert out.endswith(b"SystemExit: None\n")
    # exit() closed sys.stdin; input() still sees EOF rather than a closed file.
    assert repl.exec("input()")[1].endswith(b"EOFError: EOF when reading a line\n")
    assert repl.exec("v") == ("ok", b"1\n")


def test_forked_child_never_runs_the_driver_loop(repl):
    # Were the child to return into the loop, its sentinel would end this request before
    # the parent's line, and it would go on to run the next request too.
    code = (
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('child')\n"
        "else:\n"
        "    print('parent', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    assert repl.exec(code) == ("ok", b"child\nparent 0\n")
    assert repl.exec("print('once')") == ("ok", b"once\n")


def test_forked_child_does_not_hold_the_command_pipe(repl):
    command_pipe = f"pipe:[{os.fstat(repl.commands.fileno()).st_ino}]"
    code = (
        "import os, time\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.close(r)\n"
        "    os.write(w, b'in user code')\n"
        "    time.sleep(60)\n"
        "os.close(w)\n"
        "os.read(r, 12)\n"  # the child is past fork and its at-fork hooks
        "pid"
    )
    status, out = repl.exec(code)
    assert status == "ok"
    child = int(out)
    try:
        assert command_pipe not in fd_targets(child)
    finally:
        os.kill(child, signal.SIGKILL)
    # Its end of the user's pipe closes when it dies: wait on that, then reap it.
    assert repl.exec("os.read(r, 1), os.waitpid(pid, 0)[1]") == ("ok", b"(b'', 9)\n")


def test_forked_child_that_raises_reports_and_exits_1(repl):
    code = (
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    raise ValueError('in child')\n"
        "print('parent', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    status, out = repl.exec(code)
    assert status == "ok"
    assert out.endswith(b"ValueError: in child\nparent 1\n")


def test_namespace_is_a_clean_main_module(repl):
    status, out = repl.exec("sorted(k for k in globals() if not k.startswith('__'))")
    assert (status, out) == ("ok", b"[]\n")
    repl.exec("import sys, os")
    status, out = repl.exec(
        f"[__name__, sys.argv, {repl.uuid!r} in repr(os.environ), "
        "sys.modules['__main__'].__dict__ is globals()]"
    )
    assert (status, out) == ("ok", b"['__main__', [''], False, True]\n")


def test_a_users_module_cannot_stand_in_for_a_part_of_the_driver(tmp_path):
    # PYTHONSAFEPATH leaves the driver's folder out of sys.path: PYTHONPATH comes first then.
    for part in DRIVER.parent.glob("_python_repl_*.py"):
        (tmp_path / part.name).write_text("raise SystemExit('the user module ran')\n")
    driver = DriverProcess(["env", "PYTHONSAFEPATH=1", f"PYTHONPATH={tmp_path}",
                            sys.executable, str(DRIVER)])
    try:
        assert driver.exec("import asyncio\nawait asyncio.sleep(0)\n1 + 1") == ("ok", b"2\n")
        status, out = driver.exec("1 / 0")
        assert status == "error" and out.endswith(b"ZeroDivisionError: division by zero\n")
    finally:
        driver.close()


def test_a_users_module_named_as_the_standard_library_cannot_end_the_driver(tmp_path):
    # The driver imports some modules late, when the current folder comes first on sys.path.
    for name in ("textwrap", "asyncio", "ctypes"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('the user module ran')\n")
    driver = DriverProcess(["sh", "-c", 'cd "$1" && exec "$2" "$3"', "sh", str(tmp_path),
                            sys.executable, str(DRIVER)])
    try:
        assert driver.exec("    x = 20\n    x + 1") == ("ok", b"21\n")  # dedented
        code = "async def f():\n    return x * 2\nawait f()"
        assert driver.exec(code) == ("ok", b"40\n")
        assert driver.exec("x") == ("ok", b"20\n")
    finally:
        driver.close()


def test_classes_defined_in_the_repl_can_be_pickled(repl):
    repl.exec("import pickle\nclass Point:\n    def __init__(self, x): self.x = x")
    assert repl.exec("pickle.loads(pickle.dumps(Point(3))).x") == ("ok", b"3\n")


def test_top_level_await(repl):
    repl.exec("import asyncio\nasync def twice(x):\n    await asyncio.sleep(0)\n    return 2 * x")
    assert repl.exec("await twice(21)") == ("ok", b"42\n")
    assert repl.exec("v = await twice(1)\nprint(v)") == ("ok", b"2\n")


def test_request_that_is_not_json_string_is_an_error_and_stays_in_sync(repl):
    repl.seq += 1
    repl.scanner.expect(repl.seq)
    repl.commands.write(b"not json\n")
    status, out = repl.read_reply()
    assert status == "error"
    assert b"is not a JSON string" in out
    assert repl.exec("3") == ("ok", b"3\n")


# ------------------------------------------------------------------ friendliness


def test_an_indented_cell_is_dedented(repl):
    assert repl.exec("    x = 1\n    if x:\n        print('ran', x)\n") == ("ok", b"ran 1\n")
    assert repl.exec("\n\n\tx + 1") == ("ok", b"2\n")


def test_a_cell_whose_first_line_is_not_indented_is_left_as_it_is(repl):
    status, out = repl.exec("y = 1\n    z = 2")
    assert status == "error" and b"IndentationError: unexpected indent" in out
    assert repl.exec("'y' in globals()") == ("ok", b"False\n")


def test_an_asyncio_task_keeps_running_during_later_awaits(repl):
    repl.exec("import asyncio\nseen = []\nq = asyncio.Queue()\n"
              "async def worker():\n    while True:\n        seen.append(await q.get())")
    # Created before the cell's await: the whole cell is one task on the loop.
    assert repl.exec("task = asyncio.create_task(worker())\nawait asyncio.sleep(0)") == \
        ("ok", b"")
    # Between calls the loop is idle: a cell without await runs no task.
    assert repl.exec("q.put_nowait(1)\nseen") == ("ok", b"[]\n")
    assert repl.exec("await asyncio.sleep(0)\nseen") == ("ok", b"[1]\n")
    assert repl.exec("q.put_nowait(2)\nawait asyncio.sleep(0)\n(seen, task.done())") == \
        ("ok", b"([1, 2], False)\n")


def test_asyncio_run_still_works_in_a_cell_without_await(repl):
    repl.exec("import asyncio\nawait asyncio.sleep(0)")
    assert repl.exec("asyncio.run(asyncio.sleep(0, 'ran'))") == ("ok", b"'ran'\n")
    assert repl.exec("await asyncio.sleep(0, 'again')") == ("ok", b"'again'\n")


def test_an_interrupt_during_a_top_level_await_stops_that_cell_only(repl):
    repl.exec("import asyncio\nkept = 1\nq = asyncio.Queue()\n"
              "async def waiter():\n    return await q.get()")
    repl.exec("other = asyncio.create_task(waiter())\nawait asyncio.sleep(0)")
    repl.send("async def ticker():\n    while True:\n        print('tick', flush=True)\n"
              "        await asyncio.sleep(0.01)\nawait ticker()")
    repl.wait_for_output(b"tick\n")
    repl.interrupt()
    status, out = repl.read_reply()
    assert status == "interrupted"
    assert out.decode().endswith("KeyboardInterrupt\n")
    assert "asyncio" not in out.decode().split("Traceback")[-1]  # no frames of the loop's
    # The interrupted cell's task is gone; the task of an earlier cell is not.
    tasks = ("await asyncio.sleep(0)\n"
             "sorted(t.get_coro().__name__ for t in asyncio.all_tasks() "
             "if t is not asyncio.current_task())")
    assert repl.exec(tasks) == ("ok", b"['waiter']\n")
    assert repl.exec("q.put_nowait(kept)\nawait other") == ("ok", b"1\n")


# ------------------------------------------------------------------ pictures

HAVE_MATPLOTLIB = subprocess.run([sys.executable, "-c", "import matplotlib"],
                                 capture_output=True).returncode == 0
needs_matplotlib = pytest.mark.skipif(
    not HAVE_MATPLOTLIB, reason="matplotlib is not installed (the test extra has it)")
SWATCH = """
import struct, zlib
def _chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
class Swatch:
    def __init__(self, w=1, h=1): self.w, self.h = w, h
    def _repr_png_(self):
        rows = b''.join(b'\\x00' + b'\\x00' * self.w for _ in range(self.h))
        return (b'\\x89PNG\\r\\n\\x1a\\n'
                + _chunk(b'IHDR', struct.pack('>IIBBBBB', self.w, self.h, 8, 0, 0, 0, 0))
                + _chunk(b'IDAT', zlib.compress(rows)) + _chunk(b'IEND', b''))
"""


@pytest.fixture
def figures_repl(tmp_path):
    folder = tmp_path / "figures"
    env_dir = tmp_path / "mpl"
    driver = DriverProcess([sys.executable, str(DRIVER), str(folder)])
    driver.folder = folder
    driver.exec(f"import os\nos.environ['MPLCONFIGDIR'] = {str(env_dir)!r}\ndel os")
    try:
        yield driver
    finally:
        driver.close()


def test_a_planted_symlink_at_the_figures_folder_is_never_written_through(figures_repl,
                                                                          tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    figures_repl.folder.symlink_to(elsewhere)
    figures_repl.exec(SWATCH)
    status, out = figures_repl.exec("Swatch(2, 2)")
    assert status == "ok"
    assert "images" not in figures_repl.status
    assert b"must be a folder, not a symlink" in out
    assert list(elsewhere.iterdir()) == []


def test_the_folder_keeps_the_newest_pictures_only(figures_repl):
    from driver.python_figures import MAX_FILES

    figures_repl.exec(SWATCH)
    paths = []
    for _ in range(MAX_FILES + 5):
        assert figures_repl.exec("Swatch()")[0] == "ok"
        [image] = figures_repl.status["images"]
        paths.append(image["path"])
    kept = sorted(str(p) for p in figures_repl.folder.iterdir())
    assert kept == sorted(paths[-MAX_FILES:])


@needs_matplotlib
def test_at_most_so_many_pictures_a_call_and_a_note_for_the_rest(figures_repl):
    from driver.python_figures import MAX_PER_CALL

    status, out = figures_repl.exec(
        "import matplotlib.pyplot as plt\n"
        f"for i in range({MAX_PER_CALL + 2}):\n"
        "    plt.figure(figsize=(0.5, 0.5)); plt.show()")
    assert status == "ok", out
    assert len(figures_repl.status["images"]) == MAX_PER_CALL
    assert b"2 more picture(s) of this call were not saved" in out
    assert figures_repl.exec("plt.get_fignums()") == ("ok", b"[]\n")


@needs_matplotlib
def test_an_interrupted_call_leaves_no_figure_for_the_next(figures_repl):
    figures_repl.send("import matplotlib.pyplot as plt\nplt.plot([1, 2])\n"
                      "print('drawn', flush=True)\nwhile True: pass")
    figures_repl.wait_for_output(b"drawn\n")
    figures_repl.interrupt()
    assert figures_repl.read_reply()[0] == "interrupted"
    assert figures_repl.exec("plt.get_fignums()") == ("ok", b"[]\n")
    assert "images" not in figures_repl.status


@needs_matplotlib
def test_the_users_own_backend_is_kept(tmp_path):
    driver = DriverProcess([sys.executable, str(DRIVER), str(tmp_path / "figures")])
    try:
        driver.exec(f"import os\nos.environ['MPLCONFIGDIR'] = {str(tmp_path)!r}\n"
                    "os.environ['MPLBACKEND'] = 'svg'")
        assert driver.exec("import matplotlib\nmatplotlib.get_backend()") == ("ok", b"'svg'\n")
    finally:
        driver.close()
