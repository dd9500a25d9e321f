"""`toolsd agent`: a coding agent at a terminal, on a model endpoint and a toolsd session.

    toolsd agent --model NAME [--base-url URL] [--api openai|anthropic] [--api-key-env NAME]
                 [--workspace DIR] [--mode plan|ask|auto] [--max-steps N] [--wall-time S]
                 [--continue | --resume ID | --list]
                 [--json] [PROMPT ...]

With a PROMPT: one turn, then exit with its outcome (0 completed, 1 failed, 3
budget_exhausted, 130 interrupted). Without: one turn per line read (with a prompt on a
terminal) until the end of input (Ctrl-D); the exit status is the last turn's.

What a person sees: the model's text on stdout as it streams; on stderr each tool call as one
line and its result (shortened) when it comes, a spinner with the elapsed time while a tool
runs (on a terminal only), the questions of ask mode (y / n / always for this tool), a
warning line for each thing the session added that git on this machine would run (also at
exit), a line when a lost session was replaced, and each turn's outcome line. `--json`
prints instead every event of the turn (the lines of its events.jsonl,
agent/conversation/store.py) as JSON lines on stdout; questions stay on stderr.

Ctrl-C during a turn cancels it (it ends `interrupted`: its command is ended, its REPLs too);
a second Ctrl-C, SIGTERM or SIGHUP exits. At the prompt of a terminal, Ctrl-C clears what was
typed, and on an empty line exits (agent/terminal/prompt_keys.py); Ctrl-D at an approval declines
that call (the agent goes on, and reads the next prompt), on an empty prompt line it exits.
At exit the session ends, and every background process with it. The daemon:
agent/calls/own_daemon.py; what is written while it runs: agent/terminal/output.py. `--list`,
`--resume` and `--continue`: agent/conversation/listing.py.

Only argparse is imported with this module (it is registered on every `toolsd` command line);
the agent's modules are imported when the command runs.
"""

from __future__ import annotations

import argparse
import enum
import os
import signal
import sys

from agent.turns import settings

EXIT_CODES = {"completed": 0, "failed": 1, "budget_exhausted": 3, "interrupted": 130}
DEFAULT_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "agent", parents=[common],
        help="a coding agent on a model endpoint, its tools in a sandboxed session",
        description="Run a coding agent on an OpenAI-compatible or Anthropic endpoint; its "
                    "commands run in a toolsd session on the workspace. With no PROMPT, one "
                    "prompt per line (Ctrl-D ends). Ctrl-C cancels a turn, twice exits.")
    p.add_argument("prompt", nargs="*", metavar="PROMPT",
                   help="what to do (words are joined); none: read prompts, one per line")
    p.add_argument("--model", help="the model's name at the endpoint (default: none; "
                                    "required but with --list)")
    p.add_argument("--base-url", metavar="URL",
                   help="the API root, e.g. http://127.0.0.1:8080/v1 for a local server "
                        "(default: OpenAI's, or Anthropic's with --api anthropic)")
    p.add_argument("--api", choices=["openai", "anthropic"], default="openai",
                   help="openai: chat completions (OpenAI, llama.cpp, vLLM, Ollama, gateways); "
                        "anthropic: Messages (default: openai)")
    p.add_argument("--api-key-env", metavar="NAME",
                   help="the environment variable that holds the API key (default: "
                        "OPENAI_API_KEY, or ANTHROPIC_API_KEY; a local server needs none)")
    p.add_argument("--workspace", metavar="DIR",
                   help="the folder the agent works in (default: the current one)")
    p.add_argument("--mode", choices=["plan", "ask", "auto"], default="ask",
                   help="plan: read-only; ask: approve each command and code run; auto: "
                        "run everything (default: ask)")
    p.add_argument("--max-steps", type=positive_int, default=20, metavar="N",
                   help="model requests per turn, then a final report (default: 20)")
    p.add_argument("--wall-time", type=positive_seconds, default=1800.0, metavar="SECONDS",
                   help="a turn's wall-clock budget: a model reply still coming then is cut "
                        "off, no tool starts after it, the turn ends budget_exhausted "
                        "(default: 1800)")
    p.add_argument("--context-tokens", type=positive_int, metavar="N",
                   help="the model's context window (default: what the endpoint reports, "
                        "else known for hosted models, else 32768)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--continue", dest="latest", action="store_true",
                       help="go on with this workspace's latest conversation")
    which.add_argument("--resume", metavar="ID",
                       help="go on with that conversation of this workspace (or a prefix "
                            "of its id; --list shows them; default: a new conversation)")
    which.add_argument("--list", action="store_true",
                       help="list this workspace's conversations and exit")
    p.add_argument("--json", action="store_true",
                   help="print the turn's events as JSON lines instead of text")
    from toolsd.wire import egress  # loaded with the client already

    egress.add_allow_options(p)  # the session's network: off unless --allow
    settings.add_arguments(p)  # --mcp, --config (agent/turns/settings.py)
    p.set_defaults(func=cmd_agent)


