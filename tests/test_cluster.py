"""toolsd.cluster on a simulated Ray cluster (ray.cluster_utils.Cluster, on this machine):
sessions placed by Ray's scheduler within each node's toolsd_slot, handles used from other
Ray tasks, a node removed or added, a node's daemon killed.

Each test has a cluster of its own (tests/_cluster.py), taken down with every process it
started, failed or not. The 150-session test is marked cluster_heavy (minutes on two cores):
`-m 'not cluster_heavy'` leaves it out, `-m cluster_heavy` runs it alone.
"""

from __future__ import annotations

import concurrent.futures
import os
import time

import psutil
import pytest

from tests._cluster import ours, simulated_cluster  # before ray: it sets Ray's environment

ray = pytest.importorskip("ray", reason="ray is not installed: pip install toolsd[cluster]")

from toolsd.client import Client, ToolsdError  # noqa: E402
from toolsd.cluster import Cluster, SessionHandle  # noqa: E402


@pytest.fixture
def sim():
    with simulated_cluster() as (cluster, root):
        toolsd = Cluster(root=root)
        try:
            yield cluster, toolsd
        finally:
            try:
                toolsd.down()
            finally:
                # Whatever the test did, no daemon of it may be left.
                daemons = [p for p in ours(root)]
                psutil.wait_procs(daemons, timeout=30)


def slots_of(status: dict) -> dict[str, tuple[int, int, int]]:
    return {n["node"]: (n["slots"], n["used"], n["free"]) for n in status["nodes"]}


def use(handle: SessionHandle) -> None:
    """shell.run, repl.exec and a file round trip, as the lease's tenant over TLS."""
    with Client(handle.url, token=handle.token, fingerprint=handle.fingerprint) as c:
        s = handle.session
        assert c.shell_run(s, "echo hi-$((6*7))")["output"].strip() == "hi-42"
        turn = c.turn_begin(s)["turn"]
        assert "7" in c.repl_exec(s, turn, "3 + 4")["output"]
        c.turn_end(s, turn)
        c.file_write(s, "note.txt", b"round trip")
        assert c.file_read(s, "note.txt")["data"] == b"round trip"


def daemon_pids(status: dict) -> dict[str, int]:
    return {n["node"]: n["pid"] for n in status["nodes"]}


@pytest.mark.cluster_heavy
def test_150_sessions_spread_within_slots_and_all_work(sim):
    cluster, toolsd = sim
    sizes = [70, 50, 40]
    nodes = [cluster.add_node(n) for n in sizes]
    status = toolsd.up()
    assert sorted(s for s, _, _ in slots_of(status).values()) == sorted(sizes)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        handles = list(pool.map(lambda _: toolsd.open_session(), range(150)))
        status = toolsd.status()
        for slots, used, free in slots_of(status).values():
            assert used <= slots and free == slots - used
        assert sum(used for _, used, _ in slots_of(status).values()) == 150
        per_node = {n["node"]: set(n["sessions"]) for n in status["nodes"]}
        for h in handles:
            assert h.session in per_node[h.node]
        list(pool.map(use, handles))
        list(pool.map(SessionHandle.close, handles))
    status = toolsd.status()
    assert all(used == 0 and free == slots for slots, used, free in slots_of(status).values())
    assert all(n["sessions"] == [] for n in status["nodes"])
    # No process of any session is left on any node: each daemon has no child but its spare.
    for pid in daemon_pids(status).values():
        sandboxes = [c for c in psutil.Process(pid).children() if c.name() == "bwrap"]
        assert len(sandboxes) <= 1, sandboxes
    assert len(nodes) == 3


