"""Sessions without a host folder (PROTOCOL.md 1.2): the folders the daemon makes for them.

A session opened without `workspace` gets a fresh, empty folder `<work root>/<session id>`,
0700, which it owns: Session.run removes it at close. The work root is `--work-root DIR`,
else `workspaces/` in the state folder. Either way it is one of the paths hidden from every
session (Host.hidden_paths): a session sees its own folder, bound over the hiding, and
nothing of the others', and no session can be opened on a path inside it.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat

from toolsd.wire.protocol import IO_ERROR, ToolsdError

log = logging.getLogger("toolsd.session")

__all__ = ["make", "remove", "check_work_root"]


def check_work_root(path: str) -> str:
    """`--work-root DIR`, made if missing and checked: it is hidden from every session, so
    it must not be a folder sessions need (/, a system folder, the home or one holding
    it); ValueError says why."""
    from toolsd.sandbox.bwrap import home
    real = os.path.realpath(path)
    own_home = os.path.realpath(os.path.expanduser("~"))
    if real == "/" or own_home == real or own_home.startswith(real.rstrip("/") + "/"):
        raise ValueError(f"--work-root {path}: every session would lose {real} (the work root "
                         f"is hidden from sessions); give a folder of its own, e.g. "
                         f"/srv/toolsd-work")
    try:
        home.check_hideable(real)
        os.makedirs(real, mode=0o700, exist_ok=True)
    except (ValueError, OSError) as e:
        raise ValueError(f"--work-root {path}: {e}") from None
    return real


def make(root: str, session_id: str) -> str:
    """The new folder for session `session_id` (its real path)."""
    path = os.path.join(root, session_id)
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except OSError as e:
        raise ToolsdError(IO_ERROR, f"could not make a workspace under the work root {root} "
                          f"({e.strerror}); check that folder, or give session.open a "
                          f"workspace") from None
    return os.path.realpath(path)


def remove(path: str) -> None:
    """Remove a made workspace whole, whatever the session left in it (folders without write
    or search permission included). Never follows a symlink out of it."""
    def writable_again(function, failed, _exc_info) -> None:
        parent = os.path.dirname(failed)
        try:
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, stat.S_IRWXU)
            function(failed)
        except OSError:
            pass

    try:
        shutil.rmtree(path, onerror=writable_again)  # onexc from Python 3.12 on
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not remove the workspace %s: %s", path, e)
