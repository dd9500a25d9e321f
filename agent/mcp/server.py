"""`toolsd mcp`: the agent's tools for any MCP client (editors, desktop agents, harnesses).

    toolsd mcp [--workspace DIR] [--mode plan|auto] [--socket PATH]

The client starts it as a subprocess and speaks MCP (JSON-RPC lines) on its stdin and stdout.

- The tools of agent/calls/tools.py, with their schemas and descriptions as they are (but the
  repl's, whose state lasts until `repl_reset` here: MCP_DESCRIPTIONS), run by
  the backend `toolsd agent` uses (agent/calls/backend.py): the same results (at most 4,000
  characters, the bracketed notes, a cut output kept whole in a file, `cd` carried over, only
  the process ids this connection started). `read_image` answers with its text and the
  picture as MCP image content. Annotations say which tools only read.
- `repl_reset`: the REPL's state lasts as long as the connection (one toolsd turn); this
  ends its interpreters, and the next `repl` call starts fresh.
- `repl` answers with the figures its code made as MCP image content after its text.
- Before each call the session is looked at (SessionKeeper.check): one lost since the last call
  (the daemon restarted, its sandbox died) is replaced first, and the call runs in the fresh
  one, its result saying what was lost. Numbers sent as strings ("5") are read as numbers.
- What the backend tells the model besides a result (what the host's git would run, a lost
  session replaced by a fresh one) comes in the next result's text; both are logged to
  stderr as warnings for the person who reads the client's log.
- One toolsd session per connection (a stdio server has one): opened at start, closed with
  everything in it when the client goes: stdin closed (a client that exits, or is killed),
  or SIGTERM / SIGINT / SIGHUP (a client's shutdown sequence, a person's Ctrl-C).
- `--mode plan` opens the session read-only (the operating system refuses every write) and
  refuses plain writes early with a clear message, as `toolsd agent` does; there is no ask
  mode: an MCP client asks its user itself.
- stdout carries nothing but the protocol. While serving, the SDK's stdio transport points
  descriptor 1 at stderr (a stray print lands in the log); the daemon started for a run gets
  a pipe of its own for stdout; sandboxed commands never hold any of these (their output
  comes back through pipes the daemon owns). Logs go to stderr.

Built on the SDK's low-level `mcp.server.Server` rather than `MCPServer`: MCPServer writes a
tool's schema from a Python signature, and these schemas are shared with `toolsd agent` to
the character (and paid in tokens on every request); the SDK's own guide sends exact schemas
to `Server`. It runs under trio (the SDK is anyio), with the SDK's stdio transport reading
stdin through agent/terminal/linereader.py, so that a signal can end the serving while stdin
is open.

Only argparse is imported with this module (it is registered on every `toolsd` command line):
the SDK is an optional extra (`pip install 'toolsd[mcp]'`), imported when the command runs.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import signal
import sys

log = logging.getLogger("toolsd.mcp")

REPL_RESET = "repl_reset"
REPL_RESET_DESCRIPTION = (
    "End the REPL's interpreters: the next repl call starts fresh, with nothing defined. "
    "Background processes are not touched.")
TITLES = {
    "run_terminal": "Run a command",
    "repl": "Run code in the REPL",
    "process_start": "Start a background process",
    "process_output": "Read a background process's output",
    "process_stop": "Stop a background process",
    "process_write": "Type into a background process",
    "read_image": "Look at an image",
    "read_file": "Read a file",
    "write_file": "Write a file",
    "edit_file": "Edit a file",
    "find": "Find in files",
    REPL_RESET: "Reset the REPL",
}
# Where a tool's description as the agent has it is not true under MCP: the REPL's state
# lasts the connection (one toolsd turn), not a turn of the agent.
MCP_DESCRIPTIONS = {
    "repl": (
        "Run code in an interpreter that stays alive between calls: variables, imports and "
        "loaded data persist until repl_reset (or the end of the connection), so load once "
        "and query many times. The value of a last expression is shown."),
}
HOST_EXEC_LOGGED = 10  # warning lines of one report; a flood is counted past them
INSTALL_HINT = ("the MCP SDK is not installed: pip install 'toolsd[mcp]' (or pip install "
                "'mcp>=2.3,<3') into toolsd's environment")


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "mcp", parents=[common],
        help="serve the agent's tools to an MCP client over stdio",
        description="An MCP server on stdin/stdout: run_terminal, repl, process_start, "
                    "process_output, process_write, process_stop, read_image, read_file, "
                    "write_file, edit_file, find and repl_reset, "
                    "in one "
                    "sandboxed toolsd session that lasts as long as the connection.")
    p.add_argument("--workspace", metavar="DIR",
                   help="the folder the tools work in (default: the current one)")
    p.add_argument("--mode", choices=["plan", "auto"], default="auto",
                   help="plan: the workspace is read-only; auto: tools run as asked "
                        "(default: auto; the client approves calls itself)")
    from toolsd.wire import egress  # loaded with the client already

    egress.add_allow_options(p)  # the session's network: off unless --allow
    p.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="toolsd mcp: %(levelname)s %(message)s")
    try:
        import mcp.server  # noqa: F401
    except ImportError:
        log.error(INSTALL_HINT)
        return 1
    import trio

    from agent.calls.own_daemon import DaemonFailed, daemon_target, toolsd_socket
    from agent.gates.modes import Mode
    from toolsd.wire.egress import network_of

    try:
        target = daemon_target(args)
    except ValueError as e:  # a malformed --url or --fingerprint, an unreadable --token-file
        log.error("%s", e)
        return 2
    workspace = os.path.abspath(args.workspace or os.getcwd())
    # On a remote daemon (--url tls://...) the workspace is a folder of its machine.
    if not target.tls and not os.path.isdir(workspace):
        log.error("--workspace %s: no such folder", workspace)
        return 2
    try:
        with toolsd_socket(target, say=log.info,
                           stderr=sys.stderr) as socket_path:
            return trio.run(serve, workspace, Mode(args.mode), socket_path,
                            network_of(args.allow, args.allow_preset, args.allow_port))
    except DaemonFailed as e:
        log.error("could not start a toolsd daemon: %s", e)
        return 1
    except BaseExceptionGroup as group:
        # The client went away while a reply was being written: the session is closed
        # already (serve's finally); nothing to report but that.
        _, rest = group.split(lambda e: isinstance(e, (BrokenPipeError, ConnectionError)))
        if rest is not None:
            raise
        log.info("the client closed the connection")
        return 0


async def serve(workspace: str, mode, socket_path: str, network: str | dict = "none") -> int:
    """Open the session, serve MCP on stdio until the client goes or a signal comes, then
    close the session (every process and REPL of it). Returns the exit status."""
    import trio
    from mcp.server.stdio import stdio_server

    from agent.calls.backend import Backend
    from agent.gates.modes import ApprovalGate, Mode
    from agent.terminal.linereader import LineReader
    from toolsd.client import AsyncClient, ToolsdError

    try:
        client = await AsyncClient.connect(socket_path)
    except ToolsdError as e:
        log.error("%s", e.message)
        return 1
    try:
        try:
            backend = await Backend.open(client, workspace, writable=mode is not Mode.PLAN,
                                         network=network)
        except ToolsdError as e:
            log.error("cannot open a session on %s: %s", workspace, e.message)
            return 1
        backend.report = report
        log.info("session %s on %s (sandbox: %s, %s mode)", backend.session,
                 backend.workspace, backend.sandbox, mode.value)
        if backend.sandbox == "none":
            log.warning("this machine cannot sandbox sessions (see `toolsd doctor`): tools "
                        "run unsandboxed")
        host = ToolHost(backend, ApprovalGate(mode))
        try:
            await backend.begin_turn()
            server = host.server()
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT,
                                           signal.SIGHUP) as signals:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_stop_on_signal, signals, nursery.cancel_scope)
                    stdin = LineReader(sys.stdin.fileno(), nursery)
                    async with stdio_server(stdin=stdin) as (read, write):
                        await server.run(read, write, server.create_initialization_options())
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                repls = await backend.end_turn()
                closed = await backend.aclose()
                log.info("session %s closed: %s process(es) and %s REPL(s) ended",
                         backend.session, closed.get("processes_stopped", 0),
                         repls + closed.get("repls_stopped", 0))
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
    return 0


def report(kind: str, fields: dict) -> None:
    """What the backend says a person must know, as warnings in the log."""
    if kind == "host_exec":
        added = fields["added"]
        for line in added[:HOST_EXEC_LOGGED]:
            log.warning("session %s added what git on this machine would run: %s (look at it "
                        "before you run git there)", fields["session"], line)
        if len(added) > HOST_EXEC_LOGGED:
            log.warning("session %s added %d more such; `toolsd status` lists them all while "
                        "it is open", fields["session"], len(added) - HOST_EXEC_LOGGED)
    elif kind == "session_replaced":
        log.warning("session %s was lost (%s): its processes and REPL state are gone; going "
                    "on in a fresh session, %s, on the same workspace", fields["lost"],
                    fields["reason"], fields["session"])


async def _stop_on_signal(signals, scope) -> None:
    async for signum in signals:
        log.info("%s: closing the session", signal.Signals(signum).name)
        scope.cancel()
        return


def annotations(name: str, read_only: bool) -> dict:
    """The MCP annotations of a tool (hints for the client: it may skip asking before one
    that only reads). The session has no network, so no tool reaches an open world."""
    hints = {"title": TITLES.get(name), "read_only_hint": read_only,
             "open_world_hint": False}
    if not read_only:
        hints["destructive_hint"] = True  # a command may delete; a reset loses state
        hints["idempotent_hint"] = name == REPL_RESET
    return hints


class ToolHost:
    """The tools of one MCP connection: its Backend (the toolsd session and the REPL turn)
    and the ApprovalGate of its mode. The connection owns both; `serve` closes them."""

    def __init__(self, backend, gate):
        self.backend = backend
        self.gate = gate

    def tools(self) -> list:
        from mcp.types import Tool, ToolAnnotations

        from agent.calls.tools import TOOLS

        listed = [Tool(name=t.name, description=MCP_DESCRIPTIONS.get(t.name, t.description),
                       input_schema=t.parameters,
                       annotations=ToolAnnotations(**annotations(t.name, t.read_only)))
                  for t in TOOLS]
        listed.append(Tool(name=REPL_RESET, description=REPL_RESET_DESCRIPTION,
                           input_schema={"type": "object", "properties": {}},
                           annotations=ToolAnnotations(**annotations(REPL_RESET, False))))
        return listed

    async def call(self, name: str, arguments: dict):
        """One tools/call as a CallToolResult: a refusal or a failure the model can act on is
        a result with is_error, as in `toolsd agent`."""
        from mcp.types import CallToolResult, ImageContent, TextContent

        from agent.calls.backend import SessionLost
        from agent.calls.results import quoted
        from agent.calls.tools import TOOL_NAMES, spec
        from agent.history.messages import ToolCall
        from toolsd.client import ToolsdError

        def text(s: str, is_error: bool = False) -> CallToolResult:
            return CallToolResult(content=[TextContent(type="text", text=s)], is_error=is_error)

        try:
            # A session lost since the last call is replaced first: this call runs.
            await self.backend.keeper.check()
            if name == REPL_RESET:
                ended = await self.backend.reset_turn()
                return text("\n".join([f"The REPL was reset ({ended} interpreter(s) ended): the "
                                       f"next repl call starts fresh.",
                                       *self.backend.take_notes()]))
            if spec(name) is None:
                names = ", ".join([*TOOL_NAMES, REPL_RESET])
                return text(f"There is no tool {quoted(name)}; the tools are {names}.",
                            is_error=True)
            call = ToolCall(id="mcp", name=name, arguments=arguments)
            decision = await self.gate.check(call)
            if not decision.allowed:
                return text(decision.message, is_error=True)
            outcome = await self.backend.call(call)
            content = [TextContent(type="text", text=outcome.text)]
            if outcome.images:
                loaded = await self.backend.load_images(outcome.images)
                for ref in outcome.images:
                    image = loaded[ref]
                    if image.missing:
                        content.append(TextContent(type="text", text=f"[{image.missing}]"))
                    else:
                        content.append(ImageContent(
                            type="image", data=base64.b64encode(image.data).decode(),
                            mime_type=image.media_type))
            return CallToolResult(content=content, is_error=outcome.is_error)
        except SessionLost as e:
            log.error("%s: %s", name, e)
            return text(f"{name} failed: {e}. The next call tries again.", is_error=True)
        except ToolsdError as e:  # the daemon is gone (connection_lost), or the session
            log.error("%s: %s", name, e.message)
            return text(f"{name} failed: toolsd is unavailable ({e.message}); restart the MCP "
                        f"server", is_error=True)

    def server(self):
        """The SDK's low-level Server, its handlers on this host."""
        from mcp.server import Server
        from mcp.types import CallToolRequestParams, ListToolsResult

        tools = self.tools()

        async def list_tools(ctx, params) -> ListToolsResult:
            return ListToolsResult(tools=tools)

        async def call_tool(ctx, params: CallToolRequestParams):
            return await self.call(params.name, dict(params.arguments or {}))

        import toolsd

        mode = self.gate.mode.value
        instructions = (
            f"Tools run in a sandboxed toolsd session on {self.backend.workspace}: /tmp is "
            f"scratch space, the network is off"
            + ("; the workspace is read-only (plan mode)" if mode == "plan" else "")
            + ". The repl keeps its state until repl_reset; background processes run until "
              "process_stop or the end of the connection.")
        return Server("toolsd", version=toolsd.__version__, instructions=instructions,
                      on_list_tools=list_tools, on_call_tool=call_tool)
