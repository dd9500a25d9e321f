"""Tenants (protocol 1.2): a token names a tenant, and a tenant sees and touches only what it
opened. Every method of the dispatch table is tried with another tenant's ids (so a method
added later is tried too); each must answer exactly as for an id that never existed."""

from __future__ import annotations

import hashlib
import os

import msgspec
import pytest

from conftest import RunningDaemon, wait_for, wait_gone
from toolsd.client import Client, ToolsdError
from toolsd.daemon import dispatch
from toolsd.daemon.tenants import Scope

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdefgh"
MARK = "PWNED"
# Text params that would leave a mark if another tenant's call ever ran.
TEXT = {"command": f"touch {MARK}", "code": f"open({MARK!r}, 'w').close()",
        "path": MARK, "to": MARK + "2", "data": MARK}
NEVER = {"session": "s999999", "id": "bg999999", "turn": "t-000000000000"}


def write_tokens(path: str, text: str) -> None:
    with open(path + ".new", "w") as f:
        f.write(text)
    os.chmod(path + ".new", 0o600)
    os.replace(path + ".new", path)


TWO = (f"# two tenants\nalice {ALICE}\n"
       f"bob sha256:{hashlib.sha256(BOB.encode()).hexdigest()}\n")


def two_tenants(d: RunningDaemon) -> None:
    """Alice and Bob, in a tokens file in the daemon's folder."""
    tokens = os.path.join(d.root, "tokens")
    write_tokens(tokens, TWO)
    d.extra_args += ("--tokens", tokens)


def tokens_daemon(root: str, *extra: str) -> RunningDaemon:
    d = RunningDaemon(root, extra_args=extra, tls=True)
    two_tenants(d)
    return d.start()


pytestmark = pytest.mark.daemon(shared=True, tls=True, prepare=two_tenants)


def connect(daemon, token) -> Client:
    return Client(daemon.url, token=token, fingerprint=daemon.fingerprint)


def sample(t: msgspec.inspect.Type):
    """A value that decodes as `t` (for the params a method requires)."""
    if isinstance(t, msgspec.inspect.UnionType):
        t = next(x for x in t.types if not isinstance(x, msgspec.inspect.NoneType))
    if isinstance(t, msgspec.inspect.LiteralType):
        return t.values[0]
    if isinstance(t, (msgspec.inspect.IntType, msgspec.inspect.FloatType)):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else 1)
        return type(low)(max(low, 1)) if isinstance(t, msgspec.inspect.IntType) else float(max(low, 1))
    return {msgspec.inspect.StrType: "x", msgspec.inspect.BytesType: b"x",
            msgspec.inspect.BoolType: True, msgspec.inspect.DictType: {},
            msgspec.inspect.ListType: [], msgspec.inspect.StructType: {}}[type(t)]


def params_for(method: dispatch.Method, ids: dict[str, str]) -> dict:
    params = {}
    for field in msgspec.inspect.type_info(method.params).fields:
        if field.name in ids:
            params[field.name] = ids[field.name]
        elif field.required:
            text = TEXT.get(field.name)
            params[field.name] = text if text is not None and isinstance(
                sample(field.type), str) else sample(field.type)
    return params


def error_of(client: Client, name: str, params: dict) -> ToolsdError | None:
    try:
        client.call(name, **params)
    except ToolsdError as e:
        return e
    return None


@pytest.fixture
def bobs(daemon):
    """Bob's session (on a workspace of his own), a turn of it and a running process."""
    workspace = os.path.join(daemon.root, "bob-ws")
    os.makedirs(workspace, exist_ok=True)
    with connect(daemon, BOB) as bob:
        session = bob.session_open(workspace)["session"]
        turn = bob.turn_begin(session)["turn"]
        bg = bob.process_start(session, "sleep 4646; echo bob")["id"]
        yield bob, {"session": session, "turn": turn, "id": bg}, workspace
        if session in {s["session"] for s in bob.session_list()["sessions"]}:
            bob.session_close(session)
    assert wait_gone(daemon.running("sleep 4646"), timeout=30) == []


def test_every_method_answers_another_tenants_ids_as_never_existing(daemon, bobs):
    bob, ids, workspace = bobs
    tried = []
    with connect(daemon, ALICE) as alice:
        for name, method in dispatch.METHODS.items():
            if method.scope is Scope.NONE:
                continue
            theirs = error_of(alice, name, params_for(method, ids))
            never = error_of(alice, name, params_for(method, NEVER))
            assert theirs is not None, f"{name} with bob's ids worked for alice"
            assert never is not None and never.code == "not_found", (name, never)
            said = theirs.message
            for key, value in ids.items():
                said = said.replace(value, NEVER[key])
            assert (theirs.code, said) == (never.code, never.message), name
            tried.append(name)
        # Every row that names a session or a process says so (else the loop skipped it).
        for name, method in dispatch.METHODS.items():
            fields = {f.name for f in msgspec.inspect.type_info(method.params).fields}
            if fields & {"session", "id"} and name != "session.open":
                assert name in tried, f"{name} takes an id but its row has no scope"
        assert {"session.close", "shell.run", "repl.exec", "process.stop", "process.write",
                "process.output", "image.read", "turn.end"} <= set(tried)
        # The listings leave bob out.
        assert alice.session_list()["sessions"] == []
        assert alice.process_list()["processes"] == []
    # Nothing of bob's was touched: his process runs, his session works, no mark was left.
    assert bob.process_output(ids["id"])["status"] == "running"
    assert bob.shell_run(ids["session"], "ls -A")["output"] == ""
    assert not os.path.exists(os.path.join(workspace, MARK))
    assert bob.turn_end(ids["session"], ids["turn"])["repls_stopped"] == 0


