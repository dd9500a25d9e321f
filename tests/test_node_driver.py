"""driver/node_repl.js driven as the host drives it: fd 3 commands, sentinel-framed output."""

import os
import shutil
import signal
import uuid as uuidlib
from pathlib import Path

import pytest

try:
    from test_python_driver import DriverProcess
except ImportError:  # tests/ became a package
    from tests.test_python_driver import DriverProcess

from toolsd.sentinel import format_sentinel

DRIVER = Path(__file__).resolve().parent.parent / "driver" / "node_repl.js"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed (needed for the Node REPL driver)"
)


@pytest.fixture
def repl():
    driver = DriverProcess([NODE, str(DRIVER)])
    try:
        yield driver
    finally:
        driver.close()


def test_state_persists_and_completion_value_is_shown(repl):
    assert repl.exec("var x = 40") == ("ok", b"")
    assert repl.exec("x + 2") == ("ok", b"42\n")
    assert repl.exec("globalThis.y = {a: [1, 'b']}; y") == ("ok", b"{ a: [ 1, 'b' ] }\n")
    assert repl.exec("undefined") == ("ok", b"")


def test_console_log_order_with_completion_value(repl):
    code = "console.log('one'); process.stdout.write('two '); console.error('three'); 'four'"
    assert repl.exec(code) == ("ok", b"one\ntwo three\n'four'\n")


def test_output_of_child_processes_keeps_order(repl):
    code = (
        "console.log('before');"
        "require('child_process').execSync('echo child', {stdio: 'inherit'});"
        "console.log('after')"
    )
    assert repl.exec(code) == ("ok", b"before\nchild\nafter\n")


def test_large_output_arrives_before_the_sentinel(repl):
    # Node writes to pipes asynchronously: this would trail the sentinel if the driver let it.
    status, out = repl.exec("console.log('y'.repeat(8 * 1024 * 1024)); 'end'")
    assert status == "ok"
    assert out == b"y" * (8 * 1024 * 1024) + b"\n'end'\n"
    assert repl.exec("1") == ("ok", b"1\n")


def test_error_is_reported_and_state_kept(repl):
    repl.exec("var kept = 'yes'")
    status, out = repl.exec("console.log('before');\nfunction f() { throw new Error('boom') }\nf()")
    assert status == "error"
    text = out.decode()
    assert text.startswith("before\nError: boom\n    at f (<repl-2>:2:")
    assert "node_repl.js" not in text and "node:vm" not in text
    assert repl.exec("kept") == ("ok", b"'yes'\n")


def test_syntax_error_and_non_error_throw(repl):
    status, out = repl.exec("let y = ;")
    assert status == "error"
    assert b"SyntaxError" in out and b"<repl-1>" in out
    assert repl.exec("throw 5") == ("error", b"Uncaught 5\n")
    # A value whose display throws is an error of the request, not of the driver.
    code = "({[require('util').inspect.custom]() { throw new Error('no show') }})"
    status, out = repl.exec(code)
    assert status == "error" and out.startswith(b"Error: no show")
    assert repl.exec("2") == ("ok", b"2\n")


def test_promise_value_is_awaited(repl):
    assert repl.exec("new Promise(r => setTimeout(() => r(7), 5))") == ("ok", b"7\n")
    status, out = repl.exec("Promise.reject(new Error('rejected'))")
    assert status == "error"
    assert out.startswith(b"Error: rejected\n")


def test_sigint_interrupts_busy_loop_and_keeps_state(repl):
    repl.send("var n = 0; while (true) { n++; if (n === 1) console.log('looping') }")
    fd = repl.proc.stdout.fileno()
    seen = b""
    while b"looping\n" not in seen:
        seen += repl.scanner.feed(os.read(fd, 1024))[0]
    os.kill(repl.proc.pid, signal.SIGINT)
    status, out = repl.read_reply()
    assert status == "interrupted"
    assert repl.exec("n > 0") == ("ok", b"true\n")


def test_sigint_while_idle_is_ignored(repl):
    repl.exec("var t = 1")
    for _ in range(3):
        os.kill(repl.proc.pid, signal.SIGINT)
    assert repl.exec("new Promise(r => setTimeout(() => r(t), 200))") == ("ok", b"1\n")
    assert repl.proc.poll() is None


def test_forged_sentinels_are_output(repl):
    forged = format_sentinel(uuidlib.uuid4().hex, 1, "ok") + format_sentinel(repl.uuid, 5, "ok")
    forged = forged.decode()
    status, out = repl.exec(f"process.stdout.write({forged!r}); undefined")
    assert (status, out) == ("ok", forged.encode())
    assert repl.exec("'next'") == ("ok", b"'next'\n")


def test_stdin_is_empty_and_uuid_is_not_visible(repl):
    assert repl.exec("require('fs').readFileSync(0, 'utf8')") == ("ok", b"''\n")
    code = f"JSON.stringify([process.argv, process.env]).includes({repl.uuid!r})"
    assert repl.exec(code) == ("ok", b"false\n")


def test_command_pipe_is_not_inherited_by_subprocesses(repl):
    command_pipe = f"pipe:[{os.fstat(repl.commands.fileno()).st_ino}]"
    code = (
        "require('child_process').execSync("
        "'for f in /proc/$$/fd/*; do readlink $f; done; true', {stdio: 'inherit'}); undefined"
    )
    status, out = repl.exec(code)
    assert status == "ok"
    assert out.count(b"pipe:[") >= 2  # the output pipe is there...
    assert command_pipe not in out.decode()  # ...the command pipe is not


def test_process_exit_ends_the_driver(repl):
    repl.send("process.exit(4)")
    assert repl.read_reply() == (None, b"")
    assert repl.proc.wait(30) == 4


def test_sigint_abandons_a_pending_promise(repl):
    # Printed from a timer, so only once the script has returned and its promise is awaited:
    # a SIGINT before that is the busy-script case, tested above.
    repl.send("setTimeout(() => console.log('waiting'), 0); new Promise(() => {})")
    fd = repl.proc.stdout.fileno()
    seen = b""
    while b"waiting\n" not in seen:
        seen += repl.scanner.feed(os.read(fd, 1024))[0]
    os.kill(repl.proc.pid, signal.SIGINT)
    status, out = repl.read_reply()
    assert status == "interrupted"
    assert repl.exec("'next'") == ("ok", b"'next'\n")
