"""The offline queue of `toolsd agent`: a prompt entered while the model endpoint does not
answer is kept and sent when it answers again, never lost.

- Before each prompt read at the terminal is sent, the endpoint is asked whether it answers
  (the adapter's `unreachable`, a bounded GET: agent/models/probe.py). If it does not, the
  prompt is queued: written to `queued.json` in the conversation's folder (write, fsync,
  rename), and the run says so ("queued: ..."). It then asks again with a growing pause (1 s,
  doubling, at most `MAX_PAUSE_S`), and sends the queued prompts in order once it answers.
- While prompts wait, a line typed is queued too, and `/drop` drops the last one queued.
  Ctrl-C exits as at the prompt; the queue is kept, and `--continue` sends it (or `/drop`
  there). The end of input (a pipe, Ctrl-D) does not drop what waits: it is sent first.
- A prompt leaves the queue as its turn starts, in the same step in which the turn writes
  it into the conversation's history (no checkpoint between): it is in one or the other.

Once a turn is under way, a request whose connection is refused (the endpoint went away
between two steps: a local server restarted) waits in the same way and is sent again as it
was (`PatientModel`): the turn stays in flight, and Ctrl-C cancels it.

Only prompts read line by line are queued, and only their turns wait; a PROMPT given on the
command line fails its turn as before, with the endpoint's error, for a script to act on.

`start_lines` is what a run says as it opens a conversation: the turns a process that died
left in flight (agent/conversation/store.py marks them `interrupted`) and the prompts still queued.
"""

from __future__ import annotations

import json
import os

import trio

__all__ = ["PromptQueue", "Inbox", "PatientModel", "start_lines", "recover_latest",
           "wait_until_answers", "QUEUE_FILE", "DROP"]

QUEUE_FILE = "queued.json"
DROP = "/drop"
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 5.0


