"""The `toolsd` command: run the daemon, and talk to it as a person would."""

from __future__ import annotations

import argparse
import sys

from agent.mcp import server as mcp_server
from agent.terminal import cli as agent_cli
from toolsd.cli import (
    attach,
    close_session,
    cluster,
    cp,
    doctor,
    exec as exec_,
    forward,
    image,
    kill,
    logs,
    net,
    open_session,
    ps,
    repl,
    serve,
    start,
    status,
    token,
)
from toolsd.cli.common import CommandFailed, add_connection_options
from toolsd.cli.help import ToolsdParser
from toolsd.cli.messages import for_person
from toolsd.client import ToolsdError

# Each has add_parser(sub, common); `toolsd --help` lists them in this order. Importing one
# costs argparse and the client at most: the daemon's modules load only for `serve`.
COMMANDS = (serve, status, doctor, open_session, exec_, start, close_session, image, cp, ps,
            logs, attach, kill, repl, forward, net, agent_cli, mcp_server, token, cluster)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except CommandFailed as e:
        print(f"toolsd {e.command}: {e.message}", file=sys.stderr)
        return e.code
    except ToolsdError as e:
        print(f"toolsd: {for_person(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add_connection_options(common)
    parser = argparse.ArgumentParser(prog="toolsd", parents=[common],
                                     description="Sandboxed tool execution for AI agents.")
    sub = parser.add_subparsers(metavar="COMMAND", parser_class=ToolsdParser)
    for command in COMMANDS:
        command.add_parser(sub, common)
    return parser
