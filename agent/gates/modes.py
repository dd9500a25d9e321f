"""Approval modes: per tool call, whether it runs (auto, ask a person, plan: read-only).

- `auto`: every call runs.
- `ask`: reading tools run at once; shell, REPL and process calls wait for a person's answer
  (the `approve` callback: yes, no, or "always" for that tool from then on).
- `plan`: read-only. The session itself is opened with `writable: false` (Agent does it), so
  the operating system refuses every write to the workspace whatever the code looks like.
  The classifiers (agent/gates/shell_writes.py, agent/gates/code_writes.py) only give the model an
  early, clear refusal for what plainly writes; they are not the guard (a classifier fails
  open: a mode in a variable slips through).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from agent.calls.tools import READ_ONLY, WRITES_FILES, spec
from agent.gates.code_writes import node_write, python_write
from agent.gates.shell_writes import shell_write
from agent.history.messages import ToolCall, ToolSpec

__all__ = ["Mode", "ApprovalGate", "Decision", "Declined", "Approver", "shell_write",
           "python_write", "node_write", "plan_refusal"]


class Mode(enum.Enum):
    PLAN = "plan"
    ASK = "ask"
    AUTO = "auto"


class Declined(msgspec.Struct, frozen=True):
    """A person's no with their reason, which the model is told."""

    reason: str


Answer = bool | Literal["always"] | Declined
# Called as approve(call), or approve(call, diff) for a file tool's change (agent/calls/diffs.py).
Approver = Callable[..., Awaitable[Answer]]


class Decision(msgspec.Struct, frozen=True):
    """`message` is what the model is told instead of a result when the call does not run;
    `asked`: a person answered (the answer is `allowed`)."""

    allowed: bool
    message: str = ""
    asked: bool = False


class ApprovalGate:
    """Decides, per call, whether it runs. Owns the "always" answers of its conversation."""

    def __init__(self, mode: Mode | str, approve: Approver | None = None):
        self.mode = Mode(mode)
        if self.mode is Mode.ASK and approve is None:
            raise ValueError("ask mode needs an approve callback (or use mode 'auto' or 'plan')")
        self.approve = approve
        self.always: set[str] = set()
        # The tools beyond the built-in ones (agent/calls/catalog.py: tool_search, outside servers'
        # tools, legacy names), by name: what a call runs as. Set by the Agent.
        self.lookup: Callable[[str], ToolSpec | None] = spec

    async def check(self, call: ToolCall, diff: str | None = None) -> Decision:
        """`diff`: what a write_file or edit_file call would change, shown to the person."""
        tool = self.lookup(call.name)
        if tool is not None and tool.name != call.name:  # a legacy name: gated as its tool
            call = msgspec.structs.replace(call, name=tool.name)
        outside = tool is not None and spec(tool.name) is None
        if call.name in READ_ONLY or (outside and tool.read_only) or self.mode is Mode.AUTO:
            return Decision(True)
        if call.error is not None or tool is None:
            return Decision(True)  # nothing runs: the backend tells the model what is wrong
        if self.mode is Mode.PLAN:
            reason = (f"{call.name} is an outside server's tool that its server does not mark "
                      f"read-only") if outside else plan_refusal(call)
            if reason is None:
                return Decision(True)
            return Decision(False, f"Plan mode is read-only, and this would write ({reason}). "
                                   f"Do not try another way: describe the change instead.")
        if call.name in self.always:
            return Decision(True)
        answer = await (self.approve(call) if diff is None else self.approve(call, diff))
        if answer == "always":
            self.always.add(call.name)
        if isinstance(answer, Declined) and answer.reason:
            return Decision(False, f"The user declined this call, saying: {answer.reason}",
                            asked=True)
        if answer and not isinstance(answer, Declined):
            return Decision(True, asked=True)
        return Decision(False, "The user declined this call. Ask them, or do something else.",
                        asked=True)


def plan_refusal(call: ToolCall) -> str | None:
    """What in the call plainly writes, or None (it may still write: the OS refuses then)."""
    args = call.arguments
    if call.name in WRITES_FILES:
        return f"{call.name} writes {args.get('path') or 'a file'}"
    if call.name in ("run_terminal", "process_start") and isinstance(args.get("command"), str):
        return shell_write(args["command"])
    if call.name == "repl" and isinstance(args.get("code"), str):
        if args.get("language") == "node":
            return node_write(args["code"])
        return python_write(args["code"])
    return None
