"""The OpenAI-compatible adapter against a scripted server on loopback: what it sends, how it
reads what the servers stream (each defensive rule, one case each), its retries, and the one
line a person reads when the URL, key or model is wrong."""

from __future__ import annotations

import socket
import threading

import pytest
import trio

from agent.history.messages import ModelRequest, Text, ToolSpec, UserMessage
from agent.models import transport
from agent.models.base import ContextBudget, ContextOverflow, ModelError, Usage
from agent.models.openai import OpenAIChatModel
from model_server import (
    SSE,
    Call,
    JSONReply,
    ModelServer,
    Reset,
    Sleeps,
    openai_stream,
    quick_retries,
)

TOOL = ToolSpec("run_terminal", "Run a command.",
                {"type": "object", "properties": {"command": {"type": "string"}}})
REQUEST = ModelRequest("Be brief.", [UserMessage([Text("List the files.")])], [TOOL])


@pytest.fixture
def server():
    with ModelServer() as s:
        yield s



def adapter(url: str, sleeps: Sleeps | None = None, **kw) -> OpenAIChatModel:
    return OpenAIChatModel("scripted-7b", url, "sk-test",
                           http=quick_retries(sleeps), **kw)


def chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def test_text_streams_as_it_comes_and_the_request_is_chat_completions(server):
    server.push(openai_stream(text="Two files: a.py and b.py."))
    shown: list[str] = []
    reply = await adapter(server.openai_url).complete(REQUEST, {}, shown.append)
    assert len(shown) > 1 and "".join(shown) == "Two files: a.py and b.py."
    assert reply.text == "Two files: a.py and b.py."
    assert reply.tool_calls == [] and reply.stop == "end"
    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["model"] == "scripted-7b" and sent.body["stream"] is True
    assert sent.body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert sent.body["tools"][0]["function"]["name"] == "run_terminal"


async def test_usage_is_read_when_present_and_none_when_not(server):
    server.push(openai_stream(text="hi", usage=(120, 4)), openai_stream(text="hi", usage=None))
    assert (await adapter(server.openai_url).complete(REQUEST, {})).usage == Usage(120, 4)
    assert (await adapter(server.openai_url).complete(REQUEST, {})).usage == Usage(None, None)


async def test_arguments_as_a_json_string_in_fragments(server):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "ls -la"}, "call_9")]))
    reply = await adapter(server.openai_url).complete(REQUEST, {})
    assert [(c.id, c.name, c.arguments, c.error) for c in reply.tool_calls] == [
        ("call_9", "run_terminal", {"command": "ls -la"}, None)]
    assert reply.stop == "tool_use"


async def test_arguments_as_an_object(server):
    # Ollama-style: the whole call in one chunk, its arguments an object.
    server.push(SSE([chunk({"role": "assistant", "tool_calls": [
        {"index": 0, "id": "c1", "type": "function",
         "function": {"name": "run_terminal", "arguments": {"command": "pwd"}}}]}),
        chunk({}, "tool_calls"), "[DONE]"]))
    reply = await adapter(server.openai_url).complete(REQUEST, {})
    assert reply.tool_calls[0].arguments == {"command": "pwd"}
    assert reply.tool_calls[0].error is None


