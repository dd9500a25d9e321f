"""Diagnostics after edits: a file a tool says it edited is checked by its language server,
run in the session, and the next model request carries what it said in one runtime message;
a server that never answers, crashes at start, or floods leaves the turn going, bounded,
with "no diagnostics: why" or a capped list. The server is tests/fake_lsp_server.py (the
real protocol); the file tools that will name their edits are stood in for by a toolbox
that marks run_terminal's `> FILE` writes as edits."""

from __future__ import annotations

import os
import shutil
import sys

import msgspec
import pytest

import agentkit
from agent.calls.results import RESULT_CHARS
from agent.calls.toolbox import Toolbox
from agent.lsp.diagnostics import HEADER, DiagnosticLimits
from agent.lsp.servers import choices, language_of
from agent.lsp.wire import Deframer, Flood, Garbled, frame, read_published
from agent.models.scripted import ScriptedModel, call, reply
from agent.turns.settings import Settings
from conftest import needs_bwrap

pytestmark = pytest.mark.daemon(shared=True)
kit = agentkit.kit

FAKE = os.path.join(os.path.dirname(__file__), "fake_lsp_server.py")


def fake(kit, mode: str) -> Settings:
    """The fake server as the session runs it: a copy in the workspace, which the sandbox
    shows wherever the checkout is (a checkout under /tmp is not seen from inside)."""
    folder = os.path.join(kit.workspace, ".fake-lsp")
    os.makedirs(folder, exist_ok=True)
    copy = shutil.copy(FAKE, folder)
    return Settings(lsp={"python": [sys.executable, copy, mode]})


# ---------------------------------------------------------------- pure parts


def test_frames_are_read_however_they_are_cut_and_floods_are_refused():
    one = frame({"jsonrpc": "2.0", "method": "a", "params": {"t": "é"}}).encode()
    two = frame({"jsonrpc": "2.0", "id": 1, "result": None}).encode()
    d = Deframer()
    data = one + two
    got = []
    for i in range(0, len(data), 7):
        got += d.feed(data[i:i + 7])
    assert [m.get("method", m.get("id")) for m in got] == ["a", 1]
    assert got[0]["params"]["t"] == "é"
    with pytest.raises(Flood, match="a message of 9,999,999 bytes"):
        Deframer().feed(b"Content-Length: 9999999\r\n\r\n{")
    with pytest.raises(Flood, match="a header block over"):
        Deframer().feed(b"X" * 10_000)
    with pytest.raises(Garbled, match="without Content-Length"):
        Deframer().feed(b"Hello: there\r\n\r\n")
    with pytest.raises(Garbled, match="not JSON"):
        Deframer().feed(b"Content-Length: 3\r\n\r\nabc")


def test_a_publish_is_read_into_types_and_only_its_head_is():
    diagnostics = [{"range": {"start": {"line": i, "character": 0},
                              "end": {"line": i, "character": 1}}, "message": f"m{i}"}
                   for i in range(1000)]
    p = read_published({"jsonrpc": "2.0", "method": "textDocument/publishDiagnostics",
                        "params": {"uri": "file:///a.py", "diagnostics": diagnostics}}, 5)
    assert (p.uri, p.total, [d.message for d in p.shown]) == \
        ("file:///a.py", 1000, ["m0", "m1", "m2", "m3", "m4"])
    assert read_published({"jsonrpc": "2.0", "method": "other"}, 5) is None
    with pytest.raises(Garbled):
        read_published({"method": "textDocument/publishDiagnostics",
                        "params": {"uri": 3, "diagnostics": [{"message": 1}]}}, 5)


def test_which_server_for_which_file():
    assert [language_of(p) for p in ("a.py", "b.TSX", "c.mjs", "README.md")] == \
        ["python", "typescript", "javascript", None]
    assert choices("python", {}) == [["pyright-langserver", "--stdio"], ["pylsp"]]
    assert choices("python", {"python": ["my-lsp"]}) == [["my-lsp"]]
    assert choices("python", {"python": []}) == []


# ---------------------------------------------------------------- in a session


class FileTools(Toolbox):
    """Stands in for the file tools: a run_terminal call that writes `> NAME` names NAME as
    edited, as a file tool's result will."""

    async def call(self, tool_call, change=None):
        outcome = await super().call(tool_call, change)
        command = tool_call.arguments.get("command", "")
        if tool_call.name == "run_terminal" and "> " in command:
            target = command.rsplit("> ", 1)[1].split()[0]
            outcome = msgspec.structs.replace(outcome, edited=[target])
        return outcome


