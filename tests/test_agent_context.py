"""Repository context, the history window, and compaction within the context budget."""

from __future__ import annotations

from agent.context import (
    CONTEXT_CHARS,
    METADATA_CHARS,
    README_CHARS,
    assemble_context,
    window,
)
from agent.history import (
    AssistantMessage,
    ImageRef,
    Summary,
    Text,
    ToolResult,
    UserMessage,
)
from agent.models.scripted import call


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
