"""The turn loop's rules, one test each, with a scripted model and a real daemon."""

from __future__ import annotations

import itertools
import json
import os
import random

import pytest
import trio

from agent.calls.results import RESULT_CHARS
from agent.history.messages import AssistantMessage, ToolCall, ToolResult, UserMessage
from agent.models.providers import render_anthropic
from agent.models.scripted import Streamed, call, reply
from agent.turns.loop import NUDGE
from agent.turns.rules import AgentConfig
import agentkit
from agentkit import texts
from conftest import needs_bwrap, wait_gone

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


kit = agentkit.kit


def results(request) -> list[str]:
    return [m.text for m in request.messages if isinstance(m, ToolResult)]


def events(agent) -> list[dict]:
    return agent.conversation.events()


async def test_the_fifth_identical_call_is_skipped(kit):
    count = call("run_terminal", command="echo x >> /tmp/runs; wc -l < /tmp/runs")
    agent = await kit.open([*(reply("", count) for _ in range(6)), reply("done")])
    result = await agent.run_turn("count")
    assert result.outcome == "completed" and result.tool_calls == 6
    seen = results(agent.model.requests[-1])
    assert [s.split("\n")[0] for s in seen[:4]] == ["1", "2", "3", "4"]
    for skipped in seen[4:]:
        assert skipped.startswith("[Skipped: run_terminal with exactly these arguments already "
                                  "ran 4 times in this turn")
    r = await agent.backend.client.shell_run(agent.backend.session, "wc -l < /tmp/runs")
    assert r["output"] == "4\n"  # the fifth and sixth never ran
    # Another argument is another call.
    agent.model.add(reply("", call("run_terminal", command="true")), reply("done"))
    assert (await agent.run_turn("again")).outcome == "completed"


async def test_a_nudge_after_six_tool_calls_once(kit):
    calls = [reply("", call("run_terminal", command=f"echo {i}")) for i in range(1, 9)]
    agent = await kit.open([*calls, reply("done")])
    assert (await agent.run_turn("go")).outcome == "completed"
    seen = results(agent.model.requests[-1])
    nudged = [i for i, s in enumerate(seen, 1) if "Finish soon" in s]
    assert nudged == [6]
    assert seen[5] == "6\n[exit code 0]\n[6 tool calls so far in this turn. Finish soon: " \
                      "answer with what you have unless another call is truly needed.]"
    assert "Finish soon" not in "".join(texts(agent.model.requests[5]))  # before the sixth


async def test_the_nudge_keeps_a_long_result_within_the_cap(kit):
    calls = [reply("", call("run_terminal", command=f"echo {i}")) for i in range(1, 6)]
    # Its error names the path it could not read: a result of the whole RESULT_CHARS.
    long = reply("", call("read_image", path="z" * 30_000))
    agent = await kit.open([*calls, long, reply("done")])
    assert (await agent.run_turn("go")).outcome == "completed"
    sixth = results(agent.model.requests[-1])[5]
    assert len(sixth) <= RESULT_CHARS
    assert sixth.startswith("read_image failed: ") and "characters in all" in sixth
    assert sixth.endswith("\n" + NUDGE.format(n=6))


async def test_calls_the_model_sent_unreadable_are_duplicates_only_when_equal(kit):
    # Five calls that could not be read, each for its own reason: each is told its reason.
    broken = [ToolCall(f"b{i}", "run_terminal", {}, error=f"reason {i}") for i in range(5)]
    agent = await kit.open([*(reply("", c) for c in broken), reply("done")])
    assert (await agent.run_turn("go")).outcome == "completed"
    seen = results(agent.model.requests[-1])
    assert seen == [f"Your call of 'run_terminal' could not be read: reason {i}"
                    for i in range(5)]


async def test_twenty_steps_then_one_final_report(kit):
    counter = itertools.count(1)
    endless = (lambda req: reply("", call("run_terminal", command=f"echo {next(counter)}"))
               for _ in itertools.count())
    model_steps = itertools.islice(endless, 20)
    final = reply("Report: counted to 20; nothing left.",
                  call("run_terminal", command="touch /tmp/should-not-run"))
    agent = await kit.open([*model_steps, final])
    result = await agent.run_turn("count forever")
    assert result.outcome == "budget_exhausted" and result.steps == 21
    assert "step budget (20 model requests)" in result.reason
    assert result.text == "Report: counted to 20; nothing left."
    last = agent.model.requests[-1]
    assert len(agent.model.requests) == 21
    assert last.messages[-1] == UserMessage(
        [last.messages[-1].content[0]], attachment=True)
    assert "The step budget of this turn (20 model requests) is spent" in \
        last.messages[-1].content[0].text
    assert last.max_tokens == AgentConfig().final_report_tokens
    # What the final report asked for did not run, and the history holds only its text.
    r = await agent.backend.client.shell_run(agent.backend.session,
                                             "ls /tmp/should-not-run")
    assert r["exit_code"] != 0
    assert agent.conversation.messages[-1] == AssistantMessage(text=result.text)


