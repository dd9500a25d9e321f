"""Steering: a line the person types while a turn runs is queued and given to the model before
its next request, as part of the turn's history (not a new turn), and logged as an event.

During a turn of `toolsd agent` on a terminal, `steered_turn` reads the terminal's lines (a
`Lines` pump): a line typed while a question waits (an approval, ask_user) is its answer;
any other is `Agent.steer`ed: logged (`steer`) and queued. The turn loop gives the queue to
the model before each request (`steering_message`, pure) and, when the turn is interrupted,
puts what is left into the history, so a Ctrl-C after a line never loses it. A turn that
completes with lines left over (typed after its last request) hands them to the offline
Inbox's queue (agent/turns/offline.py): they are the next prompt, never dropped.

Only on a terminal: from a pipe the lines are the next prompts, read between turns.

Resource handling: the pump is a task in a nursery of `steered_turn`'s own, cancelled when
the turn ends; a read it leaves pending goes to the next reader (agent/terminal/linereader.py).
"""

from __future__ import annotations

import trio

from agent.calls.results import RESULT_CHARS, clip_text
from agent.history.messages import Text, UserMessage

__all__ = ["Lines", "steered_turn", "steering_message"]


def steering_message(lines: list[str]) -> UserMessage:
    said = "\n".join(f"> {line}" for line in lines)
    return UserMessage([Text(clip_text(
        f"[The user typed this while you worked; take it into account now:]\n{said}",
        RESULT_CHARS))], attachment=True)


class Lines:
    """The terminal's lines during a turn: the answer to a question that waits, or a steering
    line for the agent."""

    def __init__(self, reader, steer):
        self.reader = reader
        self.steer = steer
        self._waiting: list = []  # [event, line] of a question waiting for its answer
        self.ended = False

    async def pump(self) -> None:
        while True:
            line = await self.reader.readline()
            if self._waiting:
                waiter = self._waiting.pop(0)
                waiter[1] = line
                waiter[0].set()
            elif line is not None and line.strip():
                self.steer(line.strip())
            if line is None:
                # Ctrl-D on a terminal is an end of input of the moment: a question asked
                # later reads its answer itself.
                self.ended = True
                return

    async def answer(self) -> str | None:
        """The next line typed (a question's answer); None at the end of input."""
        if self.ended:
            return await self.reader.readline()
        waiter = [trio.Event(), None]
        self._waiting.append(waiter)
        try:
            await waiter[0].wait()
        finally:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
        return waiter[1]


async def steered_turn(agent, term, prompt: str, inbox):
    """Run the turn with the terminal's lines pumped (see the module)."""
    lines = Lines(term.reader, agent.steer)
    term.lines = lines
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lines.pump)
            try:
                result = await agent.run_turn(prompt, on_text=term.text, on_event=term.event)
            finally:
                nursery.cancel_scope.cancel()
    finally:
        term.lines = None
    for line in agent.take_steering():  # typed after the last request of a completed turn
        inbox.queue.add(line)
        term.say(f"  (your line {clip_text(line, 60)!r} came after the model's last request: "
                 f"it is the next prompt)")
    return result
