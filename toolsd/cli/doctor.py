"""`toolsd doctor`: can sessions be sandboxed here, and if not, why; and does a daemon answer
on the socket. One line per check, `ok` or `NO`, with what follows for sessions, then the
verdict: `sandbox: bwrap` or `sandbox: none` (exit 1)."""

from __future__ import annotations

from toolsd.cli.common import connect, socket_of
from toolsd.client import ToolsdError

DAEMON_TIMEOUT_S = 10.0


def add_parser(sub, common) -> None:
    p = sub.add_parser("doctor", parents=[common],
                       help="can sessions be sandboxed here (each check on its line), and "
                            "does a daemon answer on the socket")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
    # Both run probes on this machine: no daemon needed for them.
    from toolsd.sandbox.launch import host_checks
    from toolsd.sandbox.launch.probe import probe_bwrap

    line("daemon", *daemon_check(args))
    bwrap, why_not = probe_bwrap()
    line("bwrap", bool(bwrap), f"{bwrap} makes a sandbox" if bwrap else why_not)
    for check in [host_checks.user_namespaces(), *host_checks.cgroups(),
                  host_checks.overlay(bwrap), host_checks.inotify()]:
        line(check.name, check.ok, check.text)
    if bwrap:
        print("sandbox: bwrap: sessions run in their own user, pid, ipc, uts and network "
              "namespaces")
        return 0
    print(f"sandbox: none: sessions would run UNSANDBOXED ({why_not}); `toolsd serve "
          f"--require-sandbox` refuses instead")
    return 1


def daemon_check(args) -> tuple[bool, str]:
    path = socket_of(args)
    try:
        with connect(args, timeout=DAEMON_TIMEOUT_S) as c:
            hello = c.hello("toolsd-doctor")
    except (ToolsdError, OSError):
        return False, (f"none answers on {path}: `toolsd serve` starts one; exec, repl, agent "
                       f"and mcp start one of their own for a run")
    return True, f"{hello['server']} answers on {path} (sandbox: {hello['sandbox']})"


def line(name: str, ok: bool, text: str) -> None:
    print(f"{name + ':':<18} {'ok' if ok else 'NO':<3} {text}")
