"""What a hostile or broken client can send, and that the daemon survives each of it."""

from __future__ import annotations

import os
import socket
import struct
import threading

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolsd.client import Client, ToolsdError

import pytest

pytestmark = pytest.mark.daemon(shared=True)


def raw_connect(daemon) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(daemon.socket)
    return s


def frame(obj) -> bytes:
    body = obj if isinstance(obj, bytes) else msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(body)) + body


def read_frame(s: socket.socket):
    header = recv_exactly(s, 4)
    if header is None:
        return None
    (n,) = struct.unpack(">I", header)
    return msgspec.msgpack.decode(recv_exactly(s, n))


def recv_exactly(s: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def assert_closed(s: socket.socket) -> None:
    assert s.recv(1) == b"", "the daemon should close a connection after a bad frame"


def assert_alive(daemon) -> None:
    with daemon.client() as c:
        assert c.hello()["protocol"] == 1


def test_hello_describes_the_daemon(client):
    hello = client.hello()
    assert hello["protocol"] == 1
    assert hello["server"].startswith("toolsd")
    assert hello["sandbox"] in ("bwrap", "none")
    assert "sh" in hello["shells"]
    assert "python" in hello["languages"]
    assert hello["max_frame"] == 16 * 1024 * 1024


def test_socket_and_folder_are_private(daemon):
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(daemon.socket)).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("body", [
    b"\xc1\xc1\xc1",  # not msgpack
    msgspec.msgpack.encode([1, "hello", {}]),  # msgpack, not a map
    msgspec.msgpack.encode({"id": "one", "method": "hello"}),  # id not an integer
    msgspec.msgpack.encode({"id": 1}),  # no method
    b"\x82\xa2id\x01\xa6method\xa3\xff\xfe\xfd",  # invalid UTF-8 in the method
])
def test_bad_frame_is_refused_and_connection_closed(daemon, body):
    s = raw_connect(daemon)
    s.sendall(frame(body))
    reply = read_frame(s)
    assert reply["id"] == 0
    assert reply["error"]["code"] == "bad_frame"
    assert_closed(s)
    s.close()
    assert_alive(daemon)


def test_deeply_nested_frame_is_refused_not_fatal(daemon):
    # 1,100 nested one-element arrays: 1.1 KB that once blew the decoder's stack.
    body = b"\x83\xa2id\x01\xa6method\xa5hello\xa6params" + b"\x91" * 1100 + b"\xc0"
    s = raw_connect(daemon)
    s.sendall(frame(body))
    reply = read_frame(s)
    assert reply["error"]["code"] in ("bad_frame", "bad_params")
    s.close()
    assert_alive(daemon)


@pytest.mark.parametrize("method, params, field", [
    ("shell.run", {"session": "s1", "command": "true", "max_output_chars": 10**12},
     "max_output_chars"),
    ("process.stop", {"id": "bg1", "grace_s": 10**9}, "grace_s"),
    ("session.open", {"workspace": "/", "limits": {"memory_mb": 2**50}}, "memory_mb"),
])
def test_out_of_range_params_are_refused(client, method, params, field):
    with pytest.raises(ToolsdError) as e:
        client.call(method, **params)
    assert e.value.code == "bad_params"
    assert field in e.value.message


def test_huge_length_prefix_is_refused_before_the_body(daemon):
    s = raw_connect(daemon)
    s.sendall(struct.pack(">I", 2**31))  # and not one byte of body
    reply = read_frame(s)
    assert reply["id"] == 0
    assert reply["error"]["code"] == "frame_too_large"
    assert_closed(s)
    s.close()
    assert_alive(daemon)


def test_frame_cut_off_mid_body(daemon):
    s = raw_connect(daemon)
    whole = frame({"id": 1, "method": "hello", "params": {}})
    s.sendall(whole[: len(whole) - 3])
    s.close()
    assert_alive(daemon)


def test_unknown_method(client):
    with pytest.raises(ToolsdError) as e:
        client.call("shell.runn", session="s1", command="true")
    assert e.value.code == "unknown_method"
    assert "shell.runn" in e.value.message


def test_missing_param_names_the_field(client):
    with pytest.raises(ToolsdError) as e:
        client.call("session.close")
    assert e.value.code == "bad_params"
    assert "session" in e.value.message


def test_wrong_param_type_names_the_field(client):
    with pytest.raises(ToolsdError) as e:
        client.call("shell.run", session="s1", command=["ls"])
    assert e.value.code == "bad_params"
    assert "command" in e.value.message


