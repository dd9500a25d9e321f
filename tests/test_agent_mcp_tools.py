"""Outside MCP servers as deferred tools: not declared at first, found and activated with
tool_search, appended after a head that never changes; gated as the built-in tools are; a
server that dies mid-call is a tool error and the turn goes on. Legacy tool names stay
dispatchable, hidden. The server is tests/mcp_tools_server.py (the SDK's, 30 tools)."""

from __future__ import annotations

import json
import os
import sys

import msgspec
import psutil
import pytest
import trio

import agentkit
from agent.calls.catalog import Catalog, Deferred
from agent.calls.tools import TOOLS, TOOL_NAMES
from agent.history.messages import ToolSpec
from agent.models.scripted import ScriptedModel, call, reply
from agent.turns.settings import Settings, SettingsError, load_settings, parse_file
from conftest import needs_bwrap, wait_gone
from model_server import Call, ModelServer, openai_stream
from test_agent_cli import argv, run

pytestmark = pytest.mark.daemon(shared=True)
kit = agentkit.kit
place = agentkit.place

SERVER = os.path.join(os.path.dirname(__file__), "mcp_tools_server.py")
SETTINGS = Settings(mcp={"tools": [sys.executable, SERVER]})
CONVERT = "mcp__tools__unit_convert"


def servers_running() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if SERVER in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


@pytest.fixture
def files(tmp_path, monkeypatch):
    """Where the server's note_write and hang_forever write (it gets our environment)."""
    monkeypatch.setenv("NOTES_FILE", str(tmp_path / "notes"))
    monkeypatch.setenv("HANG_FILE", str(tmp_path / "hang"))
    yield tmp_path
    assert wait_gone(servers_running(), timeout=30) == [], "an MCP server was left running"


def names(request) -> list[str]:
    return [t.name for t in request.tools]


def head_bytes(request, n: int) -> bytes:
    return msgspec.json.encode(request.tools[:n])


# ---------------------------------------------------------------- pure parts


def entry(server: str, tool: str, description: str, read_only: bool = False) -> Deferred:
    spec = ToolSpec(f"mcp__{server}__{tool}", description, {"type": "object"}, read_only)
    return Deferred(spec=spec, server=server, tool=tool)


def test_search_finds_by_words_and_activation_appends_after_an_unchanged_head():
    catalog = Catalog(TOOLS)
    catalog.add([entry("t", "unit_convert", "Convert a value between units of length."),
                 entry("t", "weather_lookup", "Look up a weather forecast."),
                 entry("t", "zip_lookup", "Look up a zip archive.")])
    head = msgspec.json.encode(catalog.tools())
    assert [t.name for t in catalog.tools()] == [*TOOL_NAMES, "tool_search"]
    assert [d.tool for d in catalog.search("convert units")] == ["unit_convert"]
    assert [d.tool for d in catalog.search("look up")][:2] == ["weather_lookup", "zip_lookup"]
    assert catalog.search("nothing like it") == []
    text, error = catalog.search_text("", ["mcp__t__zip_lookup", "nope"])
    assert not error and "Activated: mcp__t__zip_lookup" in text and "Not found: nope" in text
    assert [t.name for t in catalog.tools()][-1] == "mcp__t__zip_lookup"
    assert msgspec.json.encode(catalog.tools()[:len(TOOLS) + 1]) == head
    assert catalog.search_text("", [])[1] is True


def test_no_deferred_tools_no_tool_search_and_legacy_names_resolve_hidden():
    catalog = Catalog(TOOLS, renamed={"shell": "run_terminal"})
    assert [t.name for t in catalog.tools()] == list(TOOL_NAMES)
    assert catalog.lookup("shell").name == "run_terminal"
    assert catalog.lookup("nothing") is None


