"""The launcher channel's messages: every shape driver/launcher.py sends decodes into its
Struct, anything else is dropped, and what the daemon sends is what the launcher reads."""

import logging
import marshal
import os
import re
import resource
import signal
import socket
import types

import pytest

from driver import LAUNCHER_PY, PORT_CONNECT
from driver import launcher as driver
from toolsd.sandbox.launch.channel import (UNREADABLE, Channel, Done, Exited, Failed, Pong, Ready,
                                    Started, decode, ping_message, spawn_message)


def sent(obj) -> bytes:
    """The bytes the launcher puts on the channel for `obj` (its `send`, without the socket)."""
    return driver.to_json(obj).encode()


def test_ready_as_the_launcher_says_it():
    ready = decode(sent({"op": "ready", "pid": 1, "bash": "/usr/bin/bash", "sh": "/bin/sh",
                         "python3": "/usr/bin/python3", "node": None}))
    assert ready == Ready(pid=1, bash="/usr/bin/bash", sh="/bin/sh",
                          python3="/usr/bin/python3", node=None)


def test_pong_with_and_without_its_number():
    assert decode(sent({"op": "pong", "n": 7})) == Pong(n=7)
    # serve() answers msg.get("n"): a ping without one gets null back.
    assert decode(sent({"op": "pong", "n": None})) == Pong(n=None)


def test_started_as_run_job_and_warm_up_say_it():
    assert decode(sent({"op": "started", "job": 3, "pid": 42})) == Started(job=3, pid=42)
    # The daemon reads the pids from the pidfds; the field may be missing.
    assert decode(b'{"op":"started","job":3}') == Started(job=3)


@pytest.mark.parametrize("message, expected", [
    # run_job: start_command's StartError, or a limit (EAGAIN)
    ({"op": "error", "job": 4, "message": "no such program: 'x'", "limit": False},
     Failed(job=4, message="no such program: 'x'")),
    ({"op": "error", "job": 4, "message": "cannot run 'x': busy", "limit": True},
     Failed(job=4, message="cannot run 'x': busy", limit=True)),
    # reap: a shim killed before it started the command; no "limit"
    ({"op": "error", "job": 5, "unstarted": True,
      "message": "the launcher's shim died before starting the command"},
     Failed(job=5, message="the launcher's shim died before starting the command",
            unstarted=True)),
    # serve_waiting_request: no reader could be forked
    ({"op": "error", "job": 6, "message": "the launcher could not fork: x", "limit": True},
     Failed(job=6, message="the launcher could not fork: x", limit=True)),
])
def test_every_error_the_launcher_sends(message, expected):
    assert decode(sent(message)) == expected


def test_exits_as_the_launcher_words_them():
    code3 = types.SimpleNamespace(si_code=os.CLD_EXITED, si_status=3)
    killed = types.SimpleNamespace(si_code=os.CLD_KILLED, si_status=signal.SIGKILL)
    assert decode(sent(driver.exit_message(8, code3))) == Exited(job=8, code=3)
    assert decode(sent(driver.exit_message(8, killed))) == Exited(job=8, signal=9)
    assert decode(sent(driver.exit_message_of_status(9, 0))) == Exited(job=9, code=0)
    assert (decode(sent(driver.exit_message_of_status(9, 2 << 8)))
            == Exited(job=9, code=2))
    dead_shim = driver.exit_message_of_status(9, signal.SIGKILL)  # reap(): "done" added
    dead_shim["done"] = True
    assert decode(sent(dead_shim)) == Exited(job=9, signal=9, done=True)


def test_done():
    assert decode(sent({"op": "done", "job": 10})) == Done(job=10)


def test_every_op_the_launcher_sends_has_a_struct():
    # A new message in the driver without its Struct here would be dropped as unreadable.
    source = open(LAUNCHER_PY).read() + open(PORT_CONNECT).read()
    ops = set(re.findall(r'"op": "(\w+)"', source)) - {"spawn", "ping", "connect"}  # to it
    assert ops == {"ready", "listening", "pong", "started", "error", "exited", "done",
                   "connected"}
    for op in ops:
        assert decode(sent({"op": op, "job": 1, "n": 1})) is not UNREADABLE, op


@pytest.mark.parametrize("data", [
    b"",  # nothing
    b'{"op":"started","job":1',  # truncated
    b"[1, 2]",  # not an object
    b'{"job": 1}',  # no op
    b'{"op":"spawn","job":1}',  # an op that only goes the other way
    b'{"op":"exited","job":1,"code":"0"}',  # a field of the wrong type
    b'{"op":"done"}',  # the job missing
    b'{"op":"done","job":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # deep
])
def test_anything_else_is_unreadable(data):
    assert decode(data) is UNREADABLE


def test_a_spawn_request_carries_everything_the_launcher_reads():
    msg = spawn_message(3, ["sh", "-c", "true"], "/work", {"PATH": "/bin"},
                        {"nofile": (64, 128)}, ack=False)
    # It goes as marshal: a Struct or a tuple inside would not survive, or not compare.
    assert marshal.loads(marshal.dumps(msg)) == {
        "op": "spawn", "job": 3, "argv": ["sh", "-c", "true"], "cwd": "/work",
        "env": {"PATH": "/bin"}, "rlimits": {"nofile": [64, 128]}, "ack": False}
    # Limits.fits compares lists: tuple pairs would make every shim retire.
    assert isinstance(msg["rlimits"]["nofile"], list)
    # The launcher's warm-up request has the shape of ours.
    assert set(marshal.loads(driver.WARMUP_REQUEST)) <= set(msg)
    assert spawn_message(1, ["x"], "/", {}, None, ack=True)["rlimits"] == {}


def test_a_ping_as_the_launcher_reads_it():
    msg = marshal.loads(marshal.dumps(ping_message(5)))
    assert (msg.get("op"), msg.get("n")) == ("ping", 5)


async def test_a_message_whose_descriptors_do_not_fit_is_dropped_and_said(caplog):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    spawn_ours, spawn_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel = Channel(ours, spawn_ours)
    pipe = os.pipe()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers = []
    try:
        driver.send(theirs, {"op": "started", "job": 1, "pid": 2}, list(pipe))
        # Every number under our limit taken but one: the message's second fd cannot land.
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (max(map(int, os.listdir("/proc/self/fd"))) + 8, hard))
        try:
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            os.close(fillers.pop())
        with caplog.at_level(logging.WARNING, logger="toolsd.launcher"):
            assert await channel.recv() == (UNREADABLE, [])
    finally:
        for fd in (*fillers, *pipe):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        channel.close()
        theirs.close()
        spawn_theirs.close()
    assert "came truncated (its descriptors)" in caplog.text
    assert "limit of open files" in caplog.text
