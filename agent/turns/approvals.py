"""What a turn does around a tool call's approval and run (agent/turns/loop.py calls these): a file
tool's change prepared first in ask mode, so that the person approves exactly its diff
(agent/calls/file_tools.py), and the undo snapshot before the turn's first call that may write
(agent/turns/undo.py)."""

from __future__ import annotations

from agent.calls.results import ToolOutcome
from agent.calls.tools import WRITES_FILES
from agent.gates.modes import Mode
from agent.history.messages import ToolCall
from agent.turns.undo import UndoError

__all__ = ["prepare_for_approval", "snapshot_before"]


async def prepare_for_approval(loop, call: ToolCall):
    """The Change to approve (None where no diff is shown), or the ToolOutcome saying why the
    change cannot be made; nothing is written."""
    gate = loop.host.gate
    if call.name not in WRITES_FILES or gate.mode is not Mode.ASK or call.name in gate.always:
        return None
    change = await loop.host.toolbox.prepare(call)
    if not isinstance(change, ToolOutcome):
        loop.log("diff", id=call.id, name=call.name, path=change.shown, diff=change.diff)
    return change


async def snapshot_before(loop, call: ToolCall) -> None:
    """The workspace's files kept for /undo before the turn's first call that may write."""
    tool = loop.host.gate.lookup(call.name)
    if tool is not None and tool.read_only or call.name == "ask_user":
        return
    undo = loop.host.undo
    if undo is None or undo.taken_in == loop.turn.number:
        return
    try:
        await undo.snapshot(loop.turn.number)
    except UndoError as e:
        loop.log("undo_unavailable", reason=str(e))
