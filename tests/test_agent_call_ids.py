"""Tool call ids are unique in the whole conversation, as Anthropic requires: a server that
numbers each reply's calls from zero (llama.cpp does) repeats `call_0`; such an id is
rewritten, in the call and in its result alike, when it comes and when an older conversation
saved with the repeats is sent (`--continue --api anthropic`)."""

from __future__ import annotations

import pytest

import agentkit
from agent.history.messages import (AssistantMessage, ModelRequest, Text, ToolCall, ToolResult,
                                    UserMessage)
from agent.models.anthropic import AnthropicModel
from agent.models.openai import OpenAIChatModel
from agent.models.providers import render_anthropic, render_openai_chat
from conftest import needs_bwrap
from model_server import Call, anthropic_stream, openai_stream, quick_retries

pytestmark = pytest.mark.daemon(shared=True)
kit = agentkit.kit


server = agentkit.server  # a model server of the test's own


def anthropic_ids(body: dict) -> list[tuple[list[str], list[str]]]:
    """Per assistant message with tool_use blocks: (their ids, the ids the next user message's
    tool_result blocks answer), checking each id is used once in the whole request, as the
    API does."""
    pairs, used = [], []
    messages = body["messages"]
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or not isinstance(m["content"], list):
            continue
        calls = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
        if not calls:
            continue
        used += calls
        answers = [b["tool_use_id"] for b in messages[i + 1]["content"]
                   if b["type"] == "tool_result"]
        pairs.append((calls, answers))
    assert len(used) == len(set(used)), f"a tool_use id is used twice: {used}"
    return pairs


def history_with_repeats() -> list:
    """As an older version saved a conversation with a server that numbers from zero."""
    return [
        UserMessage([Text("one")]),
        AssistantMessage(tool_calls=[ToolCall("call_0", "run_terminal", {"command": "a"}),
                                     ToolCall("call_1", "run_terminal", {"command": "b"})]),
        ToolResult("call_0", "run_terminal", "A"),
        ToolResult("call_1", "run_terminal", "B"),
        AssistantMessage(text="did a and b"),
        UserMessage([Text("two")]),
        AssistantMessage(tool_calls=[ToolCall("call_0", "run_terminal", {"command": "c"})]),
        ToolResult("call_0", "run_terminal", "C"),
        AssistantMessage(tool_calls=[ToolCall("call_0", "run_terminal", {"command": "d"})]),
        ToolResult("call_0", "run_terminal", "D"),
    ]


def test_a_saved_history_with_repeated_ids_is_sent_with_unique_ones():
    request = ModelRequest(system="s", messages=history_with_repeats())
    body = render_anthropic(request, {})
    pairs = anthropic_ids(body)
    assert pairs == [(["call_0", "call_1"], ["call_0", "call_1"]),
                     (["call_0_2"], ["call_0_2"]), (["call_0_3"], ["call_0_3"])]
    # Each result still goes with its own call.
    results = [b["content"] for m in body["messages"] if m["role"] == "user"
               and isinstance(m["content"], list) for b in m["content"]
               if b["type"] == "tool_result"]
    assert results == ["A", "B", "C", "D"]
    # The same on every request, and for OpenAI's shape too.
    assert render_anthropic(request, {}) == body
    chat = render_openai_chat(request, {})["messages"]
    calls = [c["id"] for m in chat if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    answers = [m["tool_call_id"] for m in chat if m["role"] == "tool"]
    assert calls == answers == ["call_0", "call_1", "call_0_2", "call_0_3"]


@needs_bwrap
async def test_continue_on_anthropic_after_a_server_that_repeats_ids(kit, server):
    # Two turns on an OpenAI-compatible server that calls its every first call `call_0`.
    for word in ("one", "two"):
        server.push(openai_stream(calls=[Call("run_terminal", {"command": f"echo {word}"},
                                              id="call_0")]),
                    openai_stream(text=f"said {word}"))
    first = await kit.open(model=OpenAIChatModel("local", server.openai_url,
                                                 http=quick_retries()))
    for word in ("one", "two"):
        result = await first.run_turn(f"say {word}")
        assert result.outcome == "completed", result.reason
    cid = first.conversation.id
    await first.aclose()
    # The second reply's call got an id of its own, in its call and its result alike.
    second_body = server.requests[3].body["messages"]
    ids = [c["id"] for m in second_body if m["role"] == "assistant"
           for c in m.get("tool_calls", [])]
    assert len(ids) == 2 and ids[0] == "call_0" and ids[1] != "call_0"
    assert [m["tool_call_id"] for m in second_body if m["role"] == "tool"] == ids

    # Then on Anthropic: every id once, each result right after its call.
    server.push(anthropic_stream(calls=[Call("run_terminal", {"command": "echo three"},
                                             id="call_0")]),
                anthropic_stream(text="said three"))
    again = await kit.open(model=AnthropicModel("claude-test", server.url, "ak-test",
                                                http=quick_retries()), resume=cid)
    result = await again.run_turn("say three")
    assert result.outcome == "completed", result.reason
    last = server.requests[-1].body
    pairs = anthropic_ids(last)
    assert len(pairs) == 3 and all(calls == answers for calls, answers in pairs)
    told = [b["content"] for m in last["messages"] if isinstance(m["content"], list)
            for b in m["content"] if b["type"] == "tool_result"]
    assert told == ["one\n[exit code 0]", "two\n[exit code 0]", "three\n[exit code 0]"]
