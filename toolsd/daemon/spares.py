"""Warm spares: a sandbox started ahead for the next session.open.

Starting a sandbox is most of session.open: bwrap and the launcher's Python (README, "What
it costs"). After each session.open one more sandbox is started for the same parameters and
kept unregistered; the next session.open that asks for exactly that sandbox (the same
policy, limits, and the same folders at its paths) takes it as it is. An agent opens
its sessions on one workspace over and over.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Protocol

import trio

from toolsd.daemon.session import Session, SessionOwner
from toolsd.sandbox.bwrap import home_folders
from toolsd.sandbox.errors import SandboxError
from toolsd.sandbox.bwrap.guards import identities
from toolsd.wire.protocol import ToolsdError

log = logging.getLogger("toolsd.supervisor")

# A warm spare unused for this long is closed: it would only hold memory, and what its
# launcher found on PATH when it started grows stale.
SPARE_MAX_AGE_S = 300.0
# How long after a session.open its spare is started: a new session's first commands come
# right away, and a sandbox starting next to them on a small machine slows them down.
SPARE_DELAY_S = 0.5


@dataclasses.dataclass
class Spare:
    session: Session  # started, not registered
    key: tuple
    fingerprint: tuple
    made_at: float


class SpareOwner(SessionOwner, Protocol):
    """What the pool takes from the Supervisor: a session's owner, which also says whether
    spares are wanted (--no-warm-spare) and whether it is closing."""

    closing: bool

    @property
    def warm_spare(self) -> bool: ...


class SparePool:
    """Resource handling: owns at most one spare (a started Session, not registered with the
    supervisor, running in its nursery); `aclose()` closes it."""

    def __init__(self, owner: SpareOwner):
        self._owner = owner
        self._spare: Spare | None = None
        self._making = False
        self._made = 0

    def claim(self, session: Session) -> Session | None:
        """The spare's session if it fits `session` exactly, else None (and a spare that does
        not fit is closed)."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        spare.session.check_guards()  # its own hiding mounts, as for any session
        unfit = why_unfit(spare, session)
        if unfit is None:
            return spare.session
        log.debug("the warm spare does not fit session %s: %s", session.id, unfit)
        self._owner.nursery.start_soon(spare.session.close)
        return None

    def make_soon(self, params) -> None:
        """Start a spare for `params` (after SPARE_DELAY_S), unless one is being made."""
        owner = self._owner
        if owner.warm_spare and not owner.closing and not self._making:
            self._making = True
            owner.nursery.start_soon(self._make, params)

    async def _make(self, params) -> None:
        spare = session = None
        try:
            await trio.sleep(SPARE_DELAY_S)
            if self._owner.closing:
                return
            self._made += 1
            session = Session(f"spare{self._made}", self._owner, params)
            made = fingerprint(session)  # before the sandbox binds anything
            if await self._owner.nursery.start(session.run) is not None:
                return  # it failed to start; the next session.open starts its own
            spare = Spare(session, spare_key(session), made, time.monotonic())
            old, self._spare = self._spare, spare
            log.debug("warm spare %s is ready", session.id)
            if old is not None:
                await old.session.close()
        except (ToolsdError, SandboxError) as e:
            log.debug("no warm spare: %s", e.message)
            return
        except Exception:
            # A spare is only ever a shortcut: whatever went wrong, the daemon stays up and
            # the next session.open starts its own sandbox.
            log.exception("could not make a warm spare sandbox")
            if spare is None and session is not None:
                with trio.CancelScope(shield=True):
                    await session.close()
            return
        finally:
            self._making = False
        if self._owner.closing:
            await self.aclose()
            return
        await trio.sleep(SPARE_MAX_AGE_S)
        if self._spare is spare:
            await self.aclose()

    async def aclose(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            await spare.session.close()


def why_unfit(spare: Spare, session: Session) -> str | None:
    """Why `spare` cannot serve `session` (for the log), or None when it fits exactly."""
    refusal = spare.session.refusal(now=True)
    if refusal is not None:
        return refusal
    if not spare.session.sandbox.guarded:
        return "its hiding mounts are not watched"
    if time.monotonic() - spare.made_at >= SPARE_MAX_AGE_S:
        return "it is too old"
    if spare.key != spare_key(session):
        return "it was made for another policy or other limits"
    if spare.fingerprint != fingerprint(session):
        return "a folder it binds, hides or protects was replaced since"
    return None


def spare_key(session: Session) -> tuple:
    """What a sandbox made ahead must share with `session` to serve it: the same
    policy (all but its scratch and home folders, which are the sandbox's own), the same
    limits. Of the folders shown entry by entry, only the session's home must list what
    the host's lists now: other homes (and --hide's folders) may be as they were when the
    spare started, up to SPARE_MAX_AGE_S before (other users' activity would otherwise
    keep every spare from fitting); a secret made since is not shown either way."""
    def comparable(name: str, value):
        if name == "folders":
            return tuple(f if f.writable else f.path for f in value)
        return value

    policy = tuple((f.name, comparable(f.name, getattr(session.policy, f.name)))
                   for f in dataclasses.fields(session.policy)
                   if f.name not in ("scratch", "home"))
    return (policy, session.limits, tuple(sorted(session.sandbox.rlimits.items())),
            session.sandbox_kind,
            session.net.rule)


def fingerprint(session: Session) -> tuple:
    """The identity of every path the sandbox binds, hides or protects: a folder removed
    and made again at the same path is another folder, which a sandbox made before does
    not show (or hide). In the session's home, every entry it binds, and what every
    file it copied holds (see spare_key for the other homes)."""
    p = session.policy
    own = [f for f in p.folders if f.writable]
    return (identities((p.workspace, *p.hidden_dirs, *p.hidden_files, *p.protected,
                        *p.pinned, *(f.path for f in p.folders),
                        *(entry for f in own for entry in f.binds))),
            home_folders.copies_state([entry for f in own for entry in f.copies]))
