"""The `toolsd` command: run the daemon, and talk to it as a person would."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from toolsd.client import Client, ToolsdError
from toolsd.wire.paths import default_state_dir, resolve_socket_path
from toolsd.wire.protocol import DEFAULT_MAX_FRAME


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
    common.add_argument("--socket", default=argparse.SUPPRESS,
                        help="daemon socket (default: $TOOLSD_SOCKET, "
                             "$XDG_RUNTIME_DIR/toolsd/toolsd.sock, /tmp/toolsd-$UID/toolsd.sock)")
    parser = argparse.ArgumentParser(prog="toolsd", parents=[common],
                                     description="Sandboxed tool execution for AI agents.")
    sub = parser.add_subparsers(metavar="COMMAND")

    p = sub.add_parser("serve", parents=[common], help="run the daemon in the foreground")
    p.add_argument("--state-dir", help="what survives restarts (default: beside the socket)")
    p.add_argument("--max-frame", type=int, default=DEFAULT_MAX_FRAME)
    p.add_argument("--require-sandbox", action="store_true",
                   help="refuse to start when bubblewrap cannot sandbox sessions")
    p.add_argument("--hide", action="append", default=[], metavar="PATH",
                   help="another path sessions must not see: a file or a folder, existing or "
                        "not (repeatable)")
    p.add_argument("--show", action="append", default=[], metavar="PATH",
                   help="let one of the home folder's hidden entries (docs/sandbox.md) back "
                        "into sessions, read-only, e.g. ~/.npmrc (repeatable)")
    p.add_argument("--no-warm-spare", dest="warm_spare", action="store_false",
                   help="do not keep a sandbox started ahead for the next session.open "
                        "(it makes session.open some 40 ms quicker, for ~30 MB held)")
    p.add_argument("--idle-timeout", type=duration, metavar="DURATION",
                   help="close a session after this long with no call and no running process "
                        "(90s, 30m, 2h, or seconds; default: never)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("status", parents=[common], help="is the daemon up; what it has open")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("doctor", parents=[common],
                       help="can sessions be sandboxed here, and if not, why")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("exec", parents=[common],
                       help="run one command in a fresh session and print its output")
    p.add_argument("--workspace", default=os.getcwd())
    p.add_argument("--network", choices=["none", "host"], default="none")
    p.add_argument("--read-only", action="store_true")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_exec)

    for extra in _extra_commands:
        extra(sub, common)
    return parser


# Commands of other modules register here (cli_processes etc.), keeping this file small.
_extra_commands: list = []


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """Seconds from `90`, `90s`, `1.5m`, `30m`, `2h`, `1d` (argparse raises the message)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: give seconds (90) or a number with s, m, h or d "
            f"(90s, 30m, 2h)")
    seconds = float(match[1]) * _UNITS[match[2]]
    if seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is too long to be a duration")
    if seconds <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not more than zero; leave the option out to keep idle sessions open")
    return seconds


def socket_of(args) -> str:
    return resolve_socket_path(getattr(args, "socket", None))


def connect(args) -> Client:
    return Client(socket_of(args))


