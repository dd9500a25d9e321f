"""`toolsd serve`: run the daemon in the foreground (toolsd.daemon.serve does the work)."""

from __future__ import annotations

import argparse
import os
import re
import sys

from toolsd.cli.common import socket_of
from toolsd.wire.paths import default_state_dir
from toolsd.wire.protocol import DEFAULT_MAX_FRAME


def add_parser(sub, common) -> None:
    p = sub.add_parser("serve", parents=[common], help="run the daemon in the foreground")
    p.add_argument("--state-dir", metavar="DIR",
                   help="what survives restarts: id counters, process logs (default: state/ "
                        "beside the socket)")
    p.add_argument("--max-frame", type=int, default=DEFAULT_MAX_FRAME, metavar="BYTES",
                   help="the largest message taken or sent")
    p.add_argument("--require-sandbox", action="store_true",
                   help="refuse to start when bubblewrap cannot sandbox sessions")
    p.add_argument("--hide", action="append", default=[], metavar="PATH",
                   help="another path sessions must not see: a file or a folder, existing or "
                        "not (repeatable; default: only the list in docs/sandbox.md)")
    p.add_argument("--show", action="append", default=[], metavar="PATH",
                   help="let one of the home folder's hidden entries (docs/sandbox.md) back "
                        "into sessions, read-only, e.g. ~/.npmrc (repeatable; default: none)")
    p.add_argument("--no-warm-spare", dest="warm_spare", action="store_false",
                   help="do not keep a sandbox started ahead for the next session.open "
                        "(session.open takes it instead of starting a sandbox; it holds one idle "
                        "sandbox's memory)")
    p.add_argument("--interpreter-starts", type=positive, metavar="N",
                   help="how many REPL interpreters may be starting at once, across sessions "
                        "(a burst of new turns then leaves the CPU to the calls of sessions "
                        "already running; default: the cores less one, at least one)")
    p.add_argument("--idle-timeout", type=duration, metavar="DURATION",
                   help="close a session after this long with no call and no running process "
                        "(90s, 30m, 2h, or seconds; default: never)")
    p.add_argument("--forward-bind", action="append", default=[], metavar="ADDR",
                   help="let port.forward listen on ADDR, not only on loopback (repeatable; "
                        "default: loopback only)")
    p.add_argument("--listen", action="append", default=[], metavar="tls://HOST:PORT",
                   help="also serve clients on other machines over TLS 1.3, with tokens "
                        "(repeatable; docs/remote.md; default: the Unix socket only)")
    p.add_argument("--tls-cert", metavar="PEM", help="the certificate for --listen (default: "
                   "a self-signed one made in the state folder at first start)")
    p.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert (default: the self-signed one's)")
    p.add_argument("--tokens", metavar="FILE",
                   help="lines `TENANT TOKEN` or `TENANT sha256:HEX`, readable by you alone "
                        "(default: one token for tenant `default`, made in the state folder)")
    p.add_argument("--work-root", metavar="DIR",
                   help="where sessions opened without a workspace get theirs (default: "
                        "workspaces/ in the state folder)")
    # Tests only (never a default): names resolve from this JSON file (sandbox/egress/resolver.py).
    p.add_argument("--test-resolver", metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log every request and sandbox step on stderr")
    p.set_defaults(func=cmd_serve)


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def positive(text: str) -> int:
    """A whole number of at least 1 (argparse raises the message)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return n


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


def cmd_serve(args) -> int:
    from toolsd.daemon import serve as daemon  # trio, psutil, the sandbox: only to serve

    daemon.setup_logging(args.verbose)
    path = socket_of(args)
    try:
        hidden, shown = daemon.hidden_and_shown(args.hide, args.show)
        forward_binds = daemon.check_forward_binds(args.forward_bind)
        work_root = daemon.check_work_root(args.work_root) if args.work_root else None
    except ValueError as e:
        print(f"toolsd: {e}", file=sys.stderr)
        return 2
    config = daemon.Config(
        socket_path=path,
        state_dir=os.path.abspath(args.state_dir) if args.state_dir else default_state_dir(path),
        max_frame=args.max_frame,
        require_sandbox=args.require_sandbox,
        hidden=hidden,
        shown=shown,
        warm_spare=args.warm_spare,
        idle_timeout_s=args.idle_timeout,
        interpreter_starts=args.interpreter_starts,
        forward_binds=forward_binds,
        work_root=work_root,
        listen=tuple(args.listen),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tokens_file=os.path.abspath(args.tokens) if args.tokens else None,
        test_resolver=args.test_resolver,
    )
    try:
        daemon.run(config)
    except daemon.StartupError as e:
        print(f"toolsd: {e}", file=sys.stderr)
        return 1
    return 0
