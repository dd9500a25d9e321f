"""`toolsd forward SESSION PORT`: reach a server running in a session from this machine (a dev
server in a sandbox, opened in a browser). The forward lives in the daemon (port.forward); by
default this command keeps it until Ctrl-C, then closes it; `--detach` leaves it to
`toolsd forward --close` or the session's close."""

from __future__ import annotations

import sys
import time

from toolsd.cli.common import connect
from toolsd.client import ToolsdError

# How often a kept forward is looked at, to say so when its session ended meanwhile.
LOOK_S = 2.0


def add_parser(sub, common) -> None:
    p = sub.add_parser("forward", parents=[common],
                       help="reach a port of a session from this machine (port.forward)")
    p.add_argument("session", help="session id, as `toolsd status` lists them")
    p.add_argument("port", type=int, help="the port the server listens on inside the session")
    p.add_argument("--host-port", type=int, default=0, metavar="N",
                   help="the port to listen on here (default 0: any free one)")
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="the address to listen on here (default 127.0.0.1; any other needs "
                        "`toolsd serve --forward-bind ADDR`)")
    p.add_argument("--detach", action="store_true",
                   help="print the address and exit, leaving the forward open (default: keep "
                        "it until Ctrl-C)")
    p.add_argument("--close", action="store_true",
                   help="close the session's forward of PORT instead")
    p.set_defaults(func=cmd_forward)


def cmd_forward(args) -> int:
    with connect(args) as c:
        if args.close:
            c.port_close(args.session, args.port)
            print(f"closed the forward of port {args.port} of session {args.session}")
            return 0
        r = c.port_forward(args.session, args.port, bind=args.bind, host_port=args.host_port)
        host = f"[{r['host']}]" if ":" in r["host"] else r["host"]
        said = f"forwarding http://{host}:{r['port']} -> port {args.port} of session " \
               f"{args.session}"
        if args.detach:
            print(said, flush=True)
            return 0
        try:
            # Said inside the try: a Ctrl-C that comes as soon as the line is read (before
            # the next line of ours ran) closes the forward too.
            print(said + "; Ctrl-C ends it", flush=True)
            while _still_there(c, args.session, args.port):
                time.sleep(LOOK_S)
        except KeyboardInterrupt:
            try:
                c.port_close(args.session, args.port)
            except ToolsdError as e:
                if e.code not in ("not_found", "session_closed"):
                    raise
            print("forward closed", file=sys.stderr)
            return 0
        print(f"toolsd forward: the forward of port {args.port} ended (its session "
              f"{args.session} was closed, or `toolsd forward --close` closed it)",
              file=sys.stderr)
        return 1


def _still_there(c, session: str, port: int) -> bool:
    for s in c.session_list()["sessions"]:
        if s["session"] == session:
            return any(f["port"] == port for f in s.get("forwards", ()))
    return False
