"""Egress by domain (protocol 1.2): a session reaches the names it was allowed and nothing else.

The daemon resolves names with a test resolver (toolsd serve --test-resolver) that maps
`*.test` names to loopback and exempts exactly one address, 127.0.0.2, where the tests' own
servers listen; another server on 127.0.0.1 shows that refused connections reach nothing.
No traffic leaves the machine, even with the filter broken."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest

import _egress_servers as servers
from conftest import RunningDaemon, needs_bwrap, short_tempdir, wait_for

pytestmark = needs_bwrap


class World:
    """The module's daemon and loopback servers."""

    def __init__(self):
        self.root = short_tempdir()
        self.www = os.path.join(self.root, "www")
        os.makedirs(self.www)
        self.port = servers.free_port_on_both()
        servers.write_index(self.www, f"allowed.test:{self.port}")
        with open(os.path.join(self.www, "hello.txt"), "w") as f:
            f.write("hello from allowed.test\n")
        with open(os.path.join(self.www, "big.bin"), "wb") as f:
            f.write(os.urandom(1 << 20) * 16)
        self.origin = servers.Server((servers.ORIGIN, self.port), self.www).start()
        self.blocked = servers.Server((servers.BLOCKED_LOCAL, self.port), self.www).start()
        self.tls_port = None
        if shutil.which("openssl"):
            import ssl
            self.cert, key = servers.make_cert(self.root)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.cert, key)
            self.tls = servers.Server((servers.ORIGIN, 0), self.www, context).start()
            self.tls_port = self.tls.server_address[1]
        self.resolver, self.queries = servers.resolver_file(self.root)
        self.daemon = RunningDaemon(os.path.join(self.root, "d"),
                                    extra_args=("--test-resolver", self.resolver)).start()
        self.client = self.daemon.client()
        self.ports = [self.port] + ([self.tls_port] if self.tls_port else [])

    def open(self, allow=("allowed.test",), deny=(), ports=None, network=None) -> str:
        workspace = tempfile.mkdtemp(dir=self.root)
        if self.tls_port:
            shutil.copy(self.cert, os.path.join(workspace, "cert.pem"))
        if network is None:
            network = {"allow": list(allow), "deny": list(deny), "ports": ports or self.ports}
        return self.client.session_open(workspace, network=network)["session"]

    def run(self, session: str, command: str, **kw) -> dict:
        return self.client.shell_run(session, command, timeout_s=kw.pop("timeout_s", 60), **kw)

    def asked(self) -> list[str]:
        if not os.path.exists(self.queries):
            return []
        with open(self.queries) as f:
            return f.read().split()

    def close(self):
        try:
            self.client.close()
            assert self.daemon.stop() == 0, self.daemon.read_log()
        finally:
            for s in (self.origin, self.blocked, getattr(self, "tls", None)):
                if s is not None:
                    s.shutdown()
                    s.server_close()
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def world():
    w = World()
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def session(world):
    s = world.open()
    yield s
    world.client.session_close(s)


def curl(url: str, *options: str) -> str:
    return f"curl -sS --max-time 20 {' '.join(options)} {url}; echo \" rc=$?\""


def entries(world, session) -> list[dict]:
    return world.client.session_network(session)["entries"]


# ---------------------------------------------------------------- allowed


def test_an_allowed_name_works_over_http_proxy_and_is_logged(world, session):
    r = world.run(session, curl(f"http://allowed.test:{world.port}/hello.txt"))
    assert "hello from allowed.test" in r["output"] and "rc=0" in r["output"]
    assert "network_denied" not in r
    [entry] = entries(world, session)
    assert (entry["host"], entry["port"], entry["verdict"]) == ("allowed.test", world.port,
                                                               "allowed")
    assert entry["received"] > len("hello from allowed.test") and entry["sent"] > 0
    assert world.origin.requests[-1] == ("/hello.txt", f"allowed.test:{world.port}")


def test_an_allowed_name_works_over_connect_with_tls(world, session):
    if not world.tls_port:
        pytest.skip("openssl is not installed to make the test server's certificate")
    r = world.run(session, curl(f"https://allowed.test:{world.tls_port}/hello.txt",
                                "--cacert cert.pem"))
    assert "hello from allowed.test" in r["output"], r["output"]
    assert entries(world, session)[-1]["verdict"] == "allowed"


