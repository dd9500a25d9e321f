"""TCP with TLS and tokens (protocol 1.2): what a stranger on the network gets. Every way in
without the right token and the right TLS is refused or closed, costs the daemon little, and
leaves the authenticated clients and the sessions as they were."""

from __future__ import annotations

import os
import resource
import socket
import ssl
import struct

import msgspec
import psutil
import pytest

from conftest import RunningDaemon, wait_for
from toolsd.client import Client, ToolsdError
from toolsd.client.remote import CertificateMismatch

pytestmark = pytest.mark.daemon(shared=True, tls=True)

WRONG = "a-wrong-token-of-enough-length"


def host_port(daemon) -> tuple[str, int]:
    host, _, port = daemon.url.removeprefix("tls://").rpartition(":")
    return host, int(port)


# Raw connections come from another loopback address than the clients' 127.0.0.1: the
# failures they make count against their own address (ratelimit.py), never against the
# clients of the other tests of the module.
STRANGER = ("127.0.0.2", 0)


def raw_tls(daemon, maximum: ssl.TLSVersion | None = None) -> ssl.SSLSocket:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if maximum is not None:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.maximum_version = maximum
    sock = socket.create_connection(host_port(daemon), timeout=30, source_address=STRANGER)
    return context.wrap_socket(sock)


def frame(obj) -> bytes:
    body = msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(body)) + body


def read_reply(sock) -> dict | None:
    """The next frame, or None at end of stream."""
    buf = b""
    while True:
        if len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            return msgspec.msgpack.decode(buf[4:4 + struct.unpack(">I", buf[:4])[0]])
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            data = b""
        if not data:
            return None
        buf += data


def closed(sock) -> bool:
    """The daemon closed the connection (waits for it, bounded by the socket's timeout)."""
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
        return True


def test_the_right_token_and_fingerprint_authenticate_as_tenant_default(daemon):
    with daemon.client("tls") as c:
        assert c.server_hello["tenant"] == "default"
        assert {"tcp", "tenants"} <= set(c.server_hello["features"])
    with daemon.client() as local:
        assert local.hello()["tenant"] == "local"


def test_wrong_token_is_unauthorized_then_closed(daemon):
    with pytest.raises(ToolsdError) as e:
        Client(daemon.url, token=WRONG, fingerprint=daemon.fingerprint)
    assert e.value.code == "unauthorized" and "wrong token" in e.value.message
    sock = raw_tls(daemon)
    sock.sendall(frame({"id": 1, "method": "hello", "params": {"token": WRONG}}))
    assert read_reply(sock)["error"]["code"] == "unauthorized"
    assert closed(sock)


def test_no_token_is_unauthorized(daemon):
    with pytest.raises(ToolsdError) as e:
        Client(daemon.url, fingerprint=daemon.fingerprint)
    assert e.value.code == "unauthorized" and "no token" in e.value.message


def test_a_first_frame_other_than_hello_does_nothing(daemon):
    sock = raw_tls(daemon)
    sock.sendall(frame({"id": 7, "method": "session.open",
                        "params": {"workspace": daemon.workspace, "token": daemon.token}}))
    reply = read_reply(sock)
    assert reply["id"] == 7 and reply["error"]["code"] == "unauthorized"
    assert closed(sock)
    with daemon.client() as local:
        assert local.session_list()["sessions"] == []


def test_wrong_fingerprint_is_refused_before_the_token_is_sent(daemon):
    other = "sha256:" + "ab" * 32
    logged = len(daemon.read_log())
    with pytest.raises(CertificateMismatch) as e:
        Client(daemon.url, token=daemon.token, fingerprint=other)
    assert daemon.fingerprint in e.value.message and "not sent" in e.value.message
    with daemon.client("tls") as c:  # and it is well
        assert c.hello()["tenant"] == "default"
    # The daemon saw a TLS connection close without a frame: no token reached it, so it
    # neither refused one nor let one in before the good client's.
    since = daemon.read_log()[logged:]
    assert "refused a TLS connection" not in since
    assert since.count("tenant default connected") == 1


def test_plain_tcp_without_tls_is_closed_without_an_answer(daemon):
    sock = socket.create_connection(host_port(daemon), timeout=30, source_address=STRANGER)
    sock.sendall(frame({"id": 1, "method": "hello", "params": {"token": daemon.token}}))
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    # Nothing a toolsd client could read as a reply (at most a TLS alert record).
    assert not data or data[0] == 0x15
    with daemon.client("tls") as c:
        assert c.hello()["protocol"] == 1


def test_tls_1_2_is_refused(daemon):
    with pytest.raises(ssl.SSLError):
        raw_tls(daemon, maximum=ssl.TLSVersion.TLSv1_2)


def test_a_1_gib_length_prefix_before_authentication_is_refused_unread(daemon):
    sock = raw_tls(daemon)
    sock.sendall(struct.pack(">I", 1 << 30) + b"\x00" * 1024)
    reply = read_reply(sock)
    assert reply["id"] == 0 and reply["error"]["code"] == "frame_too_large"
    assert "before authentication" in reply["error"]["message"]
    assert closed(sock)


def test_a_connection_that_sends_no_whole_first_frame_is_closed(daemon):
    sock = raw_tls(daemon)
    sock.sendall(b"\x00\x00")  # half a length prefix, then nothing
    assert closed(sock)  # after the daemon's 10 s; the socket's timeout is 30 s


