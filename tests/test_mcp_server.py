"""`toolsd mcp` as a subprocess, driven by the MCP SDK's own client over stdio."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from PIL import Image

import agentkit
from agent.calls.tools import TOOLS
from agentkit import descendants, kill_sandbox, running
from conftest import has_ended, needs_bwrap, wait_for, wait_gone

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

place = agentkit.place


def server_argv(place, *args: str, socket: str | None = None) -> list[str]:
    return ["-m", "toolsd", "mcp", "--workspace", place.workspace,
            *(["--socket", socket] if socket else []), *args]


@contextlib.asynccontextmanager
async def connect(place, *args: str, socket: str | None = None, mode: str = "auto"):
    """The SDK's client on `toolsd mcp`; the server's stderr goes to mcp.log."""
    params = StdioServerParameters(command=sys.executable,
                                   args=server_argv(place, *args, socket=socket),
                                   env=place.env)
    with open(os.path.join(place.root, "mcp.log"), "a") as log:
        async with Client(stdio_client(params, errlog=log), mode=mode) as client:
            yield client


def servers() -> list[psutil.Process]:
    """The `toolsd mcp` processes this test process started."""
    return [p for p in psutil.Process().children()
            if not has_ended(p) and "mcp" in p.cmdline() and "toolsd" in p.cmdline()]


def texts(result) -> list[str]:
    return [c.text for c in result.content if c.type == "text"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_six_tools_and_repl_reset_as_the_agent_has_them(place, daemon, mode):
    async with connect(place, socket=daemon.socket, mode=mode) as client:
        listed = (await client.list_tools()).tools
    assert [t.name for t in listed] == [t.name for t in TOOLS] + ["repl_reset"]
    for tool, spec in zip(listed, TOOLS):
        assert tool.input_schema == spec.parameters
        assert tool.description == spec.description or tool.name == "repl"
        assert tool.annotations.read_only_hint is spec.read_only
        assert tool.annotations.destructive_hint is (None if spec.read_only else True)
        assert tool.annotations.open_world_hint is False
    assert {t.name for t in listed if t.annotations.read_only_hint} == \
        {"process_output", "read_image", "read_file", "find"}
    assert listed[-1].input_schema == {"type": "object", "properties": {}}


async def test_run_terminal_gives_the_agents_results(place, daemon):
    os.makedirs(os.path.join(place.workspace, "sub"))
    async with connect(place, socket=daemon.socket) as client:
        long = await client.call_tool("run_terminal", {"command": "seq 1 5000"})
        failed = await client.call_tool("run_terminal", {"command": "echo oops; exit 3"})
        await client.call_tool("run_terminal", {"command": "cd sub"})
        where = await client.call_tool("run_terminal", {"command": "pwd"})
        wrong = await client.call_tool("run_terminal", {"comand": "ls"})
        stranger = await client.call_tool("process_stop", {"id": "bg1"})
    [text] = texts(long)
    assert not long.is_error and len(text) <= 4000 and text.startswith("1\n2\n")
    assert "[output cut: " in text and "the whole output is in /tmp/toolsd-output-" in text
    assert texts(failed) == ["oops\n[exit code 3]"]
    assert texts(where) == [f"{place.workspace}/sub\n[exit code 0]"]
    assert wrong.is_error and texts(wrong) == [
        "run_terminal: Object missing required field `command`"]
    # Process ids are daemon-wide; this connection reaches only those it started.
    assert stranger.is_error and texts(stranger) == [
        "There is no background process 'bg1' of yours. Processes you started: none."]


async def test_repl_state_lasts_until_repl_reset(place, daemon):
    async with connect(place, socket=daemon.socket) as client:
        await client.call_tool("repl", {"code": "x = 41"})
        kept = await client.call_tool("repl", {"code": "x + 1"})
        reset = await client.call_tool("repl_reset", {})
        gone = await client.call_tool("repl", {"code": "x + 1"})
    assert texts(kept) == ["42"]
    assert texts(reset) == ["The REPL was reset (1 interpreter(s) ended): the next repl call "
                            "starts fresh."]
    [text] = texts(gone)
    assert "NameError: name 'x' is not defined" in text and text.endswith("[error]")


async def test_read_image_gives_image_content(place, daemon):
    Image.new("RGB", (64, 48), "blue").save(os.path.join(place.workspace, "shot.png"))
    async with connect(place, socket=daemon.socket) as client:
        seen = await client.call_tool("read_image", {"path": "shot.png"})
        missing = await client.call_tool("read_image", {"path": "nothing.png"})
    text, image = seen.content
    assert text.type == "text" and "PNG image, shown 64x48" in text.text
    assert image.type == "image" and image.mime_type == "image/png"
    with Image.open(io.BytesIO(base64.b64decode(image.data))) as picture:
        assert picture.size == (64, 48)
    assert missing.is_error and len(missing.content) == 1
    assert texts(missing)[0].startswith("read_image: ")


async def test_repl_gives_its_figures_as_image_content(place, daemon):
    Image.new("RGB", (64, 48), "green").save(os.path.join(place.workspace, "plot.png"))
    code = ("class Plot:\n    def _repr_png_(self):\n        return open('plot.png', 'rb').read()\n"
            "Plot()")
    async with connect(place, socket=daemon.socket) as client:
        made = await client.call_tool("repl", {"code": code})
    text, image = made.content
    assert text.type == "text"
    assert re.search(r"\[1 figure attached below: /tmp/toolsd-figures/\S+\.png \(64x48\)\]$",
                     text.text), text.text
    assert image.type == "image" and image.mime_type == "image/png"
    with Image.open(io.BytesIO(base64.b64decode(image.data))) as picture:
        assert picture.size == (64, 48)


async def test_what_the_hosts_git_would_run_is_told_and_logged(place, daemon):
    hook = f"{os.path.realpath(place.workspace)}/app/.git/hooks/post-checkout"
    async with connect(place, socket=daemon.socket) as client:
        made = await client.call_tool("run_terminal", {
            "command": "git init -q app && echo evil > app/.git/hooks/post-checkout"})
        again = await client.call_tool("run_terminal", {"command": "echo again"})
    assert texts(made) == [f"(no output)\n[exit code 0]\n[host_exec: the user's git would run "
                           f"this, which the session added (the user is told): {hook}]"]
    assert texts(again) == ["again\n[exit code 0]"]
    with open(os.path.join(place.root, "mcp.log")) as f:
        warnings = [line for line in f if "WARNING" in line]
    assert len(warnings) == 1 and f"added what git on this machine would run: {hook}" in \
        warnings[0]


async def test_a_lost_session_is_replaced_and_the_model_told(place, daemon):
    os.makedirs(os.path.join(place.workspace, "sub"))
    async with connect(place, socket=daemon.socket) as client:
        started = await client.call_tool("process_start", {"command": "exec sleep 6262"})
        bg = texts(started)[0].split()[1].rstrip(".")
        await client.call_tool("repl", {"code": "x = 1"})
        await client.call_tool("run_terminal", {"command": "cd sub"})
        with daemon.client() as c:
            [lost] = [s["session"] for s in c.session_list()["sessions"]]
        kill_sandbox(daemon, lost)
        cut = await client.call_tool("run_terminal", {"command": "pwd"})
        where = await client.call_tool("run_terminal", {"command": "pwd"})
        stale = await client.call_tool("process_output", {"id": bg})
        gone = await client.call_tool("repl", {"code": "x"})
        with daemon.client() as c:
            now = [s["session"] for s in c.session_list()["sessions"]]
    # The first call after the loss runs, in the fresh session, and says what was lost.
    ws = os.path.realpath(place.workspace)
    assert not cut.is_error
    [text] = texts(cut)
    assert text.startswith(f"{ws}\n[exit code 0]\n[toolsd: the session was lost (") and \
        f"Gone with the earlier one: its background processes ({bg}), the REPL's state" in text
    assert texts(where) == [f"{ws}\n[exit code 0]"]
    assert stale.is_error and texts(stale)[0].startswith(
        f"{bg} ended with an earlier toolsd session, which was lost.")
    assert "NameError: name 'x' is not defined" in texts(gone)[0]
    assert len(now) == 1 and now != [lost]
    assert daemon.running("sleep 6262") == []
    with open(os.path.join(place.root, "mcp.log")) as f:
        assert f"session {lost} was lost (" in f.read()


async def test_plan_mode_is_read_only(place, daemon):
    async with connect(place, "--mode", "plan", socket=daemon.socket) as client:
        early = await client.call_tool("run_terminal", {"command": "touch made"})
        # No classifier sees this write (awk's own redirection): the OS refuses it.
        late = await client.call_tool("run_terminal",
                                      {"command": "awk 'BEGIN { print 1 > \"made\" }'"})
    assert early.is_error and texts(early)[0].startswith("Plan mode is read-only")
    assert "Read-only file system" in texts(late)[0]
    assert not os.path.exists(os.path.join(place.workspace, "made"))


async def test_closing_the_client_ends_the_session_and_the_server(place, daemon):
    async with connect(place, socket=daemon.socket) as client:
        await client.call_tool("process_start", {"command": "exec sleep 4545"})
        await client.call_tool("repl", {"code": "x = 1"})
        [server] = servers()
        # Started: its shim may not have exec'ed the command yet.
        wait_for(lambda: daemon.running("sleep 4545"))
        assert daemon.running("driver/python")
    assert wait_gone([server], timeout=30) == []
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []
    assert daemon.running("sleep 4545") == []
    with open(os.path.join(place.root, "mcp.log")) as f:
        assert "closed: 1 process(es) and 1 REPL(s) ended" in f.read()


KILLED_CLIENT = textwrap.dedent("""
    import sys, trio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def main():
        params = StdioServerParameters(command=sys.executable, args=sys.argv[1:])
        async with Client(params) as client:
            await client.call_tool("process_start", {"command": "exec sleep 4646"})
            print("ready", flush=True)
            await trio.sleep_forever()

    trio.run(main)
