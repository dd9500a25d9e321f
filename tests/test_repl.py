"""repl.exec through a real daemon: one interpreter per (session, turn, language), in the
session's sandbox, framed by sentinels, interrupted on timeout, killed when it will not stop,
and gone when its turn or session ends."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import time
import uuid

import msgspec
import psutil
import pytest
import trio

from conftest import alive, needs_bwrap, wait_gone
from toolsd.client import Client, ToolsdError
from toolsd.wire.framing import FrameReader, encode_frame
from toolsd.daemon.connection import MAX_IN_FLIGHT

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

HAVE_NODE = shutil.which("node") is not None
needs_node = pytest.mark.skipif(not HAVE_NODE, reason="node is not installed")
# Safety net against a hung daemon, not a timing assertion.
STUCK_S = 30


@pytest.fixture(autouse=True)
def no_interpreter_left(daemon):
    """Once the test's sessions are closed, none of their interpreters may be left."""
    yield
    with daemon.client() as c:
        for s in c.session_list()["sessions"]:
            c.session_close(s["session"])
    assert repl_pids(daemon) == [], "a test left an interpreter running"


@pytest.fixture
def turn(client, session):
    return client.turn_begin(session)["turn"]


def repl_pids(daemon, marker: str = "python_repl") -> list[int]:
    """Host pids of the daemon's interpreters (the driver's file name is in their argv)."""
    found = []
    for proc in daemon.tree():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(marker in a for a in proc.cmdline()):
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return found


async def in_thread(fn):
    """Blocking FIFO opens and raw sockets, off the trio thread; abandoned if the test's
    fail_after fires, so a hung daemon fails the test instead of hanging it."""
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


# ------------------------------------------------------------------ state and display


def test_state_persists_within_a_turn_and_a_new_turn_starts_empty(client, session, turn):
    first = client.repl_exec(session, turn, "x = 41")
    assert (first["status"], first["fresh"]) == ("ok", True)
    again = client.repl_exec(session, turn, "x += 1\nprint(x)")
    assert (again["status"], again["output"], again["fresh"]) == ("ok", "42\n", False)

    other = client.turn_begin(session)["turn"]
    r = client.repl_exec(session, other, "x")
    assert r["status"] == "error" and r["fresh"] is True
    assert "NameError: name 'x' is not defined" in r["output"]


def test_last_expression_is_shown_after_printed_output(client, session, turn):
    assert client.repl_exec(session, turn, "1+1")["output"] == "2\n"
    r = client.repl_exec(session, turn, "print('first')\nimport sys\n"
                                        "sys.stderr.write('second\\n')\n'third'")
    assert r["output"] == "first\nsecond\n'third'\n"


def test_exception_gives_error_with_traceback_and_keeps_variables(client, session, turn):
    client.repl_exec(session, turn, "kept = 'yes'")
    code = "def f():\n    raise ValueError('boom')\nprint('before')\nf()"
    r = client.repl_exec(session, turn, code)
    assert r["status"] == "error"
    assert r["output"].startswith("before\nTraceback (most recent call last):\n")
    assert "raise ValueError('boom')" in r["output"]
    assert r["output"].endswith("ValueError: boom\n")
    # KeyboardInterrupt raised by the code itself is its error, not a timeout.
    r = client.repl_exec(session, turn, "raise KeyboardInterrupt")
    assert (r["status"], r["state_lost"]) == ("error", False)
    assert client.repl_exec(session, turn, "kept")["output"] == "'yes'\n"


# ------------------------------------------------------------------ output framing


def test_output_that_looks_like_prompts_or_sentinels_comes_through_intact(client, session, turn):
    code = (
        "import sys\n"
        "sys.stdout.write('>>> 1\\n... 2\\n')\n"
        "sys.stdout.write('\\x1eTOOLSD-' + 'f' * 32 + ':1:{\"status\": \"ok\"}\\n')\n"
        "sys.stdout.write('\\x1eTOOLSD-')\n"
        "sys.stdout.buffer.write(b'bad \\xff\\xfe utf8 ')\n"
        "n = sys.stdout.write('no newline')"
    )
    r = client.repl_exec(session, turn, code)
    forged = "\x1eTOOLSD-" + "f" * 32 + ':1:{"status": "ok"}\n'
    assert r["status"] == "ok"
    assert r["output"] == ">>> 1\n... 2\n" + forged + "\x1eTOOLSD-bad \\xff\\xfe utf8 no newline"
    assert not r["truncated"]
    # Still in sync: each later call gets its own answer.
    assert client.repl_exec(session, turn, "'after'")["output"] == "'after'\n"
    assert client.repl_exec(session, turn, "2*3")["output"] == "6\n"


