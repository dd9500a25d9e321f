"""A session's memory limit: a memory cgroup for the whole session where the machine has one
(so runtimes that reserve large address ranges work), the OOM killer's work reported to the
call that met it, and RLIMIT_AS where there is no cgroup."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import RunningDaemon, needs_bwrap, wait_for
from toolsd.sandbox.launch import cgroups
pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

PLACES, WHY_NOT = cgroups.find_places()
needs_memory_cgroup = pytest.mark.skipif(
    "memory" not in PLACES, reason=f"no memory cgroup here: {WHY_NOT.get('memory')}")

# Allocates and touches MB megabytes, then says so.
ALLOCATE = "python3 -c 'x = bytearray({mb} * 1024 * 1024); print(\"allocated\", flush=True)'"
LIMIT_NOTE = "the session's memory limit ({mb} MB) was reached"


@pytest.fixture
def open_session(daemon, client):
    """Opens sessions; at the end closes them and checks that their cgroups are gone, which
    the kernel allows only once no process is left in them."""
    opened = []

    def open_(**limits) -> str:
        s = client.session_open(daemon.workspace, limits=limits)["session"]
        opened.append(s)
        return s

    yield open_
    listed = {x["session"] for x in client.session_list()["sessions"]}
    for s in opened:
        if s in listed:
            client.session_close(s)
        wait_for(lambda: not os.path.exists(session_cgroup(daemon, s)))


def session_cgroup(daemon, session: str) -> str:
    return os.path.join(PLACES["memory"].folder, f"{cgroups.PREFIX}{daemon.proc.pid}", session)


@needs_memory_cgroup
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_webassembly_works_under_the_default_limits(daemon, client, open_session):
    s = open_session()
    r = client.shell_run(s, "node -e 'const m = new WebAssembly.Memory({initial: 1}); "
                            "console.log(m.buffer.byteLength)'")
    assert r["output"] == "65536\n", r
    assert r["exit_code"] == 0
    # Not for want of a limit: the session's cgroup has the default, 4096 MB.
    with open(os.path.join(session_cgroup(daemon, s), "memory.limit_in_bytes")) as f:
        assert int(f.read()) == 4096 * 2**20
    assert "a memory cgroup per session" in daemon.read_log()


@needs_memory_cgroup
def test_a_command_over_the_limit_is_killed_and_the_call_says_so(client, open_session):
    other = open_session()
    s = open_session(memory_mb=128)
    r = client.shell_run(s, ALLOCATE.format(mb=512))
    assert r["signal"] == "SIGKILL" and r["exit_code"] is None
    assert "allocated" not in r["output"]
    assert LIMIT_NOTE.format(mb=128) in r["output"]
    # Within the limit all is as before: in the same session, in another, in the daemon.
    ok = client.shell_run(s, ALLOCATE.format(mb=32))
    assert ok["output"] == "allocated\n" and ok["signal"] is None
    assert client.shell_run(other, "echo fine")["output"] == "fine\n"
    assert client.hello()["protocol"] == 1


@needs_memory_cgroup
def test_a_shell_that_survives_its_killed_child_still_says_so(client, open_session):
    s = open_session(memory_mb=128)
    r = client.shell_run(s, ALLOCATE.format(mb=512) + "; echo shell goes on")
    assert r["exit_code"] == 0 and r["signal"] is None  # bash itself was not the victim
    assert "Killed" in r["output"] and "shell goes on" in r["output"]
    assert r["output"].rstrip().endswith("limits.memory_mb]")
    assert LIMIT_NOTE.format(mb=128) in r["output"]


@needs_memory_cgroup
def test_the_limit_is_for_the_whole_session(client, open_session):
    # Each alone fits (an address-space limit would let both run); together they do not.
    s = open_session(memory_mb=256)
    holder = client.process_start(
        s, "python3 -c 'x = bytearray(100 * 1024 * 1024); print(\"held\", flush=True); "
           "import time; time.sleep(1000)'")["id"]
    assert "held" in client.process_output(holder, wait_s=60, until="held")["output"]
    r = client.shell_run(s, ALLOCATE.format(mb=200))
    assert r["signal"] == "SIGKILL", r
    assert LIMIT_NOTE.format(mb=256) in r["output"]
    assert client.process_output(holder)["status"] == "running"
    client.process_stop(holder)


@needs_memory_cgroup
def test_a_background_process_over_the_limit_says_so(client, open_session):
    s = open_session(memory_mb=128)
    bg = client.process_start(s, ALLOCATE.format(mb=512))["id"]
    out = ""
    while True:
        r = client.process_output(bg, wait_s=30)
        out += r["output"]
        if r["status"] != "running" and LIMIT_NOTE.format(mb=128) in out:
            break
        assert r["status"] == "running", r  # it ended without the note
    assert r["status"] == "exited" and r["signal"] == "SIGKILL" and r["exit_code"] is None
    assert "allocated" not in out
    assert [p["status"] for p in client.process_list(s)["processes"]] == ["exited"]


@needs_memory_cgroup
def test_a_repl_allocation_over_the_limit_raises_memory_error_and_keeps_state(
        daemon, client, open_session):
    s = open_session(memory_mb=256)
    turn = client.turn_begin(s)["turn"]
    assert client.repl_exec(s, turn, "kept = 42")["status"] == "ok"
    r = client.repl_exec(s, turn, "b = bytearray(10**10)")
    assert r["status"] == "error" and not r["state_lost"], r
    assert r["output"].rstrip().endswith("MemoryError")
    # In pieces too: the limit is on what the interpreter allocates, however it gets there.
    r = client.repl_exec(s, turn, "parts = [bytearray(2**20) for _ in range(1024)]")
    assert r["status"] == "error" and "MemoryError" in r["output"], r
    again = client.repl_exec(s, turn, "kept")
    assert again["output"] == "42\n" and not again["fresh"] and not again["state_lost"]
    # What fits is still there to use.
    assert client.repl_exec(s, turn, "len(bytearray(64 * 2**20))")["output"] == "67108864\n"
    # The session keeps its cgroup, and the limit is the interpreter's alone: a command
    # over the session's memory is still ended by the kernel, the call saying so.
    with open(os.path.join(session_cgroup(daemon, s), "memory.limit_in_bytes")) as f:
        assert int(f.read()) == 256 * 2**20
    assert client.shell_run(s, "ulimit -d; ulimit -v")["output"] == "unlimited\nunlimited\n"
    over = client.shell_run(s, ALLOCATE.format(mb=512))
    assert over["signal"] == "SIGKILL" and LIMIT_NOTE.format(mb=256) in over["output"]
    assert client.repl_exec(s, turn, "kept")["output"] == "42\n"
    client.turn_end(s, turn)


@needs_memory_cgroup
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_a_node_repl_buffer_over_the_limit_throws_and_webassembly_still_works(client,
                                                                              open_session):
    s = open_session(memory_mb=256)
    turn = client.turn_begin(s)["turn"]
    assert client.repl_exec(s, turn, "var kept = 42", language="node")["status"] == "ok"
    r = client.repl_exec(s, turn, "const b = Buffer.alloc(2**30).fill(1)", language="node")
    assert r["status"] == "error" and not r["state_lost"], r
    assert "RangeError" in r["output"]
    # V8 reserves some 10 GB of address space for a WebAssembly memory: the limit is on
    # what is allocated, not on what is reserved.
    wasm = client.repl_exec(s, turn, "new WebAssembly.Memory({initial: 1}).buffer.byteLength",
                            language="node")
    assert wasm["output"] == "65536\n", wasm
    assert client.repl_exec(s, turn, "kept", language="node")["output"] == "42\n"
    client.turn_end(s, turn)


def test_without_a_memory_cgroup_each_process_gets_rlimit_as(daemon_root):
    """The daemon started where the memory hierarchy is out of reach (an empty tmpfs over it,
    in a mount namespace of its own): RLIMIT_AS, as before cgroups, and it says so."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to hide the memory cgroup from a daemon")
    hide = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs toolsd-test {cgroups.V1_BASE}/memory 2>/dev/null || "
            f"mount -t tmpfs toolsd-test {cgroups.V2_ROOT}; exec \"$@\"", "-")
    d = RunningDaemon(daemon_root, prefix=hide).start()
    try:
        assert "limited by RLIMIT_AS" in d.read_log()
        with d.client() as c:
            s = c.session_open(d.workspace, limits={"memory_mb": 512})["session"]
            assert c.shell_run(s, "ulimit -v")["output"] == f"{512 * 1024}\n"
            r = c.shell_run(s, ALLOCATE.format(mb=1024))
            assert r["exit_code"] == 1 and "MemoryError" in r["output"]
            assert "memory limit" not in r["output"]
            ok = c.shell_run(s, ALLOCATE.format(mb=64))
            assert ok["output"] == "allocated\n"
            default = c.session_open(d.workspace)["session"]
            assert c.shell_run(default, "ulimit -v")["output"] == f"{4096 * 1024}\n"
    finally:
        assert d.stop() == 0, d.read_log()


def test_a_session_with_a_memory_cgroup_has_no_address_space_limit(client, open_session):
    if "memory" not in PLACES:
        pytest.skip(f"no memory cgroup here: {WHY_NOT.get('memory')}")
    s = open_session(memory_mb=512)
    assert client.shell_run(s, "ulimit -v")["output"] == "unlimited\n"

