"""One history rendered into each provider's request body, checked against the shapes their
documentation gives:

- Anthropic Messages: docs.anthropic.com/en/api/messages, .../build-with-claude/tool-use
  (tool_use blocks; tool_result blocks first in the next user message), .../vision (base64
  image source), .../prompt-caching (cache_control).
- OpenAI chat completions: platform.openai.com/docs/api-reference/chat/create (system message,
  assistant tool_calls with JSON-string arguments, `tool` messages with tool_call_id,
  image_url content parts).
"""

from __future__ import annotations

import base64
import json

from agent.history.messages import (
    AssistantMessage,
    ImageRef,
    LoadedImage,
    ModelRequest,
    Summary,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserMessage,
)
from agent.models.providers import (
    LEFT_OUT,
    render_anthropic,
    render_openai_chat,
    within_request,
)

PNG = b"\x89PNG\r\n\x1a\nfake"
B64 = base64.b64encode(PNG).decode()
SHOT = ImageRef("shot.png")
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOL = ToolSpec("read_image", "Look at a picture.", SCHEMA, read_only=True)


def conversation() -> ModelRequest:
    return ModelRequest(
        system="You are a coding agent.",
        messages=[
            UserMessage([Text("What is in shot.png?")]),
            AssistantMessage("Let me look.", [ToolCall("call_1", "read_image",
                                                       {"path": "shot.png"})]),
            ToolResult("call_1", "read_image", "image attached below"),
            UserMessage([Text("The image shot.png:"), SHOT], attachment=True),
            AssistantMessage("A red square."),
            UserMessage([Text("Thanks")]),
        ],
        tools=[TOOL],
        max_tokens=1000,
    )


LOADED = {SHOT: LoadedImage("image/png", PNG, 4, 4)}
GONE = {SHOT: LoadedImage(missing="no such file")}
GONE_TEXT = "[The image shot.png could not be attached: no such file.]"


def test_anthropic_shape():
    assert render_anthropic(conversation(), LOADED) == {
        "system": [{"type": "text", "text": "You are a coding agent.",
                    "cache_control": {"type": "ephemeral"}}],
        "max_tokens": 1000,
        "tools": [{"name": "read_image", "description": "Look at a picture.",
                   "input_schema": SCHEMA}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is in shot.png?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_1", "name": "read_image",
                 "input": {"path": "shot.png"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1",
                 "content": "image attached below"},
                {"type": "text", "text": "The image shot.png:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": B64}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A red square."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks",
                                          "cache_control": {"type": "ephemeral"}}]},
        ],
    }


def test_openai_chat_shape():
    assert render_openai_chat(conversation(), LOADED) == {
        "max_tokens": 1000,
        "tools": [{"type": "function", "function": {
            "name": "read_image", "description": "Look at a picture.", "parameters": SCHEMA}}],
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "What is in shot.png?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "read_image", "arguments": '{"path":"shot.png"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "image attached below"},
            {"role": "user", "content": [
                {"type": "text", "text": "The image shot.png:"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}}]},
            {"role": "assistant", "content": "A red square."},
            {"role": "user", "content": "Thanks"},
        ],
    }


def test_vanished_image_is_reported_as_text_in_every_shape():
    anthropic = render_anthropic(conversation(), GONE)["messages"][2]["content"]
    assert anthropic[2] == {"type": "text", "text": GONE_TEXT}
    chat = render_openai_chat(conversation(), GONE)["messages"][4]
    assert chat == {"role": "user", "content": f"The image shot.png:\n\n{GONE_TEXT}"}
    for body in (render_anthropic(conversation(), GONE), render_openai_chat(conversation(), GONE)):
        assert B64 not in json.dumps(body)


def test_image_not_loaded_for_the_request_is_reported_not_dropped():
    body = render_anthropic(conversation(), {})
    assert body["messages"][2]["content"][2]["text"].startswith(
        "[The image shot.png could not be attached: it was not loaded for this request.")


def parallel_calls_with_image_between_results() -> ModelRequest:
    """The loop appended the image right after its own call's result, before the next
    result: no provider takes a user message between an assistant's tool results."""
    return ModelRequest("", [
        UserMessage([Text("look and list")]),
        AssistantMessage("", [ToolCall("a", "read_image", {"path": "shot.png"}),
                              ToolCall("b", "run_terminal", {"command": "ls"})]),
        ToolResult("a", "read_image", "image attached below"),
        UserMessage([Text("The image shot.png:"), SHOT], attachment=True),
        ToolResult("b", "run_terminal", "exit 2: no such dir", is_error=True),
    ])


