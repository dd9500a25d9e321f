"""Undo for `toolsd agent`: before each turn's first tool call that may write, a snapshot of
the workspace's files in a side git repository in the conversation's folder (never the
workspace's own `.git`, which is neither read nor written); `/undo` puts the files back as
they were before the last turn that wrote (again: the one before), `/diff` shows what that
turn changed. The conversation is not rewritten: the model is told, with the next prompt,
which files were restored.

What a snapshot holds: the files git would list (`--exclude-standard`: the workspace's own
.gitignore rules hold), less the caches below and any file over FILE_BYTES; a workspace
whose files add up to more than TOTAL_BYTES is not snapshotted (the turn says so once).
The host's git runs with no global or system config and no hooks, so nothing a session put
in the workspace (.gitattributes naming a filter) makes it run anything.

Only where the workspace is on this machine (not through `--url`).
"""

from __future__ import annotations

import os

import trio

from agent.history.messages import Text, UserMessage

__all__ = ["Undo", "UndoError"]

FILE_BYTES = 8 << 20
TOTAL_BYTES = 512 << 20
CACHES = ["__pycache__/", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", "node_modules/",
          ".venv/", ".toolsd-*", ".git"]
REF = "refs/undo/"
EMPTY_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
             "GIT_TERMINAL_PROMPT": "0", "GIT_AUTHOR_NAME": "toolsd", "GIT_COMMITTER_NAME":
             "toolsd", "GIT_AUTHOR_EMAIL": "toolsd@invalid", "GIT_COMMITTER_EMAIL":
             "toolsd@invalid"}


class UndoError(Exception):
    """What a person is told when undo cannot do what was asked."""


