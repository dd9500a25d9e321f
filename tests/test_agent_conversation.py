"""Conversations saved per workspace: fresh by default, resumed on request, and recovered after
the agent's process died mid-turn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agent.conversation.store import ConversationBusy, ConversationDamaged, ConversationStore
from agent.history.messages import AssistantMessage, UserMessage
from agent.models.scripted import ScriptedModel, reply
from agent.turns.agent import Agent
import agentkit
from conftest import needs_bwrap, wait_for
from toolsd.client import ToolsdError

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


kit = agentkit.kit


def prompts(request) -> list[str]:
    return [m.content[0].text for m in request.messages
            if isinstance(m, UserMessage) and not m.attachment]


async def test_a_new_agent_starts_fresh_and_resume_goes_back(kit):
    first = await kit.open([reply("noted: blue")])
    await first.run_turn("my colour is blue")
    cid = first.conversation.id
    await first.aclose()

    fresh = await kit.open([reply("no idea")])
    await fresh.run_turn("what is my colour?")
    assert prompts(fresh.model.requests[0]) == ["what is my colour?"]
    assert fresh.conversation.id != cid
    await fresh.aclose()

    resumed = await kit.open([reply("blue")], resume=cid)
    await resumed.run_turn("what is my colour?")
    request = resumed.model.requests[0]
    assert prompts(request) == ["my colour is blue", "what is my colour?"]
    assert AssistantMessage(text="noted: blue") in request.messages
    assert resumed.conversation.outcomes() == {1: "completed", 2: "completed"}
    # Only one agent at a time in a conversation.
    with pytest.raises(ConversationBusy):
        ConversationStore(kit.workspace, kit.store).open(cid)


async def test_resume_latest(kit):
    a = await kit.open([reply("one")])
    await a.run_turn("first")
    await a.aclose()
    b = await kit.open([reply("two")], resume="latest")
    assert b.conversation.id == a.conversation.id


AGENT_THAT_HANGS = textwrap.dedent("""
    import sys, trio
    from agent.turns.agent import Agent
    from agent.models.scripted import ScriptedModel, call, reply

    async def main(socket, workspace, store):
        model = ScriptedModel([reply("", call("run_terminal", command="echo one")),
                               reply("", call("run_terminal", command="sleep 4444"))])
        agent = await Agent.open(workspace, model, mode="auto", socket=socket, store_root=store)
        await agent.run_turn("work")

    trio.run(main, *sys.argv[1:])
""")


async def test_a_turn_in_flight_when_the_process_died_is_marked_interrupted(kit):
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT_THAT_HANGS, kit.daemon.socket, kit.workspace, kit.store],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Killed while its second tool call runs: the first has its result.
        wait_for(lambda: kit.daemon.running("sleep 4444") or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    with kit.daemon.client() as c:  # a killed agent cannot close its session: we do
        for s in c.session_list()["sessions"]:
            if s["workspace"] == os.path.realpath(kit.workspace):
                c.session_close(s["session"])

    conversation = ConversationStore(kit.workspace, kit.store).latest()
    try:
        assert conversation.outcomes() == {1: "interrupted"}
        outcome = conversation.events()[-1]
        assert outcome["type"] == "outcome"
        assert outcome["reason"] == "the agent process ended while the turn was in flight"
        first, second = conversation.messages[-3].text, conversation.messages[-1]
        assert first == "one\n[exit code 0]"
        # The call in flight gets a result saying so: every provider refuses a call left open.
        assert second.text == "[no result: the agent stopped before this call's result]"
        assert second.is_error
    finally:
        conversation.close()
    # The next agent goes on from it.
    agent = await kit.open([reply("resumed")], resume="latest")
    assert (await agent.run_turn("go on")).outcome == "completed"
    assert agent.conversation.outcomes() == {1: "interrupted", 2: "completed"}


async def test_an_agent_that_cannot_start_leaves_no_session_and_no_conversation(kit):
    with pytest.raises(FileNotFoundError) as e:
        await kit.open(resume="20000101-000000-abcdef")
    assert "no conversation '20000101-000000-abcdef'" in str(e.value)
    with pytest.raises(ToolsdError) as e:
        await Agent.open(os.path.join(kit.workspace, "missing"), ScriptedModel([]),
                         mode="auto", socket=kit.daemon.socket, store_root=kit.store)
    assert e.value.code == "bad_params" and "does not exist" in e.value.message
    with kit.daemon.client() as c:
        assert c.session_list()["sessions"] == []
    assert ConversationStore(kit.workspace, kit.store).ids() == []


async def test_an_event_line_torn_by_a_kill_is_passed_over(kit):
    """A process killed mid-write leaves half a line: the log still reads, the turn it was
    in is marked interrupted, and the next event starts a line of its own."""
    first = await kit.open([reply("one")])
    await first.run_turn("first")
    await first.aclose()
    with open(os.path.join(first.conversation.folder, "events.jsonl"), "ab") as f:
        f.write(b'{"t": 1.0, "turn": 2, "type": "turn_start", "prompt": "sec')
    agent = await kit.open([reply("two")], resume="latest")
    assert agent.conversation.outcomes() == {1: "completed"}
    assert (await agent.run_turn("second")).outcome == "completed"
    assert agent.conversation.outcomes() == {1: "completed", 2: "completed"}


async def test_a_damaged_history_says_so_and_what_to_do(kit):
    first = await kit.open([reply("one")])
    await first.run_turn("first")
    await first.aclose()
    folder = first.conversation.folder
    with open(os.path.join(folder, "history.json"), "w") as f:
        f.write('[{"type": "user", "content": [{"type": "te')
    with pytest.raises(ConversationDamaged) as e:
        await kit.open(resume="latest")
    assert str(e.value).startswith(f"conversation {first.conversation.id} cannot be read: its "
                                   f"history.json is damaged (")
    assert str(e.value).endswith(f"); start a new conversation, or move {folder} away")
    # Nothing of it is held: a new conversation opens, and so would this one, mended.
    assert (await (await kit.open([reply("fresh")])).run_turn("hi")).outcome == "completed"


def test_conversations_made_in_one_second_list_in_the_order_they_were_made(tmp_path):
    # Ids begin with the time: to the second they tied, and the random rest decided which was
    # "the newest" (--continue) and the order of --list.
    store = ConversationStore(str(tmp_path / "ws"), str(tmp_path / "store"))
    os.makedirs(store.workspace, exist_ok=True)
    made = []
    for _ in range(6):
        conversation = store.new()
        made.append(conversation.id)
        conversation.close()
        time.sleep(0.002)
    assert store.ids() == made
    latest = store.latest()
    assert latest.id == made[-1]
    latest.close()
