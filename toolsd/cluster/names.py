"""Names shared by the cluster's actors and its callers: pure, no Ray."""

from __future__ import annotations

NAMESPACE = "toolsd"
SLOT = "toolsd_slot"  # the custom resource: one per session a node may hold
MANAGER = "toolsd-manager"
LEASE_PREFIX = "toolsd-lease-"  # a lease's name, which is its placement group's name
NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id


def agent_name(node_id: str) -> str:
    return f"toolsd-agent-{node_id}"


def lease_tenant(lease: str) -> str:
    """The tenant of a lease's token (tokens.TENANT_NAME: at most 64 characters)."""
    return "lease-" + lease.removeprefix(LEASE_PREFIX)[:40]


def node_folder(node_id: str) -> str:
    """A node's folder under the cluster root: short, for the Unix socket's path limit."""
    return node_id[:16]


def record_prefix(node_id: str | None = None) -> str:
    """The key prefix of the lease records of a node (of every node: None)."""
    return "lease/" if node_id is None else f"lease/{node_id}/"


def record_key(node_id: str, lease: str) -> str:
    return f"{record_prefix(node_id)}{lease}"
