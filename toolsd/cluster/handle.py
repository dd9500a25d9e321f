"""SessionHandle: what the caller of open_session gets. Plain data (picklable, usable from
any Ray task or actor, or from a process outside Ray with the Client alone): where the
session's daemon answers, how to trust it, the lease's token, the session id, the node.

`Client(h.url, token=h.token, fingerprint=h.fingerprint)` talks to the session. `connect()`
gives a Client that also knows the lease: when its connection is lost because the session
is gone (its node left the cluster, its daemon died), a call raises `session_closed` saying
so, at once, instead of `connection_lost`, and never tries again elsewhere. Inside Ray it
also watches the lease, so a call in flight to a node that vanished without a word (no TCP
reset) ends when Ray declares the node dead, not when TCP gives up.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from typing import Any

from toolsd.client import Client, ConnectionLost, ToolsdError
from toolsd.cluster import names
from toolsd.wire.protocol import SESSION_CLOSED, UNAUTHORIZED

__all__ = ["SessionHandle", "LeaseClient"]

PROBE_S = 2.0  # how long connect() waits for the daemon when telling a blip from a loss
VERDICT_S = 60.0  # how long it waits for Ray to declare a silent node dead


@dataclasses.dataclass(frozen=True)
class SessionHandle:
    url: str
    fingerprint: str
    token: str = dataclasses.field(repr=False)
    session: str
    node: str
    lease: str
    workspace: str | None = None

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
            lease = ray.get_actor(self.lease, namespace=names.NAMESPACE)
        except ValueError:
            return  # ended already
        try:
            ray.get(lease.close.remote())
        except ray.exceptions.RayActorError:
            pass
        try:
            ray.kill(lease)
        except ValueError:
            pass

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
        """Why the session is gone, as its lease or Ray tells it."""
        where = f"session {self.session} on Ray node {self.node} ({self.url})"
        ray = _ray()
        if ray is None or not ray.is_initialized():
            return f"{where} is lost: its daemon does not know it or cannot be reached"
        try:
            lease = ray.get_actor(self.lease, namespace=names.NAMESPACE)
            reason = ray.get(lease.wait_end.remote(), timeout=wait)
            return f"{where} has ended: {reason}; open a new session"
        except ray.exceptions.GetTimeoutError:
            return f"{where} cannot be reached, and Ray still counts its node alive"
        except (ValueError, ray.exceptions.RayActorError):
            pass
        try:  # the lease is gone; its node's agent remembers why, if the node is up
            agent = ray.get_actor(names.agent_name(self.node), namespace=names.NAMESPACE)
            reason = ray.get(agent.why.remote(self.lease), timeout=PROBE_S)
            if reason:
                return f"{where} has ended: {reason}; open a new session"
        except (ValueError, ray.exceptions.RayError):
            pass
        alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
        if not alive.get(self.node, False):
            return (f"{where} is lost: the node was lost (it left the Ray cluster); open a "
                    f"new session, it will go to a node that is up")
        return f"{where} has ended: its lease is gone; open a new session"


class LeaseClient(Client):
    """A Client of the handle's session that reports a lost session as session_closed."""

    def __init__(self, handle: SessionHandle, timeout: float | None = None):
        self.handle = handle
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
        ray = _ray()
        try:
            lease = ray.get_actor(self.handle.lease, namespace=names.NAMESPACE)
            ray.get(lease.wait_end.remote())
        except Exception:
            pass
        try:  # whatever waits on the socket wakes up and reports why
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

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