async def test_the_wall_budget_stops_the_next_tool_and_request_and_keeps_the_work(
        kit, mock_clock):
    config = AgentConfig(wall_s=600)
    kept_call = call("run_terminal", command="echo kept")

    def spend_the_budget(event):
        # The budget runs out while the step's first call runs: its second never starts.
        if event["type"] == "tool_result" and event["id"] == kept_call.id:
            mock_clock.jump(601)

    agent = await kit.open([
        reply("", call("run_terminal", command="echo first")),
        reply("", kept_call, call("run_terminal", command="touch /tmp/never; echo never")),
        reply("never asked for")], config=config)
    result = await agent.run_turn("work", on_event=spend_the_budget)
    assert result.outcome == "budget_exhausted"
    assert "wall-clock budget (600 s) was spent before request 3" in result.reason
    assert len(agent.model.requests) == 2  # no request after the budget was spent
    kept = [m.text for m in agent.conversation.messages if isinstance(m, ToolResult)]
    assert kept == ["first\n[exit code 0]", "kept\n[exit code 0]",
                    "[Not run: the turn's wall-clock budget (600 s) is spent, so no more "
                    "tools run in this turn.]"]
    r = await agent.backend.client.shell_run(agent.backend.session, "ls /tmp/never")
    assert r["exit_code"] != 0
    assert [e["type"] for e in events(agent)][-1] == "outcome"


async def test_cancel_during_a_tool_call_is_interrupted_and_ends_the_command(kit):
    agent = await kit.open([reply("", call("run_terminal", command="sleep 5151"))])
    async with trio.open_nursery() as nursery:
        got = []
        nursery.start_soon(lambda: _collect(agent.run_turn("wait"), got))
        while not kit.daemon.running("sleep 5151"):
            await trio.sleep(0.05)
        agent.cancel()
    result = got[0]
    assert result.outcome == "interrupted"
    assert wait_gone(kit.daemon.running("sleep 5151"), timeout=30) == []
    # The call left open gets a result, so the next request is one any provider takes.
    assert agent.conversation.messages[-1] == ToolResult(
        call_id=agent.conversation.messages[-2].tool_calls[0].id, name="run_terminal",
        text="[no result: the turn ended interrupted first]", is_error=True)
    agent.model.add(reply("fine"))
    assert (await agent.run_turn("next")).outcome == "completed"


async def test_cancel_during_a_repl_call_ends_the_turns_repl(kit):
    code = "import time\nopen('running', 'w').close()\ntime.sleep(5353)"
    agent = await kit.open([reply("", call("repl", code=code))])
    got = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_collect, agent.run_turn("wait"), got)
        # The code runs: a cancel while the interpreter still starts would end it with the
        # start, before the turn has a REPL to end.
        while not os.path.exists(os.path.join(kit.workspace, "running")):
            await trio.sleep(0.05)
        agent.cancel()
    assert got[0].outcome == "interrupted"
    # Ended with the turn, not left for the agent's close.
    assert wait_gone(kit.daemon.running("python_repl"), timeout=30) == []
    assert events(agent)[-1]["repls_ended"] == 1


async def _collect(coroutine, into: list):
    into.append(await coroutine)


async def test_cancel_while_parked_on_an_approval_is_interrupted(kit):
    asked = trio.Event()

    async def approve(tool_call):
        asked.set()
        await trio.sleep_forever()

    agent = await kit.open([reply("", call("repl", code="x = 1"),
                                  call("run_terminal", command="touch never"))],
                           mode="ask", approve=approve)
    got = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_collect, agent.run_turn("go"), got)
        await asked.wait()
        agent.cancel()
    assert got[0].outcome == "interrupted"
    assert not os.path.exists(os.path.join(kit.workspace, "never"))
    outcome = events(agent)[-1]
    assert outcome["type"] == "outcome" and outcome["outcome"] == "interrupted"
    # Both calls of the step are answered (neither ran).
    assert [m.text for m in agent.conversation.messages[-2:]] == \
        ["[no result: the turn ended interrupted first]"] * 2


async def test_an_outer_cancel_is_recorded_then_propagates(kit):
    agent = await kit.open([reply("", call("run_terminal", command="sleep 5252"))])
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run_turn, "wait")
            while not kit.daemon.running("sleep 5252"):
                await trio.sleep(0.05)
            scope.cancel()
    assert scope.cancelled_caught
    assert agent.conversation.outcomes() == {1: "interrupted"}


async def test_an_exception_in_the_loop_still_ends_the_turns_repls(kit):
    agent = await kit.open([reply("", call("repl", code="import time; x = 1")),
                            RuntimeError("the model adapter broke")])
    assert kit.daemon.running("python_repl") == []
    result = await agent.run_turn("go")
    assert result.outcome == "failed"
    assert result.reason == "RuntimeError: the model adapter broke"
    assert wait_gone(kit.daemon.running("python_repl"), timeout=30) == []
    assert events(agent)[-1]["repls_ended"] == 1
    # The agent goes on: the next turn runs.
    agent.model.add(reply("ok"))
    assert (await agent.run_turn("again")).outcome == "completed"


