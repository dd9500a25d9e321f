"""The Anthropic Messages adapter against a scripted server on loopback: the streamed events
(text deltas, tool_use with input_json_delta, stop reason and usage), images after tool
results, the retry path, and the errors a person reads."""

from __future__ import annotations

import base64

import pytest

from agent.history.messages import (
    AssistantMessage,
    ImageRef,
    LoadedImage,
    ModelRequest,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserMessage,
)
from agent.models.anthropic import AnthropicModel
from agent.models.base import ContextBudget, ModelError, Usage
from model_server import (
    SSE,
    Call,
    JSONReply,
    ModelServer,
    Sleeps,
    anthropic_stream,
    quick_retries,
)

TOOL = ToolSpec("read_image", "Look at a picture.",
                {"type": "object", "properties": {"path": {"type": "string"}}})
REQUEST = ModelRequest("Be brief.", [UserMessage([Text("What is in shot.png?")])], [TOOL])


@pytest.fixture
def server():
    with ModelServer() as s:
        yield s



def adapter(url: str, sleeps: Sleeps | None = None, **kw) -> AnthropicModel:
    return AnthropicModel("claude-test", url, "sk-ant-test",
                          http=quick_retries(sleeps), **kw)


async def test_text_and_tool_use_stream_into_one_reply(server):
    server.push(anthropic_stream(text="Let me look.",
                                 calls=[Call("read_image", {"path": "shot.png"}, "toolu_1")]))
    shown: list[str] = []
    reply = await adapter(server.url).complete(REQUEST, {}, shown.append)
    assert len(shown) > 1 and "".join(shown) == "Let me look."
    assert reply.text == "Let me look."
    assert [(c.id, c.name, c.arguments, c.error) for c in reply.tool_calls] == [
        ("toolu_1", "read_image", {"path": "shot.png"}, None)]
    assert reply.stop == "tool_use"
    assert reply.usage == Usage(25, 9)
    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.body["model"] == "claude-test" and sent.body["stream"] is True
    assert sent.body["system"][0]["text"] == "Be brief."
    assert sent.body["tools"][0]["input_schema"]["properties"] == {"path": {"type": "string"}}


async def test_end_turn_and_max_tokens_stops(server):
    server.push(anthropic_stream(text="Done."),
                anthropic_stream(text="Cut sh", stop_reason="max_tokens"))
    assert (await adapter(server.url).complete(REQUEST, {})).stop == "end"
    assert (await adapter(server.url).complete(REQUEST, {})).stop == "max_tokens"


async def test_a_base_url_with_v1_is_not_doubled(server):
    server.push(anthropic_stream(text="ok"))
    await adapter(server.url + "/v1/").complete(REQUEST, {})
    assert server.requests[0].path == "/v1/messages"


async def test_the_image_rides_after_the_tool_result(server):
    png = b"\x89PNG\r\n\x1a\nfake"
    shot = ImageRef("shot.png")
    request = ModelRequest("", [
        UserMessage([Text("What is in shot.png?")]),
        AssistantMessage("", [ToolCall("toolu_1", "read_image", {"path": "shot.png"})]),
        ToolResult("toolu_1", "read_image", "image attached below"),
        UserMessage([Text("The image shot.png:"), shot], attachment=True),
    ], [TOOL])
    server.push(anthropic_stream(text="A red square."))
    reply = await adapter(server.url).complete(
        request, {shot: LoadedImage("image/png", png, 4, 4)})
    assert reply.text == "A red square."
    last = server.requests[0].body["messages"][-1]
    assert last["role"] == "user"
    assert last["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": "image attached below"}
    assert last["content"][2]["type"] == "image"
    assert last["content"][2]["source"] == {"type": "base64", "media_type": "image/png",
                                            "data": base64.b64encode(png).decode()}


async def test_tool_use_without_input_deltas_and_with_malformed_input(server):
    server.push(anthropic_stream(calls=[Call("read_image", "", "t0"),
                                        Call("read_image", '{"path": ', "t1")]))
    reply = await adapter(server.url).complete(REQUEST, {})
    empty, malformed = reply.tool_calls
    assert empty.arguments == {} and empty.error is None
    assert malformed.arguments == {} and "not valid JSON" in malformed.error


async def test_a_reused_tool_use_id_is_replaced(server):
    # Results are matched to calls by id: two calls of one id would leave one unanswered.
    server.push(anthropic_stream(calls=[Call("run_terminal", {"command": "a"}, "toolu_x"),
                                        Call("run_terminal", {"command": "b"}, "toolu_x")]))
    reply = await adapter(server.url).complete(REQUEST, {})
    first, second = reply.tool_calls
    assert first.id == "toolu_x" and second.id.startswith("call_")
    assert [first.arguments, second.arguments] == [{"command": "a"}, {"command": "b"}]


async def test_overloaded_before_any_content_is_retried(server):
    server.push(SSE([("error", {"type": "error", "error": {"type": "overloaded_error",
                                                         "message": "Overloaded"}})]),
                JSONReply(529, {"type": "error", "error": {"type": "overloaded_error",
                                                          "message": "Overloaded"}}),
                anthropic_stream(text="ok"))
    sleeps = Sleeps()
    reply = await adapter(server.url, sleeps).complete(REQUEST, {})
    assert reply.text == "ok" and len(server.requests) == 3 and len(sleeps) == 2


async def test_overloaded_x_n_fails_clearly_after_the_cap(server):
    server.push(*[JSONReply(529, {"type": "error", "error": {"type": "overloaded_error",
                                                            "message": "Overloaded"}})] * 3)
    with pytest.raises(ModelError) as err:
        await adapter(server.url).complete(REQUEST, {})
    assert str(err.value) == (f"{server.url}/v1/messages kept failing (HTTP 529: Overloaded) "
                              "after 3 tries; try again later")


async def test_a_stream_without_message_stop_is_not_taken_for_a_reply(server):
    cut = anthropic_stream(text="Half an answer")
    server.push(SSE(cut.events[:-2]), anthropic_stream(text="x"))
    with pytest.raises(ModelError, match="broke off midway \\(the stream ended before "
                                         "message_stop\\); ask again"):
        await adapter(server.url).complete(REQUEST, {})
    assert len(server.requests) == 1


async def test_wrong_key_and_wrong_model(server):
    server.push(JSONReply(401, {"type": "error", "error": {"type": "authentication_error",
                                                          "message": "invalid x-api-key"}}),
                JSONReply(404, {"type": "error", "error": {"type": "not_found_error",
                                                          "message": "model: claude-nope"}}))
    with pytest.raises(ModelError) as err:
        await adapter(server.url).complete(REQUEST, {})
    assert str(err.value) == (f"{server.url}/v1/messages refused the API key (HTTP 401: invalid "
                              "x-api-key); check the key in $ANTHROPIC_API_KEY")
    with pytest.raises(ModelError) as err:
        await AnthropicModel("claude-nope", server.url).complete(REQUEST, {})
    assert str(err.value) == (f"{server.url}/v1/messages does not serve the model 'claude-nope' "
                              "(HTTP 404: model: claude-nope); check the model name")
    assert "x-api-key" not in server.requests[1].headers


def test_context_budget():
    assert AnthropicModel("claude-sonnet-4-5").context_budget() == \
        ContextBudget(200_000, source="catalog", detail="claude-*")
    assert AnthropicModel("claude-x", context_tokens=1_000_000).context_budget() == \
        ContextBudget(1_000_000, source="configured", detail="--context-tokens")
    assert AnthropicModel("glm-4.6").context_budget().guessed
