"""toolsd's own program files (its drivers, its package, the interpreter and the
site-packages the daemon imports from) are never writable from a session: a driver changed
there would run in every later session, any tenant's, and a module in the daemon itself.
A workspace inside them is refused; one that holds them (a checkout of toolsd, a project
with toolsd in its .venv) gets them read-only."""

from __future__ import annotations

import os
import secrets
import sys

import pytest

import toolsd
from conftest import needs_bwrap
from driver import DRIVER_DIR
from toolsd.client import ToolsdError

pytestmark = needs_bwrap


@pytest.mark.parametrize("where", ["driver", "prefix"])
def test_a_workspace_inside_toolsd_own_programs_is_refused(client, where):
    folder = DRIVER_DIR if where == "driver" else sys.prefix
    with pytest.raises(ToolsdError) as e:
        client.session_open(folder)
    assert e.value.code == "bad_params" and "toolsd's own program files" in e.value.message


def test_toolsd_own_programs_inside_a_workspace_are_read_only(client):
    holder = os.path.dirname(os.path.realpath(DRIVER_DIR))
    name = f"probe-{secrets.token_hex(4)}.py"
    planted = os.path.join(DRIVER_DIR, name)
    s = client.session_open(holder)["session"]
    try:
        out = client.shell_run(s, f"echo 'raise SystemExit' > {planted}; echo rc=$?")["output"]
        assert "Read-only file system" in out and "rc=1" in out, out
        with pytest.raises(ToolsdError) as e:
            client.file_write(s, planted, b"raise SystemExit\n")
        assert e.value.code == "io_error" and "read-only" in e.value.message
        assert not os.path.exists(planted)
        # So is the agent beside it (`toolsd agent` runs it on the host).
        agent = os.path.join(os.path.dirname(os.path.dirname(toolsd.__file__)), "agent")
        if os.path.isdir(agent):
            out = client.shell_run(s, f"touch {agent}/{name}; echo rc=$?")["output"]
            assert "rc=1" in out and not os.path.exists(os.path.join(agent, name)), out
        # The rest of the workspace stays writable.
        assert client.shell_run(s, f"touch {name} && rm {name} && echo ok")["output"] == "ok\n"
    finally:
        client.session_close(s)
        for path in (planted, os.path.join(os.path.dirname(os.path.dirname(
                toolsd.__file__)), "agent", name)):
            if os.path.exists(path):
                os.unlink(path)
