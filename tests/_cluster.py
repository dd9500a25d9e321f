"""A simulated Ray cluster on this machine (ray.cluster_utils.Cluster) with toolsd on it,
for tests/test_cluster.py: everything on 127.0.0.1, in a private temporary folder, and
everything it started gone at the end, even when the test failed.

Ray's own state folder is private (RAY_TMPDIR), its usage report is off, and
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps every Ray address on loopback (else Ray takes the
machine's own address). Node death is declared after about 1.5 s of missed health checks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import psutil

ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
       "RAY_DEDUP_LOGS": "0"}
# Read by Ray when it is imported: set before any test module imports it.
os.environ.update(ENV)
SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 0}


def ours(root: str) -> list[psutil.Process]:
    """Every process whose command line names `root`: Ray's and the daemons'."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(root in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return [p for p in found if p.pid != os.getpid()]


class SimulatedCluster:
    def __init__(self, ray, cluster_utils, root: str):
        self.ray, self.root = ray, root
        self.cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "temp_dir": os.path.join(root, "ray"), "include_dashboard": False,
            "_system_config": SYSTEM_CONFIG})
        ray.init(address=self.cluster.address, namespace="toolsd", log_to_driver=False)
        self.nodes = []

    def add_node(self, slots: int):
        node = self.cluster.add_node(num_cpus=0, resources={"toolsd_slot": slots})
        self.nodes.append(node)
        return node

    def remove_node(self, node) -> None:
        self.cluster.remove_node(node, allow_graceful=False)
        self.nodes.remove(node)

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.shutdown()
        with contextlib.suppress(Exception):
            self.cluster.shutdown()
        head = self.cluster.head_node
        if head is not None:
            with contextlib.suppress(Exception):
                self.cluster.remove_node(head, allow_graceful=False)


@contextlib.contextmanager
def simulated_cluster():
    """(SimulatedCluster, toolsd root); on exit every process of it is gone (the leftovers
    are killed, then reported as the test's failure)."""
    import ray
    from ray import cluster_utils

    saved = {k: os.environ.get(k) for k in (*ENV, "RAY_TMPDIR")}
    root = tempfile.mkdtemp(prefix="tc26-", dir="/tmp")
    os.environ.update(ENV, RAY_TMPDIR=root)
    os.makedirs(os.path.join(root, "ray"))
    sim = None
    try:
        sim = SimulatedCluster(ray, cluster_utils, root)
        yield sim, os.path.join(root, "t")
    finally:
        if sim is not None:
            sim.shutdown()
        left = ours(root)
        _gone, alive = psutil.wait_procs(left, timeout=30)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
        assert not alive, f"processes left after the cluster: {[p.pid for p in alive]}"
