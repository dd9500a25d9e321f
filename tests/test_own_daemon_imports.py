"""A daemon that `toolsd exec` (or `toolsd agent`, `toolsd mcp`) starts for its run runs on
the host, unsandboxed; it must never import code from the folder the person runs it in,
which is a session's writable workspace. (`python -m` puts the current folder first on
sys.path: a `msgspec.py` written there by a sandboxed command would run on the host at the
next run's start.)"""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import RunningDaemon, needs_bwrap

pytestmark = needs_bwrap

# The console script, as a person runs it (its sys.path starts at its own folder).
TOOLSD = os.path.join(os.path.dirname(sys.executable), "toolsd")


def run(d: RunningDaemon, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TOOLSD, "--socket", d.socket, *args], capture_output=True,
                          text=True, timeout=120, env=d.env, cwd=d.workspace,
                          stdin=subprocess.DEVNULL)


def test_a_module_a_session_wrote_into_the_workspace_never_runs_in_the_daemon(daemon_root):
    d = RunningDaemon(daemon_root)  # never started: the runs start their own
    d.env["TMPDIR"] = os.path.join(daemon_root, "tmp")
    os.makedirs(d.env["TMPDIR"])
    mark = os.path.join(daemon_root, "ran-on-the-host")
    planted = f"open({mark!r}, 'w').write('escaped')\nraise ImportError('planted')\n"
    first = run(d, "exec", "--", f"cat > msgspec.py <<'EOF'\n{planted}EOF\nls msgspec.py")
    assert first.returncode == 0, first.stderr
    assert os.path.exists(os.path.join(d.workspace, "msgspec.py"))
    assert not os.path.exists(mark)  # the sandbox could not write it
    second = run(d, "exec", "--", "echo second run")
    assert not os.path.exists(mark), "the daemon imported the workspace's msgspec.py"
    assert second.returncode == 0 and second.stdout == "second run\n", second.stderr
    assert os.listdir(d.env["TMPDIR"]) == []
