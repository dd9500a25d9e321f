"""driver/node_repl.js driven as the host drives it: fd 3 commands, sentinel-framed output."""

import shutil
from pathlib import Path

import pytest

from _drivers import DriverProcess
from driver import NODE_REPL
from toolsd.sandbox.launch.channel import Ready
from toolsd.tools.repl import interpreter_argv

DRIVER = Path(NODE_REPL)
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed (needed for the Node REPL driver)"
)


@pytest.fixture
def repl():
    # As the daemon starts it (its flags), with this checkout's driver.
    argv = interpreter_argv(Ready(node=NODE), "node")
    driver = DriverProcess([*argv[:-1], str(DRIVER)])
    try:
        yield driver
    finally:
        driver.close()


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


def interrupter_online(repl):
    """Wait until the driver's interrupter thread reads interrupts: one has stopped a loop."""
    repl.send("while (true) {}")
    repl.interrupt()
    assert repl.read_reply()[0] == "interrupted"


def test_an_interrupt_for_an_ended_request_reaches_no_later_one(repl):
    interrupter_online(repl)
    repl.exec("var kept = 1")
    ended = repl.seq
    # A busy script and an awaited promise, each told to stop a request that has ended.
    repl.send("console.log('busy'); const until = Date.now() + 300; while (Date.now() < until) {}"
              "; kept")
    repl.wait_for_output(b"busy\n")
    repl.interrupt(ended)
    assert repl.read_reply() == ("ok", b"1\n")
    repl.send("console.log('waiting'); new Promise(r => setTimeout(() => r(kept), 300))")
    repl.wait_for_output(b"waiting\n")
    repl.interrupt(ended)
    assert repl.read_reply() == ("ok", b"1\n")


def test_interrupts_racing_the_end_of_their_request_never_end_the_driver(repl):
    # The Node REPL's old failure: a SIGINT landing just after breakOnSigint ended killed
    # node (or broke the next script). Interrupts sent at every point of a short script.
    repl.exec("var kept = 1")
    for n in range(300):
        repl.send(f"for (let i = 0; i < {n % 30} * 1000; i++) {{}}; 1")
        repl.interrupt()
        status, out = repl.read_reply()
        assert status in ("ok", "interrupted"), (n, status, out)
        assert repl.exec("kept") == ("ok", b"1\n"), n


def test_stdin_is_empty_and_uuid_is_not_visible(repl):
    assert repl.exec("require('fs').readFileSync(0, 'utf8')") == ("ok", b"''\n")
    code = f"JSON.stringify([process.argv, process.env]).includes({repl.uuid!r})"
    assert repl.exec(code) == ("ok", b"false\n")


def test_an_interrupt_abandons_a_pending_promise(repl):
    # Printed from a timer, so only once the script has returned and its promise is awaited:
    # an interrupt before that is the busy-script case, tested above.
    repl.send("setTimeout(() => console.log('waiting'), 0); new Promise(() => {})")
    repl.wait_for_output(b"waiting\n")
    repl.interrupt()
    status, out = repl.read_reply()
    assert status == "interrupted"
    assert repl.exec("'next'") == ("ok", b"'next'\n")


# ------------------------------------------------------------------ top-level await


def test_top_level_await_of_a_promise_and_of_an_import(repl):
    assert repl.exec("await new Promise(r => setTimeout(r, 10))") == ("ok", b"")
    assert repl.exec("const path = await import('node:path'); path.join('a', 'b')") == \
        ("ok", b"'a/b'\n")
    assert repl.exec("await new Promise(r => setTimeout(() => r(6), 1)) * 7") == ("ok", b"42\n")


def test_declarations_of_an_awaiting_request_persist(repl):
    assert repl.exec("const n = await 20\nlet m = 2\nfunction twice(x) { return 2 * x }\n"
                     "class K { get v() { return n + m } }") == ("ok", b"")
    assert repl.exec("twice(new K().v)") == ("ok", b"44\n")
    # A script without await keeps plain script semantics.
    assert repl.exec("const plain = 1; plain + n") == ("ok", b"21\n")


def test_errors_in_an_awaiting_request_are_reported(repl):
    status, out = repl.exec("await Promise.reject(new Error('boom'))")
    assert status == "error" and out.startswith(b"Error: boom\n")
    status, out = repl.exec("await (")
    assert status == "error" and b"SyntaxError" in out
    assert repl.exec("'next'") == ("ok", b"'next'\n")


def test_an_interrupt_during_a_top_level_await_keeps_the_state(repl):
    repl.exec("var kept = 1")
    repl.send("console.log('waiting'); await new Promise(() => {})")
    repl.wait_for_output(b"waiting\n")
    repl.interrupt()
    status, out = repl.read_reply()
    assert status == "interrupted"
    assert repl.exec("kept") == ("ok", b"1\n")
