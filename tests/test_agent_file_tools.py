"""The file tools (read_file, write_file, edit_file, find) through a real daemon and a scripted
model: they act with the session's view (hidden paths absent, plan mode refused), edits are
exact, and in ask mode a person approves the diff before anything is written."""

from __future__ import annotations

import hashlib
import os

import pytest

from agent.history.messages import ToolResult
from agent.models.scripted import call, reply
import agentkit
from conftest import needs_bwrap

pytestmark = pytest.mark.daemon(shared=True)
kit = agentkit.kit


def results(model) -> list[str]:
    return [m.text for m in model.requests[-1].messages if isinstance(m, ToolResult)]


def tree_hash(root: str) -> str:
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files) + [d + "/" for d in dirs]:
            path = os.path.join(folder, name.rstrip("/"))
            h.update(os.path.relpath(path, root).encode() + b"\0")
            if not name.endswith("/"):
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


async def run(kit, *calls, mode="auto", **options):
    agent = await kit.open([reply("", c) for c in calls] + [reply("done")], mode=mode,
                           **options)
    assert (await agent.run_turn("go")).outcome == "completed"
    return agent, results(agent.model)


@needs_bwrap
async def test_read_file_numbers_lines_and_reads_on_with_offset(kit):
    kit.write("notes.txt", "".join(f"line {i}\n" for i in range(1, 1001)))
    _, seen = await run(kit, call("read_file", path="notes.txt"),
                        call("read_file", path="notes.txt", offset=998),
                        call("read_file", path="notes.txt", offset=5, limit=2),
                        call("read_file", path="notes.txt", offset=2000))
    assert seen[0].startswith("     1\tline 1\n     2\tline 2\n")
    assert seen[0].endswith("of 1000 shown; read on with offset: " +
                            seen[0].rsplit("offset: ", 1)[1])
    assert len(seen[0]) <= 4000
    assert seen[1] == "   998\tline 998\n   999\tline 999\n  1000\tline 1000"
    assert seen[2] == "     5\tline 5\n     6\tline 6\n[lines 5-6 of 1000 shown; read on with " \
                      "offset: 7]"
    assert seen[3] == "[the file has 1000 lines: there is no line 2000]"


