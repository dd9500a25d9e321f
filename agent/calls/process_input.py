"""Input to the agent's background processes: `process_start` with `tty` (the program on a
terminal of its own, for what asks questions: a prompt, a REPL, an installer's y/n) and the
`process_write` tool that types into it (docs/protocol.md, "Input and terminals").

A mixin of agent/calls/backend.py's Backend, which owns the state it keeps: `processes` (the ids
the model may touch) and `ttys`, those of them on a terminal, whose output is read `plain`
(escape sequences removed, `\\r\\n` as `\\n`): the model reads text, not a screen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent.calls.arguments import ProcessStart, ProcessWrite
from agent.calls.results import ToolOutcome
from toolsd.client import ToolsdError

__all__ = ["ProcessInputTools"]


class ProcessInputTools:
    processes: dict[str, str]
    names: dict[str, str]
    features: frozenset[str]

    @property
    def ttys(self) -> set[str]:
        """The ids of this backend's processes started on a terminal."""
        return self.__dict__.setdefault("_ttys", set())

    def _input_options(self, a: ProcessStart) -> dict[str, Any]:
        """process.start's params for `a`'s input. Raises ToolsdError (the model is told)
        when the daemon has no terminals."""
        if not a.tty:
            return {}
        if "tty" not in self.features:
            raise ToolsdError("bad_params", "this toolsd daemon cannot give a process a "
                                            "terminal (it is older); start it without tty")
        return {"tty": True}

    def _output_options(self, pid: str) -> dict[str, Any]:
        return {"plain": True} if pid in self.ttys else {}

    def _own(self, ref: str) -> str:
        """The id a model's reference names: an id of ours, else a name it gave one."""
        return ref if ref in self.processes else self.names.get(ref, ref)

    def _started(self, r: dict, a: ProcessStart) -> ToolOutcome:
        self.processes[r["id"]] = a.command
        if a.name:
            self.names[a.name] = r["id"]
        if a.tty:
            self.ttys.add(r["id"])
            return ToolOutcome(f"Started {r['id']} on a terminal. Type into it with "
                               f"process_write, read it with process_output, stop it with "
                               f"process_stop; it keeps running until then.")
        return ToolOutcome(f"Started {r['id']}. Read its output with process_output, stop it "
                           f"with process_stop; it keeps running until then.")

    async def _process_write(self, a: ProcessWrite) -> ToolOutcome:
        pid = self._own(a.id)
        if (refusal := self._unknown(pid)) is not None:
            return refusal
        if pid not in self.ttys:
            return ToolOutcome(f"{pid} was started without a terminal, so it takes no "
                               f"input; start it again with tty: true to type into it.",
                               is_error=True)
        size = len(a.data.encode())
        try:
            r = await self._ask("process_write", pid, a.data, eof=a.eof)
        except ToolsdError as e:
            if e.code == "bad_params":
                return ToolOutcome(f"process_write: {e.message}", is_error=True)
            return self._stale(pid, e)
        written = r["written"]
        if written < size:
            return ToolOutcome(f"{pid} took {written} of {size} bytes: it is not reading "
                               f"(its terminal is full). Read its output with process_output, "
                               f"then send the rest.", is_error=True)
        eof = " and Ctrl-D" if a.eof else ""
        return ToolOutcome(f"Typed {size} bytes{eof} into {pid}. Read what it says with "
                           f"process_output (wait_s or until for its answer).")

    if TYPE_CHECKING:  # Backend's
        def _unknown(self, pid: str) -> ToolOutcome | None: ...

        def _stale(self, pid: str, e: ToolsdError) -> ToolOutcome: ...

        async def _ask(self, method: str, *args: Any, **params: Any) -> dict: ...