def test_settings_from_the_file_and_the_options(tmp_path):
    s = parse_file("a.toml", '[mcp]\nx = "srv --flag \'a b\'"\ny = ["node", "i.js"]\n'
                             '[lsp]\npython = "pylsp"\ntypescript = false\n')
    assert s.mcp == {"x": ["srv", "--flag", "a b"], "y": ["node", "i.js"]}
    assert s.lsp == {"python": ["pylsp"], "typescript": []}
    bad = {"[mcp]\nx = 3\n": "give a command line",
           "[mcp]\n\"a b\" = \"c\"\n": "must be 1 to 32 letters",
           "[other]\n": "unknown section 'other'",
           "[mcp]\nx = \"'unclosed\"\n": "check its quotes",
           "[mcp\n": "is not valid TOML",
           "[mcp]\nx = \"\"\n": "the command is empty",
           "[lsp]\nrust = \"rust-analyzer\"\n": "the languages are python, typescript, "
                                                "javascript"}
    for text, message in bad.items():
        with pytest.raises(SettingsError, match=message):
            parse_file("a.toml", text)
    path = tmp_path / "agent.toml"
    path.write_text('[mcp]\nx = "from-file"\n')

    class Args:
        config = str(path)
        mcp = ["x=from-option --a", "z=other"]

    assert load_settings(Args).mcp == {"x": ["from-option", "--a"], "z": ["other"]}
    Args.mcp = ["nameless"]
    with pytest.raises(SettingsError, match="give NAME=COMMAND"):
        load_settings(Args)
    Args.config, Args.mcp = str(tmp_path / "missing.toml"), []
    with pytest.raises(SettingsError, match="give a readable TOML file"):
        load_settings(Args)


# ---------------------------------------------------------------- with the SDK's server


@needs_bwrap
async def test_deferred_tools_are_found_activated_after_the_head_and_called(kit, files):
    model = ScriptedModel([
        reply("", call("tool_search", query="convert units of length")),
        reply("", call("tool_search", activate=[CONVERT])),
        reply("", call(CONVERT, value=2, source="km", target="mi")),
        reply("2 km is 1.243 mi."),
    ])
    agent = await kit.open(model=model, settings=SETTINGS)
    result = await agent.run_turn("how many miles is 2 km?")
    assert result.outcome == "completed", result.reason
    first, found, activated, called = model.requests
    assert names(first) == [*TOOL_NAMES, "tool_search"]  # none of the 30 declared
    assert "30 tools of outside servers (tools)" in first.tools[-1].description
    search = agent.conversation.messages[2].text
    assert search.splitlines()[:2] == [
        "Tools matching 'convert units of length':",
        f"- {CONVERT}: Convert a value between units of length (m, km, mi, ft)."]
    assert names(found) == names(first)
    assert names(called) == [*TOOL_NAMES, "tool_search", CONVERT]
    n = len(TOOL_NAMES) + 1
    assert head_bytes(called, n) == head_bytes(first, n)  # the cached prefix is kept
    results = [m for m in agent.conversation.messages if getattr(m, "call_id", None)]
    assert results[-1].text == "1.243 mi" and not results[-1].is_error
    await agent.aclose()
    assert wait_gone(servers_running(), timeout=30) == []
    # Resumed, the conversation's outside tools are declared again from its first request.
    resumed = ScriptedModel([reply("Still here.")])
    again = await kit.open(model=resumed, settings=SETTINGS, resume="latest")
    assert (await again.run_turn("and 3 km?")).outcome == "completed"
    assert names(resumed.requests[0]) == [*TOOL_NAMES, "tool_search", CONVERT]


@needs_bwrap
async def test_a_server_killed_mid_call_is_a_tool_error_and_the_turn_goes_on(kit, files):
    hang = files / "hang"

    async def kill_it(request):
        return reply("", call("mcp__tools__hang_forever"))

    async def after(request):
        return reply("It stopped; going on without it.")

    model = ScriptedModel([reply("", call("tool_search", activate=["mcp__tools__hang_forever"])),
                           kill_it, after])
    agent = await kit.open(model=model, settings=SETTINGS)
    async with trio.open_nursery() as nursery:
        async def killer():
            while not hang.exists() or not hang.read_text():
                await trio.sleep(0.05)
            os.kill(int(hang.read_text()), 9)
        nursery.start_soon(killer)
        result = await agent.run_turn("wait for it")
    assert result.outcome == "completed", result.reason
    error = [m for m in agent.conversation.messages if getattr(m, "call_id", None)][-1]
    assert error.is_error
    assert error.text.startswith("[mcp__tools__hang_forever: the MCP server tools ended "
                                 "during the call (its connection closed)")
    # Its tools now answer so at once, and the agent stays usable.
    model.add(reply("", call(CONVERT, value=1, source="m", target="ft")), reply("ok"))
    assert (await agent.run_turn("again")).outcome == "completed"
    again = [m for m in agent.conversation.messages if getattr(m, "call_id", None)][-1]
    assert again.text.startswith(f"[{CONVERT} cannot run: the MCP server tools is not running")


