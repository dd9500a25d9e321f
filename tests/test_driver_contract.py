"""What every REPL driver owes the host, run against each (driver/python_repl.py and
driver/node_repl.js, wired as the host wires them). What only one language has (fork, pickle,
SystemExit, `_`; promises, vm, `throw 5`) stays in test_python_driver and test_node_driver."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import uuid as uuidlib
from dataclasses import dataclass

import pytest

from _drivers import STUCK_S, DriverProcess, fd_targets
from driver import NODE_REPL, PYTHON_REPL
from toolsd.sandbox.launch.channel import Ready
from toolsd.tools.repl import interpreter_argv
from toolsd.tools.sentinel import MARKER_PREFIX, format_sentinel

NODE = shutil.which("node")

Exchange = tuple[str, tuple[str, bytes]]  # code, (status, output) it answers


@dataclass(frozen=True)
class Lang:
    argv: list[str]
    driver_file: str  # never in what the user sees
    state: list[Exchange]  # state kept between requests, the last value shown
    ordered: Exchange  # stdout, stderr and the value, in the order they came
    child_output: Exchange  # a child process's output in its place among ours
    keep: str  # sets kept = 'yes'
    raises: str  # prints 'before', then raises from a function on its line 2 or later
    error_head: str
    error_tail: str
    error_has: tuple[str, ...]
    write_raw: str  # code writing the str `{payload}` to stdout as it is
    list_child_fds: str  # a child listing its fds (readlink of /proc/$$/fd/*) on our stdout
    busy_setup: str | None  # before the busy loop (the loop counts n up)
    busy_loop: str  # prints 'looping' once, then loops for ever
    loop_ran: Exchange
    interrupted_tail: bytes | None
    idle_setup: str
    after_idle: Exchange  # a request that gives a stray interrupt time to land
    big: Exchange  # megabytes of output, then something after it
    exits: tuple[str, int]  # code ending the process, its exit status


PYTHON = Lang(
    argv=[sys.executable, PYTHON_REPL],
    driver_file="python_repl",  # the driver's file and its parts' (_python_repl_*.py)
    state=[("x = 40", ("ok", b"")), ("x += 2\nprint(x)", ("ok", b"42\n"))],
    ordered=("print('first')\nimport sys\nsys.stderr.write('second\\n')\n'third'",
             ("ok", b"first\nsecond\n'third'\n")),
    child_output=("import os, subprocess\nprint('one')\nos.write(1, b'two\\n')\n"
                  "subprocess.run(['echo', 'three'])\nos.write(2, b'four\\n')\nprint('five')\n",
                  ("ok", b"one\ntwo\nthree\nfour\nfive\n")),
    keep="kept = 'yes'",
    raises="def f():\n    return 1 / 0\nprint('before')\nf()",
    error_head="before\nTraceback (most recent call last):\n",
    error_tail="ZeroDivisionError: division by zero\n",
    error_has=('File "<repl-2>", line 4, in <module>', "return 1 / 0"),
    write_raw="import sys\nn = sys.stdout.buffer.write({payload}.encode())",
    list_child_fds=("import subprocess\n"
                    "subprocess.run(['sh', '-c', 'for f in /proc/$$/fd/*; do readlink $f; done'],"
                    " close_fds=False)\nNone"),
    busy_setup="n = 0",
    busy_loop="while True:\n    n += 1\n    if n == 1:\n        print('looping', flush=True)",
    loop_ran=("n > 0", ("ok", b"True\n")),
    interrupted_tail=b"KeyboardInterrupt\n",
    idle_setup="import time",
    after_idle=("time.sleep(0.2)\n'done'", ("ok", b"'done'\n")),
    big=("print('x' * (50 * 1024 * 1024 - 1))\n'end'",
         ("ok", b"x" * (50 * 1024 * 1024 - 1) + b"\n'end'\n")),
    exits=("import os\nos._exit(3)", 3),
)

NODE_LANG = Lang(
    argv=[*interpreter_argv(Ready(node=NODE or "node"), "node")[:-1], NODE_REPL],
    driver_file="node_repl.js",
    state=[("var x = 40", ("ok", b"")), ("x + 2", ("ok", b"42\n")),
           ("globalThis.y = {a: [1, 'b']}; y", ("ok", b"{ a: [ 1, 'b' ] }\n")),
           ("undefined", ("ok", b""))],
    ordered=("console.log('one'); process.stdout.write('two '); console.error('three'); 'four'",
             ("ok", b"one\ntwo three\n'four'\n")),
    child_output=("console.log('before');"
                  "require('child_process').execSync('echo child', {stdio: 'inherit'});"
                  "console.log('after')", ("ok", b"before\nchild\nafter\n")),
    keep="var kept = 'yes'",
    raises="console.log('before');\nfunction f() { throw new Error('boom') }\nf()",
    error_head="before\nError: boom\n    at f (<repl-2>:2:",
    error_tail="",
    error_has=(),
    write_raw="process.stdout.write({payload}); undefined",
    list_child_fds=("require('child_process').execSync("
                    "'for f in /proc/$$/fd/*; do readlink $f; done; true', {stdio: 'inherit'});"
                    " undefined"),
    busy_setup=None,
    busy_loop="var n = 0; while (true) { n++; if (n === 1) console.log('looping') }",
    loop_ran=("n > 0", ("ok", b"true\n")),
    interrupted_tail=None,
    idle_setup="var t = 1",
    after_idle=("new Promise(r => setTimeout(() => r(t), 200))", ("ok", b"1\n")),
    # Node writes to pipes asynchronously: this would trail the sentinel if the driver let it.
    big=("console.log('y'.repeat(8 * 1024 * 1024)); 'end'",
         ("ok", b"y" * (8 * 1024 * 1024) + b"\n'end'\n")),
    exits=("process.exit(4)", 4),
)


@pytest.fixture(params=[
    pytest.param(PYTHON, id="python"),
    pytest.param(NODE_LANG, id="node", marks=pytest.mark.skipif(
        NODE is None, reason="node is not installed (needed for the Node REPL driver)")),
])
def lang(request) -> Lang:
    return request.param


@pytest.fixture
def repl(lang):
    driver = DriverProcess(lang.argv)
    try:
        yield driver
    finally:
        driver.close()  # checks that the driver and its children are gone


def test_state_persists_between_requests_and_the_last_value_is_shown(repl, lang):
    for code, answer in lang.state:
        assert repl.exec(code) == answer


def test_output_and_the_value_come_in_order(repl, lang):
    assert repl.exec(lang.ordered[0]) == lang.ordered[1]


def test_output_of_child_processes_keeps_its_order(repl, lang):
    assert repl.exec(lang.child_output[0]) == lang.child_output[1]


def test_an_error_is_reported_without_driver_frames_and_the_state_is_kept(repl, lang):
    repl.exec(lang.keep)
    status, out = repl.exec(lang.raises)
    assert status == "error"
    text = out.decode()
    assert text.startswith(lang.error_head)
    assert text.endswith(lang.error_tail)
    for part in lang.error_has:
        assert part in text
    assert lang.driver_file not in text and "node:vm" not in text
    assert repl.exec("kept") == ("ok", b"'yes'\n")


def test_output_that_looks_like_prompts_or_sentinels_comes_through(repl, lang):
    wrong_uuid = format_sentinel(uuidlib.uuid4().hex, 1, "ok")
    right_uuid_wrong_seq = format_sentinel(repl.uuid, 7, "ok")
    partial = MARKER_PREFIX + repl.uuid.encode()[:5]
    payload = b">>> ... " + wrong_uuid + right_uuid_wrong_seq + partial
    assert repl.exec(lang.write_raw.format(payload=repr(payload.decode()))) == ("ok", payload)
    # Still in sync: the next reply is the next request's.
    assert repl.exec("'next'") == ("ok", b"'next'\n")


def test_the_command_and_interrupt_pipes_are_not_inherited_by_subprocesses(repl, lang):
    command_pipe = f"pipe:[{os.fstat(repl.commands.fileno()).st_ino}]"
    interrupt_pipe = f"pipe:[{os.fstat(repl.interrupts.fileno()).st_ino}]"
    assert command_pipe in fd_targets(repl.proc.pid)
    status, out = repl.exec(lang.list_child_fds)
    assert status == "ok"
    assert out.count(b"pipe:[") >= 2  # the output pipe is there...
    assert command_pipe not in out.decode()  # ...the command pipe is not
    assert interrupt_pipe not in out.decode()


@pytest.mark.parametrize("how", ["sigint", "interrupt"])
def test_an_interrupt_stops_a_busy_loop_and_keeps_the_state(repl, lang, how):
    if lang.busy_setup:
        repl.exec(lang.busy_setup)
    # The loop announces itself so the interrupt arrives while it runs.
    repl.send(lang.busy_loop)
    repl.wait_for_output(b"looping\n")
    if how == "sigint":
        os.kill(repl.proc.pid, signal.SIGINT)  # from elsewhere: a user's kill -INT
    else:
        repl.interrupt()
    status, out = repl.read_reply()
    assert status == "interrupted"
    if lang.interrupted_tail:
        assert out.endswith(lang.interrupted_tail)
    assert lang.driver_file not in out.decode()
    assert repl.exec(lang.loop_ran[0]) == lang.loop_ran[1]


def test_sigints_and_interrupts_while_idle_reach_no_later_request(repl, lang):
    repl.exec(lang.idle_setup)
    for _ in range(5):
        os.kill(repl.proc.pid, signal.SIGINT)
    for _ in range(3):
        repl.interrupt()  # for the request that has ended
    assert repl.exec(lang.after_idle[0]) == lang.after_idle[1]
    assert repl.proc.poll() is None


def test_megabytes_of_output_arrive_whole_before_the_sentinel(repl, lang):
    assert repl.exec(lang.big[0]) == lang.big[1]
    assert repl.exec("1") == ("ok", b"1\n")


def test_exiting_ends_the_driver_with_its_code(repl, lang):
    repl.send(lang.exits[0])
    assert repl.read_reply() == (None, b"")
    assert repl.proc.wait(STUCK_S) == lang.exits[1]