async def test_missing_call_ids_are_generated_unique(server):
    server.push(openai_stream(calls=[Call("run_terminal", {"command": "a"}),
                                     Call("run_terminal", {"command": "b"})]))
    reply = await adapter(server.openai_url).complete(REQUEST, {})
    ids = [c.id for c in reply.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    assert [c.arguments["command"] for c in reply.tool_calls] == ["a", "b"]


async def test_streamed_calls_are_assembled_by_index(server):
    # Two calls whose fragments interleave; the name comes in each call's first chunk only.
    server.push(SSE([
        chunk({"tool_calls": [{"index": 0, "id": "c0", "type": "function",
                               "function": {"name": "run_terminal", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 1, "id": "c1", "type": "function",
                               "function": {"name": "read_image", "arguments": '{"pa'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command": '}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": 'th": "x.png"}'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"make"}'}}]}),
        chunk({}, "tool_calls"), "[DONE]"]))
    reply = await adapter(server.openai_url).complete(REQUEST, {})
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("c0", "run_terminal", {"command": "make"}), ("c1", "read_image", {"path": "x.png"})]


async def test_tool_calls_are_found_by_presence_not_finish_reason(server):
    server.push(openai_stream(text="Running it.",
                              calls=[Call("run_terminal", {"command": "ls"}, "c1")],
                              finish="stop"))
    reply = await adapter(server.openai_url).complete(REQUEST, {})
    assert reply.text == "Running it."
    assert [c.name for c in reply.tool_calls] == ["run_terminal"]
    assert reply.stop == "tool_use"


async def test_malformed_tool_calls_become_calls_with_an_error(server):
    server.push(openai_stream(calls=[Call("run_terminal", '{"command": "ls', "c1"),
                                     Call("run_terminal", '["ls"]', "c2"),
                                     Call("run_terminal", '"{\\"command\\": \\"ls\\"}"', "c3")]))
    reply = await adapter(server.openai_url).complete(REQUEST, {})
    bad_json, not_object, double_encoded = reply.tool_calls
    assert bad_json.arguments == {} and "not valid JSON" in bad_json.error
    assert '{"command": "ls' in bad_json.error
    assert not_object.arguments == {}
    assert "must be one JSON object, not an array" in not_object.error
    assert double_encoded.arguments == {"command": "ls"} and double_encoded.error is None


async def test_a_server_that_does_not_stream_is_read_the_same(server):
    server.push(JSONReply(200, {"choices": [{"index": 0, "finish_reason": "tool_calls",
                                             "message": {"role": "assistant", "content": None,
                                                         "tool_calls": [
        {"type": "function", "function": {"name": "run_terminal", "arguments": {"command": "a"}}},
        {"type": "function", "function": {"name": "run_terminal", "arguments": {"command": "b"}}},
    ]}}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}))
    reply = await adapter(server.openai_url).complete(REQUEST, {})
    assert [c.arguments for c in reply.tool_calls] == [{"command": "a"}, {"command": "b"}]
    assert reply.tool_calls[0].id != reply.tool_calls[1].id
    assert reply.usage == Usage(5, 2)


async def test_a_flood_from_the_server_is_cut_off_not_held(server, monkeypatch):
    monkeypatch.setattr(transport, "MAX_REPLY_CHARS", 10_000)
    server.push(SSE([chunk({"content": "x" * 1000})] * 50),
                JSONReply(200, {"choices": [{"message": {"content": "y" * 20_000}}]}))
    for _ in range(2):
        with pytest.raises(ModelError) as err:
            await adapter(server.openai_url).complete(REQUEST, {})
        assert str(err.value) == (f"the reply from {server.openai_url}/chat/completions went "
                                  "past 10,000 characters, far more than a model's answer; "
                                  "check that the base URL is a model server")
    assert len(server.requests) == 2


async def test_a_cancel_mid_stream_ends_the_request_and_is_not_retried(server):
    server.push(SSE([chunk({"content": "Thinking"})], hold=threading.Event()),
                openai_stream(text="again"))
    with trio.CancelScope() as scope:
        await adapter(server.openai_url).complete(REQUEST, {}, lambda text: scope.cancel())
    assert scope.cancelled_caught
    assert len(server.requests) == 1


# --- Retries ---------------------------------------------------------------------------------

async def test_a_429_is_retried_after_the_servers_retry_after(server):
    server.push(JSONReply(429, {"error": {"message": "slow down"}}, {"Retry-After": "2"}),
                openai_stream(text="ok"))
    sleeps = Sleeps()
    reply = await adapter(server.openai_url, sleeps).complete(REQUEST, {})
    assert reply.text == "ok"
    assert sleeps == [2.0]
    assert len(server.requests) == 2


async def test_5xx_is_retried_with_backoff_then_fails_clearly_after_the_cap(server):
    server.push(*[JSONReply(500, {"error": {"message": "boom"}})] * 3)
    sleeps = Sleeps()
    with pytest.raises(ModelError) as err:
        await adapter(server.openai_url, sleeps).complete(REQUEST, {})
    assert str(err.value) == (f"{server.openai_url}/chat/completions kept failing "
                              "(HTTP 500: boom) after 3 tries; try again later")
    assert len(server.requests) == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0


async def test_a_retry_after_longer_than_the_cap_is_not_waited_out(server):
    server.push(JSONReply(429, {"error": {"message": "quota"}}, {"Retry-After": "3600"}))
    sleeps = Sleeps()
    with pytest.raises(ModelError) as err:
        await adapter(server.openai_url, sleeps).complete(REQUEST, {})
    assert "is rate limiting (HTTP 429: quota) after 1 try; it asks to wait 3600 s" in str(
        err.value)
    assert sleeps == [] and len(server.requests) == 1


async def test_a_connection_reset_before_any_byte_is_retried(server):
    server.push(Reset(), openai_stream(text="ok"))
    reply = await adapter(server.openai_url).complete(REQUEST, {})
    assert reply.text == "ok" and len(server.requests) == 2


async def test_a_stream_that_breaks_after_text_is_not_repeated(server):
    server.push(SSE([chunk({"content": "Half an ans"})], cut=True), openai_stream(text="x"))
    shown: list[str] = []
    with pytest.raises(ModelError) as err:
        await adapter(server.openai_url).complete(REQUEST, {}, shown.append)
    assert "broke off midway" in str(err.value)
    assert shown == ["Half an ans"] and len(server.requests) == 1


# --- What a person reads -----------------------------------------------------------------------

def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


async def test_wrong_key(server):
    server.push(JSONReply(401, {"error": {"message": "Incorrect API key provided: sk-test"}}))
    with pytest.raises(ModelError) as err:
        await adapter(server.openai_url, key_hint="$MY_KEY").complete(REQUEST, {})
    assert one_line(err) == (f"{server.openai_url}/chat/completions refused the API key "
                             "(HTTP 401: Incorrect API key provided: sk-test); check the key "
                             "in $MY_KEY")


async def test_wrong_model_by_404_and_by_400(server):
    server.push(JSONReply(404, {"error": {"message": "The model `scripted-7b` does not exist",
                                          "code": "model_not_found"}}),
                JSONReply(400, {"error": {"message": 'model "llama9" not found, try pulling '
                                                     'it first'}}))
    for _ in range(2):
        with pytest.raises(ModelError) as err:
            await adapter(server.openai_url).complete(REQUEST, {})
        assert "does not serve the model 'scripted-7b'" in one_line(err)
        assert one_line(err).endswith("; check the model name")
    assert len(server.requests) == 2  # neither is retried


async def test_wrong_path_is_a_base_url_error(server):
    server.push(JSONReply(404, "Not Found"))
    with pytest.raises(ModelError) as err:
        await adapter(server.url + "/api").complete(REQUEST, {})
    assert one_line(err) == (f"{server.url}/api/chat/completions is not a model endpoint "
                             "(HTTP 404: Not Found); check the base URL (an OpenAI-compatible "
                             "server's usually ends in /v1)")


async def test_connection_refused_names_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(ModelError) as err:
        await adapter(f"http://127.0.0.1:{port}/v1").complete(REQUEST, {})
    assert one_line(err) == (f"cannot connect to http://127.0.0.1:{port}/v1/chat/completions: "
                             "connection refused; check the base URL and that the server is "
                             "running")


async def test_unknown_host_names_the_url():
    with pytest.raises(ModelError) as err:
        await adapter("http://no-such-host.invalid/v1").complete(REQUEST, {})
    assert one_line(err).startswith(
        "cannot find the host of http://no-such-host.invalid/v1/chat/completions (")
    assert one_line(err).endswith("); check the base URL")


async def test_a_base_url_that_is_no_url_fails_at_once():
    with pytest.raises(ModelError, match="is not an http:// or https:// URL"):
        adapter("localhost:8080")


async def test_a_request_over_the_context_window_says_so(server):
    server.push(JSONReply(400, {"error": {"message": "This model's maximum context length is "
                                                     "4096 tokens. However, you requested 9000",
                                          "code": "context_length_exceeded"}}))
    with pytest.raises(ContextOverflow) as err:
        await adapter(server.openai_url).complete(REQUEST, {})
    assert one_line(err).startswith("the request is larger than scripted-7b's context window")


def test_context_budget_from_argument_table_or_labelled_guess():
    assert adapter("http://x/v1", context_tokens=8192).context_budget() == \
        ContextBudget(8192, source="configured", detail="--context-tokens")
    assert OpenAIChatModel("gpt-4o-mini").context_budget() == \
        ContextBudget(128_000, source="catalog", detail="gpt-4o*")
    assert OpenAIChatModel("openai/gpt-4.1").context_budget().tokens == 1_047_576
    assert adapter("http://x/v1").context_budget() == \
        ContextBudget(32_768, guessed=True, source="fallback", detail="unknown model")