def test_50_mb_of_output_is_capped_and_counted_and_the_next_call_is_in_sync(
        client, session, turn):
    code = ("import sys\nsys.stdout.write('HEAD' + 'x' * (50_000_000 - 8) + 'TAIL')\n"
            "n = sys.stdout.write('\\nend\\n')")
    r = client.repl_exec(session, turn, code, max_output_chars=1000)
    assert r["status"] == "ok"
    assert r["output_bytes"] == 50_000_000 + 5
    assert r["truncated"] is True
    assert len(r["output"]) <= 1000
    assert r["output"].startswith("HEADxxx")
    assert r["output"].endswith("xxxTAIL\nend\n")
    assert "bytes left out" in r["output"]
    assert client.repl_exec(session, turn, "1+1")["output"] == "2\n"


async def test_output_printed_after_an_answer_comes_with_the_next_one(daemon, session, turn):
    ready = os.path.join(daemon.workspace, "go")
    printed = os.path.join(daemon.workspace, "printed")
    os.mkfifo(ready)
    os.mkfifo(printed)
    client = await daemon.async_client()
    async with client:
        code = ("import threading\n"
                "def later():\n"
                "    open('go').read()\n"
                "    print('late line', flush=True)\n"
                "    open('printed', 'w').close()\n"
                "t = threading.Thread(target=later)\n"
                "t.start()")
        first = await client.repl_exec(session, turn, code)
        assert (first["status"], first["output"]) == ("ok", "")
        with trio.fail_after(STUCK_S):
            await in_thread(lambda: open(ready, "w").close())
            await in_thread(lambda: open(printed).read())
        second = await client.repl_exec(session, turn, "t.join()\n'now'")
    assert second["output"] == "late line\n'now'\n"


# ------------------------------------------------------------------ timeout, crash, stdin


def test_timeout_interrupts_a_busy_loop_and_keeps_the_state(client, session, turn):
    client.repl_exec(session, turn, "kept = 7")
    r = client.repl_exec(session, turn, "n = 0\nwhile True:\n    n += 1", timeout_s=1)
    assert r["status"] == "timeout"
    assert r["state_lost"] is False
    assert "KeyboardInterrupt" in r["output"]
    after = client.repl_exec(session, turn, "kept, n > 0")
    assert (after["status"], after["output"], after["fresh"]) == ("ok", "(7, True)\n", False)


def test_a_short_timeout_after_a_long_one_is_kept(daemon, session, turn):
    # A call on a running REPL has no task of its own: one alarm per interpreter serves
    # them, set for the first call's 60 s here. The second call's 1 s must move it.
    with Client(daemon.socket, timeout=STUCK_S) as c:
        c.repl_exec(session, turn, "kept = 7", timeout_s=60)
        r = c.repl_exec(session, turn, "while True:\n    pass", timeout_s=1)
        assert (r["status"], r["state_lost"]) == ("timeout", False)
        assert c.repl_exec(session, turn, "kept")["output"] == "7\n"


def test_code_ignoring_sigint_is_killed_after_the_grace_and_the_next_call_is_fresh(
        daemon, client, session, turn):
    client.repl_exec(session, turn, "kept = 7")
    before = repl_pids(daemon)
    assert len(before) == 1
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    r = client.repl_exec(session, turn, code, timeout_s=1)
    assert (r["status"], r["state_lost"]) == ("timeout", True)
    assert "killed" in r["output"]
    assert alive(before) == []
    after = client.repl_exec(session, turn, "'kept' in globals()")
    assert (after["output"], after["fresh"]) == ("False\n", True)


@pytest.mark.parametrize("command", ["sleep 2101", "trap '' INT; sleep 2101"],
                         ids=["sleep", "ignoring-sigint"])