""")


def test_a_killed_client_leaves_no_process(place):
    """The client is SIGKILLed: `toolsd mcp` sees its stdin close, ends its session and the
    daemon it started for the run (no daemon answers here)."""
    client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, *server_argv(place)],
                              env=place.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True)
    try:
        assert client.stdout.readline() == "ready\n", client.stderr.read()
        wait_for(lambda: running(descendants(client.pid), "sleep 4646"))
        tree = descendants(client.pid)
        assert running(tree, "toolsd mcp") and running(tree, "toolsd serve")
        client.send_signal(signal.SIGKILL)
        client.wait()
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        client.stdout.close()
        client.stderr.close()
    assert wait_gone(tree, timeout=30) == [], "a killed client left processes behind"


async def test_stdout_carries_only_the_protocol(place):
    """Every byte the server writes on stdout is a JSON-RPC message, though its commands
    write to /dev/stdout, /dev/tty and every descriptor they have, and it starts a daemon
    of its own (whose first lines are not JSON)."""
    wire = os.path.join(place.root, "wire.jsonl")
    forge = ("echo FORGED; echo FORGED > /dev/stdout; echo FORGED > /dev/tty; "
             "for f in /proc/self/fd/*; do echo FORGED > $f; done; true")
    params = StdioServerParameters(
        command="bash", args=["-c", f'"$0" "$@" | tee {wire}', sys.executable,
                              *server_argv(place)], env=place.env)
    with open(os.path.join(place.root, "mcp.log"), "a") as log:
        async with Client(stdio_client(params, errlog=log)) as client:
            ran = await client.call_tool("run_terminal", {"command": forge})
            await client.call_tool("process_start", {"command": forge})
            await client.call_tool("repl", {"code": "import os\nprint('FORGED')\n"
                                                    "os.write(1, b'FORGED')"})
    assert texts(ran)[0].startswith("FORGED\nFORGED\n")
    with open(wire) as f:
        lines = f.read().splitlines()
    assert len(lines) >= 4
    for line in lines:
        assert json.loads(line)["jsonrpc"] == "2.0", line
    with open(os.path.join(place.root, "mcp.log")) as f:
        log_text = f.read()
    assert "started one for this run only" in log_text and "listening on" not in "".join(lines)


async def test_no_sdk_no_server_but_a_clear_error(place):
    """Without the optional extra, `toolsd mcp` says how to get it (a stand-in `mcp` module
    that fails to import plays the missing SDK)."""
    fake = os.path.join(place.root, "fake")
    os.makedirs(os.path.join(fake, "mcp"))
    with open(os.path.join(fake, "mcp", "__init__.py"), "w") as f:
        f.write("raise ImportError('no mcp here')\n")
    done = await trio.run_process(
        [sys.executable, *server_argv(place)], capture_stdout=True, capture_stderr=True,
        check=False, env={**place.env, "PYTHONPATH": fake}, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and done.stdout == b""
    assert b"the MCP SDK is not installed: pip install 'toolsd[mcp]'" in done.stderr


# ---------------------------------------------------------------- the wire, by hand

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "by-hand", "version": "1"}}}


class Wire:
    """`toolsd mcp` on pipes, one JSON-RPC line at a time."""

    def __init__(self, place, socket: str | None = None):
        self.proc = subprocess.Popen([sys.executable, *server_argv(place, socket=socket)],
                                     env=place.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     stderr=open(os.path.join(place.root, "mcp.log"), "ab"))
        self._buffer = b""

    def send(self, message) -> None:
        line = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 60) -> dict:
        """The next line the server writes (a safety net against a hang, not a timing)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, f"no line from toolsd mcp within {timeout} s"
            chunk = os.read(fd, 65536)
            assert chunk, "toolsd mcp closed its stdout"
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def start(self) -> None:
        self.send(INITIALIZE)
        assert self.receive()["result"]["serverInfo"]["name"] == "toolsd"
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, id: int, name: str, arguments: dict) -> dict:
        self.send({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments}})
        reply = self.receive()
        assert reply["id"] == id, reply
        return reply["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def wire(place, daemon):
    w = Wire(place, socket=daemon.socket)
    yield w
    w.close()


def test_bad_lines_are_answered_and_the_server_goes_on(wire, daemon):
    wire.send(b"this is not json")  # the SDK answers nothing to a line it cannot parse
    wire.send(b'{"jsonrpc": "2.0", "id": 7, "method": "no/such/method"}')
    error = wire.receive()
    assert error["id"] == 7 and error["error"]["code"] == -32601
    wire.start()
    result = wire.call(2, "run_terminal", {"command": "echo still here"})
    assert result["content"] == [{"type": "text", "text": "still here\n[exit code 0]"}]
    wire.proc.stdin.close()  # the end of input: the server closes its session and exits
    assert wire.proc.wait(timeout=60) == 0
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


def test_sigterm_while_stdin_is_open_closes_the_session(wire, daemon):
    wire.start()
    wire.call(2, "process_start", {"command": "exec sleep 5050"})
    wait_for(lambda: daemon.running("sleep 5050"))
    wire.proc.send_signal(signal.SIGTERM)
    assert wire.proc.wait(timeout=60) == 0
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []
    assert daemon.running("sleep 5050") == []


def test_a_client_gone_mid_call_ends_the_call_and_the_session(wire, daemon):
    """stdin closes while a command runs (the client exited without waiting for the reply):
    the command is ended with the session, and the server exits."""
    wire.start()
    wire.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "run_terminal", "arguments": {"command": "sleep 5454"}}})
    wait_for(lambda: daemon.running("sleep 5454"))
    wire.proc.stdin.close()
    assert wire.proc.wait(timeout=60) == 0
    assert wait_gone(daemon.running("sleep 5454"), timeout=30) == []
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []


