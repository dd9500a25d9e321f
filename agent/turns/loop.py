"""The turn loop: one prompt's model requests and tool calls, bounded and supervised.

A turn is one prompt and everything done for it: requests to the model, the tool calls it asks
for (each through the gate, then the backend), their results fed back, until the model answers
without asking for tools. It is bounded and supervised:

- at most `max_steps` model requests; when they are spent with work left, one bounded
  final-report request (no tool runs after it), and the turn ends `budget_exhausted`;
- a wall-clock budget, checked before each model request and each tool call, and binding
  during a model request (its reply is cut off at the deadline, however steadily it
  streams): once spent, no further request is made and no further tool runs (the calls
  left get a notice), what was produced is kept (a cut reply as far as it came, marked),
  and the turn ends `budget_exhausted`;
- the same tool with the exact same arguments runs at most `duplicate_runs` times in a turn;
  later calls get a notice instead of a result;
- after `nudge_after` tool calls, the model is told once to finish;
- cancellation (Agent.cancel, Ctrl-C, an enclosing cancel scope) ends it `interrupted`, also
  while it waits for a person's approval; an exception ends it `failed`;
- whatever ends it, the turn's REPLs end (turn.end in `finally`), open tool calls get a
  result, and its outcome is logged; an interrupted reply is kept as far as it streamed,
  marked so, and the history goes on from it (the next prompt never runs into this one).

Every step is written to the conversation's event log as it happens
(agent/conversation/store.py).
What the loop reads of the session is agent/turns/host.py's TurnHost; the Agent that runs
turn after turn (agent/turns/agent.py) is one.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

import msgspec
import trio

from agent.calls.backend import SessionLost
from agent.calls.results import RESULT_CHARS, ToolOutcome, caption, clip_text
from agent.conversation.compaction import DoesNotFit, fit_history
from agent.history.call_ids import call_ids, fresh_calls
from agent.history.messages import (
    AssistantMessage,
    ImageRef,
    ModelRequest,
    Text,
    ToolCall,
    ToolResult,
    UserMessage,
)
from agent.models.base import ContextOverflow, ModelError, ModelReply
from agent.turns.approvals import prepare_for_approval, snapshot_before
from agent.turns.rules import Outcome, TurnResult
from agent.turns.steering import steering_message

if TYPE_CHECKING:
    from agent.turns.host import TurnHost

__all__ = ["Turn", "TurnLoop"]


NUDGE = ("[{n} tool calls so far in this turn. Finish soon: answer with what you have unless "
         "another call is truly needed.]")
FINAL_REPORT = ("[The step budget of this turn ({steps} model requests) is spent: no more tools "
                "will run. Reply now with a short report: what you did, what you found, and "
                "what is left to do.]")
SKIPPED = ("[Skipped: {name} with exactly these arguments already ran {runs} times in this "
           "turn, and running it again will not tell you more. Change the arguments, or "
           "answer with what you have.]")
OUT_OF_TIME = ("[Not run: the turn's wall-clock budget ({wall_s:g} s) is spent, so no more tools "
               "run in this turn.]")
INTERRUPTED = "[interrupted by the user]"
INTERRUPTED_EARLY = "[interrupted by the user before any reply]"
CUT_BY_TIME = "[cut off: the turn's wall-clock budget was spent]"
CUT_BY_TIME_EARLY = "[the turn's wall-clock budget was spent before any reply]"


class OutOfTime(Exception):
    """A model request was still going when the turn's wall-clock budget ran out."""


class Turn:
    """The state of one turn in flight: its counters, and its outcome, set once."""

    def __init__(self, number: int, wall_s: float):
        self.number = number
        self.deadline = trio.current_time() + wall_s
        self.steps = 0
        self.tool_calls = 0
        self.nudged = False
        self.runs: Counter[tuple[str, str, str | None]] = Counter()
        self.text = ""
        self.outcome: Outcome | None = None
        self.reason = ""

    def end(self, outcome: Outcome, reason: str = "") -> None:
        assert self.outcome is None, f"turn {self.number} already ended {self.outcome}"
        self.outcome, self.reason = outcome, reason

    def result(self) -> TurnResult:
        return TurnResult(turn=self.number, outcome=self.outcome.value, reason=self.reason,
                          text=self.text, steps=self.steps, tool_calls=self.tool_calls)


