"""A session's turns, and the REPLs their repl.exec calls run on: one per (turn, language).

Resource handling: ReplTurns owns every turn's REPLs; `end` (turn.end) and `aclose`
(session.close) close each, which kills its interpreter's tree.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Callable

import trio

from toolsd.wire.protocol import LIMIT_EXCEEDED, NOT_FOUND, ToolsdError

if TYPE_CHECKING:
    from toolsd.tools.repl import Repl

# Turns of one session open at once: each is kept until turn.end or session.close, so a
# client that begins turns without ending them would grow the daemon without end.
MAX_OPEN_TURNS = 1000


class ReplTurn:
    def __init__(self, turn_id: str):
        self.id = turn_id
        self._repls: dict[str, Repl] = {}  # language -> Repl

    def repl(self, language: str) -> Repl | None:
        """The turn's REPL for `language`, if a call made one."""
        return self._repls.get(language)

    def repl_for(self, language: str, make: Callable[[], Repl]) -> Repl:
        """The turn's REPL for `language`, made with `make()` if there is none yet."""
        repl = self._repls.get(language)
        if repl is None:
            repl = self._repls[language] = make()
        return repl

    @property
    def repl_count(self) -> int:
        return len(self._repls)

    async def aclose(self, cut_off: ToolsdError | None = None) -> int:
        """Close the turn's REPLs; how many had a running interpreter. `cut_off` answers
        the requests they cut off (see Repl.aclose)."""
        count = 0
        with trio.CancelScope(shield=True):
            for repl in list(self._repls.values()):
                if await repl.aclose(cut_off):
                    count += 1
        return count


class ReplTurns:
    """The turns of one session, by id."""

    def __init__(self):
        self._turns: dict[str, ReplTurn] = {}

    def begin(self, session_id: str) -> str:
        if len(self._turns) >= MAX_OPEN_TURNS:
            raise ToolsdError(LIMIT_EXCEEDED, f"session {session_id} has {MAX_OPEN_TURNS} "
                              f"turns open, the most it keeps; end one with turn.end (or "
                              f"close the session) before beginning another")
        turn_id = f"t-{uuid.uuid4().hex[:12]}"
        self._turns[turn_id] = ReplTurn(turn_id)
        return turn_id

    def get(self, turn_id: str, session_id: str) -> ReplTurn:
        turn = self._turns.get(turn_id)
        if turn is None:
            raise ToolsdError(NOT_FOUND, f"no turn {turn_id!r} in session {session_id}; "
                              f"start one with turn.begin")
        return turn

    async def end(self, turn_id: str, session_id: str) -> int:
        """End the turn: how many of its REPLs had a running interpreter."""
        turn = self.get(turn_id, session_id)
        self._turns.pop(turn_id, None)
        return await turn.aclose()

    async def aclose(self, cut_off: ToolsdError) -> int:
        """End every turn (session.close); `cut_off` answers the requests they cut off."""
        count = 0
        for turn in list(self._turns.values()):
            self._turns.pop(turn.id, None)
            count += await turn.aclose(cut_off)
        return count

    @property
    def repl_count(self) -> int:
        return sum(t.repl_count for t in self._turns.values())
