"""The blocking client: one request at a time over a blocking socket (Unix, or TCP with
TLS: see remote.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from toolsd.client import copy
from toolsd.client.copy import CopyStats
from toolsd.client.core import (
    CONNECT_WAIT_S,
    RECV_SIZE,
    ClientCore,
    ConnectionLost,
    Methods,
    connect_steps,
)
from toolsd.client.remote import (
    Target,
    check_certificate,
    hello_params,
    refused,
    resolve_target,
    tls_context,
)
from toolsd.wire.events import Event


class Client(Methods):
    """Blocking client; one request at a time (use one Client per thread).

    `url`: `unix:///path`, `tls://host:port` or a socket path (default: $TOOLSD_URL, else
    the default socket); for TLS, `token`, and `fingerprint` or `cafile` (remote.py). A TLS
    client authenticates at once: `server_hello` holds the daemon's hello (its `tenant`)."""

    def __init__(self, url: str | Target | None = None, *, token: str | None = None,
                 fingerprint: str | None = None, cafile: str | None = None,
                 timeout: float | None = None):
        self.target = resolve_target(url, token=token, fingerprint=fingerprint, cafile=cafile)
        self.socket_path = self.target.where
        self._proto = ClientCore()
        self.server_hello: dict | None = None
        wait = CONNECT_WAIT_S if timeout is None else min(timeout, CONNECT_WAIT_S)
        if self.target.tls:
            self._sock = self._connect_tls(wait)
        else:
            connecting = connect_steps(self.socket_path, wait)
            try:
                while True:
                    time.sleep(next(connecting))
            except StopIteration as connected:
                self._sock = connected.value
            finally:
                connecting.close()
        self._sock.settimeout(timeout)
        if self.target.tls:
            try:
                self.server_hello = self.call("hello", **hello_params(self.target))
            except BaseException:
                self.close()
                raise

    def _connect_tls(self, wait: float) -> socket.socket:
        target = self.target
        host, port = target.address.host, target.address.port
        try:
            sock = socket.create_connection((host, port), timeout=wait)
        except OSError as e:
            raise refused(target, e) from None
        # Small frames go out at once: with Nagle's algorithm the hello that follows the
        # handshake waited for a delayed ACK (40 ms on Linux).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tls = tls_context(target).wrap_socket(sock, server_hostname=host)
        except OSError as e:
            sock.close()
            raise refused(target, e) from None
        try:
            check_certificate(target, tls.getpeercert(binary_form=True))
        except BaseException:
            tls.close()
            raise
        return tls

    def call(self, method: str, on_event: Callable[[Event], Any] | None = None,
             **params: Any) -> Any:
        """The result of `method`. With `on_event`, the request asks for its events (1.1
        "stream": output as it comes) and `on_event(event)` is called with each, in order,
        before the result is returned; if it raises, the request is cancelled."""
        request_id, frame = self._proto.request(method, params, stream=on_event is not None)
        try:
            self._io(self._sock.sendall, frame)
            while True:
                for event in self._proto.take_events(request_id):
                    on_event(event)
                if request_id in self._proto.replies:
                    break
                self._proto.feed(self._io(self._sock.recv, RECV_SIZE))
        except BaseException:
            cancel = self._proto.abandon(request_id)
            if cancel is not None:
                try:
                    self._sock.sendall(cancel)
                except OSError:
                    pass
            raise
        return self._proto.take(request_id)

    def _io(self, fn, *args):
        try:
            return fn(*args)
        except OSError as e:  # includes the timeout given to the constructor
            raise ConnectionLost(f"no answer from toolsd at {self.socket_path} ({e})") from None

    def upload(self, local: str, session: str, remote: str, **options: Any) -> CopyStats:
        """Copy a local file or folder into the session (client/copy.py, under trio)."""
        return copy.run_blocking(self.socket_path, copy.upload, local, session, remote,
                                 **options)

    def download(self, session: str, remote: str, local: str, **options: Any) -> CopyStats:
        """Copy a file or folder of the session here (client/copy.py, under trio)."""
        return copy.run_blocking(self.socket_path, copy.download, session, remote, local,
                                 **options)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