def test_an_allowed_name_works_over_socks5h(world, session):
    r = world.run(session, curl(f"http://allowed.test:{world.port}/hello.txt",
                                "--proxy socks5h://127.0.0.1:1080"))
    assert "hello from allowed.test" in r["output"], r["output"]


def test_python_urllib_and_dns_of_an_allowed_name(world, session):
    r = world.run(session, "python3 -c \"import socket, urllib.request; "
                  f"print(urllib.request.urlopen('http://allowed.test:{world.port}/hello.txt')"
                  ".read().decode()); print(socket.gethostbyname('allowed.test'))\"")
    assert "hello from allowed.test" in r["output"] and "127.0.0.2" in r["output"], r["output"]


def test_pip_installs_from_an_index_through_the_proxy(world, session):
    index = (f"--cert cert.pem --index-url https://allowed.test:{world.tls_port}/simple/"
             if world.tls_port else f"--trusted-host allowed.test --index-url "
             f"http://allowed.test:{world.port}/simple/")
    r = world.run(session, "PIP_CONFIG_FILE=/dev/null python3 -m pip install -q "
                  "--no-cache-dir --disable-pip-version-check --target /tmp/t "
                  f"--root-user-action=ignore {index} egress-probe 2>&1 | grep -v pyenv; "
                  "PYTHONPATH=/tmp/t python3 -c 'import egress_probe; print(egress_probe.VALUE)'",
                  timeout_s=120)
    assert r["output"].strip() == "42", r["output"]


def test_npm_installs_from_a_registry_through_the_proxy(world, session):
    if not shutil.which("npm"):
        pytest.skip("npm is not installed")
    r = world.run(session, f"cd /tmp && npm install --registry http://allowed.test:{world.port}/ "
                  "--cache /tmp/npm-cache --no-audit --no-fund --no-update-notifier "
                  "--prefix /tmp/n egress-probe >/tmp/npm.log 2>&1; "
                  "node -e \"console.log(require('/tmp/n/node_modules/egress-probe'))\" "
                  "|| cat /tmp/npm.log", timeout_s=120)
    assert r["output"].strip().endswith("42"), r["output"]


# ---------------------------------------------------------------- refused names


def test_a_name_not_allowed_is_refused_everywhere_and_never_resolved(world, session):
    r = world.run(session, "; ".join([
        curl(f"http://evil.test:{world.port}/"),
        curl(f"http://evil.test:{world.port}/", "--proxy socks5h://127.0.0.1:1080"),
        "getent hosts evil.test; echo dns rc=$?"]))
    out = r["output"]
    assert "evil.test is not in the session's allow list" in out  # the 403's body
    assert "rc=97" in out  # curl: the SOCKS proxy refused the connection
    assert "dns rc=2" in out  # the DNS stub answered REFUSED
    assert r["network_denied"] == [
        f"evil.test:{world.port}: evil.test is not in the session's allow list",
        "evil.test:53: evil.test is not in the session's allow list (DNS query refused)"]
    assert "evil.test" not in world.asked()
    assert not any(h and h.startswith("evil.test") for _p, h in world.origin.requests)


def test_a_wildcard_allows_names_under_it_and_not_itself_and_deny_wins(world):
    s = world.open(allow=["*.example.test"], deny=["no.example.test"])
    try:
        r = world.run(s, "; ".join(curl(f"http://{h}:{world.port}/hello.txt")
                                   for h in ("a.example.test", "example.test",
                                             "no.example.test")))
        assert r["output"].count("hello from allowed.test") == 1
        assert r["network_denied"] == [
            f"example.test:{world.port}: example.test is not in the session's allow list",
            f"no.example.test:{world.port}: no.example.test is denied by the session's "
            f"deny list"]
        assert "example.test" not in world.asked() and "no.example.test" not in world.asked()
    finally:
        world.client.session_close(s)


def test_international_and_trailing_dot_spellings_of_a_denied_name(world):
    s = world.open(allow=["*.idn.test"], deny=["bücher.idn.test"])
    try:
        r = world.run(s, "; ".join(
            [curl(f"http://{h}:{world.port}/hello.txt") for h in
             ("xn--bcher-kva.idn.test", "XN--BCHER-KVA.idn.test.")]
            + ["getent hosts xn--bcher-kva.idn.test.; echo dns rc=$?",
               curl(f"http://ok.idn.test.:{world.port}/hello.txt")]))
        assert r["output"].count("hello from allowed.test") == 1, r["output"]
        assert "dns rc=2" in r["output"]
        assert all("xn--bcher-kva.idn.test" in line for line in r["network_denied"])
        assert "xn--bcher-kva.idn.test" not in world.asked()
    finally:
        world.client.session_close(s)


