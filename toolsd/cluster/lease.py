"""Lease: the actor that holds one `toolsd_slot` for as long as its session is open.

Ray places it (one `toolsd_slot`, plus what the caller asked: CPUs, memory, other custom
resources, a scheduling strategy), so Ray's scheduler decides where a session goes and no
node ever holds more sessions than its slots. Once placed, it asks its node's agent to open
the session, and then only waits to be ended: by `close`, by the agent (the daemon died),
or by Ray (its node died; it was killed). Ending it frees the slot.

It is detached, so a session opened in one Ray task can be used from another after the
first returned; it belongs to the Ray job that opened it, and the manager ends the leases
of jobs that are gone (manager.py). Tool calls never pass through it.
"""

from __future__ import annotations

import asyncio
import time

import ray

from toolsd.cluster import names


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class Lease:
    def __init__(self, name: str, job: str):
        self.name = name
        self.job = job
        self.reason: str | None = None
        self._ended = asyncio.Event()

    async def open(self, params: dict) -> dict:
        node = ray.get_runtime_context().get_node_id()
        try:
            agent = ray.get_actor(names.agent_name(node), namespace=names.NAMESPACE)
        except ValueError:
            # A node that just joined: Ray placed us before the manager saw it. Have the
            # manager start its agent now rather than at its next look.
            manager = ray.get_actor(names.MANAGER, namespace=names.NAMESPACE)
            await manager.sync.remote()
            agent = await _agent_when_named(node)
        return await agent.open_lease.remote(self.name, self.job, params)

    async def wait_end(self) -> str:
        """Returns, with the reason, once the lease has ended."""
        await self._ended.wait()
        return self.reason

    async def end(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._ended.set()

    async def close(self) -> None:
        node = ray.get_runtime_context().get_node_id()
        agent = ray.get_actor(names.agent_name(node), namespace=names.NAMESPACE)
        await agent.close_lease.remote(self.name)
        await self.end("the session was closed")


async def _agent_when_named(node: str, timeout_s: float = 30.0):
    """The node's agent once Ray knows its name: the manager has asked for it, and an actor's
    name is registered a moment after its creation is asked for. ValueError past timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get_actor(names.agent_name(node), namespace=names.NAMESPACE)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
