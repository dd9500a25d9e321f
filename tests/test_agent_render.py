"""A real turn's requests, rendered by agent/models/providers.py for each provider the agent speaks
to: every tool call answered next to it, the picture on the user message after the results,
roles in order."""

from __future__ import annotations

import os

import pytest
from PIL import Image

import agentkit
from agent.models.providers import render_anthropic, render_openai_chat
from agent.models.scripted import call, reply
from agent.turns.rules import AgentConfig
from conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


kit = agentkit.kit


@pytest.fixture
async def recorded(kit):
    """The model's requests of a turn with two calls in one step (a picture among them), a
    picture that vanished by the next turn, and a step budget spent into a final report."""
    Image.new("RGB", (30, 20), (0, 90, 200)).save(os.path.join(kit.workspace, "a.png"))
    Image.new("RGB", (30, 20), (0, 200, 90)).save(os.path.join(kit.workspace, "b.png"))
    agent = await kit.open([
        reply("Looking.", call("run_terminal", command="ls"), call("read_image", path="a.png")),
        reply("", call("read_image", path="b.png")),
        reply("Report: two pictures, one blue."),
        reply("", call("run_terminal", command="true")),
        reply("done"),
    ], config=AgentConfig(max_steps=2))
    assert (await agent.run_turn("look")).outcome == "budget_exhausted"
    os.remove(os.path.join(kit.workspace, "b.png"))
    assert (await agent.run_turn("again")).outcome == "completed"
    return agent.model


async def test_anthropic_shape(recorded):
    for request, images in zip(recorded.requests, recorded.images):
        body = render_anthropic(request, images)
        roles = [m["role"] for m in body["messages"]]
        assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:]))
        for i, m in enumerate(body["messages"]):
            uses = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
            if uses:
                following = body["messages"][i + 1]["content"]
                results = [b["tool_use_id"] for b in following if b["type"] == "tool_result"]
                assert results == uses
                kinds = [b["type"] for b in following]
                # tool results first, then whatever rides along (pictures, notes)
                assert kinds[:len(uses)] == ["tool_result"] * len(uses)
    last = render_anthropic(recorded.requests[-1], recorded.images[-1])
    flat = [b for m in last["messages"] for b in m["content"]]
    assert sum(b["type"] == "image" for b in flat) == 1  # a.png
    assert any(b["type"] == "text" and "b.png could not be attached" in b["text"]
               for b in flat)


async def test_openai_chat_shape(recorded):
    for request, images in zip(recorded.requests, recorded.images):
        messages = render_openai_chat(request, images)["messages"]
        assert messages[0]["role"] == "system"
        for i, m in enumerate(messages):
            if m.get("tool_calls"):
                ids = [c["id"] for c in m["tool_calls"]]
                answers = messages[i + 1: i + 1 + len(ids)]
                assert [a["role"] for a in answers] == ["tool"] * len(ids)
                assert [a["tool_call_id"] for a in answers] == ids
    last = render_openai_chat(recorded.requests[1], recorded.images[1])["messages"]
    assert last[-1]["role"] == "user"
    assert [p["type"] for p in last[-1]["content"]] == ["text", "image_url"]