def test_params_not_a_map(daemon):
    s = raw_connect(daemon)
    s.sendall(frame({"id": 5, "method": "hello", "params": [1, 2]}))
    reply = read_frame(s)
    assert reply["id"] == 5 and reply["error"]["code"] == "bad_params"
    s.sendall(frame({"id": 6, "method": "hello", "params": {}}))
    assert read_frame(s)["result"]["protocol"] == 1  # the connection stays usable
    s.close()


def test_unknown_extra_params_are_ignored(client):
    assert client.call("hello", client="t", future_field=[1, 2, 3])["protocol"] == 1


def test_200_pipelined_requests_without_reading(daemon):
    s = raw_connect(daemon)
    s.sendall(b"".join(frame({"id": i, "method": "hello", "params": {}})
                       for i in range(1, 201)))
    ids = set()
    for _ in range(200):
        reply = read_frame(s)
        assert reply["result"]["protocol"] == 1
        ids.add(reply["id"])
    assert ids == set(range(1, 201))
    s.close()
    assert_alive(daemon)


def test_50_connections_at_once(daemon):
    errors = []

    def one():
        try:
            with Client(daemon.socket) as c:
                for _ in range(5):
                    assert c.hello()["protocol"] == 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert_alive(daemon)


def test_cancel_of_unknown_request(client):
    with pytest.raises(ToolsdError) as e:
        client.call("cancel", request=12345)
    assert e.value.code == "not_found"


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.binary(max_size=200),
    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-2**63, 2**64 - 1), st.text(max_size=10),
                                                   st.none(), st.binary(max_size=10)),
                    max_size=4).map(msgspec.msgpack.encode),
    st.builds(lambda i, m, p: msgspec.msgpack.encode({"id": i, "method": m, "params": p}),
              st.integers(min_value=-5, max_value=2**40),
              st.sampled_from(["hello", "session.open", "shell.run", "process.output",
                               "cancel", "nope", ""]),
              st.dictionaries(st.sampled_from(["session", "command", "id", "workspace",
                                               "timeout_s", "request", "since"]),
                              st.one_of(st.integers(-2**63, 2**63), st.text(max_size=5), st.floats(),
                                        st.none()), max_size=3)),
))
def test_random_frames_never_hurt_the_daemon(daemon, body):
    s = raw_connect(daemon)
    try:
        s.sendall(frame(body))
        reply = read_frame(s)
        if reply is not None:
            assert "result" in reply or reply["error"]["code"] in {
                "bad_frame", "bad_params", "unknown_method", "not_found", "session_closed",
                "cancelled"}
    finally:
        s.close()
    assert_alive(daemon)


def read_replies(s: socket.socket, count: int) -> dict:
    replies = {}
    while len(replies) < count:
        reply = read_frame(s)
        replies[reply["id"]] = reply
    return replies


def test_a_cancel_right_behind_its_request_is_carried_out(daemon, client):
    # Both frames in one write, so the daemon reads them together: the cancel must find the
    # request although the request's task has not run yet.
    session = client.session_open(daemon.workspace)["session"]
    s = raw_connect(daemon)
    try:
        for n in range(20):
            run = {"id": 2 * n + 1, "method": "shell.run",
                   "params": {"session": session, "command": "sleep 30", "timeout_s": 60}}
            cancel = {"id": 2 * n + 2, "method": "cancel", "params": {"request": 2 * n + 1}}
            s.sendall(frame(run) + frame(cancel))
            replies = read_replies(s, 2)
            assert replies[2 * n + 2].get("result") == {}, replies
            assert replies[2 * n + 1]["error"]["code"] == "cancelled", replies
    finally:
        s.close()
        client.session_close(session)
    assert daemon.running("sleep 30") == []


def test_past_256_in_flight_requests_are_refused_but_cancel_still_works(daemon, client):
    session = client.session_open(daemon.workspace)["session"]
    bg = client.process_start(session, "sleep 1000")["id"]
    s = raw_connect(daemon)
    try:
        wait = {"method": "process.output", "params": {"id": bg, "wait_s": 60}}
        s.sendall(b"".join(frame({"id": i, **wait}) for i in range(1, 257)))
        s.sendall(frame({"id": 1000, "method": "hello", "params": {}}))
        refused = read_frame(s)
        assert refused["id"] == 1000 and refused["error"]["code"] == "limit_exceeded"
        assert "256" in refused["error"]["message"]
        s.sendall(frame({"id": 1001, "method": "cancel", "params": {"request": 7}}))
        replies = read_replies(s, 2)
        assert replies[1001].get("result") == {}
        assert replies[7]["error"]["code"] == "cancelled"
    finally:
        s.close()
    client.session_close(session)
    assert_alive(daemon)
