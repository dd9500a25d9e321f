"""`toolsd repl`: an interactive prompt on a fresh session's REPL, for a person to poke at it.

It is built on the same requests an agent sends (session.open, turn.begin, repl.exec,
session.close). Multi-line input: python asks codeop whether the input is complete, as the
interactive interpreter does (a block ends with a blank line); node reads on while brackets
are open, and a blank line sends what is there. Ctrl-C at the prompt clears the input;
Ctrl-C while code runs interrupts it (the daemon treats the request as cancelled, which
interrupts the code and keeps the state). Ctrl-D closes the session.
"""

from __future__ import annotations

import argparse
import codeop
import os
import sys

from toolsd.cli.common import CommandFailed, connect, daemon_socket
from toolsd.cli.messages import for_person
from toolsd.cli.open_session import add_session_options, open_options, refuse_with_session
from toolsd.cli.repl_output import ReplOutput
from toolsd.client import ConnectionLost, ToolsdError

PROMPTS = {"python": (">>> ", "... "), "node": ("> ", "... ")}


def add_parser(sub, common) -> None:
    p = sub.add_parser("repl", parents=[common],
                       help="an interactive REPL in a fresh sandboxed session (or a kept one)")
    p.add_argument("--session", metavar="ID",
                   help="work in this session, kept open by `toolsd open`; Ctrl-D then ends "
                        "the REPL and keeps the session (default: a fresh session, closed "
                        "at the end)")
    add_session_options(p)
    p.add_argument("--language", choices=["python", "node"], default="python",
                   help="the REPL's language")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="seconds one input may run before it is interrupted")
    p.add_argument("--figures", metavar="DIR",
                   help="save the figures inputs make (matplotlib, images) to DIR and print "
                        "their paths; whole outputs too long to show go there as well "
                        "(default: figures stay in the session, whole outputs go to a new "
                        "folder under $TMPDIR)")
    p.set_defaults(func=cmd_repl)


def is_complete(source: str, language: str) -> bool:
    """Whether `source` is a whole input to send, or the prompt should ask for more."""
    if language == "python":
        try:
            return codeop.compile_command(source, "<stdin>", "single") is not None
        except (SyntaxError, ValueError, OverflowError):
            return True  # send it: the REPL reports the error as Python would
    return _open_brackets(source) <= 0


def _open_brackets(source: str) -> int:
    """Brackets left open in JavaScript source, strings and comments skipped (roughly)."""
    depth = 0
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch in "\"'`":
            i += 1
            while i < n and source[i] != ch:
                i += 2 if source[i] == "\\" else 1
        elif source.startswith("//", i):
            i = source.find("\n", i)
            i = n if i < 0 else i
        elif source.startswith("/*", i):
            i = source.find("*/", i + 2)
            i = n if i < 0 else i + 1
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        i += 1
    return depth


def read_input(language: str) -> str | None:
    """One complete input from the person; None at end of file (Ctrl-D)."""
    first, more = PROMPTS[language]
    lines: list[str] = []
    while True:
        try:
            line = input(more if lines else first)
        except KeyboardInterrupt:
            # As at Python's prompt: Ctrl-C throws away what was typed so far.
            sys.stdout.write("\nKeyboardInterrupt\n")
            lines = []
            continue
        except EOFError:
            sys.stdout.write("\n")
            return None
        if not lines and not line.strip():
            continue
        lines.append(line)
        source = "\n".join(lines)
        # A blank line sends what is there (for python, codeop already says a block ended).
        if line.strip() == "" or is_complete(source, language):
            return source


def cmd_repl(args: argparse.Namespace) -> int:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    if args.figures is not None:
        args.figures = os.path.abspath(args.figures)
        if not os.path.isdir(args.figures):
            raise CommandFailed("repl", f"--figures {args.figures}: no such folder; make it "
                                        f"first (mkdir -p)", 2)
        if not os.access(args.figures, os.W_OK | os.X_OK):
            raise CommandFailed("repl", f"--figures {args.figures}: cannot write in it; name "
                                        f"a folder of yours", 2)
    if args.session is not None:
        refuse_with_session(args, "repl")
        return ReplSession(args, None).run()
    options = open_options(args, "repl")
    with daemon_socket(args, "repl") as path:
        return ReplSession(args, path, options).run()


class ReplSession:
    """One `toolsd repl` run: its session (opened here unless --session named one, then only
    a turn of it), its client, its prompt loop.

    Resource handling: the run owns its Client (replaced after a Ctrl-C that interrupted an
    input) and its turn; at the end it closes the session it opened, or ends the turn of a
    kept one (its REPL goes, the session stays). After the daemon is gone there is nothing
    to close: the run says the session is lost and exits 1."""

    def __init__(self, args, path, open_params: dict | None = None):
        self.args = args
        self.path = path
        self.open_params = open_params  # None: args.session is kept by `toolsd open`
        self.client = None
        self.session = args.session
        self.turn = None
        self.lost = False  # the daemon, or the session, is gone: nothing to end
        self.output = ReplOutput(args.figures)

    def run(self) -> int:
        try:
            self.client = connect(self.args, self.path)
            features = self.client.hello("toolsd-cli").get("features", [])
            if self.open_params is not None:
                params = dict(self.open_params)
                self.session = self.client.session_open(params.pop("workspace"),
                                                        **params)["session"]
            self.turn = self.client.turn_begin(self.session)["turn"]
            return self._loop(live="stream" in features, spill="spill" in features)
        except ConnectionLost as e:
            self.lost = True
            print(f"toolsd repl: the daemon is gone ({e.message}); session {self.session} is "
                  f"lost, and with it the REPL's state", file=sys.stderr)
            return 1
        finally:
            self._end()

    def _loop(self, live: bool, spill: bool) -> int:
        args = self.args
        if sys.stdin.isatty():
            kept = " (kept: Ctrl-D leaves it open)" if self.open_params is None else ""
            print(f"toolsd repl: {args.language} in session {self.session}{kept}; Ctrl-D to "
                  f"quit")
        extra = {"spill": True} if spill else {}
        while True:
            source = read_input(args.language)
            if source is None:
                return 0
            self.output.start()
            try:
                result = self.client.repl_exec(
                    self.session, self.turn, source, language=args.language,
                    timeout_s=args.timeout, on_event=self.output.on_event if live else None,
                    **extra)
                self.output.show(self.client, self.session, result, live)
            except KeyboardInterrupt:
                # The blocking client cannot take another request while one is in flight:
                # drop the connection (the daemon cancels the request, which interrupts the
                # code and keeps the REPL's state, or the copy of a figure) and carry on with
                # a new one.
                self.client.close()
                self.client = connect(args, self.path)
                print("\nKeyboardInterrupt")
                continue
            except ConnectionLost:
                raise
            except ToolsdError as e:
                if e.code == "not_found":  # closed by someone else, or a daemon restarted
                    print(f"toolsd repl: session {self.session} is gone ({for_person(e)}); "
                          f"the REPL's state went with it", file=sys.stderr)
                    self.lost = True
                    return 1
                print(f"toolsd repl: {for_person(e)}", file=sys.stderr)

    def _end(self) -> None:
        if self.client is None:
            return
        try:
            if self.lost:
                pass
            elif self.open_params is not None and self.session:
                self.client.session_close(self.session)
            elif self.turn is not None:
                self.client.turn_end(self.session, self.turn)
                if sys.stdin.isatty():
                    print(f"toolsd repl: session {self.session} stays open (`toolsd close "
                          f"{self.session}` ends it)")
        except (ToolsdError, OSError):
            pass  # the daemon went away: its sessions went with it
        finally:
            self.client.close()
