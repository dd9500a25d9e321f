"""What the model reads of a tool's result: pure, no I/O (agent/calls/backend.py runs the calls).

Every result is at most RESULT_CHARS characters: the head and the tail of the output, and
short lines in brackets for what the model must know (exit code, signal, timeout, processes
ended, where the whole output is when it was cut).
"""

from __future__ import annotations

import msgspec

from agent.history.messages import ImageRef

__all__ = ["RESULT_CHARS", "NOTES_ROOM", "ToolOutcome", "clip_text", "compose", "cut_note",
           "process_text", "quoted", "repl_text", "shell_text", "status_words", "host_exec_note",
           "session_lost_text", "not_finished_note", "stale_text", "caption"]

# What a model is shown of one tool result, notices included: at most this many characters.
RESULT_CHARS = 4000
# Kept free for the bracketed lines when the daemon is asked for the output.
NOTES_ROOM = 400
QUOTED_CHARS = 80  # of a name or id the model sent, quoted back in a message
# What a note quotes of one host_exec line, of a reason the daemon gave, and how many lines
# one note names: the note stays one short line, the rest of the result keeps its room.
HOST_EXEC_CHARS = 200
REASON_CHARS = 200
HOST_EXEC_LINES = 5


class ToolOutcome(msgspec.Struct, frozen=True):
    """A tool's result for the model: `text` for the tool result, and pictures to ride on the
    user message that follows the results (read_image)."""

    text: str
    is_error: bool = False
    images: list[ImageRef] = []
    # Files the call edited (the file tools say so): checked by their language servers
    # before the next request (agent/lsp/diagnostics.py). run_terminal and repl name none.
    edited: list[str] = []


def quoted(value: str, limit: int = QUOTED_CHARS) -> str:
    """A name or id the model sent, quoted for a message about it: a model that sends a
    10,000-character id must not get it back in full."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


def clip_text(text: str, limit: int) -> str:
    """`text` within `limit` characters: its head and tail around a line saying how many
    characters were left out."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text)} characters in all; the middle was left out ...]\n"
    room = limit - len(marker)
    if room <= 0:
        return marker[:limit]
    head = room // 2
    return text[:head] + marker + text[len(text) - (room - head):]


def compose(output: str, notes: list[str]) -> str:
    """The output, then one bracketed line per note, within RESULT_CHARS."""
    tail = "".join(f"\n[{n}]" for n in notes)
    if not output:
        output = "(no output)"
    body = clip_text(output.rstrip("\n"), max(0, RESULT_CHARS - len(tail)))
    return clip_text(body + tail, RESULT_CHARS)


def cut_note(result: dict) -> str | None:
    if not result.get("truncated"):
        return None
    size = result.get("output_bytes", 0)
    where = result.get("output_file")
    if where:
        return (f"output cut: {size} bytes in all; the whole output is in {where} "
                f"(grep it or page it with sed -n)")
    return f"output cut: {size} bytes in all, the middle left out"


def shell_text(r: dict, timeout_s: float, moved_to: str | None) -> str:
    notes = []
    if r["timed_out"]:
        notes.append(f"timed out after {timeout_s:g} s: the command and everything it started "
                     f"were stopped; use process_start for long-running commands")
    elif r["signal"]:
        notes.append(f"killed by {r['signal']}")
    else:
        notes.append(f"exit code {r['exit_code']}")
    if r["orphans_ended"] and not r["timed_out"]:
        notes.append(f"{r['orphans_ended']} process(es) it left running were ended; use "
                     f"process_start to keep something running")
    if r.get("shell") == "sh":
        notes.append("ran in sh: this system has no bash")
    cut = cut_note(r)
    if cut:
        notes.append(cut)
    if moved_to:
        notes.append(f"now in {moved_to}")
    notes.extend(network_notes(r))
    return compose(r["output"], notes)


def repl_text(r: dict, first_in_turn: bool, figures: list[tuple[str, int, int]] = (),
              unread: list[str] = ()) -> str:
    """A repl.exec result; `figures`: (path, width, height) of the pictures it made that
    ride below, `unread`: a line for each that could not be read."""
    notes = []
    if r["fresh"] and not first_in_turn and not r["state_lost"]:
        notes.append("a fresh interpreter: what earlier calls defined is gone")
    if r["status"] == "error":
        notes.append("error")
    cut = cut_note(r)
    if cut:
        notes.append(cut)
    if figures:
        shown = ", ".join(f"{path} ({w}x{h})" for path, w, h in figures)
        notes.append(f"{len(figures)} figure{'s' if len(figures) > 1 else ''} attached below: "
                     f"{shown}")
    notes.extend(unread)
    notes.extend(network_notes(r))
    return compose(r["output"], notes)


def process_text(r: dict) -> str:
    notes = []
    if r["dropped_bytes"]:
        notes.append(f"{r['dropped_bytes']} older bytes were no longer kept")
    waiting = ", waiting for input (process_write)" if r.get("waiting_for_input") else ""
    notes.append(f"{r['id']} {status_words(r)}{waiting}")
    notes.extend(network_notes(r))
    return compose(r["output"] or "(no new output)", notes)


def network_notes(r: dict) -> list[str]:
    """The connections the session's network refused during the call (protocol 1.2
    `network_denied`), so that a failed download says why: a few lines, each short."""
    denied = r.get("network_denied") or []
    notes = [f"network refused {one_line(line, REASON_CHARS)}" for line in denied[:3]]
    if len(denied) > 3:
        notes.append(f"and {len(denied) - 3} more connections refused")
    return notes


def status_words(r: dict) -> str:
    if r["status"] == "running":
        return "is running"
    if r["signal"]:
        return f"{r['status']} (killed by {r['signal']})"
    if r["exit_code"] is not None:
        return f"{r['status']} with exit code {r['exit_code']}"
    return r["status"]


def one_line(text: str, limit: int) -> str:
    """`text` on one line (line breaks written as \\n) of at most `limit` characters."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def caption(tool: str, path: str) -> str:
    """The line before a picture that rides after the tool results."""
    if tool == "repl":
        return f"The figure {path}, made by repl:"
    return f"The image {path}, as {tool} asked:"


def host_exec_note(added: list[str]) -> str:
    """What the session added that the host's git would run (docs/sandbox.md, "What the host
    would execute"), said once when it appears: the person is warned of it too."""
    shown = [one_line(line, HOST_EXEC_CHARS) for line in added[:HOST_EXEC_LINES]]
    more = f"; and {len(added) - len(shown)} more" if len(added) > len(shown) else ""
    return (f"[host_exec: the user's git would run this, which the session added (the user is "
            f"told): {'; '.join(shown)}{more}]")


def session_lost_text(reason: str, stale: list[str]) -> str:
    """The session was gone (closed for idleness, its sandbox died) and a fresh one replaced
    it: what of the earlier one is gone, in one bracketed note."""
    processes = f" ({one_line(', '.join(stale), REASON_CHARS)})" if stale else ""
    return (f"[toolsd: the session was lost ({one_line(reason, REASON_CHARS)}); a fresh one "
            f"was opened on the same workspace. Gone with the earlier one: its background "
            f"processes{processes}, the REPL's state and its /tmp (saved outputs, figures); "
            f"the terminal is back in the workspace root. The workspace's files are as they "
            f"were.]")


def not_finished_note(tool: str) -> str:
    return (f"[{tool} did not finish: it was not run, or cut off, with the lost session; run "
            f"it again if it is still needed]")


def stale_text(pid: str, mine: str) -> str:
    return (f"{pid} ended with an earlier toolsd session, which was lost. Processes of this "
            f"session: {mine}. Start it again with process_start.")