RAW = """
import socket, sys
for target in sys.argv[1:]:
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"GET http://%s/hello.txt HTTP/1.1\\r\\n\\r\\n" % target.encode())
    print(target, s.recv(4096).decode().splitlines()[0])
"""


def write(world, session, name: str, text: str) -> None:
    [workspace] = [x["workspace"] for x in world.client.session_list()["sessions"]
                   if x["session"] == session]
    with open(os.path.join(workspace, name), "w") as f:
        f.write(text)


def test_ip_literals_are_refused_unless_a_cidr_allows_them(world, session):
    forms = [f"{h}:{world.port}" for h in ("127.0.0.2", "2130706434", "0x7f.0.0.2",
                                           "0177.0.0.2", "127.2", "[::1]")]
    write(world, session, "raw.py", RAW)
    r = world.run(session, "python3 raw.py " + " ".join(forms))
    assert r["output"].count("403 Forbidden") == len(forms), r["output"]
    log = entries(world, session)
    assert [e["host"] for e in log] == ["127.0.0.2"] * 5 + ["::1"]
    assert all("allowed only by a CIDR entry" in e["why"] for e in log)
    s = world.open(allow=["127.0.0.2/32"])
    try:
        write(world, s, "raw.py", RAW)
        r = world.run(s, f"python3 raw.py 2130706434:{world.port} 127.0.0.1:{world.port}")
        assert "200 OK" in r["output"] and "403 Forbidden" in r["output"], r["output"]
        assert r["network_denied"] == [f"127.0.0.1:{world.port}: 127.0.0.1 is an IP address, "
                                       f"allowed only by a CIDR entry of allow"]
    finally:
        world.client.session_close(s)


def test_an_allowed_name_resolving_to_a_private_address_is_refused(world):
    names = ["rebind.test", "meta.test", "lan.test", "mixed.test"] + (
        ["own.test"] if servers.own_address() else [])
    s = world.open(allow=names)
    try:
        before = len(world.blocked.requests)
        r = world.run(s, "; ".join(curl(f"http://{h}:{world.port}/hello.txt") for h in names)
                      + "; getent hosts rebind.test; echo dns rc=$?")
        assert "hello from allowed.test" not in r["output"]
        assert "dns rc=2" in r["output"]
        denied = "\n".join(r["network_denied"])
        assert f"rebind.test resolves to {servers.BLOCKED_LOCAL}, a loopback address" in denied
        assert "meta.test resolves to 169.254.169.254, a link-local address" in denied
        assert "lan.test resolves to 10.0.0.1, a private address" in denied
        assert "mixed.test resolves to 127.0.0.1, a loopback address" in denied
        if "own.test" in names:
            assert "an address of this host" in denied
        assert len(world.blocked.requests) == before  # nothing reached 127.0.0.1
    finally:
        world.client.session_close(s)


TUNNEL = """
import socket, ssl, sys
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT allowed.test:%d HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n" % {port})
print(s.recv(100).split(b"\\r\\n")[0].decode())
ctx = ssl.create_default_context(cafile="cert.pem")
ctx.check_hostname = False
try:
    t = ctx.wrap_socket(s, server_hostname=sys.argv[1])
    t.sendall(b"GET /hello.txt HTTP/1.0\\r\\n\\r\\n")
    data = b""
    try:
        while chunk := t.recv(4096):
            data += chunk
    except ssl.SSLError:
        pass
    print(data.decode().splitlines()[-1])
except (ssl.SSLError, OSError) as e:
    print("handshake failed:", type(e).__name__)
"""