def test_failed_tokens_are_rate_limited_per_address(daemon_root):
    d = RunningDaemon(daemon_root, tls=True).start()
    try:
        refusals = []
        for _ in range(20):
            try:
                Client(d.url, token=WRONG, fingerprint=d.fingerprint)
            except ToolsdError as e:
                refusals.append(e.message)
        assert all("wrong token" in m for m in refusals[:10])
        assert "too many failed attempts" in refusals[-1]
        # Out of tries, the right token is refused too: guessing cannot go faster.
        with pytest.raises(ToolsdError) as e:
            Client(d.url, token=d.token, fingerprint=d.fingerprint)
        assert "too many failed attempts" in e.value.message
        with d.client() as local:  # the Unix socket is not a network peer
            assert local.hello()["tenant"] == "local"
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_thousand_unauthenticated_connections_cost_little_and_block_no_one(daemon):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    proc = psutil.Process(daemon.proc.pid)
    with daemon.client("tls") as before:
        session = before.session_open(daemon.workspace)["session"]
        before.shell_run(session, "true")
        fds, rss = proc.num_fds(), proc.memory_info().rss
        strangers = []
        try:
            for n in range(1000):
                if n % 2:  # half of them finish the TLS handshake and then say nothing
                    sock = raw_tls(daemon)
                    if n % 4 == 1:
                        sock.sendall(struct.pack(">I", 4000) + b"\x00" * 3000)
                else:
                    sock = socket.create_connection(host_port(daemon), timeout=30,
                                                    source_address=STRANGER)
                strangers.append(sock)
            wait_for(lambda: proc.num_fds() >= fds + 1000)
            grown = proc.memory_info().rss - rss
            assert grown < 32 << 20, f"1,000 strangers cost the daemon {grown >> 20} MiB"
            # Meanwhile the authenticated client and a newcomer are served as usual.
            assert before.shell_run(session, "echo still")["output"] == "still\n"
            with daemon.client("tls") as newcomer:
                assert newcomer.shell_run(session, "echo new")["output"] == "new\n"
        finally:
            for sock in strangers:
                sock.close()
        before.session_close(session)
    assert daemon.proc.poll() is None


def test_the_certificate_and_token_survive_a_restart(daemon_root):
    first = RunningDaemon(daemon_root, tls=True).start()
    assert first.stop() == 0
    again = RunningDaemon(daemon_root, tls=True).start()
    try:
        assert (again.fingerprint, again.token) == (first.fingerprint, first.token)
        with again.client("tls") as c:  # a client that pinned it before goes on working
            assert c.server_hello["tenant"] == "default"
    finally:
        assert again.stop() == 0, again.read_log()


def make_ca_and_server(folder: str) -> tuple[str, str, str]:
    """A CA, and a certificate for 127.0.0.1 signed by it: (ca, cert, key) PEM paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def build(subject, issuer, key, signer, ca: bool, names=None):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(days=1))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if names:
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = build(ca_name, ca_name, ca_key, ca_key, True)
    cert = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "toolsd test")]), ca_name,
                 key, ca_key, False, [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    paths = [os.path.join(folder, n) for n in ("ca.pem", "cert.pem", "key.pem")]
    for path, data in zip(paths, (ca.public_bytes(serialization.Encoding.PEM),
                                  cert.public_bytes(serialization.Encoding.PEM),
                                  key.private_bytes(serialization.Encoding.PEM,
                                                    serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))):
        with open(path, "wb") as f:
            f.write(data)
    return paths[0], paths[1], paths[2]


def test_a_given_certificate_trusted_through_a_ca_file(daemon_root):
    ca, cert, key = make_ca_and_server(daemon_root)
    d = RunningDaemon(daemon_root, extra_args=("--tls-cert", cert, "--tls-key", key),
                      tls=True).start()
    try:
        with Client(d.url, token=d.token, cafile=ca) as c:
            assert c.server_hello["tenant"] == "default"
        other_ca = make_ca_and_server(os.path.join(daemon_root, "ws"))[0]
        with pytest.raises(ToolsdError) as e:  # a CA that did not sign it: refused
            Client(d.url, token=d.token, cafile=other_ca)
        assert e.value.code == "connection_lost" and "CERTIFICATE_VERIFY_FAILED" in \
            e.value.message
    finally:
        assert d.stop() == 0, d.read_log()


@pytest.mark.parametrize("body", [
    b"", b"\xc1", msgspec.msgpack.encode([1, "hello", {}]),
    msgspec.msgpack.encode({"id": -1, "method": "hello", "params": {"token": "x"}}),
    msgspec.msgpack.encode({"id": 1, "method": "hello", "params": ["token"]}),
    msgspec.msgpack.encode({"id": 1, "method": "hello", "params": {"token": 12345}}),
    msgspec.msgpack.encode({"id": 1, "method": "hello", "params": {"token": "y" * 4000}}),
    msgspec.msgpack.encode({"id": 1, "method": "cancel", "params": {"request": 1}}),
    b"\x91" * 4000,
], ids=["empty", "not-msgpack", "array", "negative-id", "params-list", "token-int",
        "token-huge", "cancel", "nested"])
def test_a_malformed_first_frame_is_refused_and_harms_no_one(daemon, body):
    sock = raw_tls(daemon)
    sock.sendall(struct.pack(">I", len(body)) + body)
    reply = read_reply(sock)
    assert reply is None or reply["error"]["code"] in ("bad_frame", "unauthorized")
    assert closed(sock)
    with daemon.client("tls") as c:
        assert c.hello()["tenant"] == "default"
