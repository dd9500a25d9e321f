"""What `toolsd agent` writes while it runs (agent/terminal/cli.py drives it; the lines
themselves are agent/terminal/screen.py's, pure): the model's text to stdout as it streams,
everything else to stderr, or with `--json` the events as JSON lines to stdout.

Resource handling: a Terminal owns its spinner (a task in the nursery it is given, cancelled
by `_stop_spinner`); the streams and the line reader stay the caller's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import sys

import msgspec
import trio

from agent.calls.diffs import colored
from agent.terminal.prompt_keys import CTRL_C, ExitKey, ctrl_c_ends_line
from agent.terminal.screen import (
    approval_question,
    call_line,
    clip,
    diagnostics_line,
    glyphs_for,
    host_exec_lines,
    outcome_line,
    printable,
    read_answer,
    replaced_line,
    result_line,
    spinner_line,
)

__all__ = ["Terminal"]

SPINNER_TICK_S = 0.1
# Of a running command's output, shown as it comes, at most this much per tool call: the rest
# is taken from the daemon and not written, so a flood never waits on the terminal.
LIVE_OUTPUT_CHARS = 16_000


class Terminal:
    """What a run writes (see the module): the model's text to stdout, everything else to
    stderr, or with `json_mode` the events as JSON lines to stdout. It owns the spinner (a
    task in `nursery`, on a terminal only) and keeps the model's text and its own lines on
    separate lines."""

    def __init__(self, nursery, reader, *, json_mode: bool, on_gone, out=None, err=None):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.nursery = nursery
        self.reader = reader
        self.json_mode = json_mode
        self.live = self.err.isatty() and not json_mode
        self.glyphs = glyphs_for(self.err.encoding)
        self._encode = msgspec.json.Encoder().encode
        self._text_open = False  # the model's text so far does not end with a newline
        self._output_open = False  # likewise, a running command's output (see output)
        self._output_shown = 0  # of the tool call running
        self._spinner = None  # the CancelScope of the running spinner
        self.on_gone = on_gone  # called once if stdout or stderr is closed under us
        self._gone = False
        self.lines = None  # during a steered turn, where typed lines go (agent/turns/steering.py)

    async def _answer_line(self) -> str | None:
        return await (self.reader.readline() if self.lines is None else self.lines.answer())

    @staticmethod
    def width() -> int:
        return max(40, shutil.get_terminal_size((100, 24)).columns - 1)

    # ------------------------------------------------------------ writing

    def text(self, chunk: str) -> None:
        if self.json_mode or not chunk:
            return
        self._stop_spinner()
        self._write(self.out, printable(chunk))
        self._text_open = not chunk.endswith("\n")

    def _write(self, stream, text: str) -> None:
        """Write and flush; a reader that went away (`| head`) ends the run."""
        if self._gone:
            return
        try:
            stream.write(text)
            stream.flush()
        except (BrokenPipeError, ValueError):
            self._gone = True
            # Both to the null device, so that the exit's own flush is quiet too.
            null = os.open(os.devnull, os.O_WRONLY)
            for s in (self.out, self.err):
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(null, s.fileno())
            os.close(null)
            self.on_gone()

    def output(self, event) -> None:
        """A running command's output as it comes (a client's Event), on a terminal only,
        below its call line: at most LIVE_OUTPUT_CHARS of it per call (its result line still
        comes after)."""
        chunk = event.data
        room = LIVE_OUTPUT_CHARS - self._output_shown
        if not self.live or room <= 0 or not chunk:
            return
        self._stop_spinner()
        self._end_text()
        part = chunk[:room]
        self._output_shown += len(part)
        if len(chunk) > room:
            part += ("" if part.endswith("\n") else "\n") + "  (more output, not shown here)\n"
        self._write(self.err, printable(part))
        self._output_open = not part.endswith("\n")

    def _end_text(self) -> None:
        if self._text_open:
            self._write(self.out, "\n")
            self._text_open = False
        if self._output_open:
            self._write(self.err, "\n")
            self._output_open = False

    def say(self, line: str) -> None:
        """A line on stderr, below whatever the model wrote, the spinner cleared. Printable:
        it may hold what a server said (a failed turn's reason)."""
        self._stop_spinner()
        self._end_text()
        self._write(self.err, printable(line) + "\n")

    def event(self, event: dict) -> None:
        if self.json_mode:
            self._write(self.out, self._encode(event).decode() + "\n")
            return
        kind, width, g = event["type"], self.width(), self.glyphs
        if kind == "tool_call":
            self._output_shown = 0
            self.say(call_line(event, width, g))
            self._start_spinner(event["name"])
        elif kind == "tool_result":
            self.say(result_line(event, width, g))
        elif kind == "host_exec":
            for line in host_exec_lines(event):
                self.say(line)
        elif kind == "session_replaced":
            self.say(replaced_line(event))
        elif kind == "refused":
            self.say("  (the model found the request too long: older messages are summarized "
                     "and it is asked again)")
        elif kind == "steer":
            self.say(f"  (queued for the model's next request: {clip(event['text'], 60, g)})")
        elif kind == "diagnostics":
            self.say(clip(diagnostics_line(event), width, g))
        elif kind == "request" and event.get("kind") == "final_report":
            self.say("  (the turn's step budget is spent: the model is asked for a report)")

    def outcome(self, result) -> None:
        if not self.json_mode:
            self.say(outcome_line(result.outcome, result.steps, result.tool_calls,
                                  result.reason))

    # ------------------------------------------------------------ reading

    async def ask_prompt(self) -> str | None:
        """The next prompt: its text, or None at the end of input (Ctrl-D on an empty
        line). On a terminal, Ctrl-C on a line with text clears it and asks again; on an
        empty line it raises ExitKey (agent/terminal/prompt_keys.py)."""
        self._end_text()
        tty = sys.stdin.isatty()
        while True:
            # The keys first, then the prompt: a Ctrl-C typed once it shows ends the line.
            with ctrl_c_ends_line(sys.stdin.fileno()) as keys:
                if tty:
                    self._write(self.err, "> ")
                line = await self.reader.readline(b"\n" + CTRL_C if keys else b"\n")
            if self.reader.ended_by != CTRL_C:
                return line
            self._write(self.err, "\n")  # the kernel echoed `^C`
            if not line.strip():
                raise ExitKey
            self.say("  (line cleared; Ctrl-C on an empty line, or Ctrl-D, exits)")

    async def approve(self, call, diff: str | None = None):
        """Ask mode: y, n, or always for this tool. The end of input declines. A file tool's
        change is shown first as its diff (colored on a terminal)."""
        question = approval_question(call.name, call.arguments, self.width(), self.glyphs,
                                     diff is not None)
        self._stop_spinner()
        self._end_text()
        if diff is not None:
            shown = printable(diff)
            self._write(self.err, colored(shown) if self.err.isatty() else shown)
        while True:
            self._write(self.err, question)
            line = await self._answer_line()
            if line is None:
                self.say("  (Ctrl-D: declined)" if sys.stdin.isatty()
                         else "  (end of input: declined)")
                return False
            answer = read_answer(line)
            if answer is not None:
                break
            self._write(self.err, "  Answer y, n (or n and why: n use uv instead) or a.\n")
        if answer is True or answer == "always":
            self._start_spinner(call.name)
        return answer

    async def ask_user(self, question: str) -> str | None:
        """The model's question (ask_user), and the person's one-line answer; None at the end
        of input. Ctrl-C cancels the turn, as at an approval."""
        self._stop_spinner()
        self._end_text()
        self._write(self.err, "".join(f"  ? {line}\n" for line in
                                      printable(question).splitlines() or [""]))
        self._write(self.err, "  Your answer: ")
        answer = await self._answer_line()
        self._start_spinner("ask_user")
        return answer

    # ------------------------------------------------------------ the spinner

    def _start_spinner(self, name: str) -> None:
        if not self.live:
            return
        self._stop_spinner()
        self._spinner = scope = trio.CancelScope()
        self.nursery.start_soon(self._spin, name, scope)

    def _stop_spinner(self) -> None:
        if self._spinner is not None:
            self._spinner.cancel()
            self._spinner = None
            self._write(self.err, "\r\x1b[K")

    async def _spin(self, name: str, scope) -> None:
        started = trio.current_time()
        with scope:
            for tick in itertools.count():
                if scope.cancel_called:  # stopped before this task first ran
                    return
                line = spinner_line(name, trio.current_time() - started, tick, self.width(),
                                    self.glyphs)
                self._write(self.err, "\r" + line + "\x1b[K")
                await trio.sleep(SPINNER_TICK_S)
