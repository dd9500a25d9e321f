"""The pure pieces under both adapters: server-sent events as servers really send them, the
retry policy's waits, the Retry-After a server asks for, and replies of any shape a broken or
hostile server can send."""

from __future__ import annotations

import copy
import email.utils
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.models.anthropic import MessagesAssembler
from agent.models.base import ModelError
from agent.models.openai import ChatAssembler
from agent.models.stream import ServerSentEvent, SSEDecoder, parse_arguments
from agent.models.transport import RetryPolicy, Transient, retry_after
from model_server import Call, anthropic_stream, openai_stream


def decode(text: str) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events = [decoder.feed(line) for line in text.split("\n")]
    return [e for e in [*events, decoder.close()] if e is not None]


def test_sse_events_as_servers_send_them():
    assert decode("event: ping\ndata: {}\n\n"
                  ": a comment line\n"
                  "data:{\"no\":\"space\"}\n\n"
                  "data: line one\ndata: line two\n\n"
                  "retry: 100\n\n"
                  "data: [DONE]") == [
        ServerSentEvent("ping", "{}"), ServerSentEvent("", '{"no":"space"}'),
        ServerSentEvent("", "line one\nline two"), ServerSentEvent("", "[DONE]")]


def test_arguments_empty_are_an_empty_object_and_null_is_an_error():
    assert parse_arguments("") == ({}, None)
    assert parse_arguments(None) == ({}, None)
    args, error = parse_arguments("null")
    assert args == {} and error.startswith("the arguments must be one JSON object, not null")


def test_backoff_is_full_jitter_under_the_cap_and_stops_after_the_tries():
    policy = RetryPolicy(tries=6, base_s=1.0, cap_s=4.0)
    for failures, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 4.0), (5, 4.0)]:
        waits = [policy.delay(failures, None) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling / 2  # random, not a fixed fraction
    assert policy.delay(6, None) is None


def test_retry_after_is_honoured_within_the_cap():
    policy = RetryPolicy(tries=3, max_retry_after_s=60)
    assert policy.delay(1, 7.5) == 7.5
    assert policy.delay(1, 61) is None
    assert policy.delay(3, 1) is None


def test_retry_after_headers():
    assert retry_after({"Retry-After": "3"}) == 3.0
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({}) is None
    assert retry_after({"Retry-After": "soon"}) is None
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert 100 < retry_after({"Retry-After": later}) <= 120


@given(st.text(alphabet="ab: \r\n", max_size=60), st.lists(st.integers(0, 60), max_size=6))
def test_sse_text_cut_anywhere_gives_the_same_events(text, cuts):
    whole = SSEDecoder()
    expected = [*whole.feed_text(text), whole.close()]
    pieces, last = [], 0
    for cut in sorted(set(cuts)):
        pieces.append(text[last:cut])
        last = cut
    pieces.append(text[last:])
    decoder = SSEDecoder()
    got = [e for piece in pieces for e in decoder.feed_text(piece)] + [decoder.close()]
    assert got == expected


ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                   lambda children: st.lists(children, max_size=3)
                   | st.dictionaries(st.text(max_size=3), children, max_size=3),
                   max_leaves=6)
CALLS = [Call("run_terminal", {"command": "ls"}, "c1"), Call("read_image", {"path": "a.png"})]
STREAMS = [(ChatAssembler, openai_stream(text="Hi there", calls=CALLS).events),
           (MessagesAssembler, anthropic_stream(text="Hi there", calls=CALLS).events)]


def places(value, path=()):
    """Every place in a JSON value, as the keys that lead to it."""
    yield path
    children = (value.items() if isinstance(value, dict)
                else enumerate(value) if isinstance(value, list) else ())
    for key, child in children:
        yield from places(child, (*path, key))


def replaced(value, path, new):
    if not path:
        return new
    value = copy.deepcopy(value)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = new
    return value


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_assemblers_never_crash_on_what_a_server_sends(data):
    """Real streams with parts swapped for values of any type: an error or a reply, never a
    crash of the turn."""
    for make, events in STREAMS:
        events = [e for e in events if e != "[DONE]"]
        for _ in range(data.draw(st.integers(1, 3))):
            i = data.draw(st.integers(0, len(events) - 1))
            name, obj = events[i] if isinstance(events[i], tuple) else ("", events[i])
            path = data.draw(st.sampled_from(list(places(obj))))
            events[i] = (name, replaced(obj, path, data.draw(ANY)))
        assembler = make(lambda text: None)
        try:
            for event in events:
                name, obj = event if isinstance(event, tuple) else ("", event)
                assembler.feed(name, json.dumps(obj))
            reply = assembler.reply()
        except (ModelError, Transient):
            continue
        assert all(isinstance(c.id, str) and c.id and isinstance(c.arguments, dict)
                   for c in reply.tool_calls)


def test_json_nested_too_deep_is_a_model_error_not_a_crash():
    deep = "[" * 100_000 + "]" * 100_000
    for make in (ChatAssembler, MessagesAssembler):
        with pytest.raises(ModelError, match="not JSON"):
            make().feed("", deep)
