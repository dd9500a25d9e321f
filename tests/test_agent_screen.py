"""What `toolsd agent` shows of a turn, line by line (agent/terminal/screen.py: pure)."""

from __future__ import annotations

from agent.gates.modes import Declined
from agent.terminal.screen import (
    ASCII,
    UNICODE,
    approval_question,
    printable,
    call_line,
    glyphs_for,
    host_exec_lines,
    outcome_line,
    read_answer,
    replaced_line,
    result_line,
    spinner_line,
)


def call(name, **arguments):
    return {"type": "tool_call", "name": name, "arguments": arguments, "error": None}


def test_a_call_is_one_line_with_the_gist_of_its_arguments():
    assert call_line(call("run_terminal", command="pytest -q\necho done"), 80) == \
        "● run_terminal: pytest -q (+1 line)"
    assert call_line(call("repl", code="import json\nx = 1\nx", language="node"), 80) == \
        "● repl: [node] import json (+2 lines)"
    assert call_line(call("process_output", id="bg2", until="ready"), 80) == \
        "● process_output: bg2  until=ready"
    assert call_line(call("read_image", path="plot.png"), 80) == "● read_image: plot.png"
    assert call_line({"type": "tool_call", "name": "repl", "arguments": {}, "error": "bad json"},
                     80) == "● repl: (its arguments could not be read)"
    long = call_line(call("run_terminal", command="x" * 500), 60)
    assert len(long) == 60 and long.endswith("…")


def test_a_result_keeps_its_first_line_and_its_notes_within_the_width():
    text = "line one\n" + "\n".join(f"line {i}" for i in range(2, 50)) + \
        "\n[exit code 2]\n[now in src/]"
    line = result_line({"type": "tool_result", "text": text, "is_error": False}, 80)
    assert line == "  ⎿ line one (+48 lines)  [exit code 2] [now in src/]"
    wide = "A" * 300 + "\n[exit code 0]"
    clipped = result_line({"type": "tool_result", "text": wide, "is_error": False}, 50)
    assert len(clipped) <= 50 and clipped.endswith("…  [exit code 0]")
    error = result_line({"type": "tool_result", "text": "The user declined this call.",
                         "is_error": True}, 80)
    assert error == "  ✗ The user declined this call."
    assert result_line({"type": "tool_result", "text": "(no output)\n[exit code 0]",
                        "is_error": False}, 80) == "  ⎿ (no output)  [exit code 0]"


def test_the_outcome_line_says_how_and_in_how_many_steps():
    assert outcome_line("completed", 3, 2) == "[completed] 3 steps, 2 tool calls"
    assert outcome_line("interrupted", 1, 1, "cancelled") == \
        "[interrupted] 1 step, 1 tool call: cancelled"
    assert outcome_line("failed", 1, 0, "cannot connect") == \
        "[failed] 1 step, 0 tool calls: cannot connect"


def test_answers_and_the_question():
    assert [read_answer(a) for a in ("y", " Yes\n", "n", "NO", "a", "always", "", "maybe")] == \
        [True, True, False, False, "always", "always", None, None]
    # A no can say why; the model is told (agent/gates/modes.py).
    assert [read_answer(a) for a in ("n use uv instead", "No: not on main", "n - too slow",
                                     "nope", "now")] == \
        [Declined("use uv instead"), Declined("not on main"), Declined("too slow"), None, None]
    assert read_answer("n \x1b[2Jbad") == Declined("?[2Jbad")
    assert approval_question("run_terminal", {"command": "ls"}, 80).endswith(
        "Run it? [y]es / [n]o (or n, and why) / [a]lways for run_terminal: ")
    # A command longer than the call's line is shown whole before it is approved.
    code = "import os\nos.remove('a')\nos.remove('b')"
    assert "    os.remove('b')\n" in approval_question("repl", {"code": code}, 80)


def test_glyphs_fall_back_to_ascii_and_the_spinner_counts_time():
    assert glyphs_for("UTF-8") is UNICODE and glyphs_for("ascii") is ASCII
    assert spinner_line("run_terminal", 3.25, 0, 80) == "  ⠋ run_terminal 3.2s"
    assert spinner_line("repl", 0.0, 1, 80, ASCII) == "  / repl 0.0s"


def test_a_command_to_approve_reads_as_it_runs():
    """Bidirectional overrides and zero-width characters would show a command other than the
    one that runs (`rm -rf ~` displayed reversed, hidden behind a comment): shown as `?`."""
    sneaky = "echo safe #\u202e ~ fr- mr\u202c\u200b"
    question = approval_question("run_terminal", {"command": sneaky + "\n" + sneaky}, 80)
    assert "\u202e" not in question and "\u200b" not in question
    assert "    echo safe #? ~ fr- mr??\n" in question
    assert printable("tab\tand\nnewline stay; \u200d joins emoji") == \
        "tab\tand\nnewline stay; \u200d joins emoji"


def test_a_flood_of_hooks_is_ten_warning_lines_and_a_count():
    added = [f"/ws/r{i}/.git/hooks/pre-commit" for i in range(500)]
    lines = host_exec_lines({"type": "host_exec", "added": added})
    assert len(lines) == 11
    assert lines[0] == ("toolsd agent: WARNING: the session added what git on this machine "
                        "would run: /ws/r0/.git/hooks/pre-commit (look at it before you run "
                        "git in that repository)")
    assert lines[-1] == ("toolsd agent: WARNING: and 490 more such; `toolsd status` lists "
                         "them all while the session is open")


def test_a_replaced_session_is_one_line():
    assert replaced_line({"lost": "s3", "session": "s4", "stale": ["bg1", "bg2"],
                          "reason": "session s3 was closed after 90 s without activity"}) == (
        "toolsd agent: session s3 was lost (session s3 was closed after 90 s without "
        "activity); going on in a fresh one, s4: its background processes (2) and REPL state "
        "are gone")


def test_a_diagnostics_event_is_one_short_line():
    from agent.terminal.screen import diagnostics_line

    event = {"type": "diagnostics", "files": [
        {"path": "a.py", "server": "pylsp", "why": "", "count": 2},
        {"path": "b.ts", "server": "", "why": "no language server for typescript",
         "count": None}]}
    assert diagnostics_line(event) == ("  (diagnostics: a.py: 2 problems; b.ts: no "
                                       "diagnostics (no language server for typescript))")
