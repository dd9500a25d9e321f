"""A REPL interpreter's own memory limit, a little under its session's memory.

The session's memory cgroup ends the process that takes the session over its limit: for a
REPL that is the interpreter, and the agent's namespace goes with it. A limit on the
interpreter alone, set from the host once it runs, makes the same allocation fail inside it
instead: `bytearray(10**10)` raises MemoryError in Python, `Buffer.alloc(2**30)` a RangeError
in node, and the namespace stays.

RLIMIT_DATA, not RLIMIT_AS: since Linux 4.7 it counts the private writable mappings (what an
allocation takes), not address space merely reserved. V8 reserves some 10 GB, inaccessible,
for each WebAssembly memory, and glibc reserves 64 MB per thread arena: under an
address-space limit node's WebAssembly fails and threads cost more than they use; under this
one both work as on the host. The interpreter's private writable memory is never below what
it holds of its own, so with the limit under the session's memory the interpreter alone
cannot reach the cgroup's limit.

Only the soft limit: code that needs more may raise it again, up to the hard limit, and so
may the processes the REPL starts, which inherit it (`ulimit -d unlimited` in a shell).
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("toolsd.repl")

# The share of the session's memory the interpreter may allocate.
SHARE_NUM, SHARE_DEN = 15, 16
LANGUAGES = frozenset({"python", "node"})


def data_limit(memory_mb: int) -> int:
    """The interpreter's RLIMIT_DATA for a session of `memory_mb`, in bytes."""
    return memory_mb * 2**20 * SHARE_NUM // SHARE_DEN


def limit_interpreter(pid: int, language: str, memory_mb: int) -> None:
    """Set the soft RLIMIT_DATA of a just started interpreter (its host pid); never raises:
    an interpreter without it still works, and is ended by the cgroup instead."""
    if language not in LANGUAGES or pid <= 0:
        return
    limit = data_limit(memory_mb)
    try:
        _soft, hard = resource.prlimit(pid, resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.prlimit(pid, resource.RLIMIT_DATA, (limit, hard))
    except OSError as e:  # it died already, or a kernel that refuses
        log.info("the %s interpreter (pid %d) runs without its memory limit: %s", language,
                 pid, e)