def test_no_node_holds_more_sessions_than_its_slots(sim):
    cluster, toolsd = sim
    cluster.add_node(2)
    cluster.add_node(1)
    toolsd.up()
    handles = [toolsd.open_session() for _ in range(3)]
    assert sorted(u for _, u, _ in slots_of(toolsd.status()).values()) == [1, 2]
    # Every slot is taken: the fourth waits for one (Ray keeps the lease pending).
    pending = concurrent.futures.ThreadPoolExecutor(1).submit(toolsd.open_session)
    with pytest.raises(concurrent.futures.TimeoutError):
        pending.result(timeout=5)
    handles[0].close()
    fourth = pending.result(timeout=120)
    assert fourth.node == handles[0].node
    use(fourth)
    for h in handles[1:] + [fourth]:
        h.close()
    assert all(u == 0 for _, u, _ in slots_of(toolsd.status()).values())


def test_a_lease_token_reaches_its_own_session_only(sim):
    cluster, toolsd = sim
    cluster.add_node(2)
    toolsd.up()
    a, b = toolsd.open_session(), toolsd.open_session()
    assert a.node == b.node and a.token != b.token
    with Client(a.url, token=a.token, fingerprint=a.fingerprint) as c:
        assert [s["session"] for s in c.session_list()["sessions"]] == [a.session]
        with pytest.raises(ToolsdError) as e:
            c.shell_run(b.session, "true")
        assert e.value.code == "not_found"
    a.close()
    # The closed lease's token opens nothing any more.
    with pytest.raises(ToolsdError) as e:
        Client(a.url, token=a.token, fingerprint=a.fingerprint)
    assert e.value.code == "unauthorized"
    b.close()


def test_a_session_opened_in_a_task_is_used_from_another(sim):
    cluster, toolsd = sim
    cluster.add_node(2)
    toolsd.up()
    root = toolsd.root

    @ray.remote(num_cpus=0)
    def open_one():
        return Cluster(root=root).open_session()

    @ray.remote(num_cpus=0)
    def run_in(handle: SessionHandle):
        with handle.connect() as c:
            return c.shell_run(handle.session, "echo from-$((40+2)); pwd")["output"]

    handle = ray.get(open_one.remote())
    assert isinstance(handle, SessionHandle)
    out = ray.get(run_in.remote(handle)).split()
    assert out[0] == "from-42" and out[1] == handle.workspace
    handle.close()
    assert slots_of(toolsd.status())[handle.node][1] == 0


def test_a_removed_node_fails_its_sessions_fast_and_others_carry_on(sim):
    cluster, toolsd = sim
    first, second = cluster.add_node(3), cluster.add_node(6)
    toolsd.up()
    on = {first.node_id: [], second.node_id: []}
    for _ in range(4):
        h = toolsd.open_session(scheduling_strategy=None)
        on[h.node].append(h)
    # Ray packs: make sure each node has a session of ours, then remove the first's node.
    for node in (first, second):
        while not on[node.node_id]:
            h = toolsd.open_session(scheduling_strategy=_on(node.node_id))
            on[h.node].append(h)
    lost, kept = on[first.node_id], on[second.node_id]
    clients = [h.connect() for h in lost]
    pid = daemon_pids(toolsd.status())[first.node_id]
    cluster.remove_node(first)
    psutil.wait_procs([psutil.Process(pid)] if psutil.pid_exists(pid) else [], timeout=30)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        survivors = pool.map(use, kept)
        for h, c in zip(lost, clients):
            with pytest.raises(ToolsdError) as e:
                c.shell_run(h.session, "echo never")
            assert e.value.code == "session_closed"
            assert first.node_id in e.value.message and "node was lost" in e.value.message
            c.close()
        list(survivors)
    new = toolsd.open_session()
    assert new.node == second.node_id
    use(new)
    # A node that joins gets a daemon and takes new sessions.
    third = cluster.add_node(2)
    joined = toolsd.open_session(scheduling_strategy=_on(third.node_id))
    use(joined)
    for h in kept + [new, joined]:
        h.close()
    assert first.node_id not in slots_of(toolsd.status())


