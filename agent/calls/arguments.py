"""A tool call's arguments, read into the Struct of its tool (agent/calls/tools.py has the schemas
the model sees), or the error the model reads instead. Pure."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from agent.calls.results import ToolOutcome, quoted
from agent.calls.tools import TOOL_NAMES
from agent.history.messages import ToolCall

__all__ = ["ARGUMENTS", "parse_arguments", "RunTerminal", "ReplArguments", "ProcessStart",
           "ProcessOutput", "ProcessStop", "ProcessWrite", "ReadImage", "ReadFile", "WriteFile",
           "EditFile", "Find"]

Positive = Annotated[float, Meta(gt=0)]


class RunTerminal(msgspec.Struct, frozen=True):
    command: str
    timeout_s: Positive = 120.0


class ReplArguments(msgspec.Struct, frozen=True):
    code: str
    language: Literal["python", "node"] = "python"


class ProcessStart(msgspec.Struct, frozen=True):
    command: str
    name: str = ""
    tty: bool = False


class ProcessWrite(msgspec.Struct, frozen=True):
    id: str
    data: str
    eof: bool = False


class ProcessOutput(msgspec.Struct, frozen=True):
    id: str
    wait_s: Annotated[float, Meta(ge=0)] | None = None
    until: str | None = None


class ProcessStop(msgspec.Struct, frozen=True):
    id: str


class ReadImage(msgspec.Struct, frozen=True):
    path: str


class ReadFile(msgspec.Struct, frozen=True):
    path: str
    offset: Annotated[int, Meta(ge=1)] | None = None  # the first line, 1-based
    limit: Annotated[int, Meta(ge=1)] | None = None  # lines


class WriteFile(msgspec.Struct, frozen=True):
    path: str
    content: str


class EditFile(msgspec.Struct, frozen=True):
    path: str
    old: str
    new: str
    all: bool = False


class Find(msgspec.Struct, frozen=True):
    pattern: str | None = None
    glob: str | None = None
    path: str | None = None


ARGUMENTS = {"run_terminal": RunTerminal, "repl": ReplArguments, "process_start": ProcessStart,
             "process_output": ProcessOutput, "process_stop": ProcessStop,
             "read_image": ReadImage, "process_write": ProcessWrite,
             "read_file": ReadFile, "write_file": WriteFile, "edit_file": EditFile,
             "find": Find}


def parse_arguments(call: ToolCall):
    """The call's arguments as its Struct, or a ToolOutcome saying what is wrong with them."""
    if call.error is not None:
        # The error says what to send instead (agent/models/stream.py).
        return ToolOutcome(f"Your call of {quoted(call.name)} could not be read: {call.error}",
                           is_error=True)
    kind = ARGUMENTS.get(call.name)
    if kind is None:
        return ToolOutcome(f"There is no tool {quoted(call.name)}; the tools are "
                           f"{', '.join(TOOL_NAMES)}.", is_error=True)
    try:
        # Not strict: a number sent as a string ("5", "2.5"), as models and MCP clients do,
        # is read as the number; a string that is no number ("5s") is still an error.
        return msgspec.convert(call.arguments, kind, strict=False)
    except msgspec.ValidationError as e:
        where = str(e).replace("`$.", "`").replace("`$`", "the arguments")
        return ToolOutcome(f"{call.name}: {where}", is_error=True)