class Undo:
    """The snapshots of one conversation (see the module)."""

    def __init__(self, workspace: str, folder: str):
        self.workspace = workspace
        self.git_dir = os.path.join(folder, "undo.git")
        self.available = os.path.isdir(workspace)
        self.taken_in: int | None = None  # the turn whose snapshot was taken

    async def _git(self, *args: str, stdin: bytes = b"", index: str | None = None) -> bytes:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
               **EMPTY_ENV}
        if args[0] != "init":
            env.update(GIT_DIR=self.git_dir, GIT_WORK_TREE=self.workspace)
        if index:
            env["GIT_INDEX_FILE"] = index
        r = await trio.run_process(
            ["git", "-c", "core.hooksPath=" + os.devnull, "-c", "core.fsmonitor=false",
             "-c", "core.autocrlf=false", "-c", "gc.auto=0", *args],
            stdin=stdin, capture_stdout=True, capture_stderr=True, check=False, env=env,
            cwd=self.workspace)
        if r.returncode != 0:
            raise UndoError(f"git {args[0]}: {r.stderr.decode(errors='replace').strip()}")
        return r.stdout

    async def _init(self) -> None:
        if os.path.isdir(self.git_dir):
            return
        await self._git("init", "-q", "--bare", self.git_dir)
        with open(os.path.join(self.git_dir, "info", "exclude"), "w") as f:
            f.write("\n".join(CACHES) + "\n")

    async def _tree(self) -> str:
        """The workspace's files now, as a tree in the side repository."""
        await self._init()
        listed = await self._git("ls-files", "-z", "--others", "--cached", "--exclude-standard")
        keep, total = [], 0
        for name in listed.decode("utf-8", "surrogateescape").split("\0"):
            if not name or name.endswith("/"):  # a repository of its own inside: left out
                continue
            path = os.path.join(self.workspace, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_size > FILE_BYTES:
                continue
            total += st.st_size
            keep.append(name)
        if total > TOTAL_BYTES:
            raise UndoError(f"the workspace's files add up to {total} bytes, over "
                            f"{TOTAL_BYTES}: no snapshot for /undo")
        index = os.path.join(self.git_dir, "index.snapshot")
        if os.path.exists(index):
            os.unlink(index)
        data = "\0".join(keep).encode("utf-8", "surrogateescape")
        if keep:
            await self._git("add", "-f", "--pathspec-from-file=-", "--pathspec-file-nul",
                            stdin=data, index=index)
        else:
            await self._git("read-tree", "--empty", index=index)
        return (await self._git("write-tree", index=index)).decode().strip()

    async def snapshot(self, turn: int) -> None:
        """Before the turn's first call that may write (once per turn)."""
        if not self.available or self.taken_in == turn:
            return
        self.taken_in = turn
        tree = await self._tree()
        commit = (await self._git("commit-tree", tree, "-m", f"before turn {turn}")).decode()
        await self._git("update-ref", f"{REF}{turn}", commit.strip())

    async def _latest(self) -> tuple[str, int]:
        if not self.available:
            raise UndoError("/undo needs the workspace on this machine")
        if not os.path.isdir(self.git_dir):
            raise UndoError("nothing to undo: no turn has written yet")
        refs = (await self._git("for-each-ref", "--format=%(refname)", REF)).decode().split()
        turns = sorted(int(r[len(REF):]) for r in refs if r[len(REF):].isdigit())
        if not turns:
            raise UndoError("nothing left to undo")
        return f"{REF}{turns[-1]}", turns[-1]

    async def diff(self) -> str:
        ref, turn = await self._latest()
        now = await self._tree()
        out = await self._git("diff", "--stat", "-p", "--no-color", f"{ref}^{{tree}}", now)
        text = out.decode(errors="replace")
        return text or f"(no change to the workspace's files since before turn {turn})"

    async def undo(self) -> tuple[int, list[str]]:
        """Put the files back as before the last snapshotted turn; (that turn, the paths
        restored or removed). Its snapshot is then dropped, so the next /undo goes further."""
        ref, turn = await self._latest()
        before = f"{ref}^{{tree}}"
        now = await self._tree()
        changed = (await self._git("diff", "--name-status", "-z", "--no-renames", before, now)
                   ).decode("utf-8", "surrogateescape").split("\0")
        pairs = list(zip(changed[0::2], changed[1::2]))
        for status, name in pairs:
            if status == "A":  # made by the turn: removed
                path = os.path.join(self.workspace, name)
                if os.path.lexists(path):
                    os.unlink(path)
                _prune(os.path.dirname(path), self.workspace)
        index = os.path.join(self.git_dir, "index.restore")
        await self._git("read-tree", before, index=index)
        restore = [name for status, name in pairs if status != "A"]
        for name in restore:  # a folder now where a file was: make room
            path = os.path.join(self.workspace, name)
            if os.path.isdir(path) and not os.path.islink(path):
                raise UndoError(f"{name} is now a folder: not restored; move it away first")
        if restore:
            await self._git("checkout-index", "-f", "-z", "--stdin", index=index,
                            stdin="\0".join(restore).encode("utf-8", "surrogateescape"))
        await self._git("update-ref", "-d", ref)
        if self.taken_in == turn:
            self.taken_in = None
        return turn, [name for _, name in pairs]


def _prune(folder: str, top: str) -> None:
    """Remove the folders left empty up to `top` (the turn made them)."""
    while folder != top and folder.startswith(top + os.sep):
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = os.path.dirname(folder)


def restored_note(turn: int, paths: list[str]) -> UserMessage:
    shown = ", ".join(paths[:20]) + (f" and {len(paths) - 20} more" if len(paths) > 20 else "")
    return UserMessage([Text(f"[The user ran /undo: the workspace's files are back as they were "
                             f"before turn {turn} ({shown or 'no file had changed'}). What you "
                             f"wrote then is gone from the files; read them again before "
                             f"editing.]")], attachment=True)


async def slash(agent, say, line: str) -> bool:
    """/undo and /diff at the prompt; False for any other line."""
    word = line.strip()
    if word not in ("/undo", "/diff"):
        return False
    try:
        if word == "/diff":
            say((await agent.undo.diff()).rstrip("\n"))
        else:
            turn, paths = await agent.undo.undo()
            agent.conversation.append(restored_note(turn, paths))
            say(f"toolsd agent: restored the files as they were before turn {turn} "
                f"({len(paths)} changed); the model is told with your next prompt")
    except UndoError as e:
        say(f"toolsd agent: {word}: {e}")
    return True
