"""`toolsd cluster up|status|down`: toolsd on every node of a Ray cluster that offers
`toolsd_slot` resources (docs/cluster.md). Ray is imported only here, in the command."""

from __future__ import annotations

import json
import sys


def add_parser(sub, common) -> None:
    p = sub.add_parser("cluster", parents=[common],
                       help="toolsd on every node of a Ray cluster (pip install toolsd[cluster])")
    p.add_argument("action", choices=["up", "status", "down"],
                   help="up: a daemon on every node with toolsd_slot resources; status: "
                        "nodes, slots, sessions; down: end every session and daemon")
    p.add_argument("--address", help="the Ray cluster (default: RAY_ADDRESS, else the one "
                   "running on this machine)")
    p.add_argument("--root", help="each node's toolsd folder (default: "
                   "~/.local/state/toolsd-cluster on each node)")
    p.add_argument("--port", type=int, default=0,
                   help="the daemons' TLS port (default: any free one)")
    p.add_argument("--json", action="store_true", help="status as JSON (default: a table)")
    p.set_defaults(func=cmd_cluster)


def cmd_cluster(args) -> int:
    try:
        from toolsd.cluster import Cluster
    except ImportError as e:
        print(f"toolsd: cluster needs Ray ({e}); pip install 'toolsd[cluster]'",
              file=sys.stderr)
        return 2
    cluster = Cluster(args.address or "auto", root=args.root, port=args.port)
    try:
        if args.action == "down":
            cluster.down()
            print("toolsd cluster: every session and daemon ended")
            return 0
        status = cluster.up() if args.action == "up" else cluster.status()
    except ConnectionError as e:
        print(f"toolsd: cannot reach the Ray cluster ({e}); start it with `ray start "
              f"--head --resources '{{\"toolsd_slot\": 64}}'` or pass --address",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"{'NODE':<14} {'URL':<28} {'SLOTS':>5} {'USED':>5} {'FREE':>5} {'RESTARTS':>8}")
    for n in status["nodes"]:
        print(f"{n['node'][:12]:<14} {n.get('url') or '(' + n.get('error', '?')[:26] + ')':<28}"
              f" {n['slots']:>5} {n['used']:>5} {n['free']:>5} {n.get('restarts', 0):>8}")
    if not status["nodes"]:
        print("no node offers toolsd_slot: start Ray nodes with --resources "
              "'{\"toolsd_slot\": N}'")
    return 0