def test_each_tenant_sees_its_own_and_the_local_owner_sees_all(daemon, bobs):
    bob, ids, _ = bobs
    with connect(daemon, ALICE) as alice:
        assert alice.server_hello["tenant"] == "alice"
        mine = alice.session_open()["session"]
        assert alice.shell_run(mine, "echo mine")["output"] == "mine\n"
        bg = alice.process_start(mine, "sleep 4747")["id"]
        assert [s["session"] for s in alice.session_list()["sessions"]] == [mine]
        assert [p["id"] for p in alice.process_list()["processes"]] == [bg]
        assert [s["session"] for s in bob.session_list()["sessions"]] == [ids["session"]]
        bobs_ids = {p["id"] for p in bob.process_list()["processes"]}
        assert ids["id"] in bobs_ids and bg not in bobs_ids
        with daemon.client() as local:
            assert local.hello()["tenant"] == "local"
            tenants = {s["session"]: s["tenant"] for s in local.session_list()["sessions"]}
            assert tenants == {mine: "alice", ids["session"]: "bob"}
            assert {p["id"] for p in local.process_list()["processes"]} >= {bg, ids["id"]}
        assert alice.process_stop(bg)["survivors"] == 0
        alice.session_close(mine)


def test_status_and_ps_show_each_sessions_tenant(daemon, bobs):
    import subprocess
    import sys

    _, ids, _ = bobs
    env = {**daemon.env, "HOME": daemon.home}
    out = subprocess.run([sys.executable, "-m", "toolsd", "--socket", daemon.socket, "status"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert f"{ids['session']}" in out and "tenant=bob" in out
    ps = subprocess.run([sys.executable, "-m", "toolsd", "--socket", daemon.socket, "ps"],
                        capture_output=True, text=True, env=env, check=True).stdout
    header, row = ps.splitlines()[0], next(l for l in ps.splitlines() if ids["id"] in l)
    assert header.split()[:3] == ["ID", "SESSION", "TENANT"] and row.split()[2] == "bob"


def test_a_tokens_file_others_can_read_is_refused_at_start(daemon_root):
    tokens = os.path.join(daemon_root, "tokens")
    with open(tokens, "w") as f:
        f.write(f"alice {ALICE}\n")
    os.chmod(tokens, 0o644)
    d = RunningDaemon(daemon_root, extra_args=("--tokens", tokens), tls=True)
    with pytest.raises(RuntimeError) as e:
        d.start()
    assert "chmod 600" in str(e.value) and d.proc.returncode == 1


def test_tokens_are_read_again_when_the_file_changes(daemon_root):
    d = tokens_daemon(daemon_root)
    tokens = os.path.join(daemon_root, "tokens")
    try:
        staying = connect(d, ALICE)
        carol = "carol-token-0123456789abcdef"
        write_tokens(tokens, f"bob {BOB}\ncarol {carol}\n")  # alice revoked, carol added
        with connect(d, carol) as c:
            assert c.server_hello["tenant"] == "carol"
        with pytest.raises(ToolsdError) as e:
            connect(d, ALICE)
        assert e.value.code == "unauthorized"
        assert staying.hello()["tenant"] == "alice"  # a connection it let in stays
        staying.close()
        write_tokens(tokens, "bob short\n")  # not valid: the tokens read before are kept
        with connect(d, carol) as c:
            assert c.server_hello["tenant"] == "carol"
        assert "kept the tokens read before" in d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_another_tenants_ended_session_is_not_found_not_closed(daemon_root):
    d = tokens_daemon(daemon_root, "--idle-timeout", "1")
    try:
        with connect(d, BOB) as bob, connect(d, ALICE) as alice:
            session = bob.session_open(d.workspace)["session"]
            # A listing is a look from outside: it keeps nothing from being idle.
            wait_for(lambda: bob.session_list()["sessions"] == [])
            with pytest.raises(ToolsdError) as e:  # closed by the idle timeout: bob is told
                bob.shell_run(session, "true")
            assert e.value.code == "session_closed" and "without activity" in e.value.message
            with pytest.raises(ToolsdError) as e:
                alice.shell_run(session, "true")
            assert e.value.code == "not_found"
            assert e.value.message == error_of(alice, "shell.run", {
                "session": "s999999", "command": "true"}).message.replace("s999999", session)
    finally:
        assert d.stop() == 0, d.read_log()
