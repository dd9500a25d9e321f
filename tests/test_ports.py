"""port.forward / port.close (protocol 1.2 "ports") on a real daemon: a server started with
process.start in a `network: "none"` session, reached from the host through a listener the
daemon makes, each connection connected inside the sandbox's network namespace by its
launcher; closing a forward or the session ends it; bad input gets clear errors."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from conftest import RunningDaemon, has_ended, needs_bwrap, wait_gone
from toolsd.client import ToolsdError

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

# http.server with a listen queue that takes a burst of connections (its own is 5, which
# makes 100 connections at once wait for SYN retransmits, forwarded or not).
HTTP_SERVER = ("python3 -c 'import runpy, socketserver, sys; "
               "socketserver.TCPServer.request_queue_size = 256; "
               "sys.argv = [\"http.server\", \"{port}\", \"--bind\", \"127.0.0.1\"]; "
               "runpy.run_module(\"http.server\", run_name=\"__main__\")'")
# Echoes what it reads; once the client half-closes, says how much it read and closes.
ECHO_SERVER = """python3 -c '
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port})); s.listen(64); print("listening", flush=True)
def serve(c):
    n = 0
    while chunk := c.recv(65536):
        n += len(chunk); c.sendall(chunk)
    c.sendall(b"total %d\\n" % n); c.close()
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
'"""