def test_a_timeout_in_os_system_keeps_the_state_and_ends_the_shell(
        daemon, client, session, turn, command):
    # C's system() ignores SIGINT while it waits: the interrupt must reach what it waits on
    # (ended even if it ignores SIGINT), and the interpreter once system() returns.
    client.repl_exec(session, turn, "kept = 7")
    r = client.repl_exec(session, turn, f"import os\nos.system({command!r})\nafter = 1",
                         timeout_s=1)
    assert (r["status"], r["state_lost"]) == ("timeout", False)
    assert r["output"].startswith("Traceback") and "KeyboardInterrupt" in r["output"]
    assert wait_gone(daemon.running("sleep 2101"), timeout=STUCK_S) == []
    after = client.repl_exec(session, turn, "kept, 'after' in globals()")
    assert (after["status"], after["output"], after["fresh"]) == ("ok", "(7, False)\n", False)


# The call's own processes, by kind, each a shell (sh) running `sleep 2204; echo done`: dash
# does not exec its last command, so ending the shell alone would leave the sleep running.
BLOCKING = {
    "subprocess.run": "subprocess.run('sleep 2204; echo done', shell=True)",
    "check_output": "subprocess.check_output('sleep 2204; echo done', shell=True)",
    "os.popen": "os.popen('sleep 2204; echo done').read()",
}


@pytest.mark.parametrize("kind", BLOCKING)
def test_a_timeout_ends_what_the_call_started_and_spares_what_earlier_calls_did(
        daemon, client, session, turn, kind):
    r = client.repl_exec(session, turn,
                         "import os, subprocess\nkeeper = subprocess.Popen(['sleep', '2201'])")
    assert r["status"] == "ok"
    # A child that leaves the session (setsid), one that leaves the interpreter (a double
    # fork: it comes back to the sandbox's shim), then the call waits on a shell.
    code = ("subprocess.Popen(['setsid', 'sleep', '2202'])\n"
            "if os.fork() == 0:\n"
            "    if os.fork() == 0:\n"
            "        os.execvp('sleep', ['sleep', '2203'])\n"
            "    os._exit(0)\n"
            f"{BLOCKING[kind]}\n"
            "after = 1")
    r = client.repl_exec(session, turn, code, timeout_s=1)
    assert (r["status"], r["state_lost"]) == ("timeout", False)
    for n in (2202, 2203, 2204):
        assert wait_gone(daemon.running(f"sleep {n}"), timeout=STUCK_S) == [], n
    assert len(daemon.running("sleep 2201")) == 1, "an earlier call's child was ended"
    # The setsid and double-forked sleeps, the shell's sleep, and the shell unless the
    # interrupted code ended it itself (subprocess kills its child when interrupted).
    assert r["processes_ended"] >= 3
    assert f"{r['processes_ended']} processes it started were ended" in r["output"]
    after = client.repl_exec(session, turn, "keeper.poll(), 'after' in globals()")
    assert (after["output"], after["fresh"]) == ("(None, False)\n", False)


def cancel_once_started(daemon, session: str, turn: str, code: str) -> dict[int, dict]:
    """The replies (by id) to repl.exec `code` (id 1), which must create the FIFO `started`
    in the workspace when it has got far enough, and to its cancel (id 2), sent then."""
    started = os.path.join(daemon.workspace, "started")
    os.mkfifo(started)
    with raw_socket(daemon) as s:
        params = {"session": session, "turn": turn, "code": code}
        s.sendall(frame({"id": 1, "method": "repl.exec", "params": params}))
        open(started).read()
        s.sendall(frame({"id": 2, "method": "cancel", "params": {"request": 1}}))
        return {reply["id"]: reply for reply in read_reply_list(s, until=2, count=2)}


def test_a_call_that_finds_the_state_lost_by_a_cancel_says_so(daemon, session, turn):
    with daemon.client() as c:
        c.repl_exec(session, turn, "kept = 1")
    code = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "open('started', 'w').close()\nwhile True:\n    pass")
    assert cancel_once_started(daemon, session, turn, code)[1]["error"]["code"] == "cancelled"
    # The interpreter was killed after the grace, and the cancel's answer could not say so.
    with daemon.client() as c:
        r = c.repl_exec(session, turn, "'kept' in globals()")
        assert (r["output"], r["fresh"], r["state_lost"]) == ("False\n", True, True)
        r = c.repl_exec(session, turn, "1")
        assert (r["fresh"], r["state_lost"]) == (False, False)