@needs_bwrap
async def test_read_file_of_a_secret_a_hidden_path_a_huge_file_and_a_binary(kit):
    huge = kit.write("huge.log", "".join(f"entry {i}\n" for i in range(1, 3000)))
    with open(huge, "r+b") as f:
        f.truncate(2 << 30)  # 2 GiB, sparse: only the head is read
    with open(os.path.join(kit.workspace, "blob.bin"), "wb") as f:
        f.write(b"\x7fELF\x02\x01\x00\x00" + bytes(range(256)) * 8)
    with open(os.path.join(kit.workspace, "shot.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    hidden = os.path.join(kit.daemon.state_dir, "anything")
    _, seen = await run(kit, call("read_file", path="~/.ssh/id_rsa"),
                        call("read_file", path=os.path.join(kit.daemon.home, ".ssh/id_rsa")),
                        call("read_file", path=hidden), call("read_file", path="huge.log"),
                        call("read_file", path="blob.bin"), call("read_file", path="shot.png"))
    assert all("SECRET-KEY" not in text for text in seen)
    assert "does not exist" in seen[0] and "does not exist" in seen[1]
    assert "does not exist" in seen[2]
    assert seen[3].startswith("     1\tentry 1\n")
    assert "entry 2999" not in seen[3] and "2147483648 bytes in all" in seen[3]
    assert seen[4] == "read_file: blob.bin is binary (2056 bytes), not text: inspect it " \
                      "with run_terminal (file, xxd | head)"
    assert seen[5].startswith("read_file: shot.png is a PNG image") and "read_image" in seen[5]


@needs_bwrap
async def test_write_file_makes_folders_and_edit_file_replaces_exactly(kit):
    agent, seen = await run(
        kit, call("write_file", path="src/deep/app.py", content="a = 1\nb = 2\nb = 2\n"),
        call("edit_file", path="src/deep/app.py", old="a = 1", new="a = 10"),
        call("edit_file", path="src/deep/app.py", old="b = 2", new="b = 3"),
        call("edit_file", path="src/deep/app.py", old="c = 2\n", new="c = 3\n"),
        call("edit_file", path="src/deep/app.py", old="b = 2", new="b = 4", all=True),
        call("edit_file", path="missing.py", old="x", new="y"))
    with open(os.path.join(kit.workspace, "src/deep/app.py")) as f:
        assert f.read() == "a = 10\nb = 4\nb = 4\n"
    assert seen[0] == "created src/deep/app.py (3 lines)."
    assert seen[1] == "edited src/deep/app.py: 1 replacement."
    assert seen[2].startswith("edit_file: `old` matches 2 times in src/deep/app.py (at lines "
                              "2, 3)") and "all: true" in seen[2]
    assert seen[3].startswith("edit_file: `old` was not found in src/deep/app.py. The closest "
                              "is at line 2") and "b = 2" in seen[3]
    assert seen[4] == "edited src/deep/app.py: 2 replacements."
    assert seen[5].startswith("edit_file: missing.py does not exist; create it with "
                              "write_file")
    # The edits name their file for diagnostics (agent/lsp/diagnostics.py's hook).
    outcome = await agent.backend.call(call("write_file", path="w.py", content="x = 1\n"))
    assert outcome.edited == [os.path.join(kit.workspace, "w.py")]


@needs_bwrap
async def test_find_by_regex_and_by_glob_leaves_hidden_folders_out(kit):
    kit.write("src/a.py", "def alpha():\n    return 1\n")
    kit.write("src/b.txt", "alpha beta\n")
    kit.write(".git/config", "alpha in git\n")
    for i in range(150):
        kit.write(f"many/f{i:03}.py", "needle\n")
    _, seen = await run(kit, call("find", pattern=r"alph[a]", path="src"),
                        call("find", glob="*.py", path="src"),
                        call("find", pattern="needle"), call("find"),
                        call("find", pattern="(unclosed"))
    assert sorted(seen[0].splitlines()) == ["src/a.py:1: def alpha():", "src/b.txt:1: alpha beta"]
    assert seen[1] == "src/a.py"
    assert seen[2].endswith("[100 shown, more not: narrow the pattern, glob or path]")
    assert "many/f000.py:1: needle" in seen[2]
    assert seen[3].startswith("find: give `pattern`")
    assert seen[4].startswith("find: ") and "regex" in seen[4]


@needs_bwrap
async def test_plan_mode_refuses_the_writing_file_tools_at_once(kit):
    kit.write("keep.txt", "as it was\n")
    before = tree_hash(kit.workspace)
    _, seen = await run(kit, call("write_file", path="new.txt", content="x"),
                        call("edit_file", path="keep.txt", old="as", new="not as"),
                        call("read_file", path="keep.txt"), mode="plan")
    assert seen[0].startswith("Plan mode is read-only, and this would write (write_file "
                              "writes new.txt)")
    assert seen[1].startswith("Plan mode is read-only, and this would write (edit_file "
                              "writes keep.txt)")
    assert seen[2] == "     1\tas it was"
    assert tree_hash(kit.workspace) == before


@needs_bwrap
async def test_ask_mode_shows_the_diff_and_writes_only_on_yes(kit):
    path = kit.write("app.py", "x = 1\ny = 2\n")
    shown = []
    answers = iter([False, True, True])

    async def approve(tool_call, diff=None):
        shown.append(diff)
        with open(path, "rb") as f:
            assert f.read() == before  # nothing touched before the answer
        if len(shown) == 3:  # someone changes the file between the diff and the answer
            with open(path, "w") as f:
                f.write("x = 1\ny = 2\nz = 3\n")
        return next(answers)

    before = b"x = 1\ny = 2\n"
    agent, seen = await run(kit, call("edit_file", path="app.py", old="y = 2", new="y = 20"),
                            mode="ask", approve=approve)
    assert shown[0] == ("--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n"
                        "+y = 20\n")
    with open(path, "rb") as f:
        assert f.read() == before  # byte-identical after the "no"
    assert seen[0].startswith("The user declined this call.")
    agent.model.add(reply("", call("edit_file", path="app.py", old="y = 2", new="y = 20")),
                    reply("done"))
    assert (await agent.run_turn("again")).outcome == "completed"
    with open(path, "rb") as f:
        assert f.read() == b"x = 1\ny = 20\n"  # exactly that diff
    before = b"x = 1\ny = 20\n"
    agent.model.add(reply("", call("edit_file", path="app.py", old="y = 20", new="y = 3")),
                    reply("done"))
    assert (await agent.run_turn("once more")).outcome == "completed"
    with open(path) as f:
        assert f.read() == "x = 1\ny = 2\nz = 3\n"  # the change on disk is not overwritten
    assert results(agent.model)[-1].startswith("edit_file: app.py changed on disk after the "
                                               "diff was made")
    diffs = [e for e in agent.conversation.events() if e["type"] == "diff"]
    assert [d["path"] for d in diffs] == ["app.py"] * 3


@needs_bwrap
async def test_a_write_to_a_session_opened_read_only_says_so(kit):
    from agent.calls.backend import Backend

    client = await kit.daemon.async_client()
    backend = await Backend.open(client, kit.workspace, writable=False)
    try:
        wrote = await backend.call(call("write_file", path="made.txt", content="x"))
        edited = await backend.call(call("edit_file", path="made.txt", old="x", new="y"))
    finally:
        await backend.aclose()
        await client.aclose()
    assert wrote.is_error and wrote.text == (
        "write_file: the workspace is read-only in this session (plan mode, or a session "
        "opened with writable: false): nothing was written")
    assert edited.text.startswith("edit_file: made.txt does not exist")
    assert os.listdir(kit.workspace) == []


@needs_bwrap
async def test_bad_file_tool_calls_get_clear_errors(kit):
    os.mkfifo(os.path.join(kit.workspace, "pipe"))
    kit.write("a.txt", "a\n")
    _, seen = await run(kit, call("read_file", path="."), call("read_file", path="/dev/zero"),
                        call("read_file", path="pipe"), call("read_file", path="a.txt", offset=0),
                        call("write_file", path="", content="x"),
                        call("edit_file", path="a.txt", old="", new="b"),
                        config=agentkit.AgentConfig(nudge_after=100))
    assert seen[0].startswith("read_file: . is a folder")
    assert seen[1].startswith("read_file: ") and "device" in seen[1]
    assert seen[2].startswith("read_file: ") and "FIFO" in seen[2].upper()
    assert seen[3].startswith("read_file: ") and "offset" in seen[3]
    assert seen[4] == "write_file: `path` is empty: name the file"
    assert seen[5] == "edit_file: `old` is empty; to write a whole file use write_file"
    _, more = await run(kit, call("find", pattern="x", path="no/such/folder"),
                        call("write_file", path="a.txt/under", content="x"))
    assert more[0].startswith("find: 'no/such/folder' does not exist")
    assert more[1].startswith("write_file: ")


@needs_bwrap
async def test_a_write_into_a_hidden_folder_never_reaches_it(kit):
    target = os.path.join(kit.daemon.home, ".ssh", "authorized_keys")
    _, seen = await run(kit, call("write_file", path=target, content="ssh-ed25519 AAAA\n"),
                        call("edit_file", path=os.path.join(kit.daemon.home, ".ssh/id_rsa"),
                             old="SECRET", new="x"))
    # The write lands in the session's own cover over ~/.ssh (as `echo > ~/.ssh/x` in its
    # shell would), never in the host's folder.
    assert seen[1].startswith("edit_file: ") and "SECRET" not in seen[1]
    assert not os.path.exists(target)
    with open(os.path.join(kit.daemon.home, ".ssh", "id_rsa")) as f:
        assert f.read() == "SECRET-KEY\n"
