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

from toolsd.cli.common import connect
from toolsd.client import ToolsdError

PROMPTS = {"python": (">>> ", "... "), "node": ("> ", "... ")}


def add_parser(sub, common) -> None:
    p = sub.add_parser("repl", parents=[common],
                       help="an interactive REPL in a fresh sandboxed session")
    p.add_argument("--workspace", default=os.getcwd(),
                   help="folder the session works in (default: the current one)")
    p.add_argument("--language", choices=["python", "node"], default="python")
    p.add_argument("--network", choices=["none", "host"], default="none")
    p.add_argument("--read-only", action="store_true",
                   help="mount the workspace read-only: every write fails")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds one input may run before it is interrupted (default 600)")
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


def show(result: dict) -> None:
    output = result["output"]
    sys.stdout.write(output)
    if output and not output.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()


def cmd_repl(args: argparse.Namespace) -> int:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    client = connect(args)
    session = client.session_open(os.path.abspath(args.workspace), network=args.network,
                                  writable=not args.read_only)["session"]
    try:
        turn = client.turn_begin(session)["turn"]
        if sys.stdin.isatty():
            print(f"toolsd repl: {args.language} in session {session} "
                  f"(workspace {os.path.abspath(args.workspace)}); Ctrl-D to quit")
        while True:
            source = read_input(args.language)
            if source is None:
                return 0
            try:
                result = client.repl_exec(session, turn, source, language=args.language,
                                          timeout_s=args.timeout)
            except KeyboardInterrupt:
                # The blocking client cannot take another request while one is in flight:
                # drop the connection (the daemon cancels the request, which interrupts the
                # code and keeps the REPL's state) and carry on with a new one.
                client.close()
                client = connect(args)
                print("\nKeyboardInterrupt")
                continue
            except ToolsdError as e:
                print(f"toolsd: {e.code}: {e.message}", file=sys.stderr)
                continue
            show(result)
    finally:
        try:
            client.session_close(session)
        except (ToolsdError, OSError):
            # The daemon went away: its sessions went with it.
            pass
        client.close()