def test_image_rides_after_all_tool_results_never_inside_one():
    req = parallel_calls_with_image_between_results()
    last = render_anthropic(req, LOADED)["messages"][-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "tool_result", "text",
                                                    "image"]
    assert [b.get("tool_use_id") for b in last["content"][:2]] == ["a", "b"]
    assert last["content"][1]["is_error"] is True
    assert all(isinstance(b["content"], str) for b in last["content"][:2])

    chat = render_openai_chat(req, LOADED)["messages"]
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "tool", "user"]
    assert chat[1]["content"] is None
    assert chat[3]["content"] == "Error: exit 2: no such dir"
    assert chat[4]["content"][1]["type"] == "image_url"



def test_summary_is_a_user_message_saying_it_summarises_and_merges():
    req = ModelRequest("", [Summary("Built the parser; tests pass."),
                            UserMessage([Text("Now the CLI.")])])
    expected_text = ("Summary of earlier work in this conversation (the older messages were "
                     "replaced by it to save room):\nBuilt the parser; tests pass.")
    anthropic = render_anthropic(req, {})["messages"]
    assert len(anthropic) == 1 and anthropic[0]["role"] == "user"
    assert anthropic[0]["content"][0] == {"type": "text", "text": expected_text}
    assert anthropic[0]["content"][1]["text"] == "Now the CLI."
    chat = render_openai_chat(req, {})["messages"]
    assert chat == [{"role": "user", "content": f"{expected_text}\n\nNow the CLI."}]


def test_a_call_without_its_result_is_answered_and_a_stray_result_kept_as_text():
    req = ModelRequest("", [
        UserMessage([Text("go")]),
        AssistantMessage("", [ToolCall("a", "run_terminal", {"command": "sleep 99"})]),
        UserMessage([Text("stop that")]),
        ToolResult("zz", "repl", "42"),
    ])
    chat = render_openai_chat(req, {})["messages"]
    assert chat[2] == {"role": "tool", "tool_call_id": "a", "content": (
        "Error: This call was not run: the turn ended before its result came back.")}
    assert chat[3]["role"] == "user"
    assert chat[3]["content"] == "stop that\n\n(Result of an earlier repl call, id zz:)\n42"
    anthropic = render_anthropic(req, {})["messages"]
    assert anthropic[2]["content"][0]["tool_use_id"] == "a"
    assert anthropic[2]["content"][0]["is_error"] is True


def test_empty_messages_and_outputs_are_not_sent_empty():
    req = ModelRequest("", [
        UserMessage([Text("run it")]),
        AssistantMessage("", [ToolCall("a", "run_terminal", {"command": "true"})]),
        ToolResult("a", "run_terminal", ""),
        AssistantMessage(""),
        UserMessage([Text("")]),
    ])
    messages = render_anthropic(req, {})["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[2]["content"][0]["content"] == "(no output)"


def test_a_request_carries_the_most_recent_pictures_it_can():
    """32 MB is all Anthropic takes in one request, 100 images at most: pictures past that
    would fail the request, and every later one while they are in the window."""
    big = [(ImageRef(f"big{i}.png"), LoadedImage("image/png", b"x" * 3_000_000, 9, 9))
           for i in range(10)]
    gone = (ImageRef("gone.png"), LoadedImage(missing="no such file"))
    fitted = within_request("anthropic", [big[0], gone, *big[1:]])
    assert list(fitted) == [big[0][0], gone[0], *(ref for ref, _ in big[1:])]  # in order
    kept = [ref.path for ref, image in fitted.items() if image.missing is None]
    assert kept == [f"big{i}.png" for i in range(4, 10)]  # 6 x 4 MB of base64: 24 MB
    assert fitted[big[0][0]].missing == LEFT_OUT and fitted[gone[0]].missing == "no such file"
    small = [(ImageRef(f"s{i}.png"), LoadedImage("image/png", b"x", 1, 1)) for i in range(101)]
    fitted = within_request("anthropic", small)
    assert [r.path for r, i in fitted.items() if i.missing] == ["s0.png"]
    assert all(i.missing is None for i in within_request("openai", small).values())
    text = render_anthropic(ModelRequest("", [UserMessage([Text("look"), big[0][0]])]),
                            within_request("anthropic", big))["messages"][0]["content"][1]
    assert text["text"] == f"[The image big0.png could not be attached: {LEFT_OUT}.]"