async def test_two_calls_at_once_run_at_once(place, daemon):
    """A client may send calls without waiting for the last reply: the first here waits for
    what the second does, so it only returns if they run side by side."""
    waiter = "until [ -e /tmp/go ]; do sleep 0.05; done; echo waited"
    got = {}

    async def run(key, command):
        got[key] = await client.call_tool("run_terminal", {"command": command,
                                                           "timeout_s": 120})

    async with connect(place, socket=daemon.socket) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "waiter", waiter)
            while not daemon.running("until [ -e /tmp/go ]"):
                await trio.sleep(0.05)
            nursery.start_soon(run, "maker", "touch /tmp/go; echo made")
    assert texts(got["maker"]) == ["made\n[exit code 0]"]
    assert texts(got["waiter"]) == ["waited\n[exit code 0]"]


async def test_a_cancelled_call_ends_its_command(place, daemon):
    async with connect(place, socket=daemon.socket) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.call_tool, "run_terminal", {"command": "sleep 5151"})
            while not daemon.running("sleep 5151"):
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        with trio.fail_after(60):
            while daemon.running("sleep 5151"):
                await trio.sleep(0.05)
        after = await client.call_tool("run_terminal", {"command": "echo next"})
    assert texts(after) == ["next\n[exit code 0]"]


