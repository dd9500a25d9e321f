"""What a person at a terminal sees of a turn, as text: pure, no I/O (agent/terminal/cli.py
writes it).

- a tool call is one line: the tool and the gist of its arguments (the command, the first
  line of the code, the process id, the path);
- its result is one line: the first line of the output, how many more there are, and the
  bracketed notes the model was given (exit code, timeout, where the whole output is);
- the spinner line says which tool runs and for how long;
- the outcome line says how the turn ended and in how many steps;
- a warning line for each thing the session added that git on this machine would run, and
  a line when a lost session was replaced by a fresh one.

Lines are clipped to the terminal's width, and control characters (escape sequences of a
command's output or a model's text) are shown as `?`, never sent to the terminal. `Glyphs`
are the symbols, in Unicode or in ASCII for a terminal that cannot show the former.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from agent.gates.modes import Declined

__all__ = ["Glyphs", "UNICODE", "ASCII", "glyphs_for", "call_line", "result_line",
           "outcome_line", "spinner_line", "approval_question", "read_answer", "clip",
           "printable", "host_exec_lines", "replaced_line", "diagnostics_line"]


class Glyphs(msgspec.Struct, frozen=True):
    call: str
    result: str
    error: str
    ellipsis: str
    spinner: str


UNICODE = Glyphs(call="●", result="⎿", error="✗", ellipsis="…", spinner="⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
ASCII = Glyphs(call="*", result="->", error="x", ellipsis="...", spinner="|/-\\")


def glyphs_for(encoding: str | None) -> Glyphs:
    return UNICODE if (encoding or "").lower().replace("-", "") in ("utf8", "utf_8") else ASCII


# Warning lines of one host_exec event; a flood of hooks is counted past them.
HOST_EXEC_SHOWN = 10

# Control characters but newline and tab (C0, DEL, C1): what a terminal would act on. Output
# of a command or text of a model must not move the cursor, retitle the window or write the
# clipboard (OSC 52) of the person reading it. And the invisible ones that reorder text or
# hide a break in it (bidirectional embeddings, overrides and isolates; zero-width space, word
# joiner, byte order mark): a command shown for approval must read as it runs.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b\u202a-\u202e\u2060\u2066-\u2069"
                       r"\ufeff]")


def printable(text: str) -> str:
    """`text` with the control characters a terminal would act on, and the invisible ones
    that reorder text, replaced by `?`; newlines and tabs are kept."""
    return _CONTROLS.sub("?", text)


def clip(text: str, width: int, g: Glyphs = UNICODE) -> str:
    """`text` on one line of at most `width` characters, printable."""
    text = printable(text.expandtabs(4))
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    if len(text) <= width:
        return text
    return text[:max(0, width - len(g.ellipsis))] + g.ellipsis


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _more(lines: list[str]) -> str:
    return f" (+{_count(len(lines) - 1, 'line')})" if len(lines) > 1 else ""


def gist(name: str, arguments: dict[str, Any]) -> str:
    """The arguments of a call as a person reads them."""
    a = arguments

    def text(key: str) -> str:
        value = a.get(key)
        return value if isinstance(value, str) else json.dumps(value)

    if name in ("run_terminal", "process_start") and "command" in a:
        lines = _lines(text("command"))
        shown = (lines[0] if lines else "") + _more(lines)
        if name == "process_start" and a.get("name"):
            shown += f"  [{text('name')}]"
        if name == "process_start" and a.get("tty") is True:
            shown += "  (on a terminal)"
        return shown
    if name == "repl" and "code" in a:
        lines = _lines(text("code"))
        language = f"[{text('language')}] " if a.get("language") not in (None, "python") else ""
        return language + (lines[0] if lines else "") + _more(lines)
    if name == "process_output" and "id" in a:
        extra = "".join(f"  {key}={text(key)}" for key in ("until", "wait_s") if key in a)
        return text("id") + extra
    if name == "process_stop" and "id" in a:
        return text("id")
    if name == "process_write" and "id" in a:
        typed = json.dumps(a.get("data", ""), ensure_ascii=False)
        return f"{text('id')} {typed}" + ("  eof" if a.get("eof") else "")
    if name in ("read_image", "read_file", "write_file", "edit_file") and "path" in a:
        return text("path")
    if name == "ask_user" and "question" in a:
        return _lines(text("question"))[0] if _lines(text("question")) else ""
    if name == "find":
        return "  ".join(f"{key}={text(key)}" for key in ("pattern", "glob", "path") if key in a)
    return json.dumps(a, ensure_ascii=False) if a else ""


def call_line(event: dict, width: int, g: Glyphs = UNICODE) -> str:
    """A `tool_call` event as one line."""
    if event.get("error"):
        return clip(f"{g.call} {event['name']}: (its arguments could not be read)", width, g)
    shown = gist(event["name"], event.get("arguments") or {})
    return clip(f"{g.call} {event['name']}" + (f": {shown}" if shown else ""), width, g)


def _split_notes(text: str) -> tuple[list[str], list[str]]:
    """(output lines, the bracketed note lines that end a result)."""
    lines = _lines(text)
    notes: list[str] = []
    while lines and lines[-1].startswith("[") and lines[-1].rstrip().endswith("]"):
        notes.insert(0, lines.pop().strip())
    return lines, notes


def result_line(event: dict, width: int, g: Glyphs = UNICODE) -> str:
    """A `tool_result` event as one line: its first line, how many more, and its notes."""
    body, notes = _split_notes(event.get("text", ""))
    mark = g.error if event.get("is_error") else g.result
    indent = "  "
    width -= len(indent)
    if event.get("skipped"):
        return indent + clip(f"{mark} skipped: the same call already ran too often", width, g)
    first = body[0] if body else ""
    more = _more(body)
    tail = " ".join(notes)
    # The notes matter more than the output's first line: that is what gets clipped.
    room = width - len(f"{mark} ") - len(more) - (len(tail) + 2 if tail else 0)
    shown = clip(first, max(room, 12), g) if first else ""
    line = f"{mark} {shown}{more}" + (f"  {tail}" if tail and shown else tail)
    return indent + clip(line, width, g)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def outcome_line(outcome: str, steps: int, tool_calls: int, reason: str = "") -> str:
    """How a turn ended: `[completed] 3 steps, 2 tool calls`, with the reason for the others."""
    line = f"[{outcome}] {_count(steps, 'step')}, {_count(tool_calls, 'tool call')}"
    return f"{line}: {reason}" if reason and outcome != "completed" else line


def host_exec_lines(event: dict, most: int = HOST_EXEC_SHOWN) -> list[str]:
    """A `host_exec` event: one warning line for each thing added, whole (it is what the
    person must go and look at), at most `most` of them and a line that counts the rest."""
    added = event.get("added", [])
    lines = [f"toolsd agent: WARNING: the session added what git on this machine would run: "
             f"{line} (look at it before you run git in that repository)"
             for line in added[:most]]
    if len(added) > most:
        lines.append(f"toolsd agent: WARNING: and {len(added) - most} more such; `toolsd "
                     f"status` lists them all while the session is open")
    return lines


def replaced_line(event: dict) -> str:
    """A `session_replaced` event."""
    stale = len(event.get("stale") or [])
    return (f"toolsd agent: session {event['lost']} was lost ({event['reason']}); going on "
            f"in a fresh one, {event['session']}: its background processes ({stale}) and "
            f"REPL state are gone")


def spinner_line(name: str, elapsed_s: float, tick: int, width: int,
                 g: Glyphs = UNICODE) -> str:
    frame = g.spinner[tick % len(g.spinner)]
    return "  " + clip(f"{frame} {name} {elapsed_s:.1f}s", width - 2, g)


def approval_question(name: str, arguments: dict[str, Any], width: int,
                      g: Glyphs = UNICODE, diff: bool = False) -> str:
    """The question before a call runs in ask mode (the call's line is already shown above
    it; a long command is shown whole here, since this is what the person approves)."""
    a = arguments
    whole = a.get("command") if name in ("run_terminal", "process_start") else \
        a.get("code") if name == "repl" else None
    shown = ""
    if isinstance(whole, str) and len(whole) > width - 4 or "\n" in str(whole or ""):
        shown = "".join(f"    {line}\n" for line in printable(str(whole)).splitlines())
    verb = "Apply it" if diff else "Run it"
    return f"{shown}  {verb}? [y]es / [n]o (or n, and why) / [a]lways for {name}: "


# "n", "no", then what to tell the model: "n use uv", "no: not on main", "n - too slow".
_NO_BECAUSE = re.compile(r"(?is)(?:no|n)(?:\s*[:,;.\-]\s*|\s+)(\S.*)")


def read_answer(text: str) -> bool | str | Declined | None:
    """A person's answer: True, False, "always", a Declined with the reason given after a
    no, or None when it is none of them."""
    word = text.strip().lower()
    if word in ("y", "yes"):
        return True
    if word in ("n", "no"):
        return False
    if word in ("a", "always"):
        return "always"
    because = _NO_BECAUSE.fullmatch(printable(text.strip()))
    if because:
        return Declined(reason=because.group(1).strip())
    return None


def diagnostics_line(event: dict) -> str:
    """A `diagnostics` event: what the language servers said of the files edited, in short
    (the model gets the whole of it)."""
    parts = []
    for f in event.get("files") or []:
        count = f.get("count")
        said = f"no diagnostics ({f.get('why')})" if count is None else \
            _count(count, "problem")
        parts.append(f"{f.get('path')}: {said}")
    return "  (diagnostics: " + "; ".join(parts) + ")"
