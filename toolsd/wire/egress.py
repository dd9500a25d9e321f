"""Protocol 1.2 "egress" (PROTOCOL.md, "Egress by domain"): session.open's network map,
session.network's params and result. Entries are checked by sandbox/egress/rules.py."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, UnsetType, field

# On shell.run, repl.exec and process.output results: the connections refused during the
# call, as "host:port: why"; left out when there were none.
NetworkDenied = list[str] | UnsetType


# Named lists of names for `--allow-preset` (the CLI, toolsd agent, toolsd mcp; listed in
# docs/sandbox.md): what each ecosystem's package tools fetch from, and nothing more.
PRESETS: dict[str, tuple[str, ...]] = {
    "pypi": ("pypi.org", "files.pythonhosted.org"),
    "npm": ("registry.npmjs.org",),
    "debian": ("deb.debian.org", "security.debian.org"),
    "github": ("github.com", "api.github.com", "codeload.github.com",
               "objects.githubusercontent.com", "raw.githubusercontent.com"),
}


def network_of(allow: list[str], presets: list[str], ports: list[int] = ()) -> dict | str:
    """session.open's `network` for `--allow NAME`, `--allow-preset NAME` and `--allow-port
    PORT` options: the map, or "none" when no name is given. ValueError for an unknown
    preset."""
    names = list(allow)
    for preset in presets:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; the presets are "
                             f"{', '.join(sorted(PRESETS))}")
        names += PRESETS[preset]
    if not names:
        return "none"
    return {"allow": names, **({"ports": [80, 443, *ports]} if ports else {})}


def add_allow_options(parser) -> None:
    """`--allow NAME` and `--allow-preset PRESET` on an argparse parser (`toolsd exec`, `toolsd
    agent`, `toolsd mcp`); `network_of(args.allow, args.allow_preset)` reads them."""
    parser.add_argument(
        "--allow", action="append", default=[], metavar="NAME",
        help="let the session reach this host name (docs.example.org), the names under a "
             "suffix (*.example.org) or a CIDR (192.0.2.0/24), on ports 80 and 443, through a "
             "proxy the daemon runs; everything else stays refused (repeatable; default: none, no network)")
    parser.add_argument(
        "--allow-preset", action="append", default=[], metavar="PRESET",
        choices=sorted(PRESETS),
        help=f"--allow the hosts of a package ecosystem: {', '.join(sorted(PRESETS))} "
             f"(docs/sandbox.md lists them; repeatable; default: none)")
    parser.add_argument(
        "--allow-port", action="append", default=[], metavar="PORT", type=int,
        help="a port the allowed names may be reached on, besides 80 and 443 (repeatable; default: none)")


class NetworkRule(Struct):
    """`network: {allow, deny, ports}`: names (`docs.example.org`, `*.example.org`) and
    CIDRs (`192.0.2.0/24`) the session may reach, on those ports."""

    allow: list[str]
    deny: list[str] = []
    ports: list[int] = field(default_factory=lambda: [80, 443])


class SessionNetworkParams(Struct):
    session: str
    since: Annotated[int, Meta(ge=0)] = 0


class NetworkEntry(Struct):
    at: float
    host: str
    port: int
    verdict: Literal["allowed", "denied"]
    why: str
    sent: int
    received: int


class SessionNetworkResult(Struct):
    entries: list[NetworkEntry]
    next: int
    dropped: int
    network: str = "none"  # the session's network: "none", "host" or "filtered"