def test_a_tls_server_name_other_than_the_connect_host_is_refused(world, session):
    if not world.tls_port:
        pytest.skip("openssl is not installed to make the test server's certificate")
    write(world, session, "tunnel.py", TUNNEL.replace("{port}", str(world.tls_port)))
    ok = world.run(session, "python3 tunnel.py allowed.test")
    assert "hello from allowed.test" in ok["output"], ok["output"]
    bad = world.run(session, "python3 tunnel.py other.test")
    assert "200 Connection established" in bad["output"]
    assert "handshake failed" in bad["output"], bad["output"]
    assert bad["network_denied"] == [
        f"allowed.test:{world.tls_port}: the TLS server name 'other.test' does not match the "
        f"host asked for, allowed.test"]


def test_a_host_header_other_than_the_request_host_is_refused(world, session):
    r = world.run(session, "printf 'GET http://allowed.test:%d/hello.txt HTTP/1.1\\r\\n"
                  "Host: evil.test\\r\\n\\r\\n' " + str(world.port) + " | "
                  "python3 -c \"import socket,sys; s=socket.create_connection(('127.0.0.1',"
                  "3128)); s.sendall(sys.stdin.buffer.read()); print(s.recv(4096).decode())\"")
    assert "403 Forbidden" in r["output"] and "hello from" not in r["output"]
    assert "the Host header 'evil.test' does not match" in r["network_denied"][0]


def test_programs_ignoring_the_proxy_fail_at_once(world, session):
    r = world.run(session, curl(f"http://allowed.test:{world.port}/hello.txt",
                                "--noproxy '*'") + "; python3 -c \"import socket; "
                  "socket.create_connection(('192.0.2.1', 80), timeout=30)\" 2>&1 | tail -1")
    assert "rc=7" in r["output"]  # curl: could not connect
    assert "Network is unreachable" in r["output"]
    assert not r["timed_out"]


def test_killing_everything_inside_keeps_the_filter(world, session):
    world.run(session, "pkill -9 -f . ; kill -9 -1; true")
    r = world.run(session, curl(f"http://allowed.test:{world.port}/hello.txt") + "; "
                  + curl(f"http://evil.test:{world.port}/") + "; python3 -c \"import socket; "
                  "socket.create_connection(('192.0.2.1', 80))\" 2>&1 | tail -1")
    assert "hello from allowed.test" in r["output"]
    assert "evil.test is not in the session's allow list" in r["output"]
    assert "Network is unreachable" in r["output"]
    # Nothing of the proxy runs inside for the session's code to take over.
    r = world.run(session, "python3 -c \"import socket; s=socket.socket(); "
                  "s.bind(('127.0.0.1', 3128))\" 2>&1 | tail -1")
    assert "Address already in use" in r["output"]


def test_network_none_says_the_network_is_off(world):
    s = world.open(network="none")
    try:
        r = world.run(s, curl(f"http://allowed.test:{world.port}/hello.txt")
                      + "; getent hosts allowed.test; echo dns rc=$?")
        assert "network is off for this session" in r["output"] and "dns rc=2" in r["output"]
        assert r["network_denied"] == [
            f"allowed.test:{world.port}: network is off for this session",
            "allowed.test:53: network is off for this session (DNS query refused)"]
        info = [x for x in world.client.session_list()["sessions"] if x["session"] == s]
        assert info[0]["network"] == "none"
    finally:
        world.client.session_close(s)


def test_session_network_lists_both_verdicts_and_results_only_their_own(world, session):
    first = world.run(session, curl(f"http://evil.test:{world.port}/"))
    second = world.run(session, curl(f"http://allowed.test:{world.port}/hello.txt"))
    assert first["network_denied"] and "network_denied" not in second
    log = world.client.session_network(session)
    assert [e["verdict"] for e in log["entries"]] == ["denied", "allowed"]
    assert log["network"] == "filtered" and log["next"] == 2 and log["dropped"] == 0
    assert world.client.session_network(session, since=1)["entries"][0]["host"] == \
        "allowed.test"


def test_bad_entries_are_bad_params_naming_them(world):
    from toolsd.wire.protocol import ToolsdError
    for network, named in [({"allow": ["exa mple.test"]}, "exa mple.test"),
                           ({"allow": ["10.0.0.0/33"]}, "10.0.0.0/33"),
                           ({"allow": ["ok.test"], "ports": [70000]}, "70000"),
                           ({"deny": ["x.test"]}, "allow")]:
        with pytest.raises(ToolsdError) as e:
            world.client.session_open(world.root, network=network)
        assert e.value.code == "bad_params" and named in e.value.message