class UsageError(Exception):
    pass


def make_model(args):
    """The model adapter the options ask for. Raises UsageError or ModelError (a bad URL)."""
    from agent.models.anthropic import AnthropicModel
    from agent.models.openai import OpenAIChatModel

    variable = args.api_key_env or KEY_VARIABLES[args.api]
    key = os.environ.get(variable) or None
    if args.api_key_env and key is None:
        raise UsageError(f"--api-key-env {variable}: that environment variable is not set; "
                         f"export it, or name the one that holds the key")
    if key is None and args.base_url is None:
        # The hosted API refuses every request without one: say so before a session opens.
        raise UsageError(f"no API key for {DEFAULT_URLS[args.api]}: export {variable} (or "
                         f"name the variable that holds it with --api-key-env); a local "
                         f"server needs none, give its --base-url")
    kind = OpenAIChatModel if args.api == "openai" else AnthropicModel
    return kind(args.model, args.base_url or DEFAULT_URLS[args.api], key,
                context_tokens=args.context_tokens, key_hint=f"${variable}")


def cmd_agent(args) -> int:
    from agent.calls.own_daemon import DaemonFailed, daemon_target, toolsd_socket
    from agent.models.base import ModelError

    def fail(message: str, code: int = 1) -> int:
        print(f"toolsd agent: {message}", file=sys.stderr)
        return code

    try:
        target = daemon_target(args)
    except ValueError as e:  # a malformed --url or --fingerprint, an unreadable --token-file
        return fail(str(e), 2)
    workspace = os.path.abspath(args.workspace or os.getcwd())
    # On a remote daemon (--url tls://...) the workspace is a folder of its machine.
    if not target.tls and not os.path.isdir(workspace):
        return fail(f"--workspace {workspace}: no such folder", 2)
    from agent.conversation.listing import NoConversation, list_conversations, listing, pick
    from agent.conversation.store import ConversationStore

    store = ConversationStore(workspace)
    if args.list:
        sys.stdout.write(listing(store, list_conversations(store)))
        return 0
    if not args.model:
        return fail("--model NAME is required: the model's name at the endpoint", 2)
    try:
        args.resume = pick(store, args.resume, args.latest)
    except NoConversation as e:
        return fail(str(e), 2)
    try:
        model = make_model(args)
        args.settings = settings.load_settings(args)
    except (UsageError, ModelError, settings.SettingsError) as e:
        return fail(str(e), 2)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a terminal that cannot show a character: `?`
            stream.reconfigure(errors="replace")
    try:
        with toolsd_socket(target, say=lambda m: fail(m)) as socket:
            import trio

            return trio.run(AgentRun(args, model, workspace, socket).main)
    except DaemonFailed as e:
        return fail(f"could not start a toolsd daemon: {e}")


class Phase(enum.Enum):
    """Where a run is, for what Ctrl-C does: during a turn it cancels the turn, otherwise
    (and once the turn is cancelling) it exits."""

    STARTING = "starting"
    PROMPT = "prompt"
    TURN = "turn"
    CANCELLING = "cancelling"
    EXITING = "exiting"


_MOVES = {
    Phase.STARTING: {Phase.PROMPT, Phase.EXITING},
    Phase.PROMPT: {Phase.TURN, Phase.EXITING},
    Phase.TURN: {Phase.PROMPT, Phase.CANCELLING, Phase.EXITING},
    Phase.CANCELLING: {Phase.PROMPT, Phase.EXITING},
    Phase.EXITING: set(),
}


