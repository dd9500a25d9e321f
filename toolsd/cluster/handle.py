"""SessionHandle: what the caller of open_session gets. Plain data (picklable, usable from
any Ray task or actor, or from a process outside Ray with the Client alone): where the
session's daemon answers, how to trust it, the lease's token, the session id, the node.

`Client(h.url, token=h.token, fingerprint=h.fingerprint)` talks to the session. `connect()`
gives a Client that also knows the lease: when its connection is lost because the session
is gone (its node left the cluster, its daemon died), a call raises `session_closed` saying
so, at once, instead of `connection_lost`, and never tries again elsewhere. Inside Ray it
also watches the lease's record (lease_record.py, every WATCH_S), so a call in flight to a
node that vanished without a word (no TCP reset) ends when Ray declares the node dead, not
when TCP gives up.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from typing import Any

from toolsd.client import Client, ConnectionLost, ToolsdError
from toolsd.cluster import names
from toolsd.wire.protocol import SESSION_CLOSED, UNAUTHORIZED

__all__ = ["SessionHandle", "LeaseClient"]

PROBE_S = 2.0  # how long connect() waits for the daemon when telling a blip from a loss
VERDICT_S = 60.0  # how long it waits for Ray to declare a silent node dead
WATCH_S = 1.0  # how often a LeaseClient looks at its lease's record


@dataclasses.dataclass(frozen=True)
class SessionHandle:
    url: str
    fingerprint: str
    token: str = dataclasses.field(repr=False)
    session: str
    node: str
    lease: str
    workspace: str | None = None
    placement_group: str | None = None  # the lease's, hex

    def connect(self, timeout: float | None = None) -> LeaseClient:
        return LeaseClient(self, timeout=timeout)

    def close(self) -> None:
        """End the session and its lease (frees the slot); nothing if already ended."""
        ray = _ray()
        if ray is None or not ray.is_initialized():
            raise RuntimeError("closing a cluster session needs Ray: call close() from a "
                               "process connected to the cluster (ray.init(address=...)), "
                               "or session.close through the Client and let the lease end "
                               "with its job")
        try:
            agent = ray.get_actor(names.agent_name(self.node), namespace=names.NAMESPACE)
            if ray.get(agent.close_lease.remote(self.lease)):
                return
        except (ValueError, ray.exceptions.RayActorError):
            pass  # its node is gone, or its agent is
        if self.placement_group:
            from toolsd.cluster import lease

            lease.release(self.placement_group)

    def __enter__(self) -> SessionHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lost(self, cause: ToolsdError) -> ToolsdError:
        """The error for a connection lost: session_closed with the reason when the session
        is gone, else `cause` itself (a dropped link: connect again, the session is there)."""
        try:
            with Client(self.url, token=self.token, fingerprint=self.fingerprint,
                        timeout=PROBE_S) as probe:
                listed = {s["session"] for s in probe.session_list()["sessions"]}
            if self.session in listed:
                return cause
        except ToolsdError:
            pass  # unreachable, or the token is no longer valid: the lease has ended
        return ToolsdError(SESSION_CLOSED, self.verdict(wait=VERDICT_S))

    def verdict(self, wait: float) -> str:
        """Why the session is gone, as its lease's record or Ray tells it; waits up to
        `wait` s for Ray to tell a node that cannot be reached from a node that is lost."""
        where = f"session {self.session} on Ray node {self.node} ({self.url})"
        ray = _ray()
        if ray is None or not ray.is_initialized():
            return f"{where} is lost: its daemon does not know it or cannot be reached"
        from toolsd.cluster import lease_record

        deadline = time.monotonic() + wait
        while True:
            record = lease_record.read(self.node, self.lease)
            if record is None:
                return f"{where} has ended: its lease is gone; open a new session"
            if record["state"] == lease_record.LeaseState.LOST.value:
                return f"{where} is lost: {record['reason']}; open a new session"
            if record["state"] != lease_record.LeaseState.OPEN.value:
                return f"{where} has ended: {record['reason']}; open a new session"
            if not _alive(ray, self.node):
                return (f"{where} is lost: the node was lost (it left the Ray cluster); open "
                        f"a new session, it will go to a node that is up")
            if time.monotonic() > deadline:
                return f"{where} cannot be reached, and Ray still counts its node alive"
            time.sleep(0.25)


def _alive(ray, node: str) -> bool:
    return any(n["NodeID"] == node and n["Alive"] for n in ray.nodes())


class LeaseClient(Client):
    """A Client of the handle's session that reports a lost session as session_closed."""

    def __init__(self, handle: SessionHandle, timeout: float | None = None):
        self.handle = handle
        self._closed = threading.Event()
        try:
            super().__init__(handle.url, token=handle.token, fingerprint=handle.fingerprint,
                             timeout=timeout)
        except ToolsdError as e:
            if e.code not in ("connection_lost", UNAUTHORIZED):
                raise
            raise handle.lost(e) from None
        ray = _ray()
        if ray is not None and ray.is_initialized():
            threading.Thread(target=self._watch, daemon=True,
                             name=f"toolsd-lease-{handle.session}").start()

    def _watch(self) -> None:
        from toolsd.cluster import lease_record

        while not self._closed.wait(WATCH_S):
            try:
                record = lease_record.read(self.handle.node, self.handle.lease)
            except Exception:
                return  # Ray went away
            if record is None or record["state"] != lease_record.LeaseState.OPEN.value:
                break
        else:
            return  # closed
        try:  # whatever waits on the socket wakes up and reports why
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self._closed.set()
        super().close()

    def call(self, method: str, on_event=None, **params: Any) -> Any:
        try:
            return super().call(method, on_event=on_event, **params)
        except ConnectionLost as e:
            raise self.handle.lost(e) from None


def _ray():
    try:
        import ray
    except ImportError:
        return None
    return ray