async def open_agent(kit, mode: str, script, limits: DiagnosticLimits = DiagnosticLimits()):
    model = ScriptedModel(script)
    agent = await kit.open(model=model, settings=fake(kit, mode))
    agent.toolbox = FileTools(agent.backend, agent.toolbox.catalog)
    agent.diagnostics.limits = limits
    return agent, model


def runtime_messages(request) -> list[str]:
    return [t for t in agentkit.texts(request) if t.startswith(HEADER)]


@needs_bwrap
async def test_an_edit_with_a_type_error_reaches_the_next_request(kit):
    agent, model = await open_agent(kit, "normal", [
        reply("", call("run_terminal", command="printf 'x = 1\\ny = TYPE_ERROR\\n' > bad.py")),
        reply("", call("run_terminal", command="printf 'y = 2\\n' > bad.py")),
        reply("", call("run_terminal", command="printf 'not python' > notes.md")),
        reply("Fixed."),
    ])
    result = await agent.run_turn("make the file")
    assert result.outcome == "completed", result.reason
    first, after_bad, after_fix, after_notes = model.requests
    assert runtime_messages(first) == []
    assert runtime_messages(after_bad) == [
        f"{HEADER}\nbad.py (fake_lsp_server.py): 1 problem:\n"
        f"  2:1 error: Type error: TYPE_ERROR is not a str [fake-lsp]"]
    # The second edit is a didChange of the open document: the server's word is the new one.
    assert runtime_messages(after_fix)[-1] == \
        f"{HEADER}\nbad.py (fake_lsp_server.py): no problems reported"
    # A kind of file no server checks adds nothing.
    assert len(runtime_messages(after_notes)) == 2
    events = [e for e in agent.conversation.events() if e["type"] == "diagnostics"]
    assert [e["files"][0]["count"] for e in events] == [1, 0]


@needs_bwrap
async def test_the_file_tools_edits_reach_the_next_request(kit):
    model = ScriptedModel([
        reply("", call("write_file", path="bad.py", content="x = 1\ny = TYPE_ERROR\n")),
        reply("", call("edit_file", path="bad.py", old="TYPE_ERROR", new="2")),
        reply("Fixed."),
    ])
    agent = await kit.open(model=model, settings=fake(kit, "normal"))  # the real file tools
    assert (await agent.run_turn("make the file")).outcome == "completed"
    first, after_write, after_edit = model.requests
    assert runtime_messages(first) == []
    assert runtime_messages(after_write) == [
        f"{HEADER}\nbad.py (fake_lsp_server.py): 1 problem:\n"
        f"  2:1 error: Type error: TYPE_ERROR is not a str [fake-lsp]"]
    assert runtime_messages(after_edit)[-1] == \
        f"{HEADER}\nbad.py (fake_lsp_server.py): no problems reported"


@needs_bwrap
async def test_a_server_that_never_answers_is_bounded_and_said(kit):
    agent, model = await open_agent(kit, "silent", [
        reply("", call("run_terminal", command="printf 'y = TYPE_ERROR\\n' > a.py")),
        reply("", call("run_terminal", command="printf 'z = 1\\n' > a.py")),
        reply("Done."),
    ], DiagnosticLimits(start_s=2, wait_s=2))
    assert (await agent.run_turn("go")).outcome == "completed"
    assert runtime_messages(model.requests[1]) == [
        f"{HEADER}\na.py: no diagnostics: fake_lsp_server.py did not answer initialize "
        f"within 2 s"]
    # It was stopped, and is not asked again: the next edit says why at once.
    assert runtime_messages(model.requests[2])[-1] == runtime_messages(model.requests[1])[0]
    listed = await agent.backend.client.process_list(agent.backend.session)
    assert [p["status"] for p in listed["processes"] if p["name"] == "lsp-python"] == \
        ["stopped"]


@needs_bwrap
async def test_a_server_that_crashes_at_start_says_what_it_said(kit):
    agent, model = await open_agent(kit, "crash", [
        reply("", call("run_terminal", command="printf 'y = TYPE_ERROR\\n' > a.py")),
        reply("Done."),
    ])
    assert (await agent.run_turn("go")).outcome == "completed"
    assert runtime_messages(model.requests[1]) == [
        f"{HEADER}\na.py: no diagnostics: fake_lsp_server.py stopped: it exited (exit code "
        f"3); it said: fake-lsp: cannot start: no project config"]