async def test_a_repl_variable_of_turn_one_is_gone_in_turn_two(kit):
    agent = await kit.open([reply("", call("repl", code="secret = 42")), reply("set"),
                            reply("", call("repl", code="secret")), reply("looked")])
    assert (await agent.run_turn("set it")).outcome == "completed"
    assert (await agent.run_turn("read it")).outcome == "completed"
    seen = results(agent.model.requests[-1])
    assert "NameError: name 'secret' is not defined" in seen[-1]


async def test_a_server_started_in_turn_one_answers_in_turn_two(kit):
    port = random.randrange(20000, 60000)
    kit.write("index.html", "hello from turn one\n")
    fetch = (f"python3 -c \"import urllib.request; print(urllib.request.urlopen("
             f"'http://127.0.0.1:{port}/index.html').read().decode())\"")
    agent = await kit.open([
        reply("", call("process_start",
                       command=f"python3 -m http.server {port} --bind 127.0.0.1")),
        lambda req: reply("", call("process_output", id=_started(req), until="Serving",
                                   wait_s=60)),
        reply("started"),
        reply("", call("run_terminal", command=fetch)),
        reply("fetched"),
    ])
    assert (await agent.run_turn("serve")).outcome == "completed"
    assert (await agent.run_turn("fetch")).outcome == "completed"
    assert results(agent.model.requests[-1])[-1].startswith("hello from turn one\n")


def _started(request) -> str:
    return next(m.text.split()[1].rstrip(".") for m in request.messages
                if isinstance(m, ToolResult) and m.text.startswith("Started "))


async def test_disposing_the_agent_leaves_no_process(kit):
    agent = await kit.open([
        reply("", call("process_start", command="sleep 7777 & sleep 7778"),
              call("repl", code="import subprocess; p = subprocess.Popen(['sleep', '7779'])")),
        reply("running"),
    ])
    assert (await agent.run_turn("start things")).outcome == "completed"
    # The REPL's child ended with its turn; the background process and its child stay.
    sleepers = [p for p in kit.daemon.running("sleep 777") if p.name() == "sleep"]
    assert sorted(p.cmdline()[1] for p in sleepers) == ["7777", "7778"]
    everything = kit.daemon.tree()  # the sandbox, its launcher, the processes
    assert len(everything) > 2
    await agent.aclose()
    assert wait_gone(everything, timeout=30) == []
    assert kit.daemon.tree() == []


async def test_each_turn_has_an_outcome_and_an_event_log(kit):
    agent = await kit.open([reply("", call("run_terminal", command="echo hi")),
                            reply("said hi")])
    result = await agent.run_turn("say hi")
    assert result.outcome == "completed" and result.text == "said hi"
    with open(os.path.join(agent.conversation.folder, "events.jsonl")) as f:
        log = [json.loads(line) for line in f]
    assert [e["type"] for e in log] == ["turn_start", "request", "reply", "tool_call",
                                       "tool_result", "request", "reply", "outcome"]
    assert all(e["turn"] == 1 for e in log)
    assert log[0]["prompt"] == "say hi"
    assert log[4]["text"] == "hi\n[exit code 0]"
    assert log[-1]["outcome"] == "completed" and log[-1]["steps"] == 2


async def _interrupt_streaming(kit, step: Streamed):
    """A turn whose model request is interrupted while `step` streams; the agent."""
    agent = await kit.open([step])
    got = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_collect, agent.run_turn("first question"), got)
        await step.streaming.wait()
        agent.cancel()
    assert got[0].outcome == "interrupted"
    return agent


async def test_an_interrupted_reply_is_kept_as_far_as_it_streamed(kit):
    agent = await _interrupt_streaming(kit, Streamed("Let me look at the tests"))
    assert agent.conversation.messages[-1] == AssistantMessage(
        text="Let me look at the tests\n\n[interrupted by the user]")
    kept = [e for e in events(agent) if e["type"] == "reply"]
    assert [(e["text"], e["stop"], e["partial"]) for e in kept] == [
        ("Let me look at the tests", "interrupted", True)]
    # The next prompt follows an answer: two prompts never run together into one message.
    agent.model.add(reply("ok"))
    assert (await agent.run_turn("second question")).outcome == "completed"
    sent = agent.model.requests[-1].messages
    assert [type(m).__name__ for m in sent] == ["UserMessage", "AssistantMessage",
                                               "UserMessage"]
    assert sent[1].text.startswith("Let me look at the tests")
    assert render_anthropic(agent.model.requests[-1], {})["messages"][0] == {
        "role": "user", "content": [{"type": "text", "text": "first question"}]}


async def test_a_prompt_interrupted_before_any_reply_is_marked(kit):
    agent = await _interrupt_streaming(kit, Streamed(""))
    assert agent.conversation.messages[-1] == AssistantMessage(
        text="[interrupted by the user before any reply]")
    agent.model.add(reply("ok"))
    assert (await agent.run_turn("second question")).outcome == "completed"
    assert [type(m).__name__ for m in agent.model.requests[-1].messages] == [
        "UserMessage", "AssistantMessage", "UserMessage"]
