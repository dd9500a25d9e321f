"""Manager: the one detached actor that keeps a NodeAgent on every node offering
`toolsd_slot`, answers status(), and ends leases whose Ray job is gone.

Ray has no event for a node that joins, nor for a job that ends: the manager looks at the
node and job tables every WATCH_S (one call to Ray's control store each; nothing else on the
node does any work in between). A node that left takes its agent, daemon and leases with it
(they were its processes); the manager forgets it.
"""

from __future__ import annotations

import asyncio
import logging

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from toolsd.cluster import names
from toolsd.cluster.agent import NodeAgent

log = logging.getLogger("toolsd.cluster")

HEAD_NODE = "node:__internal_head__"  # the resource Ray gives the head node alone
WATCH_S = 1.0
STATUS_WAIT_S = 10.0


# On the head node (as Ray Train places its state actor): a removed worker node must not
# take the manager with it. Restarted if its process dies; it finds the agents by name.
@ray.remote(num_cpus=0, max_concurrency=1000, max_restarts=-1,
            resources={HEAD_NODE: 0.001})
class Manager:
    def __init__(self, root: str, port: int = 0, serve_args: list[str] = ()):
        self.root = root
        self.port = port
        self.serve_args = list(serve_args)
        self.agents: dict[str, object] = {}  # node id -> NodeAgent handle
        self.slots: dict[str, float] = {}
        self._sync_lock = asyncio.Lock()
        self._watching = False
        self.stopped = False
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self._watching = True  # it was up before it died: go on watching
            asyncio.get_running_loop().create_task(self._watch())

    async def up(self) -> dict:
        await self.sync()
        if not self._watching:
            self._watching = True
            asyncio.get_running_loop().create_task(self._watch())
        return await self.status()

    async def _watch(self) -> None:
        while not self.stopped:
            await asyncio.sleep(WATCH_S)
            try:
                await self.sync()
                await self._reap_jobs()
            except Exception:
                log.exception("watching the cluster")

    async def sync(self) -> None:
        """An agent (and so a daemon) on every live node with slots; none for the others."""
        async with self._sync_lock:
            alive = {n["NodeID"]: n["Resources"].get(names.SLOT, 0)
                     for n in ray.nodes() if n["Alive"]}
            for node in [n for n in self.agents if n not in alive]:
                log.info("node %s left the cluster", node)
                self.agents.pop(node)
                self.slots.pop(node, None)
            starting = {}
            for node, slots in alive.items():
                if slots > 0 and node not in self.agents and not self.stopped:
                    starting[node] = NodeAgent.options(
                        name=names.agent_name(node), namespace=names.NAMESPACE,
                        lifetime="detached", get_if_exists=True,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                    ).remote(node, self.root, self.port, self.serve_args)
                    self.slots[node] = slots
            for node, agent in starting.items():
                try:
                    await agent.start.remote()
                    self.agents[node] = agent
                except Exception as e:
                    log.warning("no toolsd on node %s: %s", node, e)

    async def _reap_jobs(self) -> None:
        dead = [job["JobID"] for job in ray._private.state.jobs() if job.get("IsDead")]
        if dead:
            await asyncio.gather(*(a.reap.remote(dead) for a in self.agents.values()),
                                 return_exceptions=True)

    async def status(self) -> dict:
        nodes = []
        agents = list(self.agents.items())
        answers = await asyncio.gather(
            *(asyncio.wait_for(asyncio.wrap_future(a.status.remote().future()), STATUS_WAIT_S)
              for _, a in agents), return_exceptions=True)
        for (node, _), answer in zip(agents, answers):
            if isinstance(answer, BaseException):
                nodes.append({"node": node, "url": None, "error": str(answer)[:200],
                              "slots": int(self.slots.get(node, 0)), "used": 0, "free": 0,
                              "sessions": []})
                continue
            slots = int(self.slots.get(node, 0))
            answer.update(slots=slots, free=max(slots - answer["used"], 0))
            nodes.append(answer)
        return {"nodes": nodes}

    async def down(self) -> None:
        self.stopped = True
        for node in (n["NodeID"] for n in ray.nodes() if n["Alive"]):
            if node not in self.agents:  # one a manager before this one started
                try:
                    self.agents[node] = ray.get_actor(names.agent_name(node),
                                                      namespace=names.NAMESPACE)
                except ValueError:
                    pass
        agents = list(self.agents.values())
        await asyncio.gather(*(a.stop.remote() for a in agents), return_exceptions=True)
        for agent in agents:
            ray.kill(agent)
        self.agents.clear()
