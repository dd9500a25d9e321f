"""Cluster: the caller's side. `up()` connects to Ray and starts (or finds) the manager,
which puts a toolsd on every node offering `toolsd_slot`; `open_session(**params)` reserves
a lease (a placement group: lease.py), has its node's agent open the session, and returns
its SessionHandle; `status()`; `down()`."""

from __future__ import annotations

import os
import time
import uuid

import ray

from toolsd.cluster import lease as leases
from toolsd.cluster import names
from toolsd.cluster.handle import SessionHandle
from toolsd.cluster.manager import Manager

__all__ = ["Cluster", "default_root"]


def default_root() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "toolsd-cluster")


class Cluster:
    """`address`: a Ray cluster (as ray.init takes it; None: the one this process is in,
    or RAY_ADDRESS, or a new local one). `root`: each node's toolsd folder under it (on
    every node's own disk). `port`: the daemons' TLS port (0: any free one).
    `serve_args`: more `toolsd serve` options (e.g. `--hide PATH`)."""

    def __init__(self, address: str | None = None, *, root: str | None = None,
                 port: int = 0, serve_args: list[str] = ()):
        self.address = address
        self.root = root or default_root()
        self.port = port
        self.serve_args = list(serve_args)
        self._manager = None
        self._agents: dict[str, object] = {}  # node id -> its NodeAgent's handle

    def _connect(self):
        if not ray.is_initialized():
            ray.init(address=self.address, namespace=names.NAMESPACE,
                     log_to_driver=False)
        if self._manager is None:
            self._manager = Manager.options(
                name=names.MANAGER, namespace=names.NAMESPACE, lifetime="detached",
                get_if_exists=True).remote(self.root, self.port, self.serve_args)
        return self._manager

    def up(self) -> dict:
        """A daemon on every node with slots; the status."""
        return ray.get(self._connect().up.remote())

    def open_session(self, *, resources: dict | None = None, num_cpus: float = 0,
                     memory: int | None = None, scheduling_strategy=None,
                     label_selector: dict | None = None, **params) -> SessionHandle:
        """A session (session.open's `params`) on a node Ray picks: a lease of one
        toolsd_slot plus `resources`, `num_cpus`, `memory` (bytes), on the node of a
        NodeAffinitySchedulingStrategy or with the node labels of `label_selector`. Blocks
        until Ray has placed the lease and the session is open."""
        self._connect()
        name = f"{names.LEASE_PREFIX}{uuid.uuid4().hex}"
        bundle = leases.bundle_of(resources, num_cpus, memory)
        pg, node = leases.reserve(name, bundle,
                                  leases.placement_options(scheduling_strategy, label_selector))
        job = ray.get_runtime_context().get_job_id()
        try:
            opened = ray.get(self._agent(node).open_lease.remote(name, pg.id.hex(), job,
                                                                 params))
        except BaseException:
            self._agents.pop(node, None)
            leases.release(pg.id.hex())
            raise
        return SessionHandle(url=opened["url"], fingerprint=opened["fingerprint"],
                             token=opened["token"], session=opened["session"],
                             node=opened["node"], lease=name,
                             workspace=opened.get("workspace"), placement_group=pg.id.hex())

    def _agent(self, node: str, timeout_s: float = 30.0):
        """The node's agent. One that just joined may have none yet (Ray placed the lease
        before the manager's look): have the manager start it now, and wait for its name
        (registered a moment after its creation is asked for)."""
        if node in self._agents:
            return self._agents[node]
        deadline = time.monotonic() + timeout_s
        synced = False
        while True:
            try:
                agent = ray.get_actor(names.agent_name(node), namespace=names.NAMESPACE)
                break
            except ValueError:
                if not synced:
                    ray.get(self._connect().sync.remote())
                    synced = True
                elif time.monotonic() > deadline:
                    raise
                else:
                    time.sleep(0.2)
        self._agents[node] = agent
        return agent

    def status(self) -> dict:
        """{nodes: [{node, url, fingerprint, slots, used, free, sessions, restarts, lost,
        pid}]}"""
        return ray.get(self._connect().status.remote())

    def down(self) -> None:
        """End every session and daemon, and the manager."""
        try:
            ray.get(self._connect().down.remote())
        except ray.exceptions.RayActorError:
            # Taken down by someone else (`toolsd cluster down`): a new manager finds any
            # agent left by name.
            self._manager = None
            ray.get(self._connect().down.remote())
        ray.kill(self._manager)
        self._manager = None
        self._agents.clear()
