"""`toolsd doctor`: can sessions be sandboxed here, and if not, why."""

from __future__ import annotations


def add_parser(sub, common) -> None:
    p = sub.add_parser("doctor", parents=[common],
                       help="can sessions be sandboxed here, and if not, why")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
    from toolsd.sandbox.probe import probe_bwrap  # runs bwrap: no daemon needed

    bwrap, why_not = probe_bwrap()
    if bwrap:
        print(f"sandbox: bwrap ({bwrap}): sessions run in their own user, pid, ipc, uts and "
              f"network namespaces")
        return 0
    print(f"sandbox: none: {why_not}")
    print("sessions would run UNSANDBOXED; `toolsd serve --require-sandbox` refuses instead")
    return 1