class PromptQueue:
    """The prompts waiting for the endpoint, in a file of the conversation's folder, kept in
    step with `items` by each change (the owner of that file is this object)."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, QUEUE_FILE)
        self.items: list[str] = []
        self.damaged: str | None = None  # where a queue that could not be read was put
        try:
            with open(self.path, encoding="utf-8") as f:
                loaded = json.load(f)
            self.items = [p for p in loaded if isinstance(p, str)] \
                if isinstance(loaded, list) else []
        except FileNotFoundError:
            pass
        except (OSError, ValueError):
            # Damaged: kept aside for a person to read, never silently emptied.
            self.damaged = self.path + ".damaged"
            os.replace(self.path, self.damaged)

    def _save(self) -> None:
        if not self.items:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.items, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def add(self, prompt: str) -> None:
        self.items.append(prompt)
        self._save()

    def drop_last(self) -> str | None:
        if not self.items:
            return None
        dropped = self.items.pop()
        self._save()
        return dropped

    def take_first(self) -> str:
        prompt = self.items.pop(0)
        self._save()
        return prompt


def _count(n: int) -> str:
    return f"{n} prompt" + ("" if n == 1 else "s")


def start_lines(recovered: list[int], queue: PromptQueue, interactive: bool = True) -> list[str]:
    """What a run says as it opens a conversation that a dead process left (pure but for
    the queue's fields)."""
    lines = [f"toolsd agent: turn {turn} was interrupted: the agent process ended while it "
             f"was in flight (its conversation is kept; tool calls left open say so)"
             for turn in recovered]
    queued = len(queue.items)
    if queued and interactive:
        lines.append(f"toolsd agent: {_count(queued)} queued while the endpoint did not "
                     f"answer: sent when it answers ({DROP} drops the last)")
    elif queued:
        lines.append(f"toolsd agent: {_count(queued)} queued while the endpoint did not "
                     f"answer, kept: `toolsd agent --continue` without a PROMPT sends them")
    if queue.damaged:
        lines.append(f"toolsd agent: the queue of prompts could not be read; it is kept as "
                     f"{queue.damaged} for you to read")
    return lines


async def wait_until_answers(unreachable) -> None:
    """Until `unreachable()` says None: asked after 1 s, then after a pause that doubles to
    at most MAX_PAUSE_S."""
    pause = FIRST_PAUSE_S
    while True:
        await trio.sleep(pause)
        if await unreachable() is None:
            return
        pause = min(pause * 2, MAX_PAUSE_S)


class PatientModel:
    """A model adapter whose requests wait out an endpoint that stopped answering: a
    request whose connection is refused (`Unreachable`: nothing of it was sent) is sent
    again, as it is, once the endpoint answers, however long that takes; the turn waits
    in flight, and Ctrl-C cancels it as ever. Everything else is the adapter's."""

    def __init__(self, model, say):
        self._model = model
        self._say = say

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    async def complete(self, request, images, on_text=None):
        from agent.models.base import Unreachable

        while True:
            try:
                return await self._model.complete(request, images, on_text)
            except Unreachable as e:
                ask = getattr(self._model, "unreachable", None)
                if ask is None:
                    raise
                self._say(f"toolsd agent: the model endpoint stopped answering ({e}): the "
                          f"request waits and is sent when it answers (Ctrl-C cancels the "
                          f"turn)")
                await wait_until_answers(ask)
                self._say("toolsd agent: the endpoint answers again: sending the request")


def recover_latest(store) -> list[str]:
    """A new conversation is starting: the latest one of the workspace, if a killed run left
    a turn of it in flight, is marked now (opening it does) rather than whenever it is next
    continued, and a line says so. Nothing for one open in another agent."""
    from agent.conversation.store import ConversationError

    try:
        latest = store.latest()
    except (ConversationError, OSError):
        return []
    if latest is None:
        return []
    try:
        queued = len(PromptQueue(latest.folder).items)
        return [f"toolsd agent: the last run's turn {turn} (conversation {latest.id}) was "
                f"interrupted: the agent process ended while it was in flight; "
                f"--continue goes on from it" for turn in latest.recovered] + \
            ([f"toolsd agent: {_count(queued)} queued in conversation {latest.id}: "
              f"--continue sends them"] if queued else [])
    finally:
        latest.close()


class Inbox:
    """Where the next prompt of an interactive run comes from: the queue first, once the
    endpoint answers, then the terminal (see the module). Owns its PromptQueue."""

    def __init__(self, term, model, folder: str):
        self.term = term
        self.queue = PromptQueue(folder)
        self._ask = getattr(model, "unreachable", None)  # a scripted model always answers
        self._eof = False

    async def unreachable(self) -> str | None:
        return None if self._ask is None else await self._ask()

    async def next(self) -> str | None:
        """The next prompt to run, None at the end of input with nothing queued."""
        try:
            while True:
                if self.queue.items:
                    if await self.unreachable() is None:
                        return self.queue.take_first()
                    await self._wait()
                    continue
                if self._eof:
                    return None
                line = await self.term.ask_prompt()
                if line is None:
                    return None
                if not line.strip():
                    continue
                if line.strip() == DROP:
                    self.term.say("toolsd agent: nothing is queued to drop")
                    continue
                reason = await self.unreachable()
                if reason is None:
                    return line
                self.queue.add(line)
                self.term.say(f"toolsd agent: queued: the model endpoint does not answer "
                              f"({reason}); the prompt is kept and sent when it answers. "
                              f"Type {DROP} to drop it; Ctrl-C exits and keeps it for "
                              f"--continue")
                await self._wait()
        except BaseException:
            if self.queue.items:
                self.term.say(f"toolsd agent: {_count(len(self.queue.items))} still queued, "
                              f"kept: `toolsd agent --continue` sends them")
            raise

    async def _wait(self) -> None:
        """Until the endpoint answers, or the queue is emptied by /drop; lines typed
        meanwhile are queued or drop."""
        pause = FIRST_PAUSE_S
        while self.queue.items:
            with trio.move_on_after(pause):
                if self._eof:
                    await trio.sleep_forever()
                line = await self.term.reader.readline()
                if line is None:
                    self._eof = True
                elif line.strip() == DROP:
                    self.queue.drop_last()
                    left = len(self.queue.items)
                    self.term.say("toolsd agent: dropped the last queued prompt" +
                                  (f"; {_count(left)} still queued" if left else ""))
                elif line.strip():
                    self.queue.add(line)
                    self.term.say(f"toolsd agent: queued too ({_count(len(self.queue.items))} "
                                  f"waiting)")
                continue  # a line came: ask again only after a whole pause
            if await self.unreachable() is None:
                self.term.say(f"toolsd agent: the endpoint answers again: sending "
                              f"{_count(len(self.queue.items))}")
                return
            pause = min(pause * 2, MAX_PAUSE_S)
