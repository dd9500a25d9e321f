"""`toolsd exec -- COMMAND`: run one command in a fresh session (or a kept one, --session)
and print its output, as it comes where the daemon streams (protocol 1.1 "stream"), else
once the command has ended. What the result says beside the output (processes the command
left running and that were ended, what the host's git would run, connections refused) goes
to stderr. With no daemon answering, it starts one for this run (common.daemon_socket)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys

from toolsd.cli.common import connect, daemon_socket
from toolsd.cli.notices import print_notices
from toolsd.cli.open_session import add_session_options, open_options, refuse_with_session
from toolsd.cli.start import command_text


def add_parser(sub, common) -> None:
    p = sub.add_parser("exec", parents=[common],
                       help="run one command in a fresh session (or a kept one) and print "
                            "its output",
                       description="Run COMMAND (after --) with bash in a sandboxed session "
                                   "and pass on its exit code. Without --session the session "
                                   "is opened for the command and closed after it: whatever "
                                   "the command left running is ended.")
    p.add_argument("--session", metavar="ID",
                   help="run in this session, kept open by `toolsd open` (default: a fresh "
                        "one, closed after the command)")
    add_session_options(p)
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="seconds before the command is ended (exit code 124)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: the command; one word is taken as shell text")
    p.set_defaults(func=cmd_exec)


def cmd_exec(args) -> int:
    text = command_text(args.command, "exec")
    kept = args.session is not None
    if kept:
        refuse_with_session(args, "exec")
        options = None
        where = contextlib.nullcontext(None)
    else:
        options = open_options(args, "exec")
        where = daemon_socket(args, "exec")
    printed = [""]  # the last text printed live

    def print_live(event) -> None:
        # Flushed at once: a person watches it. A slow terminal holds the command.
        sys.stdout.write(event.data)
        sys.stdout.flush()
        printed[0] = event.data

    with where as path, connect(args, path) as c:
        live = "stream" in c.hello("toolsd-cli").get("features", [])
        session = args.session if kept else c.session_open(options.pop("workspace"),
                                                           **options)["session"]
        try:
            result = c.shell_run(session, text, timeout_s=args.timeout,
                                 on_event=print_live if live else None)
        except BrokenPipeError:
            # Whoever read our output stopped (`| head`): the command was cancelled.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        finally:
            if not kept:
                c.session_close(session)
    # Streamed, the output ended with the same notices as `output` (tools/live_output.py).
    shown = printed[0] if live else result["output"]
    if not live:
        sys.stdout.write(shown)
    if shown and not shown.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    print_notices("exec", result, session_kept=kept)
    if result["timed_out"]:
        print(f"toolsd exec: timed out after {args.timeout:g} s", file=sys.stderr)
        return 124
    if result["exit_code"] is None:
        print(f"toolsd exec: killed by {result['signal']}", file=sys.stderr)
        return 128 + int(getattr(signal, result["signal"] or "SIGKILL", signal.SIGKILL))
    return result["exit_code"]