def free_host_port() -> int:
    """A port nothing listens on here now (so the session's server, on the same number in
    its own namespace, is shown not to be the host's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(client, session: str, template: str, port: int, ready: str) -> dict:
    bg = client.process_start(session, template.format(port=port))
    out = client.process_output(bg["id"], wait_s=60, until=ready)
    assert ready in out["output"], out
    return bg


def fetch(host: str, port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{host}:{port}/{path}", timeout=60) as r:
        return r.read()


def connect(forward: dict) -> socket.socket:
    return socket.create_connection((forward["host"], forward["port"]), timeout=30)


def refused(forward: dict) -> bool:
    try:
        socket.create_connection((forward["host"], forward["port"]), timeout=30).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_server_in_a_network_none_session_is_fetched_from_the_host(daemon, client):
    assert "ports" in client.hello()["features"]
    s = client.session_open(daemon.workspace, network="none")["session"]
    with open(os.path.join(daemon.workspace, "hello.txt"), "w") as f:
        f.write("hello from the sandbox\n")
    port = free_host_port()
    start_server(client, s, "python3 -m http.server {port} --bind 127.0.0.1", port, "Serving")
    # The session's own loopback: the host's port of that number has nothing on it.
    assert refused({"host": "127.0.0.1", "port": port})
    forward = client.port_forward(s, port)
    assert forward["host"] == "127.0.0.1" and forward["port"] != port
    assert fetch(forward["host"], forward["port"], "hello.txt") == b"hello from the sandbox\n"
    listed = [x for x in client.session_list()["sessions"] if x["session"] == s][0]
    assert listed["forwards"] == [{"port": port, "host": "127.0.0.1",
                                   "host_port": forward["port"]}]
    # Asked again with the same bind: the same listener.
    assert client.port_forward(s, port) == forward


def test_a_server_bound_to_ipv6_loopback_only_is_reached_too(daemon, client):
    # `localhost` may mean ::1 alone to a server (node's, since 17): refused on 127.0.0.1,
    # the connect inside tries [::1].
    s = client.session_open(daemon.workspace)["session"]
    with open(os.path.join(daemon.workspace, "six.txt"), "w") as f:
        f.write("over ipv6\n")
    bg = client.process_start(s, "python3 -m http.server 8000 --bind ::1")
    out = client.process_output(bg["id"], wait_s=60, until="Serving|Error|error")
    if "Serving" not in out["output"]:
        pytest.skip(f"no IPv6 loopback in the sandbox: {out['output'][-200:]}")
    forward = client.port_forward(s, 8000)
    assert fetch(forward["host"], forward["port"], "six.txt") == b"over ipv6\n"


def test_a_hundred_connections_at_once_each_get_the_whole_file(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    data = os.urandom(1 << 20)
    with open(os.path.join(daemon.workspace, "blob"), "wb") as f:
        f.write(data)
    start_server(client, s, HTTP_SERVER, 8000, "Serving")
    forward = client.port_forward(s, 8000)
    with concurrent.futures.ThreadPoolExecutor(100) as pool:
        got = list(pool.map(lambda _: fetch(forward["host"], forward["port"], "blob"),
                            range(100)))
    want = hashlib.sha256(data).hexdigest()
    assert [hashlib.sha256(g).hexdigest() for g in got] == [want] * 100


def test_a_port_nothing_listens_on_fails_the_connection(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    forward = client.port_forward(s, 9)
    with connect(forward) as c:
        # Reset, not an open connection that never answers (the timeout is a safety net).
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert c.recv(100) == b"", "the connection was not reset"
    # The forward itself stays, for a server that is still starting.
    assert client.session_list()["sessions"][0]["forwards"][0]["port"] == 9


def test_a_half_close_passes_through_and_bytes_come_back_in_order(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    start_server(client, s, ECHO_SERVER, 7000, "listening")
    forward = client.port_forward(s, 7000)
    payload = os.urandom(3 << 20)
    with connect(forward) as c:
        got = bytearray()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            def read_all():
                while chunk := c.recv(1 << 16):
                    got.extend(chunk)
            reading = pool.submit(read_all)
            c.sendall(payload)
            c.shutdown(socket.SHUT_WR)
            reading.result(timeout=60)
    assert bytes(got) == payload + b"total %d\n" % len(payload)


def test_close_ends_the_forward_and_the_connections_it_carries(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    start_server(client, s, ECHO_SERVER, 7000, "listening")
    forward = client.port_forward(s, 7000)
    held = connect(forward)
    held.sendall(b"ping")
    assert held.recv(4) == b"ping"
    assert client.port_close(s, 7000) == {}
    try:
        assert held.recv(100) == b""  # ended by the daemon, as a closed connection reads
    except ConnectionResetError:
        pass
    finally:
        held.close()
    assert refused(forward)
    assert client.session_list()["sessions"][0]["forwards"] == []
    with pytest.raises(ToolsdError) as e:
        client.port_close(s, 7000)
    assert e.value.code == "not_found" and "session.list" in e.value.message
    # Forwarded again, it works again (the server never noticed).
    again = client.port_forward(s, 7000)
    with connect(again) as c:
        c.sendall(b"pong")
        assert c.recv(4) == b"pong"


def test_session_close_ends_all_its_forwards_and_leaves_nothing(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    other = client.session_open(daemon.workspace)["session"]
    start_server(client, s, ECHO_SERVER, 7000, "listening")
    start_server(client, other, ECHO_SERVER, 7000, "listening")
    forwards = [client.port_forward(s, 7000), client.port_forward(s, 9)]
    theirs = client.port_forward(other, 7000)
    held = connect(forwards[0])
    held.sendall(b"x")
    assert held.recv(1) == b"x"
    client.session_close(s)
    assert all(refused(f) for f in forwards)
    try:
        assert held.recv(100) == b""
    except ConnectionResetError:
        pass
    finally:
        held.close()
    # Another session's forward is its own.
    with connect(theirs) as c:
        c.sendall(b"y")
        assert c.recv(1) == b"y"
    client.session_close(other)
    assert refused(theirs)
    left = wait_gone([p for p in daemon.tree() if not has_ended(p)], timeout=10)
    assert left == []


@pytest.mark.parametrize("params, words", [
    ({"port": 8000, "bind": "0.0.0.0"}, "--forward-bind 0.0.0.0"),
    ({"port": 8000, "bind": "localhost"}, "not an IP address"),
    ({"port": 0}, "params.port"),
    ({"port": 65536}, "params.port"),
    ({"port": 8000, "host_port": -1}, "params.host_port"),
])
def test_bad_forwards_are_refused_by_name(daemon, client, params, words):
    s = client.session_open(daemon.workspace)["session"]
    with pytest.raises(ToolsdError) as e:
        client.port_forward(s, **params)
    assert e.value.code == "bad_params" and words in e.value.message
    assert client.session_list()["sessions"][0]["forwards"] == []


def test_a_taken_host_port_or_a_second_place_for_one_port_is_refused(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ToolsdError) as e:
            client.port_forward(s, 8000, host_port=taken.getsockname()[1])
        assert e.value.code == "bad_params" and "in use" in e.value.message
    first = client.port_forward(s, 8000)
    with pytest.raises(ToolsdError) as e:
        client.port_forward(s, 8000, host_port=free_host_port())
    assert e.value.code == "bad_params" and str(first["port"]) in e.value.message
    with pytest.raises(ToolsdError) as e:
        client.port_forward("s-none", 8000)
    assert e.value.code == "not_found"


def test_forward_bind_lets_a_forward_listen_beyond_loopback(daemon_root):
    d = RunningDaemon(daemon_root, extra_args=("--forward-bind", "0.0.0.0")).start()
    try:
        with d.client() as c:
            s = c.session_open(d.workspace)["session"]
            start_server(c, s, ECHO_SERVER, 7000, "listening")
            forward = c.port_forward(s, 7000, bind="0.0.0.0")
            assert forward["host"] == "0.0.0.0"
            with socket.create_connection(("127.0.0.1", forward["port"]), timeout=30) as conn:
                conn.sendall(b"z")
                assert conn.recv(1) == b"z"
            with pytest.raises(ToolsdError) as e:
                c.port_forward(s, 7001, bind="192.0.2.1")  # named by no --forward-bind
            assert e.value.code == "bad_params"
            c.session_close(s)
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_forward_bind_that_is_no_address_stops_the_daemon_at_start(daemon_root):
    run = subprocess.run([sys.executable, "-m", "toolsd", "serve", "--socket",
                          os.path.join(daemon_root, "s.sock"), "--forward-bind", "everywhere"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--forward-bind 'everywhere'" in run.stderr


def test_toolsd_forward_prints_the_address_and_closes_on_ctrl_c(daemon, client):
    s = client.session_open(daemon.workspace)["session"]
    start_server(client, s, ECHO_SERVER, 7000, "listening")
    cli = subprocess.Popen([sys.executable, "-m", "toolsd", "forward", "--socket",
                            daemon.socket, s, "7000"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        line = cli.stdout.readline()
        assert f"port 7000 of session {s}" in line, line + cli.stderr.read()
        address = line.split()[1]  # "http://127.0.0.1:NNNN"
        port = int(address.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(b"q")
            assert conn.recv(1) == b"q"
        cli.send_signal(2)
        assert cli.wait(timeout=60) == 0
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        cli.stdout.close()
        cli.stderr.close()
    assert client.session_list()["sessions"][0]["forwards"] == []
    assert refused({"host": "127.0.0.1", "port": port})


def test_toolsd_forward_refuses_an_unknown_session_clearly(daemon):
    run = subprocess.run([sys.executable, "-m", "toolsd", "forward", "--socket", daemon.socket,
                          "s-none", "7000"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "not_found" in run.stderr and "s-none" in run.stderr