async def test_a_workspace_that_is_not_there(place):
    done = await trio.run_process(
        [sys.executable, "-m", "toolsd", "mcp", "--workspace", place.workspace + "/nope"],
        capture_stdout=True, capture_stderr=True, check=False, env=place.env,
        stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == b""
    assert f"--workspace {place.workspace}/nope: no such folder".encode() in done.stderr


async def test_the_file_tools_through_the_sdk_client(place, daemon):
    with open(os.path.join(place.workspace, "app.py"), "w") as f:
        f.write("x = 1\n")
    async with connect(place, socket=daemon.socket) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        read = await client.call_tool("read_file", {"path": "app.py"})
        wrote = await client.call_tool("write_file", {"path": "sub/b.py", "content": "y = 2\n"})
        edited = await client.call_tool("edit_file", {"path": "app.py", "old": "x = 1",
                                                      "new": "x = 5"})
        found = await client.call_tool("find", {"pattern": "= [25]"})
    assert {"read_file", "write_file", "edit_file", "find"} <= names
    assert not names & {"ask_user", "undo"}
    assert texts(read) == ["     1\tx = 1"]
    assert texts(wrote) == ["created sub/b.py (1 line)."] and not wrote.is_error
    assert texts(edited) == ["edited app.py: 1 replacement."]
    assert sorted(texts(found)[0].splitlines()) == ["app.py:1: x = 5", "sub/b.py:1: y = 2"]
    with open(os.path.join(place.workspace, "app.py")) as f:
        assert f.read() == "x = 5\n"


async def test_a_file_write_to_a_read_only_session_fails_clearly(place, daemon):
    async with connect(place, "--mode", "plan", socket=daemon.socket) as client:
        wrote = await client.call_tool("write_file", {"path": "made", "content": "x"})
        read = await client.call_tool("find", {"glob": "*"})
    assert wrote.is_error and texts(wrote)[0].startswith(
        "Plan mode is read-only, and this would write (write_file writes made)")
    assert not read.is_error
    assert os.listdir(place.workspace) == []
