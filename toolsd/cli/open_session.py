"""`toolsd open`: a session kept between commands, for a person or a script.

It prints the session's id alone on stdout (`S=$(toolsd open)`), so that `toolsd exec
--session S`, `toolsd repl --session S` and `toolsd start --session S` work in it, and
`toolsd close S` ends it. It lasts as long as the daemon: it needs one that lasts (`toolsd
serve`), never one started for a single run."""

from __future__ import annotations

import os
import sys

from toolsd.cli.common import CommandFailed, connect, require_daemon
from toolsd.wire.egress import add_allow_options, network_of


def add_parser(sub, common) -> None:
    p = sub.add_parser("open", parents=[common],
                       help="open a session kept between commands and print its id",
                       description="Open a sandboxed session and print its id. Commands "
                                   "given --session ID run in it; `toolsd close ID` ends it "
                                   "and everything it runs.")
    add_session_options(p)
    p.set_defaults(func=cmd_open)


def add_session_options(p) -> None:
    """The options of a session opened by a subcommand (open, exec, repl)."""
    p.add_argument("--workspace", metavar="DIR",
                   help="the folder the session works in (default: the current folder)")
    p.add_argument("--network", choices=["none", "host"], default=None,
                   help="none: loopback only; host: the host's network (default: none)")
    p.add_argument("--read-only", action="store_true",
                   help="mount the workspace read-only: every write to it fails")
    add_allow_options(p)


def open_options(args, command: str) -> dict:
    """session.open's params from the options of add_session_options."""
    workspace = os.path.abspath(args.workspace or os.getcwd())
    if not os.path.isdir(workspace):
        raise CommandFailed(command, f"--workspace {workspace}: no such folder", 2)
    network = network_of(args.allow, args.allow_preset, args.allow_port)
    if network != "none" and args.network == "host":
        raise CommandFailed(command, "--allow and --allow-preset filter the network; leave "
                                     "out --network host", 2)
    if network == "none":
        network = args.network or "none"
    return {"workspace": workspace, "network": network, "writable": not args.read_only}


def refuse_with_session(args, command: str) -> None:
    """A session given with --session has its workspace and network already."""
    given = [name for name, value in (("--workspace", args.workspace),
                                      ("--network", args.network),
                                      ("--read-only", args.read_only),
                                      ("--allow", args.allow),
                                      ("--allow-preset", args.allow_preset)) if value]
    if given:
        raise CommandFailed(command, f"{', '.join(given)}: session {args.session} was opened "
                                     f"with its own; leave {'it' if len(given) == 1 else 'them'} "
                                     f"out, or leave out --session for a fresh session", 2)


def cmd_open(args) -> int:
    options = open_options(args, "open")
    path = require_daemon(args, "open", "a session kept between commands")
    with connect(args, path) as c:
        opened = c.session_open(options.pop("workspace"), **options)
    session = opened["session"]
    print(session)
    print(f"toolsd open: session {session} on {opened['workspace']} (sandbox: "
          f"{opened['sandbox']}); `toolsd exec --session {session} -- CMD` runs in it, "
          f"`toolsd close {session}` ends it", file=sys.stderr)
    return 0