class AgentRun:
    """One `toolsd agent` run: its Agent (opened in `main`, closed at its end, whatever
    ends it), its terminal, and its phase."""

    def __init__(self, args, model, workspace: str, socket: str):
        self.args = args
        self.model = model
        self.workspace = workspace
        self.socket = socket
        self.phase = Phase.STARTING
        self.agent = None
        self.term = None  # its Terminal (agent/terminal/output.py), made in main
        self.exit_scope = None

    def move(self, to: Phase) -> None:
        # Exiting is final: a turn that ends just as the exit is asked is still leaving.
        if to is self.phase or self.phase is Phase.EXITING:
            return
        assert to in _MOVES[self.phase], f"{self.phase} -> {to}"
        self.phase = to

    def interrupt(self, signum: int) -> None:
        if signum == signal.SIGINT and self.phase is Phase.TURN:
            self.move(Phase.CANCELLING)
            self.agent.cancel()
            self.term.say("^C: cancelling the turn (Ctrl-C again exits)")
            return
        self.leave()

    def leave(self) -> None:
        """Exit: cancel whatever runs (the Agent is closed on the way out)."""
        if self.phase is not Phase.EXITING:
            self.move(Phase.EXITING)
            if self.exit_scope is not None:
                self.exit_scope.cancel()

    async def main(self) -> int:
        import trio

        from agent.conversation.store import ConversationError
        from agent.terminal.linereader import LineReader
        from agent.terminal.output import Terminal
        from agent.turns.agent import Agent
        from agent.turns.rules import AgentConfig
        from toolsd.client import ToolsdError
        from toolsd.wire.egress import network_of

        args = self.args
        code = EXIT_CODES["interrupted"]
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, signals)
                reader = LineReader(sys.stdin.fileno(), nursery)
                self.term = term = Terminal(nursery, reader, json_mode=args.json,
                                            on_gone=self.leave)
                try:
                    with trio.CancelScope() as self.exit_scope:
                        try:
                            self.agent = await Agent.open(
                                self.workspace, self.model, mode=args.mode,
                                approve=term.approve if args.mode == "ask" else None,
                                config=AgentConfig(max_steps=args.max_steps,
                                                   wall_s=args.wall_time,
                                                   network=network_of(
                                                       args.allow, args.allow_preset,
                                                       args.allow_port)),
                                socket=self.socket, resume=args.resume,
                                settings=getattr(args, "settings", None))
                        except (ToolsdError, ConversationError, FileNotFoundError) as e:
                            term.say(f"toolsd agent: {getattr(e, 'message', None) or e}")
                            code = 1
                        else:
                            # What comes between turns too (at exit: what the session left
                            # that git would run).
                            self.agent.on_event = term.event
                            if "stream" in self.agent.backend.features:
                                self.agent.backend.keeper.watch = term.output
                            self.move(Phase.PROMPT)
                            code = await self._turns(reader)
                finally:
                    with trio.CancelScope(shield=True):
                        if self.agent is not None:
                            await self.agent.aclose()
                nursery.cancel_scope.cancel()
        return code

    async def _watch(self, signals) -> None:
        async for signum in signals:
            self.interrupt(signum)

    async def _turns(self, reader) -> int:
        from agent.models.limits import budget_label
        from agent.terminal.prompt_keys import ExitKey
        from agent.turns.offline import Inbox, PatientModel, start_lines
        from agent.turns.steering import steered_turn
        from agent.turns.undo import slash

        term, agent = self.term, self.agent
        if agent.backend.sandbox == "none":
            term.say("toolsd agent: WARNING: this machine cannot sandbox sessions (see `toolsd "
                     "doctor`): the agent's commands run unsandboxed, as you")
        interactive = not self.args.prompt
        if interactive and sys.stdin.isatty():
            term.say(f"toolsd agent: {self.args.model}, {self.args.mode} mode, in "
                     f"{agent.backend.workspace} (conversation {agent.conversation.id}); "
                     f"{budget_label(agent.budget)}; one prompt per line, Ctrl-D ends")
        if sys.stdin.isatty() and not self.args.json:
            agent.toolbox.ask_user = term.ask_user  # someone to answer (agent/calls/ask_user.py)
        inbox = Inbox(term, agent.model, agent.conversation.folder)
        if interactive:  # a request waits out an endpoint that went away (agent/turns/offline.py)
            agent.model = PatientModel(agent.model, term.say)
        for line in start_lines(agent.conversation.recovered, inbox.queue,
                                interactive) + agent.notes:
            term.say(line)
        code = 0
        while True:
            if interactive:
                try:
                    prompt = await inbox.next()  # the offline queue's, or the terminal's
                except ExitKey:
                    return EXIT_CODES["interrupted"]
                if prompt is None:
                    return code
                if await slash(agent, term.say, prompt):  # /undo, /diff (agent/turns/undo.py)
                    continue
            else:
                prompt = " ".join(self.args.prompt)
            self.move(Phase.TURN)
            if interactive and sys.stdin.isatty():  # lines typed meanwhile steer it
                result = await steered_turn(agent, term, prompt, inbox)
            else:
                result = await agent.run_turn(prompt, on_text=term.text, on_event=term.event)
            if self.phase is Phase.EXITING:
                return EXIT_CODES["interrupted"]
            self.move(Phase.PROMPT)
            term.outcome(result)
            code = EXIT_CODES.get(result.outcome, 1)
            if not interactive:
                return code