@needs_bwrap
async def test_plan_mode_refuses_tools_not_marked_read_only_and_ask_mode_asks(kit, files):
    plan = ScriptedModel([reply("", call("mcp__tools__note_write", line="x"),
                                call(CONVERT, value=1, source="km", target="m")),
                          reply("done")])
    agent = await kit.open(model=plan, mode="plan", settings=SETTINGS)
    assert (await agent.run_turn("note it")).outcome == "completed"
    refused, converted = [m for m in agent.conversation.messages if getattr(m, "call_id", None)]
    assert refused.is_error and refused.text.startswith(
        "Plan mode is read-only, and this would write (mcp__tools__note_write is an outside "
        "server's tool that its server does not mark read-only)")
    assert converted.text == "1000.000 m"
    assert not (files / "notes").exists()
    asked = []

    async def approve(tool_call):
        asked.append(tool_call.name)
        return True

    ask = ScriptedModel([reply("", call("mcp__tools__note_write", line="hello"),
                               call(CONVERT, value=1, source="km", target="m")),
                         reply("done")])
    agent = await kit.open(model=ask, mode="ask", approve=approve, settings=SETTINGS)
    assert (await agent.run_turn("note it")).outcome == "completed"
    assert asked == ["mcp__tools__note_write"]  # the read-only one ran unasked
    assert (files / "notes").read_text() == "hello\n"


@needs_bwrap
async def test_a_renamed_tool_runs_from_a_saved_conversation_hidden_from_the_catalog(kit):
    renamed = {"shell": "run_terminal"}
    first = ScriptedModel([reply("", call("shell", command="echo old name")), reply("ok")])
    agent = await kit.open(model=first, renamed=renamed)
    assert (await agent.run_turn("go")).outcome == "completed"
    await agent.aclose()
    model = ScriptedModel([reply("", call("shell", command="echo still")), reply("ok")])
    again = await kit.open(model=model, renamed=renamed, resume="latest")
    assert (await again.run_turn("again")).outcome == "completed"
    results = [m for m in again.conversation.messages if getattr(m, "call_id", None)]
    assert [r.text for r in results] == ["old name\n[exit code 0]", "still\n[exit code 0]"]
    assert all("shell" not in names(r) for r in first.requests + model.requests)


@needs_bwrap
async def test_a_server_that_cannot_start_is_reported_and_the_others_work(kit, files):
    settings = Settings(mcp={"tools": [sys.executable, SERVER],
                             "gone": ["/nonexistent/mcp-server"]})
    model = ScriptedModel([reply("", call("tool_search", query="zip archive")), reply("ok")])
    agent = await kit.open(model=model, settings=settings)
    assert agent.notes == ["toolsd agent: the MCP server gone did not start: its command was "
                           "not found (/nonexistent/mcp-server) (its tools are not available)"]
    assert (await agent.run_turn("zip?")).outcome == "completed"
    text = agent.conversation.messages[2].text
    assert "- mcp__tools__zip_archive_lookup: Look up a zip archive." in text
    assert "(The server gone is unavailable: its command was not found" in text
    model.add(reply("", call("mcp__tools__guessed", x=1)), reply("ok"))
    assert (await agent.run_turn("guess")).outcome == "completed"
    guessed = [m for m in agent.conversation.messages if getattr(m, "call_id", None)][-1]
    assert guessed.is_error and guessed.text.startswith(
        "There is no tool 'mcp__tools__guessed'; the tools declared are run_terminal, ")
    assert guessed.text.endswith(", tool_search; tool_search finds more by words.")


