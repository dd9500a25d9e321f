"""Manager: the one detached actor that keeps a NodeAgent on every node offering
`toolsd_slot`, answers status(), and has the agents end the leases that Ray ended.

Ray has no event for a node that joins, a job that ends or a placement group removed: the
manager looks at the node, job and placement group tables every WATCH_S (one call to Ray's
control store each; nothing else on the node does any work in between) and tells each agent
which of its leases are still placed on its node (NodeAgent.check).

A node that left takes its agent, daemon and sessions with it (they were its processes).
Ray would move its leases' bundles to other nodes; the manager removes those placement
groups and records the leases as lost with their node (lease_record.py), so a session is
reported lost, never moved.
"""

from __future__ import annotations

import asyncio
import logging

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray.util.placement_group import placement_group_table

from toolsd.cluster import lease as leases
from toolsd.cluster import lease_record, names
from toolsd.cluster.lease_record import LeaseState
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
        self.buried: set[str] = set()  # dead nodes whose leases were recorded lost
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
                await self._check_leases()
            except Exception:
                log.exception("watching the cluster")

    async def sync(self) -> None:
        """An agent (and so a daemon) on every live node with slots; none for the others."""
        async with self._sync_lock:
            table = ray.nodes()
            alive = {n["NodeID"]: n["Resources"].get(names.SLOT, 0)
                     for n in table if n["Alive"]}
            for node in {n["NodeID"] for n in table if not n["Alive"]} - self.buried - set(alive):
                self._bury(node)
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

    def _bury(self, node: str) -> None:
        """A node died: its leases are lost; remove their placement groups before Ray gives
        their bundles to another node."""
        reason = (f"the node was lost (Ray node {node} left the Ray cluster); its daemon and "
                  f"sessions went with it")
        for lease, record in lease_record.of_node(node).items():
            if record["state"] == LeaseState.OPEN.value:
                leases.release(record["pg"])
                lease_record.write(node, lease, LeaseState.LOST, pg=record["pg"],
                                   job=record["job"], session=record["session"],
                                   reason=reason)
        self.buried.add(node)

    async def _check_leases(self) -> None:
        dead = [job["JobID"] for job in ray._private.state.jobs() if job.get("IsDead")]
        placed: dict[str, list[str]] = {node: [] for node in self.agents}
        for entry in placement_group_table().values():
            node = entry.get("bundles_to_node_id", {}).get(0)
            if (entry.get("state") == "CREATED" and node in placed
                    and entry.get("name", "").startswith(names.LEASE_PREFIX)):
                placed[node].append(entry["name"])
        await asyncio.gather(*(agent.check.remote(placed[node], dead)
                               for node, agent in self.agents.items()),
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
        lease_record.drop_all()
