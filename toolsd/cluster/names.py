"""Names shared by the cluster's actors and its callers: pure, no Ray."""

from __future__ import annotations

NAMESPACE = "toolsd"
SLOT = "toolsd_slot"  # the custom resource: one per session a node may hold
MANAGER = "toolsd-manager"
LEASE_PREFIX = "toolsd-lease-"


def agent_name(node_id: str) -> str:
    return f"toolsd-agent-{node_id}"


def lease_tenant(lease: str) -> str:
    """The tenant of a lease's token (tokens.TENANT_NAME: at most 64 characters)."""
    return "lease-" + lease.removeprefix(LEASE_PREFIX)[:40]


def node_folder(node_id: str) -> str:
    """A node's folder under the cluster root: short, for the Unix socket's path limit."""
    return node_id[:16]
