"""`toolsd token`: what a client on another machine needs to reach this daemon (its URL,
token and certificate fingerprint), read from the state folder of a daemon started with
`--listen tls://...`."""

from __future__ import annotations

import json
import os
import shlex
import sys

from toolsd.cli.common import socket_of
from toolsd.wire.paths import default_state_dir

INFO_FILE = "remote.json"  # written by toolsd.daemon.remote_setup at start


def add_parser(sub, common) -> None:
    p = sub.add_parser("token", parents=[common],
                       help="print the URL, token and fingerprint a remote client needs")
    p.add_argument("--state-dir", help="the daemon's state folder (default: beside the socket)")
    p.add_argument("--json", action="store_true",
                   help="print the URL, token and fingerprint as one JSON object")
    p.set_defaults(func=cmd_token)


def cmd_token(args) -> int:
    state = (os.path.abspath(args.state_dir) if args.state_dir
             else default_state_dir(socket_of(args)))
    try:
        with open(os.path.join(state, INFO_FILE), encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        print(f"toolsd token: no TLS listener was started with the state folder {state}; "
              f"start one with `toolsd serve --listen tls://HOST:PORT` (or give --state-dir)",
              file=sys.stderr)
        return 1
    token = None
    if info.get("token_file"):
        try:
            with open(info["token_file"], encoding="utf-8") as f:
                token = f.read().split()[1]
        except (OSError, IndexError):
            print(f"toolsd token: cannot read {info['token_file']}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps({"urls": info["urls"], "token": token,
                          "fingerprint": info["fingerprint"]}, indent=2))
        return 0
    url = info["urls"][0] if info["urls"] else "tls://HOST:PORT"
    print(f"url:         {', '.join(info['urls'])}")
    if any(wild in url for wild in ("//0.0.0.0:", "//[::]:")):
        print("             (it listens on every address: a client names this machine by "
              "its own name or address instead)")
    print(f"fingerprint: {info['fingerprint']}")
    if token is not None:
        print(f"token:       {token}  (tenant default)")
    else:
        print(f"token:       the one of your tenant in {info.get('tokens_file')}")
    print("\nOn the client:")
    print(f"  export TOOLSD_URL={shlex.quote(url)}")
    print(f"  export TOOLSD_FINGERPRINT={info['fingerprint']}")
    print(f"  export TOOLSD_TOKEN={shlex.quote(token) if token else '...'}")
    return 0
