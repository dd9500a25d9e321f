"""`toolsd exec -- COMMAND`: run one command in a fresh session and print its output, as it
comes where the daemon streams (protocol 1.1 "stream"), else once the command has ended."""

from __future__ import annotations

import argparse
import os
import sys

from toolsd.cli.common import connect
from toolsd.wire.egress import add_allow_options, network_of


def add_parser(sub, common) -> None:
    p = sub.add_parser("exec", parents=[common],
                       help="run one command in a fresh session and print its output")
    p.add_argument("--workspace", default=os.getcwd())
    p.add_argument("--network", choices=["none", "host"], default="none")
    add_allow_options(p)
    p.add_argument("--read-only", action="store_true")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_exec)


def cmd_exec(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("toolsd exec: give a command after --, e.g. toolsd exec -- ls -la", file=sys.stderr)
        return 2
    import shlex

    network = network_of(args.allow, args.allow_preset, args.allow_port)
    if network == "none":
        network = args.network
    elif args.network == "host":
        print("toolsd exec: --allow and --allow-preset filter the network; leave out "
              "--network host", file=sys.stderr)
        return 2

    text = command[0] if len(command) == 1 else shlex.join(command)
    printed = [""]  # the last text printed live

    def print_live(event) -> None:
        # Flushed at once: a person watches it. A slow terminal holds the command.
        sys.stdout.write(event.data)
        sys.stdout.flush()
        printed[0] = event.data

    with connect(args) as c:
        live = "stream" in c.hello().get("features", [])
        session = c.session_open(os.path.abspath(args.workspace), network=network,
                                 writable=not args.read_only)["session"]
        try:
            result = c.shell_run(session, text, timeout_s=args.timeout,
                                 on_event=print_live if live else None)
        except BrokenPipeError:
            # Whoever read our output stopped (`| head`): the command was cancelled.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        finally:
            c.session_close(session)
    # Streamed, the output ended with the same notices as `output` (tools/live.py).
    shown = printed[0] if live else result["output"]
    if not live:
        sys.stdout.write(shown)
    if shown and not shown.endswith("\n"):
        sys.stdout.write("\n")
    for line in result.get("network_denied", []):  # 1.2 "egress": why a download failed
        print(f"toolsd exec: network refused {line}", file=sys.stderr)
    if result["timed_out"]:
        print(f"toolsd exec: timed out after {args.timeout} s", file=sys.stderr)
        return 124
    if result["exit_code"] is None:
        print(f"toolsd exec: killed by {result['signal']}", file=sys.stderr)
        import signal

        return 128 + int(getattr(signal, result["signal"] or "SIGKILL", signal.SIGKILL))
    return result["exit_code"]