@needs_bwrap
async def test_ten_thousand_diagnostics_come_as_a_capped_list(kit):
    agent, model = await open_agent(kit, "flood", [
        reply("", call("run_terminal", command="printf 'y = 1\\n' > a.py")),
        reply("Done."),
    ])
    assert (await agent.run_turn("go")).outcome == "completed"
    [message] = runtime_messages(model.requests[1])
    assert message.splitlines()[1] == \
        "a.py (fake_lsp_server.py): 10000 problems; the first 30:"
    assert message.splitlines()[-1] == "  30:1 error: flood 29 [fake-lsp]"
    assert len(message) <= RESULT_CHARS


@needs_bwrap
async def test_a_server_that_mixes_logs_into_the_protocol_is_stopped_and_said(kit):
    agent, model = await open_agent(kit, "chatty", [
        reply("", call("run_terminal", command="printf 'y = 1\\n' > a.py")),
        reply("Done."),
    ])
    assert (await agent.run_turn("go")).outcome == "completed"
    [message] = runtime_messages(model.requests[1])
    assert message.startswith(
        f"{HEADER}\na.py: no diagnostics: fake_lsp_server.py sent a header without "
        f"Content-Length: b'Starting the fake server\\nContent-Length: ")
    listed = await agent.backend.client.process_list(agent.backend.session)
    assert [p["status"] for p in listed["processes"] if p["name"] == "lsp-python"] == \
        ["stopped"]


@needs_bwrap
async def test_no_server_in_the_session_is_said_and_terminal_writes_get_none(kit):
    model = ScriptedModel([
        reply("", call("run_terminal", command="printf 'y = TYPE_ERROR\\n' > a.py")),
        reply("Done."),
    ])
    agent = await kit.open(model=model, settings=Settings(lsp={"python": ["/nonexistent/ls"]}))
    assert (await agent.run_turn("go")).outcome == "completed"
    assert runtime_messages(model.requests[1]) == []  # run_terminal names no edit
    agent.diagnostics.file_edited("a.py")  # as a file tool's result would
    model.add(reply("ok"))
    assert (await agent.run_turn("again")).outcome == "completed"
    assert runtime_messages(model.requests[2]) == [
        f"{HEADER}\na.py: no diagnostics: no language server for python in the session "
        f"(looked for /nonexistent/ls; set one in the agent's [lsp] config)"]


PYLSP = os.path.join(os.path.dirname(sys.executable), "pylsp")


@needs_bwrap
@pytest.mark.skipif(not os.path.exists(PYLSP), reason="python-lsp-server is not installed "
                    "(pip install 'toolsd[lsp]')")
async def test_a_real_language_server_reports_the_type_error(kit):
    pytest.importorskip("pylsp_mypy", reason="pylsp-mypy is not installed")
    model = ScriptedModel([
        reply("", call("run_terminal", command="printf 'count: int = \"many\"\\n' > typed.py")),
        reply("Done."),
    ])
    agent = await kit.open(model=model, settings=Settings(lsp={"python": [PYLSP]}))
    agent.toolbox = FileTools(agent.backend, agent.toolbox.catalog)
    # mypy's first run is slow
    agent.diagnostics.limits = DiagnosticLimits(start_s=60, wait_s=120)
    assert (await agent.run_turn("go")).outcome == "completed"
    [message] = runtime_messages(model.requests[1])
    assert message.startswith(f"{HEADER}\ntyped.py (pylsp): ")
    assert 'Incompatible types in assignment (expression has type "str", variable has ' \
           'type "int")' in message


@needs_bwrap
async def test_a_lost_session_gets_a_new_server_in_its_new_session(kit):
    agent, model = await open_agent(kit, "normal", [
        reply("", call("run_terminal", command="printf 'y = TYPE_ERROR\\n' > a.py")),
        reply("Done."),
    ])
    assert (await agent.run_turn("go")).outcome == "completed"
    lost = agent.backend.session
    agentkit.kill_sandbox(kit.daemon, lost)  # its language server dies with it
    model.add(reply("", call("run_terminal", command="printf 'z = TYPE_ERROR\\n' > b.py")),
              reply("Done."))
    assert (await agent.run_turn("again")).outcome == "completed"
    assert agent.backend.session != lost
    assert runtime_messages(model.requests[3])[-1] == (
        f"{HEADER}\nb.py (fake_lsp_server.py): 1 problem:\n"
        f"  1:1 error: Type error: TYPE_ERROR is not a str [fake-lsp]")
