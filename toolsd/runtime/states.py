"""The base of the daemon's state enums (a Job's, a request's, an interpreter's...): each
moves through a table of allowed moves, a dict of sets keyed by its members, on every call.

Enum's own __hash__ is Python code run at every lookup; its members are singletons compared
by identity, so the object's identity hash, in C, serves the same."""

from __future__ import annotations

import enum


class States(enum.Enum):
    __hash__ = object.__hash__
