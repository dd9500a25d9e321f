"""The conversations saved for a workspace, as `toolsd agent --list` shows them, and which one
`--continue` or `--resume ID` takes (or why none).

Read from the files (agent/conversation/store.py's layout) without taking a conversation's lock:
one open in another agent is listed too, and marked so.
"""

from __future__ import annotations

import fcntl
import os
import time

import msgspec

from agent.conversation.store import EVENTS, HISTORY, ConversationStore

__all__ = ["Listed", "list_conversations", "listing", "pick"]

PROMPT_CHARS = 60


class Listed(msgspec.Struct, frozen=True):
    id: str
    turns: int
    first_prompt: str
    last_prompt: str
    changed: float  # when its history was last written (epoch seconds)
    busy: bool  # open in an agent now


def _events(folder: str) -> list[dict]:
    found = []
    try:
        with open(os.path.join(folder, EVENTS), "rb") as f:
            for line in f:
                try:
                    event = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    continue  # a torn line
                if isinstance(event, dict):
                    found.append(event)
    except FileNotFoundError:
        pass
    return found


def _busy(folder: str) -> bool:
    try:
        fd = os.open(os.path.join(folder, "lock"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def list_conversations(store: ConversationStore) -> list[Listed]:
    """The workspace's conversations, oldest first."""
    listed = []
    for cid in store.ids():
        folder = os.path.join(store.folder, cid)
        prompts = [e.get("prompt") for e in _events(folder) if e.get("type") == "turn_start"]
        prompts = [p for p in prompts if isinstance(p, str)]
        try:
            changed = os.stat(os.path.join(folder, HISTORY)).st_mtime
        except FileNotFoundError:
            continue
        listed.append(Listed(id=cid, turns=len(prompts),
                             first_prompt=prompts[0] if prompts else "",
                             last_prompt=prompts[-1] if prompts else "",
                             changed=changed, busy=_busy(folder)))
    return listed


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= PROMPT_CHARS else text[:PROMPT_CHARS - 3] + "..."


def listing(store: ConversationStore, listed: list[Listed]) -> str:
    """What `--list` prints: a line per conversation, newest last, and how to take one."""
    if not listed:
        return (f"No conversation saved for {store.workspace} yet: run `toolsd agent` there "
                f"to start one.\n")
    lines = [f"Conversations for {store.workspace} (newest last):"]
    for c in listed:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.changed))
        turns = f"{c.turns} turn" + ("" if c.turns == 1 else "s")
        prompt = f"  {_clip(c.first_prompt)!r}" if c.first_prompt else ""
        if c.last_prompt and c.last_prompt != c.first_prompt:
            prompt += f" ... {_clip(c.last_prompt)!r}"
        busy = "  (open in an agent now)" if c.busy else ""
        lines.append(f"  {c.id}  {when}  {turns}{prompt}{busy}")
    lines.append("Go on with one: toolsd agent --resume ID (the newest: --continue)")
    return "\n".join(lines) + "\n"


class NoConversation(Exception):
    """`--continue` or `--resume` names nothing there; the message says what to do."""


def pick(store: ConversationStore, resume: str | None, latest: bool) -> str | None:
    """The conversation id to open (None: a new one). Raises NoConversation."""
    ids = store.ids()
    if latest:
        if not ids:
            raise NoConversation(f"--continue: no conversation was saved for "
                                 f"{store.workspace} yet; leave out --continue to start one")
        return ids[-1]
    if resume is None:
        return None
    if resume in ids:
        return resume
    matches = [cid for cid in ids if cid.startswith(resume)] if resume else []
    if len(matches) == 1:
        return matches[0]
    saved = "none" if not ids else f"{len(ids)}, see toolsd agent --list"
    why = "names more than one" if len(matches) > 1 else "is not one"
    raise NoConversation(f"--resume {resume}: that {why} of the conversations saved for "
                         f"{store.workspace} (saved: {saved})")