@pytest.mark.parametrize("language", ["python", pytest.param("node", marks=needs_node)])
def test_cancels_sent_with_their_call_never_lose_state_or_reach_a_later_call(
        daemon, session, turn, language):
    # Each round writes a call and its cancel at once: the cancel's interrupt comes at any
    # point of the call, just before its end and just after it included. The Node REPL used
    # to die of one (node ends itself on a SIGINT just after vm's breakOnSigint ended).
    if language == "node":
        setup, check, busy = "var kept = 1", "kept", "for (let i = 0; i < {n}; i++) {{}}; 1"
    else:
        setup, check, busy = "kept = 1", "kept", "for i in range({n}):\n    pass"
    with daemon.client() as c:
        assert c.repl_exec(session, turn, setup, language=language)["status"] == "ok"
    with raw_socket(daemon) as s:
        for n in range(200):
            rid = 3 * n + 1
            params = {"session": session, "turn": turn, "language": language,
                      "code": busy.format(n=(n % 40) * 250)}
            s.sendall(frame({"id": rid, "method": "repl.exec", "params": params})
                      + frame({"id": rid + 1, "method": "cancel", "params": {"request": rid}}))
            replies = {r["id"]: r for r in read_reply_list(s, until=rid + 1, count=2)}
            told = replies[rid].get("result", {}).get("state_lost", False)
            params = {"session": session, "turn": turn, "language": language, "code": check}
            s.sendall(frame({"id": rid + 2, "method": "repl.exec", "params": params}))
            innocent = read_replies(s, until=rid + 2)[rid + 2]["result"]
            assert innocent["status"] != "timeout", (n, innocent)
            if innocent["state_lost"] or told:
                pytest.fail(f"round {n}: the state was lost (said so: {innocent})")
            assert (innocent["status"], innocent["output"]) == ("ok", "1\n"), (n, innocent)


@pytest.mark.parametrize("code", [
    "import os\nprint('bye', flush=True)\nos._exit(3)",
    "import ctypes\nprint('bye', flush=True)\nctypes.string_at(0)",
], ids=["os._exit", "segfault"])
def test_interpreter_death_is_a_crash_and_the_next_call_is_fresh(client, session, turn, code):
    client.repl_exec(session, turn, "kept = 7")
    r = client.repl_exec(session, turn, code)
    assert (r["status"], r["state_lost"]) == ("crashed", True)
    assert r["output"].startswith("bye\n")
    assert ("exit code 3" in r["output"]) or ("SIGSEGV" in r["output"])
    after = client.repl_exec(session, turn, "'kept' in globals()")
    assert (after["status"], after["output"], after["fresh"]) == ("ok", "False\n", True)


def test_code_that_stops_its_interpreter_goes_on(client, session, turn):
    # The interpreter's shim resumes it: the call answers, its state kept, rather than
    # waiting stopped until its timeout.
    r = client.repl_exec(session, turn, "import os, signal\nx = 41\n"
                         "os.kill(os.getpid(), signal.SIGSTOP)\nprint('went on', x + 1)",
                         timeout_s=STUCK_S)
    assert (r["status"], r["output"], r["state_lost"]) == ("ok", "went on 42\n", False), r


def test_input_gets_end_of_file_at_once(client, session, turn):
    r = client.repl_exec(session, turn, "input('name? ')", timeout_s=20)
    assert r["status"] == "error"
    assert r["output"].endswith("EOFError: EOF when reading a line\n")


# ------------------------------------------------------------------ lifecycle


def test_turn_end_kills_the_interpreter_and_its_children(daemon, client, session, turn):
    r = client.repl_exec(session, turn,
                         "import subprocess\np = subprocess.Popen(['sleep', '1000'])")
    assert r["status"] == "ok"
    interpreters = repl_pids(daemon)
    assert len(interpreters) == 1
    family = interpreters + [c.pid for c in psutil.Process(interpreters[0]).children()]
    assert len(family) == 2
    assert client.turn_end(session, turn) == {"repls_stopped": 1}
    assert alive(family) == []
    with pytest.raises(ToolsdError) as e:
        client.repl_exec(session, turn, "1")
    assert e.value.code == "not_found"


