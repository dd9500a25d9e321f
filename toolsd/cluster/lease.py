"""A session's lease: a placement group of one bundle holding one `toolsd_slot` (plus what the
caller asked: CPUs, memory, other custom resources, a node) for as long as the session is
open. Ray's scheduler places the bundle, so Ray decides where a session goes and no node
ever holds more sessions than its slots; a bundle is a reservation in Ray's books, not a
process, so a lease costs no Ray worker.

The lease's name is its placement group's name (names.LEASE_PREFIX + a random hex). Ray
ends it with its owner: the job that opened it (when opened from a driver or a task) or the
actor that did. Ray would move the bundle of a node that died to another node; the manager
removes such a lease instead (its session is lost, never moved: manager.py).
"""

from __future__ import annotations

import ray
from ray.util.placement_group import (PlacementGroup, placement_group, placement_group_table,
                                      remove_placement_group)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from toolsd.cluster import names

__all__ = ["bundle_of", "placement_options", "reserve", "release", "node_of"]

WAIT_S = 30.0  # each wait for Ray to place the bundle (it waits as long as it takes)


def bundle_of(resources: dict | None, num_cpus: float, memory: int | None) -> dict:
    """The lease's bundle: one slot and the caller's resources (Ray refuses zero amounts)."""
    bundle = {k: v for k, v in (resources or {}).items() if v}
    if num_cpus:
        bundle["CPU"] = num_cpus
    if memory:
        bundle["memory"] = memory
    bundle[names.SLOT] = 1
    return bundle


def placement_options(scheduling_strategy=None, label_selector: dict | None = None) -> dict:
    """placement_group()'s options for what an actor would take as `scheduling_strategy`:
    None / "DEFAULT", or a NodeAffinitySchedulingStrategy (soft=False: that node or wait;
    soft=True: that node if it has room). `label_selector`: node labels the bundle needs."""
    selector = dict(label_selector or {})
    options = {}
    if isinstance(scheduling_strategy, NodeAffinitySchedulingStrategy):
        if scheduling_strategy.soft:
            options["_soft_target_node_id"] = scheduling_strategy.node_id
        else:
            selector[names.NODE_LABEL] = scheduling_strategy.node_id
    elif scheduling_strategy not in (None, "DEFAULT"):
        raise ValueError(f"a session's lease is a placement group: it takes no scheduling "
                         f"strategy {scheduling_strategy!r}; use NodeAffinitySchedulingStrategy"
                         f" or label_selector (node labels)")
    if selector:
        options["bundle_label_selector"] = [selector]
    return options


def reserve(name: str, bundle: dict, options: dict) -> tuple[PlacementGroup, str]:
    """Ask Ray for the bundle and wait until it is placed: (the placement group, its node)."""
    pg = placement_group([bundle], strategy="STRICT_PACK", name=name, **options)
    try:
        while not pg.wait(WAIT_S):
            pass  # no room yet: Ray keeps it pending, as it would an actor
        return pg, node_of(pg.id.hex())
    except BaseException:
        remove_placement_group(pg)
        raise


def node_of(pg: str) -> str | None:
    """The node a lease's bundle is on now (None: not placed, or removed)."""
    entry = placement_group_table(_group(pg))
    if entry.get("state") != "CREATED":
        return None
    return entry.get("bundles_to_node_id", {}).get(0)


def release(pg: str) -> None:
    """End a lease (frees its slot); nothing if it ended already."""
    try:
        remove_placement_group(_group(pg))
    except Exception:  # removed already, or Ray is going down
        pass


def _group(pg: str) -> PlacementGroup:
    return PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg)))
