"""A Python REPL's own address-space limit, a little under its session's memory.

The session's memory cgroup ends the process that takes the session over its limit: for a
REPL that is the interpreter, and the agent's namespace goes with it. An address-space limit
on the interpreter alone (RLIMIT_AS, soft, set from the host once it runs) makes the same
allocation fail inside it instead: `bytearray(10**10)` raises MemoryError and the namespace
stays. The interpreter's address space is never below what it holds, so with the limit under
the session's memory the interpreter alone cannot reach the cgroup's limit.

Only the soft limit: code that needs more address space than memory (a runtime that reserves
large ranges) may raise it again, up to the hard limit, and so may the processes the REPL
starts, which inherit it (`ulimit -v unlimited` in a shell). Not for node: V8 reserves some
10 GB of address space for each WebAssembly memory, which any such limit would refuse; node's
REPL has the session's cgroup only.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("toolsd.repl")

# The share of the session's memory the Python interpreter may map.
SHARE_NUM, SHARE_DEN = 15, 16
LANGUAGES = frozenset({"python"})


def address_space_limit(memory_mb: int) -> int:
    """The interpreter's RLIMIT_AS for a session of `memory_mb`, in bytes."""
    return memory_mb * 2**20 * SHARE_NUM // SHARE_DEN


def limit_interpreter(pid: int, language: str, memory_mb: int) -> None:
    """Set the soft RLIMIT_AS of a just started interpreter (its host pid); never raises:
    an interpreter without it still works, and is ended by the cgroup instead."""
    if language not in LANGUAGES or pid <= 0:
        return
    limit = address_space_limit(memory_mb)
    try:
        _soft, hard = resource.prlimit(pid, resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)  # the session's own RLIMIT_AS, without a cgroup
        resource.prlimit(pid, resource.RLIMIT_AS, (limit, hard))
    except OSError as e:  # it died already, or a kernel that refuses
        log.info("the %s interpreter (pid %d) runs without its address-space limit: %s",
                 language, pid, e)
