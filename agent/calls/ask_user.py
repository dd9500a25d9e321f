"""ask_user: the model asks the person at the terminal a question and goes on with the answer
as the tool's result. Offered only where someone can answer: `toolsd agent` on a terminal
(agent/terminal/cli.py sets `Toolbox.ask_user`), never with --json, from a pipe, or over MCP.
Pure."""

from __future__ import annotations

from agent.calls.results import RESULT_CHARS, ToolOutcome, clip_text
from agent.history.messages import ToolSpec

__all__ = ["ASK_USER", "ASK_USER_SPEC", "answer_outcome"]

ASK_USER = "ask_user"
QUESTION_CHARS = 2000

ASK_USER_SPEC = ToolSpec(
    name=ASK_USER,
    description="Ask the user a question when you cannot go on without their answer; it is "
                "the result.",
    parameters={"type": "object", "properties": {"question": {"type": "string"}},
                "required": ["question"]},
    read_only=True,
)


def question_of(arguments: dict) -> str | None:
    q = arguments.get("question")
    return q[:QUESTION_CHARS] if isinstance(q, str) and q.strip() else None


def answer_outcome(answer: str | None) -> ToolOutcome:
    if answer is None:
        return ToolOutcome("The user gave no answer (end of input): go on without it, or end "
                           "the turn saying what you need.", is_error=True)
    if not answer.strip():
        return ToolOutcome("The user answered with an empty line.")
    return ToolOutcome(clip_text(f"The user answered: {answer.strip()}", RESULT_CHARS))