@pytest.mark.parametrize("warm", [False, True], ids=["first-call", "running-repl"])
async def test_turn_end_answers_the_call_it_cuts_short(daemon, session, turn, warm):
    started = os.path.join(daemon.workspace, "started")
    os.mkfifo(started)
    with daemon.client() as c:
        if warm:
            c.repl_exec(session, turn, "1")
        client = await daemon.async_client()
        async with client:
            with trio.fail_after(STUCK_S):
                async with trio.open_nursery() as nursery:
                    result = {}

                    async def spin():
                        result["r"] = await client.repl_exec(
                            session, turn, "open('started', 'w').close()\nwhile True:\n    pass")

                    nursery.start_soon(spin)
                    await in_thread(lambda: open(started).read())
                    assert await in_thread(lambda: c.turn_end(session, turn)) == {
                        "repls_stopped": 1}
        assert (result["r"]["status"], result["r"]["state_lost"]) == ("crashed", True)
        with pytest.raises(ToolsdError) as e:
            c.repl_exec(session, turn, "1")
        assert e.value.code == "not_found"


def test_session_close_kills_every_interpreter(daemon, client, session, turn):
    other = client.turn_begin(session)["turn"]
    client.repl_exec(session, turn, "1")
    client.repl_exec(session, other, "2")
    interpreters = repl_pids(daemon)
    assert len(interpreters) == 2
    assert client.session_close(session)["repls_stopped"] == 2
    assert alive(interpreters) == []


def test_an_interpreter_that_died_between_calls_is_replaced(daemon, client, session, turn):
    client.repl_exec(session, turn, "kept = 1")
    [pid] = repl_pids(daemon)
    interpreter = psutil.Process(pid)
    interpreter.kill()
    interpreter.wait(STUCK_S)
    r = client.repl_exec(session, turn, "'kept' in globals()")
    # Run on a fresh one, and the first call to know says the state is lost.
    assert (r["status"], r["output"], r["fresh"], r["state_lost"]) == ("ok", "False\n", True,
                                                                        True)
    r = client.repl_exec(session, turn, "kept = 2; kept")
    assert (r["output"], r["fresh"], r["state_lost"]) == ("2\n", False, False)


# ------------------------------------------------------------------ sandbox


def test_writes_outside_the_workspace_fail(client, session, turn):
    outside = f"/var/tmp/toolsd-repl-probe-{uuid.uuid4().hex}"
    code = (f"open('inside.txt', 'w').write('ok')\n"
            f"try:\n    open({outside!r}, 'w')\nexcept OSError as e:\n    print(type(e).__name__)")
    try:
        r = client.repl_exec(session, turn, code)
        assert r["output"] in ("OSError\n", "PermissionError\n"), r["output"]
        assert not os.path.exists(outside)
    finally:
        if os.path.exists(outside):
            os.unlink(outside)


def test_read_only_session_refuses_every_write(daemon, client):
    session = client.session_open(daemon.workspace, writable=False)["session"]
    turn = client.turn_begin(session)["turn"]
    code = ("import os\nfor act in (lambda: open('new.txt', 'w'), lambda: os.mkdir('d')):\n"
            "    try:\n        act()\n        print('wrote')\n"
            "    except OSError as e:\n        print(e.strerror)")
    try:
        r = client.repl_exec(session, turn, code)
    finally:
        client.session_close(session)
    assert r["output"] == "Read-only file system\nRead-only file system\n"
    assert os.listdir(daemon.workspace) == []


# ------------------------------------------------------------------ node


@needs_node
def test_node_keeps_state_reports_errors_and_times_out(client, session, turn):
    first = client.repl_exec(session, turn, "var x = 40; x + 2", language="node")
    assert (first["status"], first["output"], first["fresh"]) == ("ok", "42\n", True)
    err = client.repl_exec(session, turn, "throw new TypeError('nope')", language="node")
    assert err["status"] == "error" and "TypeError: nope" in err["output"]
    loop = client.repl_exec(session, turn, "while (true) {}", language="node", timeout_s=1)
    assert (loop["status"], loop["state_lost"]) == ("timeout", False)
    after = client.repl_exec(session, turn, "x", language="node")
    assert (after["output"], after["fresh"]) == ("40\n", False)
    # Python in the same turn is its own interpreter.
    assert client.repl_exec(session, turn, "'x' in globals()")["output"] == "False\n"


