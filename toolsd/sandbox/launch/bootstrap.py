"""The launcher's code, compiled once by the daemon and handed to the sandbox's python."""

from __future__ import annotations

import marshal
import os

from toolsd.runtime.child_fds import ChildFds

# Runs the launcher from code compiled by the daemon and handed over on stdin: run as a script,
# launcher.py would be compiled afresh by every session start (no .pyc for a script), a large
# part of the launcher's start. argv stays [launcher.py, FD, SPAWN_FD], as for the script.
BOOTSTRAP = "import marshal,sys;sys.argv=sys.argv[1:];exec(marshal.loads(sys.stdin.buffer.read()))"
_compiled: dict[tuple[str, int, int], bytes] = {}


def launcher_code(path: str) -> bytes:
    """The marshalled code of driver/launcher.py, compiled once per version of the file."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    code = _compiled.get(key)
    if code is None:
        with open(path, "rb") as f:
            code = marshal.dumps(compile(f.read(), path, "exec", dont_inherit=True))
        _compiled.clear()
        _compiled[key] = code
    return code


def code_file(code: bytes) -> int:
    """A memfd holding `code`, at offset 0."""
    with ChildFds() as fds:
        fd = fds.ours(os.memfd_create("toolsd-launcher-code", os.MFD_CLOEXEC))
        os.write(fd, code)  # a memfd takes it all in one write
        os.lseek(fd, 0, os.SEEK_SET)
    return fd
