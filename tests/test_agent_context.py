"""Repository context, the history window, and compaction within the context budget."""

from __future__ import annotations

import itertools
import os

from PIL import Image

import pytest

from agent.conversation.compaction import COMPACT_SYSTEM
from agent.conversation.repo_context import (CONTEXT_CHARS, METADATA_CHARS, README_CHARS,
                                            assemble_context)
from agent.conversation.window import window
from agent.history.messages import (
    AssistantMessage,
    ImageRef,
    Summary,
    Text,
    ToolResult,
    UserMessage,
)
from agent.models.base import ContextBudget, ContextOverflow
from agent.models.scripted import ScriptedModel, call, reply
from agent.turns.rules import AgentConfig
import agentkit
from conftest import needs_bwrap


pytestmark = pytest.mark.daemon(shared=True)
kit = agentkit.kit


def user(text: str) -> UserMessage:
    return UserMessage([Text(text)])


def prompts(messages) -> list[str]:
    return [m.content[0].text for m in messages if isinstance(m, UserMessage)
            and not m.attachment]


# ---------------------------------------------------------------- the window


def test_window_keeps_six_user_turns_and_attachments_do_not_count():
    history = []
    for n in range(1, 9):
        history += [user(f"turn {n}"), AssistantMessage(text=f"answer {n}")]
    # Five pictures attached in the last turn, each after a tool result.
    for i in range(5):
        c = call("read_image", path=f"f{i}.png")
        history += [AssistantMessage(tool_calls=[c]),
                    ToolResult(call_id=c.id, name=c.name, text="attached below"),
                    UserMessage([ImageRef(path=f"/ws/f{i}.png")], attachment=True)]
    sent = window(history)
    assert prompts(sent) == [f"turn {n}" for n in range(3, 9)]
    assert sum(1 for m in sent if isinstance(m, UserMessage) and m.attachment) == 5


def test_window_starts_at_the_last_summary():
    history = [user("old 1"), AssistantMessage(text="a"), Summary("what happened"),
               user("new"), AssistantMessage(text="b")]
    assert window(history) == [Summary("what happened"), user("new"),
                               AssistantMessage(text="b")]


@needs_bwrap
async def test_five_images_in_one_turn_leave_six_real_turns_sent(kit):
    for i in range(5):
        Image.new("RGB", (20, 20), (i * 40, 0, 0)).save(os.path.join(kit.workspace,
                                                                     f"frame{i}.png"))
    agent = await kit.open()
    for n in range(1, 7):
        agent.model.add(reply(f"answer {n}"))
        assert (await agent.run_turn(f"turn {n}")).outcome == "completed"
    agent.model.add(*(reply("", call("read_image", path=f"frame{i}.png")) for i in range(5)),
                    reply("seen"))
    assert (await agent.run_turn("turn 7: look at the frames")).outcome == "completed"
    last = agent.model.requests[-1]
    assert prompts(last.messages) == [f"turn {n}" for n in range(2, 7)] + \
        ["turn 7: look at the frames"]
    refs = [p for m in last.messages if isinstance(m, UserMessage) for p in m.content
            if isinstance(p, ImageRef)]
    assert len(refs) == 5
    assert all(not agent.model.images[-1][r].missing for r in refs)


# ---------------------------------------------------------------- repository context


def test_repository_context_is_capped_piece_by_piece_and_in_all():
    metadata = {"pyproject.toml": "[project]\nname = 'demo'\nversion = '1.2'\n"
                                  "description = 'A demo'\ndependencies = ['trio', 'msgspec']\n",
                "package.json": '{"name": "web", "scripts": {"test": "jest"}, '
                                '"dependencies": {"react": "18"}}'}
    readme = ("README.md", "# Demo\n" + "word " * 5000)
    top = [f"entry{i}/" for i in range(5000)]
    text = assemble_context("/ws", metadata, readme, top)
    assert len(text) <= CONTEXT_CHARS
    assert "name: demo 1.2" in text and "dependencies: trio, msgspec" in text
    assert "scripts: test (jest)" in text and "dependencies: react" in text
    readme_part = text.split("## README (README.md)\n")[1].split("\n## ")[0]
    assert len(readme_part) <= README_CHARS
    meta_part = text.split("## Package metadata\n")[1].split("\n## ")[0]
    assert len(meta_part) <= METADATA_CHARS