@needs_node
def test_node_prints_after_being_interrupted_while_printing(client, session, turn):
    # An interrupt landing inside the output stream's own code must not leave it broken
    # (with a stream.Writable, every later console.log was queued for ever).
    for _ in range(3):
        loop = client.repl_exec(session, turn, "for (;;) console.log('x'.repeat(100))",
                                language="node", timeout_s=0.5, max_output_chars=100)
        assert (loop["status"], loop["state_lost"]) == ("timeout", False)
        after = client.repl_exec(session, turn, "console.log('after'); 7", language="node")
        assert (after["output"], after["fresh"]) == ("after\n7\n", False)


# ------------------------------------------------------------------ bad input


def test_unknown_turn_is_not_found(client, session):
    with pytest.raises(ToolsdError) as e:
        client.repl_exec(session, "t-nosuchturn", "1")
    assert e.value.code == "not_found"


def test_unknown_language_is_bad_params(client, session, turn):
    with pytest.raises(ToolsdError) as e:
        client.repl_exec(session, turn, "1", language="ruby")
    assert e.value.code == "bad_params" and "language" in e.value.message


def test_node_missing_from_the_sandbox_is_bad_params(daemon, client):
    # A PATH with a shell and python but no node, inside the workspace (the sandbox sees it).
    bindir = os.path.join(daemon.workspace, "bin")
    os.makedirs(bindir)
    for name, target in (("bash", shutil.which("bash")), ("sh", shutil.which("sh")),
                         ("python3", sys.executable)):
        os.symlink(os.path.realpath(target), os.path.join(bindir, name))
    session = client.session_open(daemon.workspace, env={"PATH": bindir})["session"]
    try:
        turn = client.turn_begin(session)["turn"]
        with pytest.raises(ToolsdError) as e:
            client.repl_exec(session, turn, "1", language="node")
        assert e.value.code == "bad_params" and "node" in e.value.message
        assert client.repl_exec(session, turn, "1+1")["output"] == "2\n"
    finally:
        client.session_close(session)


# ------------------------------------------------------------------ concurrency


