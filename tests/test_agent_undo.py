"""/undo and /diff: the workspace's files back as before the last turn that wrote, from a side
git repository in the conversation's folder; the workspace's own .git untouched; the model
told. A scripted model and a real daemon; `toolsd agent` under pexpect for the prompt."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pexpect
import pytest

from agent.models.scripted import call, reply
from agent.turns.undo import slash
import agentkit
from conftest import needs_bwrap
from model_server import Call, openai_stream
from test_agent_cli import argv, server, spawn  # noqa: F401 (a fixture)

pytestmark = pytest.mark.daemon(shared=True)
kit = agentkit.kit
place = agentkit.place


def tree_hash(root: str, *, inside: str | None = None) -> str:
    """Of every path and file under `root` (its .git left out), or under root/inside only."""
    top = os.path.join(root, inside) if inside else root
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(top):
        if inside is None and ".git" in dirs:
            dirs.remove(".git")
        dirs.sort()
        for name in sorted(files) + sorted(d + "/" for d in dirs):
            path = os.path.join(folder, name.rstrip("/"))
            st = os.lstat(path)
            h.update(f"{os.path.relpath(path, root)} {st.st_mode:o}\0".encode())
            if not name.endswith("/"):
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def git(ws: str, *args: str) -> None:
    subprocess.run(["git", "-C", ws, "-c", "user.name=t", "-c", "user.email=t@invalid", *args],
                   check=True, capture_output=True)


@needs_bwrap
async def test_undo_restores_each_turn_exactly_and_leaves_git_alone(kit):
    kit.write("app.py", "x = 1\n")
    kit.write("docs/old.md", "old\n")
    kit.write("build/out.bin", "ignored\n")
    kit.write(".gitignore", "build/\n")
    git(kit.workspace, "init", "-q")
    git(kit.workspace, "add", "-A")
    git(kit.workspace, "commit", "-qm", "start")
    start, own_git = tree_hash(kit.workspace), tree_hash(kit.workspace, inside=".git")
    agent = await kit.open([
        reply("", call("edit_file", path="app.py", old="x = 1", new="x = 2"),
              call("write_file", path="new/deep/made.py", content="made\n"),
              call("run_terminal", command="rm docs/old.md && chmod +x app.py")),
        reply("turn one"),
        reply("", call("write_file", path="app.py", content="x = 3\n")),
        reply("turn two"), reply("seen")])
    assert (await agent.run_turn("one")).outcome == "completed"
    after_one = tree_hash(kit.workspace)
    assert after_one != start
    assert (await agent.run_turn("two")).outcome == "completed"
    said = []
    assert await slash(agent, said.append, "/diff")
    assert "-x = 2\n+x = 3" in said[-1]
    assert await slash(agent, said.append, "/undo")
    assert tree_hash(kit.workspace) == after_one
    assert await slash(agent, said.append, "/undo")  # twice in a row: the turn before
    assert tree_hash(kit.workspace) == start
    assert tree_hash(kit.workspace, inside=".git") == own_git
    assert await slash(agent, said.append, "/undo")
    assert said[-1] == "toolsd agent: /undo: nothing left to undo"
    assert (await agent.run_turn("what now")).outcome == "completed"
    history = json.dumps([m.text for m in agent.model.requests[-1].messages
                          if hasattr(m, "text")] + [str(m) for m in
                                                    agent.model.requests[-1].messages])
    assert "The user ran /undo" in history and "before turn 1" in history
    assert os.path.exists(os.path.join(kit.workspace, "build/out.bin"))  # ignored: untouched


@needs_bwrap
def test_undo_and_diff_at_the_prompt(server, place, daemon):
    with open(os.path.join(place.workspace, "keep.txt"), "w") as f:
        f.write("kept\n")
    server.push(openai_stream(calls=[Call("write_file", {"path": "made.txt",
                                                         "content": "new\n"})]),
                openai_stream(text="Made it."))
    child = spawn(argv(server, place, "--mode", "auto", socket=daemon.socket), place)
    child.expect_exact("> ")
    child.sendline("make a file")
    child.expect_exact("[completed] 2 steps, 1 tool call")
    child.expect_exact("> ")
    child.sendline("/diff")
    child.expect_exact("+++ b/made.txt")
    child.expect_exact("> ")
    child.sendline("/undo")
    child.expect_exact("restored the files as they were before turn 1 (1 changed)")
    child.expect_exact("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert sorted(os.listdir(place.workspace)) == ["keep.txt"]
    assert len(server.requests) == 2  # /undo and /diff are no prompts