def hidden_and_shown(hide: list[str], show: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`--hide` paths (absolute) and `--show` entries (relative to the home), checked;
    ValueError says what cannot be done and why."""
    from toolsd.sandbox import home

    hidden = tuple(os.path.abspath(os.path.expanduser(h)) for h in hide)
    for path in hidden:
        try:
            home.check_hideable(os.path.realpath(path))
        except ValueError as e:
            raise ValueError(f"--hide {path}: {e}") from None
    own_home = os.path.realpath(os.path.expanduser("~"))
    shown = tuple(dict.fromkeys(home.shown_entry(os.path.expanduser(s), own_home)
                                for s in show))
    for rel in shown:
        path = os.path.join(own_home, rel)
        if any(os.path.realpath(h) == path for h in hidden):
            raise ValueError(f"{path} is given to both --hide and --show; keep one")
    return hidden, shown


def cmd_serve(args) -> int:
    from toolsd.daemon import serve as daemon
    from toolsd.sandbox.policy import Limits
    from toolsd.daemon.supervisor import Config

    daemon.setup_logging(args.verbose)
    path = socket_of(args)
    try:
        hidden, shown = hidden_and_shown(args.hide, args.show)
    except ValueError as e:
        print(f"toolsd: {e}", file=sys.stderr)
        return 2
    config = Config(
        socket_path=path,
        state_dir=os.path.abspath(args.state_dir) if args.state_dir else default_state_dir(path),
        max_frame=args.max_frame,
        require_sandbox=args.require_sandbox,
        hidden=hidden,
        shown=shown,
        limits=Limits(),
        warm_spare=args.warm_spare,
        idle_timeout_s=args.idle_timeout,
    )
    try:
        daemon.run(config)
    except daemon.StartupError as e:
        print(f"toolsd: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_status(args) -> int:
    # A person asking "is it up?" gets an answer even from a daemon that hangs.
    with Client(socket_of(args), timeout=30) as c:
        hello = c.hello("toolsd-cli")
        sessions = c.session_list()["sessions"]
    if args.json:
        print(json.dumps({"hello": hello, "sessions": sessions}, indent=2))
        return 0
    print(f"{hello['server']} on {socket_of(args)}")
    print(f"sandbox: {hello['sandbox']}; shells: {', '.join(hello['shells'])}; "
          f"languages: {', '.join(hello['languages'])}")
    print(f"sessions: {len(sessions)}")
    for s in sessions:
        mode = "rw" if s["writable"] else "ro"
        dead = "" if s.get("alive", True) else "  DEAD (its sandbox died)"
        print(f"  {s['session']}  {s['workspace']}  {s['sandbox']}  net={s['network']}  {mode}  "
              f"processes={s['processes']}  repls={s['repls']}{dead}")
        host_exec = s.get("host_exec") or []
        if host_exec:
            print(f"    the host's git would run what this session added "
                  f"({len(host_exec)}; check before running git there):")
            for line in host_exec:
                print(f"      {line}")
    return 0


def cmd_doctor(args) -> int:
    from toolsd.sandbox.probe import probe_bwrap

    bwrap, why_not = probe_bwrap()
    if bwrap:
        print(f"sandbox: bwrap ({bwrap}): sessions run in their own user, pid, ipc, uts and "
              f"network namespaces")
        return 0
    print(f"sandbox: none: {why_not}")
    print("sessions would run UNSANDBOXED; `toolsd serve --require-sandbox` refuses instead")
    return 1


def cmd_exec(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("toolsd exec: give a command after --, e.g. toolsd exec -- ls -la", file=sys.stderr)
        return 2
    import shlex

    text = command[0] if len(command) == 1 else shlex.join(command)
    with connect(args) as c:
        session = c.session_open(os.path.abspath(args.workspace), network=args.network,
                                 writable=not args.read_only)["session"]
        try:
            result = c.shell_run(session, text, timeout_s=args.timeout)
        finally:
            c.session_close(session)
    sys.stdout.write(result["output"])
    if result["output"] and not result["output"].endswith("\n"):
        sys.stdout.write("\n")
    if result["timed_out"]:
        print(f"toolsd exec: timed out after {args.timeout} s", file=sys.stderr)
        return 124
    if result["exit_code"] is None:
        print(f"toolsd exec: killed by {result['signal']}", file=sys.stderr)
        import signal

        return 128 + int(getattr(signal, result["signal"] or "SIGKILL", signal.SIGKILL))
    return result["exit_code"]
from toolsd import cli_image as _cli_image  # noqa: E402
_extra_commands.append(_cli_image.add_parser)
from toolsd import cli_processes as _cli_processes  # noqa: E402
_extra_commands.append(_cli_processes.add_parser)
from toolsd import cli_repl as _cli_repl  # noqa: E402
_extra_commands.append(_cli_repl.add_parser)
from agent import cli as _agent_cli  # noqa: E402
_extra_commands.append(_agent_cli.add_parser)
from agent import mcp_server as _mcp_server  # noqa: E402
_extra_commands.append(_mcp_server.add_parser)