@needs_bwrap
def test_mcp_option_end_to_end(place, daemon, files):
    with ModelServer() as server:
        server.push(openai_stream(calls=[Call("tool_search", {"activate": [CONVERT]})]),
                    openai_stream(text="Ready."))
        done = run(argv(server, place, "--mode", "auto", "--mcp",
                        f"tools={sys.executable} {SERVER}", "go",
                        socket=daemon.socket), place)
        assert done.returncode == 0, done.stderr
        first, second = (r.body["tools"] for r in server.requests)
        assert [t["function"]["name"] for t in first][-1] == "tool_search"
        assert [t["function"]["name"] for t in second][-1] == CONVERT
        assert json.dumps(second[:len(first)]) == json.dumps(first)
    # The same server from the agent's config file, at its default place.
    config = os.path.join(place.root, "config", "toolsd")
    os.makedirs(config)
    with open(os.path.join(config, "agent.toml"), "w") as f:
        f.write(f"[mcp]\ntools = {json.dumps([sys.executable, SERVER])}\n")
    place.env["XDG_CONFIG_HOME"] = os.path.join(place.root, "config")
    with ModelServer() as server:
        server.push(openai_stream(text="Ready."))
        done = run(argv(server, place, "--mode", "auto", "go", socket=daemon.socket),
                   place)
        assert done.returncode == 0, done.stderr
        assert [t["function"]["name"] for t in server.requests[0].body["tools"]][-1] == \
            "tool_search"
    bad = run(argv(server, place, "--mcp", "oops", "go"), place)
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("toolsd agent: --mcp 'oops': give NAME=COMMAND, e.g. --mcp "
                                  "tickets='tickets-mcp --stdio'")


def test_a_search_lists_within_bounds_whatever_the_server_wrote():
    catalog = Catalog(TOOLS)
    catalog.add([entry("t", f"tool_{i}", "convert " + "x" * 5000) for i in range(40)])
    text, error = catalog.search_text("convert", [f"mcp__t__tool_{i}" for i in range(40)])
    assert not error
    assert text.count("\n- ") == 8 and max(map(len, text.splitlines())) < 400
    assert len(catalog.active) == 16  # at most that many from one call


async def test_deferring_keeps_the_tool_block_small(tmp_path, files):
    """The figure in the README: what the tool block costs (characters / 4) with the 30
    tools deferred behind tool_search, and with all of them declared."""
    from agent.calls.mcp_tools import McpTools

    mcp = McpTools(SETTINGS.mcp, str(tmp_path), str(tmp_path))
    await mcp.start()
    try:
        catalog = Catalog(TOOLS)
        catalog.add(mcp.entries())
        assert len(mcp.entries()) == 30
        cost = {what: len(msgspec.json.encode(tools)) // 4 for what, tools in {
            "built-in": TOOLS, "deferred": catalog.tools(),
            "declared": TOOLS + [e.spec for e in mcp.entries()]}.items()}
        print(f"\ntool block: built-in {cost['built-in']} tokens; with 30 MCP tools "
              f"deferred {cost['deferred']}; all declared {cost['declared']}")
        assert cost["deferred"] - cost["built-in"] < (cost["declared"] - cost["built-in"]) / 5
    finally:
        await mcp.close()


@needs_bwrap
def test_a_killed_agent_leaves_no_mcp_server(place, files):
    """The servers are the agent's children on the host: killed with SIGKILL, it gives them
    no word, but their stdin closes with it, and an MCP server ends at the end of its
    input."""
    import subprocess
    import threading

    from agentkit import descendants, running
    from conftest import wait_for

    hold = threading.Event()
    with ModelServer() as server:
        streaming = openai_stream(text="thinking")
        streaming.hold = hold  # the model streams while the agent is killed
        server.push(streaming)
        proc = subprocess.Popen(argv(server, place, "--mode", "auto", "--mcp",
                                     f"tools={sys.executable} {SERVER}", "go"),
                                env=place.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            server.wait_for_requests(1)
            tree = descendants(proc.pid)
            assert running(tree, SERVER)
            proc.kill()
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            hold.set()
    assert wait_gone(tree, timeout=60) == [], "a killed agent left its MCP server or daemon"
