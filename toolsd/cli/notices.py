"""What a result says beside its output, told on stderr to the person who ran the command:
processes it ended, files the host would execute, connections refused."""

from __future__ import annotations

import sys


def plural(n: int, word: str) -> str:
    if n == 1:
        return f"1 {word}"
    return f"{n} {word}es" if word.endswith("s") else f"{n} {word}s"


def print_notices(command: str, result: dict, *, session_kept: bool = False) -> None:
    """The notices of a shell.run or repl.exec result, each on its own line of stderr."""
    for line in notices(command, result, session_kept=session_kept):
        print(line, file=sys.stderr)


def notices(command: str, result: dict, *, session_kept: bool = False) -> list[str]:
    lines = []
    orphans = result.get("orphans_ended") or 0
    if orphans:
        keep = ("`toolsd start --session ID -- CMD` keeps one running"
                if session_kept else
                "`toolsd open` and `toolsd start --session ID -- CMD` keep one running")
        lines.append(f"toolsd {command}: the command left {plural(orphans, 'process')} "
                     f"running; ended when it exited ({keep})")
    host_exec = result.get("host_exec") or []
    if host_exec:
        lines.append(f"toolsd {command}: the host's git would run what this session added "
                     f"({len(host_exec)}; check before running git there):")
        lines.extend(f"  {item}" for item in host_exec)
    denied = result.get("network_denied") or []
    if denied:
        lines.append(f"toolsd {command}: network refused {', '.join(denied)}")
    return lines
