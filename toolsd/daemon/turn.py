"""A turn of a session: the REPLs its repl.exec calls run on, one per language.

Resource handling: a Turn owns its REPLs; `aclose()` (turn.end, session.close) closes each,
which kills its interpreter's tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import trio

if TYPE_CHECKING:
    from toolsd.tools.repl import Repl
    from toolsd.wire.protocol import ToolsdError


class Turn:
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