def _is_cancellation(e: BaseException) -> bool:
    """A cancel or Ctrl-C, also when a nursery on the way wrapped it in a group."""
    if isinstance(e, BaseExceptionGroup):
        return e.split((trio.Cancelled, KeyboardInterrupt))[1] is None
    return isinstance(e, (trio.Cancelled, KeyboardInterrupt))


class TurnLoop:
    """One turn's run: the steps, the tools, and the ending (see the module)."""

    def __init__(self, host: TurnHost, turn: Turn, on_event, on_text):
        self.host = host
        self.turn = turn
        self.config = host.config
        self.conversation = host.conversation
        self.backend = host.backend
        self.on_event = on_event
        self.on_text = on_text
        # The text of the reply streaming now; None while no request is in flight.
        self.streamed: list[str] | None = None

    def log(self, type: str, **fields) -> None:
        event = self.conversation.log(type, self.turn.number, **fields)
        if self.on_event is not None:
            self.on_event(event)

    async def run(self, prompt: str) -> None:
        turn = self.turn
        self.log("turn_start", prompt=prompt, conversation=self.conversation.id)
        self.conversation.append(UserMessage([Text(prompt)]))
        try:
            await self.backend.begin_turn()
            notes = self.backend.take_notes()  # a lost session replaced as the turn began
            if notes:
                self.conversation.append(UserMessage([Text("\n".join(notes))],
                                                     attachment=True))
            while turn.outcome is None:
                if trio.current_time() >= turn.deadline:
                    turn.end(Outcome.BUDGET_EXHAUSTED,
                             f"the turn's wall-clock budget ({self.config.wall_s:g} s) was spent "
                             f"before request {turn.steps + 1}")
                elif turn.steps >= self.config.max_steps:
                    await self.final_report()
                    turn.end(Outcome.BUDGET_EXHAUSTED,
                             f"the step budget ({self.config.max_steps} model requests) was "
                             f"spent; the model gave a final report")
                else:
                    reply = await self.request()
                    if not reply.tool_calls:
                        turn.end(Outcome.COMPLETED)
                    else:
                        await self.run_tools(reply.tool_calls)
        except BaseException as e:
            if _is_cancellation(e):
                turn.end(Outcome.INTERRUPTED, "cancelled")
                self.give_steering()  # a line typed before the Ctrl-C is kept
                self.keep_interrupted()
                raise
            if isinstance(e, OutOfTime):
                turn.end(Outcome.BUDGET_EXHAUSTED, str(e))
                self.keep_interrupted(CUT_BY_TIME, CUT_BY_TIME_EARLY, stop="budget")
            elif isinstance(e, DoesNotFit):
                turn.end(Outcome.FAILED, f"context: {e}; the conversation is kept as it was")
            elif isinstance(e, (ModelError, SessionLost)):
                turn.end(Outcome.FAILED, str(e))  # one line for a person: what to check
            else:
                turn.end(Outcome.FAILED, f"{type(e).__name__}: {e}")
            if not isinstance(e, Exception):
                raise
            # Otherwise the turn has failed, and the agent and its session stay usable.
        finally:
            with trio.CancelScope(shield=True):
                answered = self.conversation.answer_open_calls(
                    f"the turn ended {turn.outcome.value} first")
                for result in answered:
                    self.log("tool_result", id=result.call_id, name=result.name,
                             text=result.text, is_error=True)
                repls = await self.backend.end_turn()
                self.log("outcome", outcome=turn.outcome.value, reason=turn.reason,
                         steps=turn.steps, tool_calls=turn.tool_calls, repls_ended=repls)

    def give_steering(self) -> None:
        """Lines the person typed meanwhile, into the history (agent/turns/steering.py)."""
        lines = self.host.take_steering()
        if lines:
            self.conversation.append(steering_message(lines))
            self.log("steering", lines=lines)

    def keep_interrupted(self, mark: str = INTERRUPTED, early: str = INTERRUPTED_EARLY, *,
                         stop: str = "interrupted") -> None:
        """The reply cut off by the interrupt (or the deadline), as far as it streamed,
        marked: the next
        request goes on from it, and a prompt left without any reply gets a mark instead,
        so that the next prompt does not run into it (providers merge adjacent user
        messages)."""
        text = "".join(self.streamed or ())
        self.streamed = None
        messages = self.conversation.messages
        if not text and not (messages and isinstance(messages[-1], UserMessage)):
            return  # it ends with an answer or tool results: nothing runs together
        self.conversation.append(AssistantMessage(
            text=f"{text}\n\n{mark}" if text else early))
        self.log("reply", step=self.turn.steps, text=text, stop=stop, tool_calls=[],
                 partial=True)

    def _stream(self, chunk: str) -> None:
        if self.streamed is not None:
            self.streamed.append(chunk)
        if self.on_text is not None:
            self.on_text(chunk)

    # ------------------------------------------------------------ model requests

    async def _send(self, *, max_tokens: int, kind: str) -> ModelReply:
        """One model request over the history's window, under the turn's deadline (raises
        OutOfTime, the reply so far kept in `streamed`). A compaction takes effect (is put
        in the history) once a request made with it is answered."""
        with trio.move_on_at(self.turn.deadline) as scope:
            return await self._send_in_time(max_tokens=max_tokens, kind=kind)
        assert scope.cancelled_caught
        raise OutOfTime(f"the turn's wall-clock budget ({self.config.wall_s:g} s) was spent "
                        f"during request {self.turn.steps}; the reply so far is kept")

    async def _send_in_time(self, *, max_tokens: int, kind: str) -> ModelReply:
        host = self.host
        base = ModelRequest(system=host.system, messages=[], tools=host.toolbox.tools(),
                            max_tokens=max_tokens)
        self.turn.steps += 1
        await self.host.drain_diagnostics()  # what edits since the last request caused
        self.give_steering()
        refused = None
        while True:
            fitted = await fit_history(host.model, self.conversation.messages, base,
                                       host.budget, force=refused is not None)
            refs = [p for m in fitted.messages if isinstance(m, UserMessage)
                    for p in m.content if isinstance(p, ImageRef)]
            images = await self.backend.load_images(refs)
            request = ModelRequest(system=host.system, messages=fitted.messages,
                                   tools=base.tools, max_tokens=max_tokens)
            self.log("request", kind=kind, step=self.turn.steps, messages=len(fitted.messages),
                     images=len(images), tokens_estimate=fitted.tokens,
                     budget=host.budget.tokens, budget_guessed=host.budget.guessed,
                     budget_source=host.budget.origin, budget_detail=host.budget.detail,
                     compacted=fitted.summary is not None)
            self.streamed = []
            try:
                reply = await host.model.complete(request, images, self._stream)
            except ContextOverflow as e:
                self.streamed = None
                if refused is not None:
                    raise DoesNotFit(f"the model refused the request as too long even after "
                                     f"compaction ({e})") from None
                # Its window is smaller than the budget said: compact, and ask once more.
                refused = str(e)
                self.log("refused", step=self.turn.steps, message=refused)
                continue
            except BaseException as e:
                # An interrupt keeps it (keep_interrupted); a failure drops it with the
                # turn, the conversation kept as it was.
                if not _is_cancellation(e):
                    self.streamed = None
                raise
            self.streamed = None
            break
        # Ids unique in the conversation: a server that numbers each reply's calls from 0
        # repeats them, which Anthropic refuses (agent/history/call_ids.py).
        reply = msgspec.structs.replace(reply, tool_calls=fresh_calls(
            reply.tool_calls, call_ids(self.conversation.messages)))
        if fitted.summary is not None:
            self.conversation.insert(fitted.at, fitted.summary)
            self.log("compaction", summary=fitted.summary.text, at=fitted.at,
                     tokens=fitted.tokens, budget=host.budget.tokens,
                     budget_guessed=host.budget.guessed, refused=refused)
        self.log("reply", step=self.turn.steps, text=reply.text, stop=reply.stop,
                 tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments}
                             for c in reply.tool_calls],
                 usage=msgspec.to_builtins(reply.usage))
        if reply.text:
            self.turn.text = reply.text
        return reply

    async def request(self) -> ModelReply:
        reply = await self._send(max_tokens=self.config.max_tokens, kind="step")
        self.conversation.append(AssistantMessage(text=reply.text, tool_calls=reply.tool_calls))
        return reply

    async def final_report(self) -> None:
        """One bounded request for a report once the step budget is spent. Tools are still
        declared (the history holds tool calls, which some providers only accept then), but
        nothing it asks for runs: its calls are dropped."""
        self.conversation.append(UserMessage(
            [Text(FINAL_REPORT.format(steps=self.config.max_steps))], attachment=True))
        reply = await self._send(max_tokens=self.config.final_report_tokens, kind="final_report")
        self.conversation.append(AssistantMessage(text=reply.text))

    # ------------------------------------------------------------ tools

    async def run_tools(self, calls: list[ToolCall]) -> None:
        turn = self.turn
        images: list[tuple[str, ImageRef]] = []
        for i, call in enumerate(calls):
            outcome = await self.run_tool(call)
            text = outcome.text
            last = i == len(calls) - 1
            if last and turn.tool_calls >= self.config.nudge_after and not turn.nudged:
                turn.nudged = True
                nudge = NUDGE.format(n=turn.tool_calls)
                text = clip_text(text, RESULT_CHARS - len(nudge) - 1) + "\n" + nudge
                self.log("nudge", tool_calls=turn.tool_calls)
            # Saved one by one: a turn cancelled mid-step keeps the results it has.
            self.conversation.append(ToolResult(call_id=call.id, name=call.name, text=text,
                                                is_error=outcome.is_error))
            images.extend((call.name, ref) for ref in outcome.images)
        if images:
            parts = []
            for tool, ref in images:
                parts += [Text(caption(tool, ref.path)), ref]
            self.conversation.append(UserMessage(parts, attachment=True))

    async def run_tool(self, call: ToolCall) -> ToolOutcome:
        turn = self.turn
        turn.tool_calls += 1
        self.log("tool_call", id=call.id, name=call.name, arguments=call.arguments,
                 error=call.error)
        if trio.current_time() >= turn.deadline:
            outcome = ToolOutcome(OUT_OF_TIME.format(wall_s=self.config.wall_s), is_error=True)
            self.log("tool_result", id=call.id, name=call.name, text=outcome.text,
                     is_error=True)
            return outcome
        key = (call.name, json.dumps(call.arguments, sort_keys=True, default=str), call.error)
        turn.runs[key] += 1
        if turn.runs[key] > self.config.duplicate_runs:
            outcome = ToolOutcome(SKIPPED.format(name=call.name, runs=self.config.duplicate_runs))
            self.log("tool_result", id=call.id, name=call.name, text=outcome.text,
                     is_error=False, skipped=True)
            return outcome
        gate, change = self.host.gate, await prepare_for_approval(self, call)
        if isinstance(change, ToolOutcome):  # the change cannot be made: nothing to approve
            self.log("tool_result", id=call.id, name=call.name, text=change.text,
                     is_error=change.is_error)
            return change
        decision = await gate.check(call, None if change is None else change.diff)
        if decision.asked or not decision.allowed:
            self.log("approval", id=call.id, name=call.name, allowed=decision.allowed,
                     asked=decision.asked, mode=self.host.gate.mode.value)
        if not decision.allowed:
            outcome = ToolOutcome(decision.message, is_error=True)
        else:
            await snapshot_before(self, call)  # for /undo (agent/turns/undo.py)
            outcome = await self.host.toolbox.call(call, change)  # agent/calls/toolbox.py
        self.log("tool_result", id=call.id, name=call.name, text=outcome.text,
                 is_error=outcome.is_error, images=[r.path for r in outcome.images])
        for path in outcome.edited:
            self.host.diagnostics.file_edited(path)  # checked before the next request
        return outcome