@needs_bwrap
async def test_the_system_prompt_has_the_repository_but_no_file_listing(kit):
    kit.write("pyproject.toml", "[project]\nname = 'demo'\nversion = '0.1'\n")
    kit.write("README.md", "# Demo\nIt demonstrates.\n")
    kit.write("src/demo/deep_module.py", "x = 1\n")
    agent = await kit.open([reply("hi")])
    await agent.run_turn("hello")
    system = agent.model.requests[0].system
    assert "name: demo 0.1" in system and "It demonstrates." in system
    assert "README.md" in system and "src/" in system
    assert "deep_module.py" not in system


# ---------------------------------------------------------------- compaction


def step_or_summary(plan):
    """A model that answers compaction requests with a summary and others from `plan`."""
    plan = iter(plan)

    def respond(request):
        if request.system == COMPACT_SYSTEM:
            return reply("SUMMARY: the user asked for numbers; three seq runs printed them.")
        step = next(plan)
        if isinstance(step, BaseException):
            raise step
        return step
    return itertools.repeat(respond)


BIG = "seq 100000 103000"  # some 3,000 characters of output, about 900 tokens


@needs_bwrap
async def test_compaction_summarizes_older_material_and_the_turn_goes_on(kit):
    model = ScriptedModel(step_or_summary(
        [reply("", call("run_terminal", command=f"{BIG} | head -{n}00")) for n in (5, 6, 7, 8)]
        + [reply("done")]), budget=ContextBudget(tokens=4000))
    agent = await kit.open(model=model)
    result = await agent.run_turn("print numbers")
    assert result.outcome == "completed", result
    compactions = [r for r in model.requests if r.system == COMPACT_SYSTEM]
    assert len(compactions) >= 1
    assert compactions[0].tools == [] and compactions[0].max_tokens <= 2048
    assert "print numbers" in compactions[0].messages[0].content[0].text
    # The requests after it start from the summary, with the user's request kept verbatim.
    after = model.requests[model.requests.index(compactions[0]) + 1]
    assert isinstance(after.messages[0], Summary)
    assert "SUMMARY: the user asked" in after.messages[0].text
    assert "The user's current request, verbatim:\nprint numbers" in after.messages[0].text
    # The conversation keeps everything, the summary in its place.
    history = agent.conversation.messages
    assert prompts(history) == ["print numbers"]
    assert sum(isinstance(m, Summary) for m in history) == len(compactions)
    assert [e["type"] for e in agent.conversation.events()].count("compaction") == \
        len(compactions)


@needs_bwrap
async def test_a_history_that_cannot_fit_fails_the_turn_and_keeps_the_conversation(kit):
    model = ScriptedModel([], budget=ContextBudget(tokens=300, guessed=True))
    agent = await kit.open(model=model)
    result = await agent.run_turn("hello")
    assert result.outcome == "failed"
    assert result.reason.startswith("context: the conversation needs about ")
    assert "300 tokens (a guess: neither the config nor the provider said; set " \
           "context_tokens)" in result.reason
    assert model.requests == []  # no request over the budget was sent
    assert agent.conversation.messages == [user("hello")]
    # A budget from the config wins over the model's guess.
    big = await kit.open(model=ScriptedModel([reply("fits")],
                                             budget=ContextBudget(300, guessed=True)),
                         config=AgentConfig(context_tokens=50_000))
    assert (await big.run_turn("hello")).outcome == "completed"


@needs_bwrap
async def test_a_server_refusing_a_request_as_too_long_gets_one_compacted_request(kit):
    model = ScriptedModel(step_or_summary([
        reply("", call("run_terminal", command="seq 1 10")),
        ContextOverflow("the request is larger than the model's context window"),
        reply("done"),
    ]))
    agent = await kit.open(model=model)
    result = await agent.run_turn("print numbers")
    assert result.outcome == "completed" and result.steps == 2
    assert [r.system == COMPACT_SYSTEM for r in model.requests] == [False, False, True, False]
    assert isinstance(model.requests[-1].messages[0], Summary)
    types = [e["type"] for e in agent.conversation.events()]
    assert types.index("refused") < types.index("compaction")
    assert sum(isinstance(m, Summary) for m in agent.conversation.messages) == 1


@needs_bwrap
async def test_refused_again_after_compaction_the_turn_fails_and_keeps_the_history(kit):
    too_long = ContextOverflow("the request is larger than the model's context window")
    model = ScriptedModel(step_or_summary([
        reply("", call("run_terminal", command="seq 1 10")), too_long, too_long]))
    agent = await kit.open(model=model)
    result = await agent.run_turn("print numbers")
    assert result.outcome == "failed"
    assert result.reason.startswith("context: the model refused the request as too long even "
                                    "after compaction")
    assert not any(isinstance(m, Summary) for m in agent.conversation.messages)
    assert prompts(agent.conversation.messages) == ["print numbers"]