HOSTILE = """
import socket, sys
held, busy, failed = [], 0, 0
for _ in range(1000):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    except OSError:
        failed += 1
        continue
    held.append(s)
for s in held:
    s.settimeout(0.5)
    try:
        busy += b"503" in s.recv(200)
    except OSError:
        pass
print("done", len(held), busy, failed, flush=True)
__import__("time").sleep(3600)
"""


def test_ten_thousand_connections_are_refused_past_the_limit_and_others_go_on(world, session):
    hostile = world.open()
    procs = []
    try:
        write(world, hostile, "hostile.py", HOSTILE)
        daemon = psutil.Process(world.daemon.proc.pid)
        rss_before = daemon.memory_info().rss
        procs = [world.client.process_start(hostile, "python3 hostile.py")["id"]
                 for _ in range(10)]
        r = world.run(session, curl(f"http://allowed.test:{world.port}/big.bin",
                                    "-o /dev/null -w '%{size_download}'"))
        assert f"{16 << 20} rc=0" in r["output"], r["output"]
        outputs = {}

        def all_done():
            for p in procs:
                outputs[p] = world.client.process_output(p, since=0)["output"]
            return all("done" in o for o in outputs.values())

        wait_for(all_done, timeout=240)
        counts = [list(map(int, o.split()[1:4])) for o in outputs.values()]
        assert sum(c[1] for c in counts) > 0  # refused at the limit with a 503
        assert daemon.num_fds() < 2 * 256 + 300  # not one per hostile connection
        assert daemon.memory_info().rss - rss_before < 200 << 20
        log = world.client.session_network(hostile)["entries"]
        assert any("connections open, its limit" in e["why"] for e in log)
    finally:
        for p in procs:
            world.client.process_stop(p)
        world.client.session_close(hostile)


def toolsd(world, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolsd", "--socket", world.daemon.socket,
                           *args], capture_output=True, text=True, timeout=120,
                          env=world.daemon.env)


def test_toolsd_exec_allow_and_toolsd_net(world, session):
    workspace = tempfile.mkdtemp(dir=world.root)
    url = f"http://allowed.test:{world.port}/hello.txt"
    ok = toolsd(world, "exec", "--workspace", workspace, "--allow", "allowed.test",
                "--allow-port", str(world.port), "--", "curl", "-sS", url)
    assert ok.returncode == 0 and "hello from allowed.test" in ok.stdout, ok.stderr
    off = toolsd(world, "exec", "--workspace", workspace, "--", "curl", "-sS", url)
    assert "hello from" not in off.stdout
    assert "toolsd exec: network refused" in off.stderr
    assert (f"allowed.test:{world.port}: network is off for this session") in off.stderr
    world.run(session, curl(f"http://evil.test:{world.port}/"))
    shown = toolsd(world, "net", session)
    assert shown.returncode == 0, shown.stderr
    assert f"denied   evil.test:{world.port}  evil.test is not in the session's allow list" \
        in shown.stdout


def pypi_reachable() -> str | None:
    """Why the Python package index cannot be reached from here, or None."""
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError as e:
        return f"the Python package index is unreachable from this machine ({e})"
    return None


def test_pip_download_with_only_the_pypi_preset(daemon_root):
    # The one test that leaves the machine: the Python package index's hosts, and only them.
    why = pypi_reachable()
    if why:
        pytest.skip(why)
    from toolsd.wire.egress import network_of
    d = RunningDaemon(daemon_root).start()  # the host's resolver: no test resolver
    try:
        with d.client() as c:
            s = c.session_open(d.workspace, network=network_of([], ["pypi"]))["session"]
            r = c.shell_run(s, "python3 -m pip download --isolated --no-deps --no-cache-dir "
                            "--cert /etc/ssl/certs/ca-certificates.crt --index-url "
                            "https://pypi.org/simple -d /tmp/d six >/dev/null 2>&1; ls /tmp/d",
                            timeout_s=180)
            assert r["output"].startswith("six-"), r["output"]
            hosts = {(e["host"], e["verdict"]) for e in c.session_network(s)["entries"]}
            assert ("files.pythonhosted.org", "allowed") in hosts
            c.session_close(s)
    finally:
        assert d.stop() == 0, d.read_log()