async def test_two_requests_on_one_repl_run_one_after_the_other(daemon, session, turn):
    started = os.path.join(daemon.workspace, "started")
    go = os.path.join(daemon.workspace, "go")
    os.mkfifo(started)
    os.mkfifo(go)
    client = await daemon.async_client()
    results = {}

    def second_request_then_release_first():
        # One write holds request B then a hello: once the hello is answered, the daemon has
        # read B and started its task while A is still running.
        with raw_socket(daemon) as s:
            b = {"session": session, "turn": turn, "code": "print('B', done)"}
            s.sendall(frame({"id": 1, "method": "repl.exec", "params": b})
                      + frame({"id": 2, "method": "hello", "params": {}}))
            replies = read_replies(s, until=2)
            assert 1 not in replies, "B must wait for A"
            open(go, "w").close()
            replies.update(read_replies(s, until=1))
            return replies[1]["result"]

    async with client:
        async def first():
            results["a"] = await client.repl_exec(
                session, turn, "open('started', 'w').close()\nopen('go').read()\n"
                               "done = 'a'\nprint('A')")

        with trio.fail_after(STUCK_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                await in_thread(lambda: open(started).read())
                results["b"] = await in_thread(second_request_then_release_first)
    assert (results["a"]["status"], results["a"]["output"]) == ("ok", "A\n")
    assert (results["b"]["status"], results["b"]["output"]) == ("ok", "B a\n")


def frame(request: dict) -> bytes:
    return encode_frame(msgspec.msgpack.encode(request))


@contextlib.contextmanager
def raw_socket(daemon):
    """A connection to the daemon without a client library: frames as the test writes them."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(STUCK_S)
        s.connect(daemon.socket)
        yield s


def read_replies(s: socket.socket, *, until: int) -> dict[int, dict]:
    """Replies by id, read until the one with id `until` is in."""
    return {reply["id"]: reply for reply in read_reply_list(s, until=until)}


def read_reply_list(s: socket.socket, *, until: int, count: int = 1) -> list[dict]:
    """Every reply in the order it came, read until the one with id `until` is in and
    `count` replies in all."""
    reader = FrameReader(1 << 24)
    replies: list[dict] = []
    while len(replies) < count or not any(reply["id"] == until for reply in replies):
        data = s.recv(1 << 16)
        assert data, "the daemon closed the connection"
        replies += [msgspec.msgpack.decode(body) for body in reader.feed(data)]
    return replies


def test_each_request_is_answered_once_and_a_cancel_after_the_answer_finds_nothing(
        daemon, session, turn):
    # The answer goes out from the task that reads the sentinel (calls.Detached); nothing
    # may send it again, nor may a cancel reach it after.
    with raw_socket(daemon) as s:
        for n in range(1, 30, 3):
            params = {"session": session, "turn": turn, "code": f"print({n})"}
            s.sendall(frame({"id": n, "method": "repl.exec", "params": params}))
            first = read_reply_list(s, until=n)
            s.sendall(frame({"id": n + 1, "method": "cancel", "params": {"request": n}}))
            s.sendall(frame({"id": n + 2, "method": "hello", "params": {}}))
            rest = read_reply_list(s, until=n + 2, count=2)
            assert [r["id"] for r in first] == [n]
            assert first[0]["result"]["output"] == f"{n}\n"
            # The two answers may come in either order; one of each, nothing else.
            assert sorted(r["id"] for r in rest) == [n + 1, n + 2]
            cancel = next(r for r in rest if r["id"] == n + 1)
            assert cancel["error"]["code"] == "not_found"


def test_a_client_that_reads_no_answers_is_held_to_the_in_flight_limit(daemon, session, turn):
    # Calls one at a time on a running REPL (each without a task), answers of 100 kB, none
    # read. Each keeps its slot until its answer is out, so the daemon stops taking calls
    # after 256 (MAX_IN_FLIGHT) plus the few answers the socket holds. Each call appends a
    # byte to a file when it has run. Up to the limit a call gets STUCK_S to run; past it,
    # one that has not run within 2 s ends the count (a slow machine only ends it sooner).
    ran_file = os.path.join(daemon.workspace, "ran")
    with daemon.client() as c:
        c.repl_exec(session, turn, "1")
    code = "print('x' * 100_000)\nwith open('ran', 'a') as f:\n    f.write('1')"
    ran = 0
    with raw_socket(daemon) as s:
        for rid in range(1, 400):
            s.sendall(frame({"id": rid, "method": "repl.exec",
                             "params": {"session": session, "turn": turn, "code": code,
                                        "max_output_chars": 200_000}}))
            deadline = time.monotonic() + (STUCK_S if rid <= MAX_IN_FLIGHT else 2)
            while time.monotonic() < deadline and file_size(ran_file) < rid:
                time.sleep(0.002)
            ran = file_size(ran_file)
            if ran < rid:
                break
    assert MAX_IN_FLIGHT <= ran < MAX_IN_FLIGHT + 40


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("warm", [False, True], ids=["first-call", "running-repl"])
async def test_a_cancel_interrupts_the_code_ends_its_processes_and_the_repl_stays_in_sync(
        daemon, session, turn, warm):
    if warm:
        with daemon.client() as c:
            c.repl_exec(session, turn,
                        "import subprocess\nkeeper = subprocess.Popen(['sleep', '2301'])")
    code = ("import subprocess\nchild = subprocess.Popen(['sleep', '2302'])\n"
            "set_before = 6\nopen('started', 'w').close()\nwhile True:\n    pass")
    with trio.fail_after(STUCK_S):
        replies = await in_thread(lambda: cancel_once_started(daemon, session, turn, code))
    assert replies[2]["result"] == {}
    assert replies[1]["error"]["code"] == "cancelled"
    # What the call started is ended, not what an earlier call did.
    assert wait_gone(daemon.running("sleep 2302"), timeout=STUCK_S) == []
    assert len(daemon.running("sleep 2301")) == int(warm)
    with daemon.client() as c:
        r = c.repl_exec(session, turn, "set_before", timeout_s=20)
    assert (r["status"], r["output"], r["fresh"]) == ("ok", "6\n", False)


def test_many_calls_sent_at_once_each_get_their_own_output(daemon, session, turn):
    # The first runs without a task if the REPL is idle, the rest queue in tasks; a few
    # are cancelled on the way. Each answer must carry its own code's output, once.
    with daemon.client() as c:
        c.repl_exec(session, turn, "n = 0")
    with raw_socket(daemon) as s:
        batch = b""
        for rid in range(1, 61):
            params = {"session": session, "turn": turn, "code": f"n += 1\nprint({rid})"}
            batch += frame({"id": rid, "method": "repl.exec", "params": params})
        for rid in (100, 101):
            batch += frame({"id": rid, "method": "cancel", "params": {"request": rid - 70}})
        s.sendall(batch)
        replies = read_reply_list(s, until=60, count=62)
    assert sorted(r["id"] for r in replies) == list(range(1, 61)) + [100, 101]
    ran = 0
    for reply in replies:
        if reply["id"] < 100 and "result" in reply:
            assert reply["result"]["output"] == f"{reply['id']}\n"
            ran += 1
        elif reply["id"] < 100:
            assert reply["error"]["code"] == "cancelled"
    with daemon.client() as c:
        assert c.repl_exec(session, turn, "n")["output"] == f"{ran}\n"


def test_big_answers_stay_whole_when_the_client_reads_them_late(daemon, session):
    # Answers of a megabyte each, on four REPLs at once, to a client that reads nothing until
    # all are asked: an answer the socket takes only in part must be finished before any
    # other goes out.
    size = 1_000_000
    with daemon.client() as c:
        turns = [c.turn_begin(session)["turn"] for _ in range(4)]
        for t in turns:  # running and idle: the first answer of each has no task
            c.repl_exec(session, t, "1")
    with raw_socket(daemon) as s:
        requests = [(n * 4 + i + 1, t) for n in range(2) for i, t in enumerate(turns)]
        for rid, t in requests:
            params = {"session": session, "turn": t, "code": f"print('{rid % 10}' * {size})",
                      "max_output_chars": size + 1}
            s.sendall(frame({"id": rid, "method": "repl.exec", "params": params}))
        s.sendall(frame({"id": 100, "method": "hello", "params": {}}))
        reader = FrameReader(1 << 24)
        replies = []
        while len(replies) < len(requests) + 1:
            data = s.recv(1 << 16)
            assert data, "the daemon closed the connection"
            replies += [msgspec.msgpack.decode(body) for body in reader.feed(data)]
    assert sorted(r["id"] for r in replies) == sorted([rid for rid, _ in requests] + [100])
    for reply in replies:
        if reply["id"] != 100:
            assert reply["result"]["output"] == str(reply["id"] % 10) * size + "\n"


async def test_a_slow_repl_exec_does_not_delay_hello(daemon, session, turn):
    # Raw frames on one connection: the daemon's per-request tasks are what is shown, with
    # nothing of a client library's own scheduling in between.
    started = os.path.join(daemon.workspace, "started")
    go = os.path.join(daemon.workspace, "go")
    os.mkfifo(started)
    os.mkfifo(go)

    def slow_exec_then_hello():
        with raw_socket(daemon) as s:
            code = "open('started', 'w').close()\nopen('go').read()\n'done'"
            params = {"session": session, "turn": turn, "code": code}
            s.sendall(frame({"id": 1, "method": "repl.exec", "params": params}))
            open(started).read()  # the code runs, and waits for `go`
            s.sendall(frame({"id": 2, "method": "hello", "params": {}}))
            replies = read_replies(s, until=2)
            assert replies[2]["result"]["protocol"] == 1
            assert 1 not in replies, "the slow request answered before it was released"
            open(go, "w").close()
            replies.update(read_replies(s, until=1))
            return replies[1]["result"]

    with trio.fail_after(STUCK_S):
        slow = await in_thread(slow_exec_then_hello)
    assert (slow["status"], slow["output"]) == ("ok", "'done'\n")


async def test_a_cancelled_request_is_interrupted_and_the_repl_stays_in_sync(
        daemon, session, turn):
    started = os.path.join(daemon.workspace, "started")
    os.mkfifo(started)
    with daemon.client() as c:
        c.repl_exec(session, turn, "kept = 5")
    client = await daemon.async_client()
    with trio.fail_after(STUCK_S):
        async with trio.open_nursery() as nursery:
            async def spin():
                await client.repl_exec(session, turn,
                                       "open('started', 'w').close()\nwhile True:\n    pass")

            nursery.start_soon(spin)
            await in_thread(lambda: open(started).read())
            nursery.cancel_scope.cancel()
    # The client goes away mid-request: the daemon cancels the request.
    await client.aclose()
    with daemon.client() as c:
        r = c.repl_exec(session, turn, "kept", timeout_s=20)
    assert (r["status"], r["output"], r["fresh"]) == ("ok", "5\n", False)
