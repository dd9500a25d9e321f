"""Upstream servers on loopback for the egress tests, and the test resolver's file.

Nothing here reaches beyond the machine: servers listen on 127.0.0.1 and 127.0.0.2 only, and
the daemon under test resolves names from the file written here, never from a real resolver.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import ipaddress
import json
import os
import ssl
import subprocess
import tarfile
import threading
import zipfile

import psutil

ORIGIN = "127.0.0.2"  # the one address the test resolver exempts from the address check
BLOCKED_LOCAL = "127.0.0.1"  # a server here too: a broken filter would reach it


class Counting(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.requests.append((self.path, self.headers.get("Host")))
        super().do_GET()


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, folder: str, context: ssl.SSLContext | None = None):
        self.requests: list = []
        self.folder = folder
        super().__init__(address, lambda *a: Counting(*a, directory=folder))
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True)

    def start(self) -> Server:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self


def free_port_on_both() -> int:
    import socket
    for _ in range(50):
        with socket.socket() as a:
            a.bind((ORIGIN, 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind((BLOCKED_LOCAL, port))
                except OSError:
                    continue
        return port
    raise RuntimeError("no port free on both loopback addresses")


def make_cert(folder: str) -> tuple[str, str]:
    cert, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    key, "-out", cert, "-days", "2", "-subj", "/CN=allowed.test",
                    "-addext", "subjectAltName=DNS:allowed.test,DNS:other.test"],
                   check=True, capture_output=True)
    return cert, key


def own_address() -> str | None:
    """An address of this host that is neither loopback nor link-local, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            try:
                ip = ipaddress.ip_address(a.address.split("%")[0])
            except ValueError:
                continue
            if ip.version == 4 and not ip.is_loopback and not ip.is_link_local:
                return str(ip)
    return None


def resolver_file(folder: str) -> tuple[str, str]:
    """(the resolver's file, the file it logs every name it was asked about to)."""
    log = os.path.join(folder, "queries.log")
    names = {n: [ORIGIN] for n in ("allowed.test", "other.test", "evil.test", "example.test",
                                   "a.example.test", "no.example.test",
                                   "xn--bcher-kva.idn.test", "ok.idn.test")}
    names.update({"rebind.test": [BLOCKED_LOCAL], "meta.test": ["169.254.169.254"],
                  "lan.test": ["10.0.0.1"], "mixed.test": [ORIGIN, BLOCKED_LOCAL]})
    own = own_address()
    if own:
        names["own.test"] = [own]
    path = os.path.join(folder, "resolver.json")
    with open(path, "w") as f:
        json.dump({"names": names, "exempt": [ORIGIN], "log": log}, f)
    return path, log


def write_index(root: str, host: str) -> None:
    """A Python package index (PEP 503) and an npm registry with one package each."""
    files = {"egress_probe/__init__.py": b"VALUE = 42\n",
             "egress_probe-1.0.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: egress-probe\nVersion: 1.0\n",
             "egress_probe-1.0.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()) + "egress_probe-1.0.dist-info/RECORD,,\n"
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("egress_probe-1.0.dist-info/RECORD", record)
    wheel_name = "egress_probe-1.0-py3-none-any.whl"
    os.makedirs(os.path.join(root, "files"), exist_ok=True)
    os.makedirs(os.path.join(root, "simple", "egress-probe"), exist_ok=True)
    with open(os.path.join(root, "files", wheel_name), "wb") as f:
        f.write(wheel.getvalue())
    digest = hashlib.sha256(wheel.getvalue()).hexdigest()
    with open(os.path.join(root, "simple", "egress-probe", "index.html"), "w") as f:
        f.write(f'<a href="/files/{wheel_name}#sha256={digest}">{wheel_name}</a>\n')

    package = json.dumps({"name": "egress-probe", "version": "1.0.0"}).encode()
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as t:
        for name, data in (("package/package.json", package),
                           ("package/index.js", b"module.exports = 42;\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    tarball = tgz.getvalue()
    os.makedirs(os.path.join(root, "egress-probe", "-"), exist_ok=True)
    with open(os.path.join(root, "egress-probe", "-", "egress-probe-1.0.0.tgz"), "wb") as f:
        f.write(tarball)
    doc = {"name": "egress-probe", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": {
        "name": "egress-probe", "version": "1.0.0",
        "dist": {"tarball": f"http://{host}/egress-probe/-/egress-probe-1.0.0.tgz",
                 "shasum": hashlib.sha1(tarball).hexdigest(),
                 "integrity": "sha512-" + base64.b64encode(
                     hashlib.sha512(tarball).digest()).decode()}}}}
    with open(os.path.join(root, "egress-probe", "index.html"), "w") as f:
        json.dump(doc, f)


class UpstreamProxy:
    """An HTTP proxy on loopback standing for the one a user's daemon sits behind: it takes
    CONNECT and absolute-form GET, goes to `names` (name -> address), and records what it
    was asked for."""

    def __init__(self, names: dict[str, str]):
        import socket
        self.names = names
        self.asked: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.3", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        import socket
        import urllib.parse
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            line, _, rest = head.partition(b"\r\n")
            method, target, version = line.decode().split(" ")
            self.asked.append(f"{method} {target}")
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
            else:
                url = urllib.parse.urlsplit(target)
                host, port = url.hostname, url.port or 80
            upstream = socket.create_connection((self.names[host], int(port)))
            if method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
                extra = head.partition(b"\r\n\r\n")[2]
            else:
                path = urllib.parse.urlsplit(target).path or "/"
                extra = f"{method} {path} {version}\r\n".encode() + rest
            with upstream:
                upstream.sendall(extra)
                threading.Thread(target=_pump, args=(conn, upstream), daemon=True).start()
                _pump(upstream, conn)

    def close(self):
        self.sock.close()


def _pump(src, dst):
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(1)
        except OSError:
            pass
