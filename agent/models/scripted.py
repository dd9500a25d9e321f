"""A Model that answers from a script, for tests: each request takes the next step.

A step is a `ModelReply`, an exception to raise, a callable (sync or async) given the
request and returning a reply, e.g. one that waits until the test lets it go, or a
`Streamed` reply that streams its text and waits in the middle. Every request
is recorded with the pictures it carried, so a test asserts on what a provider would have
been sent. A script that runs out raises ModelError, so a test notices a request too many.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable, Mapping

import trio

from agent.history.messages import ImageRef, LoadedImage, ModelRequest, ToolCall
from agent.models.base import ContextBudget, ModelError, ModelReply

__all__ = ["ScriptedModel", "Streamed", "reply", "call"]

_ids = itertools.count(1)


def call(name: str, /, **arguments) -> ToolCall:
    """A tool call with a fresh id."""
    return ToolCall(id=f"call_{next(_ids)}", name=name, arguments=arguments)


def reply(text: str = "", *calls: ToolCall) -> ModelReply:
    return ModelReply(text=text, tool_calls=list(calls), stop="tool_use" if calls else "end")


class Streamed:
    """A reply whose text streams: `before` is streamed, then it waits (`streaming` is set)
    until `release` is set, then streams `after` and answers with all of it. A test
    interrupts it while it waits."""

    def __init__(self, before: str, after: str = ""):
        self.before, self.after = before, after
        self.streaming = trio.Event()
        self.release = trio.Event()

    async def play(self, on_text: Callable[[str], None] | None) -> ModelReply:
        if on_text is not None:
            on_text(self.before)
        self.streaming.set()
        await self.release.wait()
        if on_text is not None and self.after:
            on_text(self.after)
        return reply(self.before + self.after)


Step = ModelReply | BaseException | Callable | Streamed


class ScriptedModel:
    name = "scripted"
    provider = "anthropic"

    def __init__(self, script: Iterable[Step], *, budget: ContextBudget | None = None):
        self._script = iter(script)
        self._budget = budget or ContextBudget(tokens=200_000)
        self.requests: list[ModelRequest] = []
        self.images: list[dict[ImageRef, LoadedImage]] = []

    def add(self, *steps: Step) -> None:
        """More steps, after those left."""
        self._script = itertools.chain(self._script, steps)

    def context_budget(self) -> ContextBudget:
        return self._budget

    async def complete(self, request: ModelRequest, images: Mapping[ImageRef, LoadedImage],
                       on_text: Callable[[str], None] | None = None) -> ModelReply:
        self.requests.append(request)
        self.images.append(dict(images))
        step = next(self._script, None)
        if step is None:
            raise ModelError(f"the scripted model has no reply left for request "
                             f"{len(self.requests)}")
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, Streamed):
            return await step.play(on_text)
        if callable(step):
            step = step(request)
            if inspect.isawaitable(step):
                step = await step
        if on_text is not None and step.text:
            on_text(step.text)
        return step