def test_an_upstream_proxy_of_the_daemon_carries_allowed_connections(world, daemon_root):
    upstream = servers.UpstreamProxy({"allowed.test": servers.ORIGIN})
    proxy = f"http://127.0.0.3:{upstream.port}"
    d = RunningDaemon(daemon_root, extra_args=("--test-resolver", world.resolver),
                      env={"HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "NO_PROXY": ""}).start()
    try:
        with d.client() as c:
            workspace = tempfile.mkdtemp(dir=world.root)
            s = c.session_open(workspace, network={"allow": ["allowed.test"],
                                                   "ports": [world.port]})["session"]
            r = c.shell_run(s, "; ".join([
                curl(f"http://allowed.test:{world.port}/hello.txt"),
                curl(f"http://allowed.test:{world.port}/hello.txt",
                     "--proxy socks5h://127.0.0.1:1080"),
                curl(f"http://evil.test:{world.port}/")]))
            assert r["output"].count("hello from allowed.test") == 2, r["output"]
            assert upstream.asked == [f"GET http://allowed.test:{world.port}/hello.txt",
                                      f"CONNECT allowed.test:{world.port}"]
            assert r["network_denied"][0].startswith("evil.test")
            c.session_close(s)
    finally:
        upstream.close()
        assert d.stop() == 0, d.read_log()


IN_TUNNEL = """
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT allowed.test:%s HTTP/1.1\\r\\n\\r\\n" % sys.argv[1].encode())
print(s.recv(100).split(b"\\r\\n")[0].decode())
s.sendall(b"GET /hello.txt HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n" % sys.argv[2].encode())
data = b""
while chunk := s.recv(4096):
    data += chunk
print(data.decode().splitlines()[-1] if data else "closed")
"""


def test_a_host_header_in_a_tunnel_must_name_the_connect_host(world, session):
    write(world, session, "in_tunnel.py", IN_TUNNEL)
    ok = world.run(session, f"python3 in_tunnel.py {world.port} allowed.test:{world.port}")
    assert "hello from allowed.test" in ok["output"], ok["output"]
    bad = world.run(session, f"python3 in_tunnel.py {world.port} evil.test")
    assert bad["output"].split("\n")[:2] == ["HTTP/1.1 200 Connection established", "closed"]
    assert bad["network_denied"] == [f"allowed.test:{world.port}: the Host header 'evil.test' "
                                     f"does not match the request's host allowed.test"]


def test_network_denied_on_repl_exec_and_process_output(world, session):
    turn = world.client.turn_begin(session)["turn"]
    code = ("import urllib.request\ntry:\n    urllib.request.urlopen("
            f"'http://evil.test:{world.port}/')\nexcept Exception as e:\n    print(e)")
    # The first starts the interpreter; the second finds it idle, and is answered by the
    # read of its output (no task of its own): both say what was refused.
    for _ in range(2):
        r = world.client.repl_exec(session, turn, code)
        assert "403" in r["output"]
        assert r["network_denied"] == [
            f"evil.test:{world.port}: evil.test is not in the session's allow list"]
    world.client.turn_end(session, turn)
    bg = world.client.process_start(session, curl(f"http://other.test:{world.port}/"))["id"]
    wait_for(lambda: world.client.process_output(bg, since=0)["status"] == "exited")
    out = world.client.process_output(bg)
    assert out["network_denied"] == [
        f"other.test:{world.port}: other.test is not in the session's allow list"]
    assert "network_denied" not in world.client.process_output(bg)  # reported once


def test_a_session_never_runs_under_a_spare_made_for_another_rule(world, daemon_root):
    from test_warm_spare import sandboxes
    d = RunningDaemon(daemon_root, extra_args=("--test-resolver", world.resolver),
                      warm_spare=True).start()
    try:
        with d.client() as c:
            rule = {"allow": ["allowed.test"], "ports": [world.port]}
            first = c.session_open(d.workspace, network=rule)["session"]
            wait_for(lambda: len(sandboxes(d)) == 2)  # the spare, made for that rule
            other = c.session_open(d.workspace, network={
                "allow": ["other.test"], "ports": [world.port]})["session"]
            r = c.shell_run(other, curl(f"http://allowed.test:{world.port}/hello.txt"))
            assert "hello from" not in r["output"] and r["network_denied"]
            wait_for(lambda: len(sandboxes(d)) == 3)  # a spare for other.test's rule now
            c.session_close(other)
            wait_for(lambda: len(sandboxes(d)) == 2)
            same = c.session_open(d.workspace, network=rule)["session"]
            r = c.shell_run(same, curl(f"http://allowed.test:{world.port}/hello.txt") + "; "
                            + curl(f"http://other.test:{world.port}/hello.txt"))
            assert r["output"].count("hello from allowed.test") == 1, r["output"]
            for s in (first, same):
                c.session_close(s)
    finally:
        assert d.stop() == 0, d.read_log()


SILENT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
if len(sys.argv) > 2:
    s.sendall(b"CONNECT allowed.test:%s HTTP/1.1\\r\\n\\r\\n" % sys.argv[2].encode())
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    s.sendall(b"\\x16\\x03")  # the start of a ClientHello, then a pause
data = b""
while chunk := s.recv(4096):
    data += chunk
print("closed", data[:12])
"""


def test_clients_that_send_too_little_are_closed_and_nothing_unchecked_passes(world,
                                                                               daemon_root):
    if not world.tls_port:
        pytest.skip("openssl is not installed to make the test server's certificate")
    with open(world.resolver) as f:
        spec = json.load(f)
    spec["head_timeout_s"] = 1  # so that the test need not wait 30 s per case
    resolver = os.path.join(daemon_root, "resolver.json")
    with open(resolver, "w") as f:
        json.dump(spec, f)
    d = RunningDaemon(os.path.join(daemon_root, "d"),
                      extra_args=("--test-resolver", resolver)).start()
    try:
        with d.client() as c:
            workspace = tempfile.mkdtemp(dir=world.root)
            with open(os.path.join(workspace, "silent.py"), "w") as f:
                f.write(SILENT)
            s = c.session_open(workspace, network={"allow": ["allowed.test"],
                                                   "ports": [world.tls_port]})["session"]
            before = len(world.tls.requests)
            r = c.shell_run(s, "python3 silent.py 3128; python3 silent.py 1080; "
                            f"python3 silent.py 3128 {world.tls_port}")
            assert r["output"].split("\n")[:3] == ["closed b''"] * 3, r["output"]
            assert len(world.tls.requests) == before
            c.session_close(s)
    finally:
        assert d.stop() == 0, d.read_log()


def test_toolsd_agent_allow_tells_the_model_what_was_refused(world):
    from model_server import Call, ModelServer, openai_stream
    workspace = tempfile.mkdtemp(dir=world.root)
    command = (curl(f"http://allowed.test:{world.port}/hello.txt") + "; "
               + curl(f"http://evil.test:{world.port}/"))
    with ModelServer() as server:
        server.push(openai_stream(text="", calls=[Call("run_terminal", {"command": command})]),
                    openai_stream(text="done"))
        done = subprocess.run(
            [sys.executable, "-m", "toolsd", "agent", "--base-url", server.openai_url,
             "--model", "scripted", "--workspace", workspace, "--socket", world.daemon.socket,
             "--mode", "auto", "--json", "--allow", "allowed.test", "--allow-port",
             str(world.port), "go"], capture_output=True, text=True, timeout=180,
            env=world.daemon.env)
        assert done.returncode == 0, done.stderr
        requests = server.requests
    events = [json.loads(line) for line in done.stdout.splitlines()]
    [result] = [e["text"] for e in events if e["type"] == "tool_result"]
    assert "hello from allowed.test" in result
    assert (f"[network refused evil.test:{world.port}: evil.test is not in the session's "
            f"allow list]") in result
    system = requests[0].body["messages"][0]["content"]
    assert "limited to allowed.test" in system


def test_toolsd_status_counts_a_sessions_refusals(world, session):
    world.run(session, curl(f"http://evil.test:{world.port}/"))
    shown = toolsd(world, "status")
    assert shown.returncode == 0, shown.stderr
    assert f"its network refused 1 connection(s) lately (toolsd net {session} lists them)" \
        in shown.stdout


def test_toolsd_mcp_and_agent_take_the_allow_options(world):
    for command in ("mcp", "agent"):
        shown = toolsd(world, command, "--help")
        assert all(option in shown.stdout for option in
                   ("--allow NAME", "--allow-preset PRESET", "--allow-port PORT")), shown.stdout
    bad = toolsd(world, "mcp", "--allow-preset", "nope")
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr
