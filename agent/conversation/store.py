"""Conversations saved per workspace, to the project each happened in: a new agent starts a
fresh one, resume goes back to one.

Layout: `<root>/<workspace name>-<hash>/<conversation id>/`, root by default
`$XDG_STATE_HOME/toolsd/agent` (~/.local/state/toolsd/agent): outside the workspace, so the
sandboxed code the agent runs cannot rewrite its own record, and git sees nothing new.

- `history.json`: the messages (agent/history/messages.py), rewritten whole (write, fsync,
  rename) after each change; what a resumed conversation goes on from.
- `events.jsonl`: append-only, one JSON object per line (`t`, `turn`, `type`, ...): each
  turn's start, requests, replies, tool calls, approvals, results, compactions and outcome,
  so a turn reads as a lifecycle, not as the last text on a screen.
- `lock`: held (flock) while an agent has the conversation open. Opening one that nobody
  holds recovers it: a turn that started and has no outcome was in flight when its process
  ended, and is marked `interrupted`; tool calls left without a result get one that says so.

Resource handling: a Conversation holds its lock's file descriptor until `close()`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time

import msgspec

from agent.history.messages import AssistantMessage, Message, ToolResult, history_decoder, \
    history_encoder

__all__ = ["Conversation", "ConversationStore", "ConversationError", "ConversationBusy",
           "ConversationDamaged", "default_root"]

HISTORY = "history.json"
EVENTS = "events.jsonl"


class ConversationError(Exception):
    """A conversation that cannot be opened; the message says why and what to do."""


class ConversationBusy(ConversationError):
    pass


class ConversationDamaged(ConversationError):
    pass


def default_root() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "toolsd", "agent")


class ConversationStore:
    """The conversations of one workspace."""

    def __init__(self, workspace: str, root: str | None = None):
        real = os.path.realpath(workspace)
        digest = hashlib.sha256(real.encode()).hexdigest()[:12]
        self.workspace = real
        self.folder = os.path.join(root or default_root(),
                                   f"{os.path.basename(real) or 'root'}-{digest}")

    def ids(self) -> list[str]:
        """Conversation ids, oldest first (ids sort by the time they were made)."""
        try:
            return sorted(n for n in os.listdir(self.folder)
                          if os.path.isfile(os.path.join(self.folder, n, HISTORY)))
        except FileNotFoundError:
            return []

    def new(self) -> Conversation:
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        while True:
            # To the millisecond, then random: ids made in the same second still sort in
            # the order they were made (ids() is oldest first, --continue takes the last).
            now = time.time()
            cid = (time.strftime("%Y%m%d-%H%M%S-", time.localtime(now))
                   + f"{int(now * 1000) % 1000:03d}" + os.urandom(2).hex())
            try:
                os.mkdir(os.path.join(self.folder, cid), 0o700)
                break
            except FileExistsError:
                continue
        conversation = Conversation(os.path.join(self.folder, cid))
        conversation.save()
        return conversation

    def open(self, cid: str) -> Conversation:
        if cid not in self.ids():
            raise FileNotFoundError(f"no conversation {cid!r} for {self.workspace}; "
                                    f"saved ones: {', '.join(self.ids()) or 'none'}")
        return Conversation(os.path.join(self.folder, cid))

    def latest(self) -> Conversation | None:
        ids = self.ids()
        return self.open(ids[-1]) if ids else None


_line_encoder = msgspec.json.Encoder()


class Conversation:
    """One conversation's folder: its messages and its event log (see the module)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.id = os.path.basename(folder)
        self._lock_fd = os.open(os.path.join(folder, "lock"),
                                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise ConversationBusy(f"conversation {self.id} is open in another agent; close "
                                   f"that one or start a new conversation") from None
        self.messages: list[Message] = []
        path = os.path.join(folder, HISTORY)
        try:
            if os.path.exists(path):
                with open(path, "rb") as f:
                    self.messages = list(history_decoder.decode(f.read()))
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            os.close(self._lock_fd)
            raise ConversationDamaged(
                f"conversation {self.id} cannot be read: its {HISTORY} is damaged ({e}); "
                f"start a new conversation, or move {folder} away") from None
        self._events = open(os.path.join(folder, EVENTS), "ab+")
        if self._events.tell() and not self._ends_a_line():
            # A write cut off (the process killed mid-line, a full disk): the next event
            # starts a line of its own, and events() passes over the torn one.
            self._events.write(b"\n")
        self._recover()

    # ------------------------------------------------------------ messages

    def append(self, *messages: Message) -> None:
        self.messages.extend(messages)
        self.save()

    def insert(self, index: int, message: Message) -> None:
        self.messages.insert(index, message)
        self.save()

    def save(self) -> None:
        path = os.path.join(self.folder, HISTORY)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(history_encoder.encode(self.messages))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def answer_open_calls(self, why: str) -> list[ToolResult]:
        """Results for the tool calls of the last assistant message that have none (the turn
        ended between a call and its result): every provider refuses a call left open."""
        last = next((i for i in range(len(self.messages) - 1, -1, -1)
                     if isinstance(self.messages[i], AssistantMessage)), None)
        if last is None:
            return []
        answered = {m.call_id for m in self.messages[last + 1:] if isinstance(m, ToolResult)}
        missing = [ToolResult(call_id=c.id, name=c.name, text=f"[no result: {why}]",
                              is_error=True)
                   for c in self.messages[last].tool_calls if c.id not in answered]
        if missing:
            # Right after the other results: pictures attached to them come later.
            at = last + 1 + sum(1 for m in self.messages[last + 1:] if isinstance(m, ToolResult))
            self.messages[at:at] = missing
            self.save()
        return missing

    # ------------------------------------------------------------ events

    def log(self, type: str, turn: int | None = None, **fields) -> dict:
        event = {"t": round(time.time(), 3), "turn": turn, "type": type, **fields}
        self._events.write(_line_encoder.encode(event) + b"\n")
        self._events.flush()
        return event

    def events(self) -> list[dict]:
        """The events logged, in order; a line torn by a write cut off is passed over."""
        found = []
        with open(os.path.join(self.folder, EVENTS), "rb") as f:
            for line in f:
                try:
                    event = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    continue
                if isinstance(event, dict) and "type" in event:
                    found.append(event)
        return found

    def _ends_a_line(self) -> bool:
        self._events.seek(-1, os.SEEK_END)
        last = self._events.read(1)
        self._events.seek(0, os.SEEK_END)
        return last == b"\n"

    def outcomes(self) -> dict[int, str]:
        """turn number -> outcome, for every turn that started."""
        found: dict[int, str] = {}
        for e in self.events():
            if e["type"] == "turn_start":
                found[e["turn"]] = ""
            elif e["type"] == "outcome":
                found[e["turn"]] = e["outcome"]
        return found

    def next_turn(self) -> int:
        return max(self.outcomes(), default=0) + 1

    def _recover(self) -> None:
        self.recovered: list[int] = []  # turns found in flight, marked interrupted here
        for turn, outcome in self.outcomes().items():
            if not outcome:
                self.recovered.append(turn)
                self.answer_open_calls("the agent stopped before this call's result")
                self.log("outcome", turn, outcome="interrupted",
                         reason="the agent process ended while the turn was in flight")

    def close(self) -> None:
        if self._lock_fd >= 0:
            self._events.close()
            os.close(self._lock_fd)
            self._lock_fd = -1
