"""A lease's record: one key in Ray's own key-value store (in the GCS, so it outlives the
node, the agent and the manager) saying which node holds the lease and, once it ended
otherwise than by `close`, why. Keyed by node (names.record_key), so the manager finds the
leases of a node that died with one listing, and a handle finds its own by its node and
lease alone.

Written by the node's agent (open, ended) and by the manager (lost with its node); read by
handles to tell the caller why a session is gone. A closed lease's record is deleted; the
others stay until `down()` (a few hundred bytes each).
"""

from __future__ import annotations

import enum
import json

from ray.experimental import internal_kv

from toolsd.cluster import names


class LeaseState(str, enum.Enum):
    OPEN = "open"
    ENDED = "ended"  # its owner's job ended, or its placement group was removed
    LOST = "lost"  # its daemon died, or its node did: the session's state is gone


def write(node: str, lease: str, state: LeaseState, *, pg: str, job: str,
          session: str | None, reason: str | None = None) -> None:
    value = {"state": state.value, "pg": pg, "job": job, "session": session,
             "reason": reason}
    internal_kv._internal_kv_put(names.record_key(node, lease), json.dumps(value),
                                 namespace=names.NAMESPACE)


def read(node: str, lease: str) -> dict | None:
    raw = internal_kv._internal_kv_get(names.record_key(node, lease),
                                       namespace=names.NAMESPACE)
    return None if raw is None else json.loads(raw)


def drop(node: str, lease: str) -> None:
    internal_kv._internal_kv_del(names.record_key(node, lease), namespace=names.NAMESPACE)


def of_node(node: str) -> dict[str, dict]:
    """lease -> record, for every lease a node held."""
    found = {}
    prefix = names.record_prefix(node)
    for key in internal_kv._internal_kv_list(prefix, namespace=names.NAMESPACE):
        key = key.decode()
        record = read(node, key.removeprefix(prefix))
        if record is not None:
            found[key.removeprefix(prefix)] = record
    return found


def drop_all() -> None:
    internal_kv._internal_kv_del(names.record_prefix(), del_by_prefix=True,
                                 namespace=names.NAMESPACE)