def test_a_killed_daemon_is_restarted_and_its_sessions_reported_lost(sim):
    cluster, toolsd = sim
    node = cluster.add_node(3)
    toolsd.up()
    h = toolsd.open_session()
    with h.connect() as c:
        old_bg = c.process_start(h.session, "sleep 600")["id"]
    old_pid = daemon_pids(toolsd.status())[node.node_id]
    psutil.Process(old_pid).kill()
    error = error_of(h)
    assert error.code == "session_closed" and "restarted" in error.message
    assert node.node_id in error.message
    fresh = toolsd.open_session()  # waits for the daemon to be up again
    status = {n["node"]: n for n in toolsd.status()["nodes"]}[node.node_id]
    assert status["restarts"] == 1 and status["pid"] != old_pid
    assert [lost["session"] for lost in status["lost"]] == [h.session]
    assert fresh.session != h.session
    with fresh.connect() as c:
        new_bg = c.process_start(fresh.session, "true")["id"]
    assert int(new_bg.removeprefix("bg")) > int(old_bg.removeprefix("bg"))
    fresh.close()
    assert slots_of(toolsd.status())[node.node_id][1] == 0
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == "zombie"


def error_of(handle: SessionHandle) -> ToolsdError:
    """The error a call on `handle` gets, connecting anew."""
    try:
        with handle.connect() as c:
            c.shell_run(handle.session, "echo never")
    except ToolsdError as e:
        return e
    raise AssertionError("a call on a lost session succeeded")


def _on(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def test_cluster_status_names_every_node_with_slots_only(sim):
    cluster, toolsd = sim
    with_slots = cluster.add_node(2)
    cluster.cluster.add_node(num_cpus=0)  # no toolsd_slot: no daemon there
    status = toolsd.up()
    assert [n["node"] for n in status["nodes"]] == [with_slots.node_id]
    entry = status["nodes"][0]
    assert entry["url"].startswith("tls://127.0.0.1:") and entry["fingerprint"]
    assert os.path.exists(os.path.join(toolsd.root))


OWNER = r"""
import dataclasses, json, os, sys
import ray
from toolsd.cluster import Cluster
ray.init(address=sys.argv[1], namespace="toolsd", log_to_driver=False)
h = Cluster(root=sys.argv[2]).open_session()
print(json.dumps(dataclasses.asdict(h)), flush=True)
os._exit(0)  # gone without closing: its job ends
"""


def test_a_lease_whose_job_ended_ends_its_session(sim):
    import json
    import subprocess
    import sys

    cluster, toolsd = sim
    node = cluster.add_node(2)
    toolsd.up()
    out = subprocess.run([sys.executable, "-c", OWNER, cluster.cluster.address, toolsd.root],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    handle = SessionHandle(**json.loads(out.strip().splitlines()[-1]))
    deadline = time.monotonic() + 120
    while True:
        status = {n["node"]: n for n in toolsd.status()["nodes"]}[node.node_id]
        if status["used"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status["used"] == 0 and handle.session not in status["sessions"]
    error = error_of(handle)
    assert error.code == "session_closed" and "job" in error.message


def test_toolsd_cluster_up_status_down_for_a_person(sim):
    import json
    import subprocess
    import sys

    cluster, toolsd = sim
    node = cluster.add_node(4)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "toolsd", "cluster", *args, "--address",
                               cluster.cluster.address, "--root", toolsd.root],
                              capture_output=True, text=True, timeout=300)

    up = cli("up")
    assert up.returncode == 0, up.stderr
    assert node.node_id[:12] in up.stdout and "tls://127.0.0.1:" in up.stdout
    h = toolsd.open_session()
    status = json.loads(cli("status", "--json").stdout)
    entry = {n["node"]: n for n in status["nodes"]}[node.node_id]
    assert (entry["slots"], entry["used"], entry["free"]) == (4, 1, 3)
    assert entry["sessions"] == [h.session]
    down = cli("down")
    assert down.returncode == 0, down.stderr
    assert not psutil.pid_exists(entry["pid"]) or psutil.Process(entry["pid"]).status() == "zombie"
    with pytest.raises(ToolsdError):
        h.connect().shell_run(h.session, "true")
