"""The `toolsd` command: run the daemon, and talk to it as a person would."""

from __future__ import annotations

import argparse
import sys

from agent import cli as agent_cli, mcp_server
from toolsd.cli import (
    attach,
    cluster,
    doctor,
    exec as exec_,
    image,
    kill,
    logs,
    ps,
    repl,
    serve,
    status,
    token,
)
from toolsd.cli.common import add_connection_options
from toolsd.client import ToolsdError

# Each has add_parser(sub, common); `toolsd --help` lists them in this order. Importing one
# costs argparse and the client at most: the daemon's modules load only for `serve`.
COMMANDS = (serve, status, doctor, exec_, image, ps, logs, attach, kill, repl, agent_cli,
            mcp_server, token, cluster)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except ToolsdError as e:
        print(f"toolsd: {e.code}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add_connection_options(common)
    parser = argparse.ArgumentParser(prog="toolsd", parents=[common],
                                     description="Sandboxed tool execution for AI agents.")
    sub = parser.add_subparsers(metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub, common)
    return parser
