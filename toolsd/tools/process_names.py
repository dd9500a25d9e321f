"""Which background process a reference names: its id, or its `name` (process.start's).

The rule, for every method that takes a process's `id` (process.output, stop, write, resize):
- an id wins: a reference that is the id of a known process is that process;
- else it is a name, looked for among the processes of `session` when the call gives one
  (every session's otherwise): the one running process of that name; several running is an
  error naming their ids; none running, the most recently started one of that name (so the
  output of a server that died can still be read by its name);
- a name that looks like an id (`bg` and digits) is refused at process.start, so a reference
  never means one process as an id and another as a name.
Pure: the caller passes the processes it knows, in start order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from toolsd.wire.protocol import BAD_PARAMS, NOT_FOUND, ToolsdError

if TYPE_CHECKING:
    from toolsd.tools.background_process import BackgroundProcess

ID_SHAPE = re.compile(r"bg[0-9]+")


def check_name(name: str) -> None:
    """process.start's check of a name: refuse one that could be read as an id."""
    if ID_SHAPE.fullmatch(name):
        raise ToolsdError(BAD_PARAMS, f"process.start: name {name!r} looks like a process id; "
                          f"choose a name that is not 'bg' followed by digits")


def by_name(processes: Iterable[BackgroundProcess], name: str,
            session_id: str | None) -> BackgroundProcess:
    """The process `name` names (see the rule above); ToolsdError if none or several."""
    named = [bg for bg in processes
             if bg.name == name and name and (session_id is None or bg.session.id == session_id)]
    running = [bg for bg in named if bg.running]
    if len(running) == 1:
        return running[0]
    where = f" of session {session_id}" if session_id else ""
    if len(running) > 1:
        ids = ", ".join(bg.id for bg in running)
        raise ToolsdError(BAD_PARAMS, f"the name {name!r} is held by {len(running)} running "
                          f"processes{where} ({ids}); use one of these ids")
    if named:
        return named[-1]
    raise ToolsdError(NOT_FOUND, f"no background process with the id or name {name!r}{where}; "
                      f"process.list shows the known ones")


def by_name_or_id(processes: Iterable[BackgroundProcess], ref: str,
                  session_id: str | None) -> BackgroundProcess:
    """The process `ref` names among `processes`: its id first, else by the rule above."""
    processes = list(processes)
    for bg in processes:
        if bg.id == ref:
            return bg
    return by_name(processes, ref, session_id)
