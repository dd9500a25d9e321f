"""Honest limits: a route's context budget says where it came from (the option, the
endpoint's own report, the catalog of known models, or the fallback), in the status line of
`toolsd agent` and in each request's event."""

from __future__ import annotations

import json

import pytest

import agentkit
from agent.models.base import ContextBudget
from agent.models.limits import budget_label, reported_context
from agent.models.openai import OpenAIChatModel
from agent.models.probe import route_budget
from conftest import needs_bwrap, wait_gone
from model_server import JSONReply, openai_stream
from test_agent_cli import argv, run, spawn

pytestmark = pytest.mark.daemon(shared=True)
place = agentkit.place


server = agentkit.server  # a model server of the test's own


def test_each_source_is_named_in_the_label():
    assert budget_label(OpenAIChatModel("local-7b", "http://x.invalid/v1").context_budget()) \
        == "context 32k (fallback: unknown model)"
    assert budget_label(OpenAIChatModel("gpt-4o").context_budget()) == \
        "context 128k (catalog: gpt-4o*)"
    assert budget_label(OpenAIChatModel("m", "http://x.invalid/v1", context_tokens=8192)
                        .context_budget()) == "context 8k (configured: --context-tokens)"
    assert budget_label(ContextBudget(300, guessed=True)) == "context 300 (fallback)"


def test_what_servers_report_is_read_and_odd_replies_are_not():
    vllm = {"object": "list", "data": [{"id": "other", "max_model_len": 4096},
                                       {"id": "qwen", "max_model_len": 32000}]}
    assert reported_context(vllm, "qwen") == (32000, "/models max_model_len")
    assert reported_context({"data": [{"id": "only", "context_length": 9000}]}, "x") == \
        (9000, "/models context_length")
    assert reported_context({"default_generation_settings": {"n_ctx": 4096}}, "x") == \
        (4096, "/props n_ctx")
    # Two entries, none of this id: nobody said which one serves it.
    assert reported_context({"data": [{"id": "a", "context_length": 1},
                                      {"id": "b", "context_length": 2}]}, "x") is None
    for odd in (None, [], "text", {"data": "x"}, {"data": [{"id": "x", "max_model_len": -5}]},
                {"data": [{"id": "x", "max_model_len": True}]},
                {"default_generation_settings": {"n_ctx": "big"}}):
        assert reported_context(odd, "x") is None


async def test_the_endpoints_report_wins_over_the_catalog_and_the_option_over_both(server):
    server.gets["/v1/models"] = JSONReply(200, {"data": [{"id": "gpt-4o",
                                                          "max_model_len": 16384}]})
    model = OpenAIChatModel("gpt-4o", server.openai_url)
    assert await route_budget(None, model) == \
        ContextBudget(16384, source="endpoint", detail="/models max_model_len")
    assert (await route_budget(2000, model)).origin == "configured"
    configured = OpenAIChatModel("gpt-4o", server.openai_url, context_tokens=1000)
    assert await route_budget(None, configured) == configured.context_budget()
    assert server.requests == []  # probes are GETs, never a model request


async def test_an_endpoint_that_says_nothing_or_is_down_leaves_the_catalog_or_fallback(server):
    assert (await route_budget(None, OpenAIChatModel("gpt-4o", server.openai_url))).origin \
        == "catalog"
    assert len(server.probes) == 2  # the model list, then llama.cpp's /props: both 404
    down = OpenAIChatModel("mystery", "http://127.0.0.1:9/v1")
    assert await route_budget(None, down) == down.context_budget()
    assert down.context_budget().origin == "fallback"


@needs_bwrap
def test_the_status_line_and_each_request_say_where_the_budget_came_from(server, place,
                                                                         daemon):
    server.push(openai_stream(text="Hi."))
    child = spawn(argv(server, place, "--mode", "auto", socket=daemon.socket), place)
    child.expect_exact("context 32k (fallback: unknown model); one prompt per line")
    child.sendline("hello")
    child.expect_exact("[completed] 1 step")
    child.sendeof()
    child.expect_exact("\n")
    child.wait()
    server.gets["/props"] = JSONReply(200, {"default_generation_settings": {"n_ctx": 8192}})
    server.push(openai_stream(text="Hi."))
    child = spawn(argv(server, place, "--mode", "auto", socket=daemon.socket), place)
    child.expect_exact("context 8k (endpoint: /props n_ctx); one prompt per line")
    child.sendeof()
    child.wait()
    server.push(openai_stream(text="Hi."))
    done = run(argv(server, place, "--mode", "auto", "--json", "--context-tokens", "5000",
                    "go", socket=daemon.socket), place)
    assert done.returncode == 0, done.stderr
    request = [e for e in map(json.loads, done.stdout.splitlines())
               if e["type"] == "request"][0]
    assert (request["budget"], request["budget_source"], request["budget_detail"]) == \
        (5000, "configured", "--context-tokens")
    assert wait_gone(daemon.running("bwrap"), timeout=30) == []
