"""What a request carries besides the tools: the repository context (in the system prompt), and
the window of history that fits the route's context budget.

- Repository context (seed 000): a summary of the package metadata, the README and the
  top-level folder, each capped, all capped again at CONTEXT_CHARS; no file listing (the
  agent has tools to find files). Read through the session (`gather_context`), so a README
  that is a symlink to a secret outside the session's view is not read either.
- The window: the six most recent user turns; pictures attached after tool results are not
  turns. Everything before the last `Summary` is replaced by it.
- Compaction (seed 002): when the window would exceed the budget, the older part is
  summarized by the model in one bounded request and the turn goes on; if the rest still does
  not fit, `DoesNotFit`, and the turn fails with the conversation kept as it was. A server
  that refuses a request as too long (its window smaller than the budget said) gets one
  compacted request more (`force`).

Token counts are estimates (characters / 4, a fixed price per picture); the budget's origin
(config, provider, or a guess) is carried along and said when it matters.
"""

from __future__ import annotations

import json
import tomllib

import msgspec

from agent.history import (
    AssistantMessage,
    ImageRef,
    Message,
    ModelRequest,
    Summary,
    Text,
    ToolResult,
    UserMessage,
)
from agent.models.base import ContextBudget, Model

__all__ = ["CONTEXT_CHARS", "DoesNotFit", "assemble_context", "estimate_tokens",
           "fit_history", "gather_context", "resolve_budget", "summarize_metadata", "window"]

CONTEXT_CHARS = 8000
METADATA_CHARS = 2000
README_CHARS = 4000
TOP_LEVEL_CHARS = 2000
TOP_LEVEL_ENTRIES = 200
METADATA_FILES = ("pyproject.toml", "package.json", "Cargo.toml", "go.mod", "setup.cfg")
README_NAMES = ("README.md", "README.rst", "README.txt", "README", "readme.md", "Readme.md")
USER_TURNS = 6
# What a picture costs in tokens, as estimated (Anthropic: about width*height/750, so a
# 1568 px picture is some 1,600).
IMAGE_TOKENS = 1600
# Compaction keeps at most this share of the budget verbatim, and summarizes the rest.
KEEP_SHARE = 0.5
SUMMARY_TOKENS = 2048
# Each older message is shown to the summarizer within this many characters.
TRANSCRIPT_MESSAGE_CHARS = 2000


class DoesNotFit(Exception):
    """The history cannot be brought within the budget; the message says how far off. (A
    server's own refusal is agent.models.base.ContextOverflow.)"""


# ---------------------------------------------------------------- repository context (pure)


def _cap(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 16)].rstrip() + "\n[... cut ...]"


def summarize_metadata(name: str, text: str) -> str:
    """One package file in a few lines: name, version, description, dependencies, scripts.
    A file that does not parse is shown as its beginning."""
    try:
        if name == "package.json":
            return _summarize_package_json(json.loads(text))
        if name in ("pyproject.toml", "Cargo.toml"):
            return _summarize_toml(name, tomllib.loads(text))
        if name == "go.mod":
            return _summarize_go_mod(text)
    except (ValueError, tomllib.TOMLDecodeError, AttributeError, TypeError):
        pass
    return _cap(text, METADATA_CHARS // 2)


def _line(label: str, value) -> str | None:
    if not value:
        return None
    if isinstance(value, dict):
        value = ", ".join(value)
    elif isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    return f"{label}: {value}"


def _summarize_package_json(data: dict) -> str:
    scripts = data.get("scripts") or {}
    lines = [
        _line("name", " ".join(str(data.get(k, "")) for k in ("name", "version")).strip()),
        _line("description", data.get("description")),
        _line("scripts", [f"{k} ({v})" for k, v in scripts.items()]),
        _line("dependencies", data.get("dependencies")),
        _line("devDependencies", data.get("devDependencies")),
    ]
    return "\n".join(x for x in lines if x)


def _summarize_toml(name: str, data: dict) -> str:
    if name == "Cargo.toml":
        package = data.get("package", {})
        deps = data.get("dependencies", {})
        extra = [_line("workspace members", data.get("workspace", {}).get("members"))]
    else:
        package = data.get("project") or data.get("tool", {}).get("poetry", {})
        deps = package.get("dependencies", [])
        extra = [_line("requires-python", package.get("requires-python")),
                 _line("scripts", package.get("scripts")),
                 _line("optional", package.get("optional-dependencies"))]
    lines = [
        _line("name", " ".join(str(package.get(k, "")) for k in ("name", "version")).strip()),
        _line("description", package.get("description")),
        _line("dependencies", deps),
        *extra,
    ]
    return "\n".join(x for x in lines if x)


def _summarize_go_mod(text: str) -> str:
    module = [ln for ln in text.splitlines() if ln.startswith(("module ", "go "))]
    requires = [ln.split()[0] for ln in text.splitlines()
                if ln.startswith("\t") and ln.strip() and not ln.strip().startswith("//")]
    return "\n".join([*module, *([_line("requires", requires)] if requires else [])])


def assemble_context(workspace: str, metadata: dict[str, str], readme: tuple[str, str] | None,
                     top_level: list[str]) -> str:
    """The repository context for the system prompt, within CONTEXT_CHARS."""
    parts = [f"Repository: {workspace}"]
    if metadata:
        summaries = "\n".join(f"{name}:\n{summarize_metadata(name, text)}"
                              for name, text in metadata.items())
        parts.append("## Package metadata\n" + _cap(summaries, METADATA_CHARS))
    if readme:
        parts.append(f"## README ({readme[0]})\n" + _cap(readme[1], README_CHARS))
    if top_level:
        shown = top_level[:TOP_LEVEL_ENTRIES]
        more = f" ... and {len(top_level) - len(shown)} more" if len(top_level) > len(shown) \
            else ""
        parts.append("## Top-level folder\n" + _cap(" ".join(shown) + more, TOP_LEVEL_CHARS))
    return _cap("\n\n".join(parts), CONTEXT_CHARS)


async def gather_context(backend) -> str:
    """The repository context, read through the session (its view, its limits)."""
    client, session = backend.client, backend.session
    listing = await client.shell_run(session, "ls -A -p -1", max_output_chars=20000)
    names = [n for n in listing["output"].splitlines() if n] if listing["exit_code"] == 0 \
        else []
    metadata = {}
    for name in METADATA_FILES:
        if name in names:
            metadata[name] = await _read(backend, name, 20000)
    readme = None
    for name in README_NAMES:
        if name in names:
            readme = (name, await _read(backend, name, README_CHARS + 200))
            break
    return assemble_context(backend.workspace, metadata, readme, names)


async def _read(backend, name: str, limit: int) -> str:
    r = await backend.client.shell_run(backend.session, f"head -c {4 * limit} -- ./{name}",
                                       max_output_chars=limit)
    return r["output"] if r["exit_code"] == 0 else ""


# ---------------------------------------------------------------- the window (pure)


def window(messages: list[Message], user_turns: int = USER_TURNS) -> list[Message]:
    """What is sent of the history: the last Summary (standing for all before it), then the
    messages from the start of the `user_turns`-th most recent user turn. Pictures attached
    after tool results are user messages, but not turns."""
    start = 0
    summary: list[Message] = []
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], Summary):
            summary, start = [messages[i]], i + 1
            break
    turns = [i for i in range(start, len(messages)) if _is_turn(messages[i])]
    if len(turns) > user_turns:
        start = turns[-user_turns]
    return summary + messages[start:]


def _is_turn(m: Message) -> bool:
    return isinstance(m, UserMessage) and not m.attachment


_encoder = msgspec.json.Encoder()


def _message_tokens(m: Message) -> int:
    images = 0
    if isinstance(m, UserMessage):
        images = sum(1 for p in m.content if isinstance(p, ImageRef))
    return len(_encoder.encode(m)) // 4 + images * IMAGE_TOKENS


def estimate_tokens(request: ModelRequest) -> int:
    """Characters / 4 of what the request is made of, pictures at IMAGE_TOKENS each."""
    fixed = (len(request.system) + len(_encoder.encode(request.tools))) // 4
    return fixed + sum(_message_tokens(m) for m in request.messages)


def resolve_budget(configured: int | None, model: Model) -> ContextBudget:
    if configured:
        return ContextBudget(tokens=configured, guessed=False)
    return model.context_budget()


def _budget_words(budget: ContextBudget) -> str:
    if budget.guessed:
        return (f"{budget.tokens} tokens (a guess: neither the config nor the provider said; "
                f"set context_tokens)")
    return f"{budget.tokens} tokens"


# ---------------------------------------------------------------- compaction


class Fitted(msgspec.Struct, frozen=True):
    """The messages to send; `summary` and `at`: a compaction to insert in the history at
    that index (before the first message kept verbatim)."""

    messages: list[Message]
    tokens: int
    summary: Summary | None = None
    at: int = 0


async def fit_history(model: Model, history: list[Message], base: ModelRequest,
                      budget: ContextBudget, *, force: bool = False) -> Fitted:
    """The window of `history` within `budget` for a request like `base`, compacting once if
    needed (or, with `force`, anyway: the server refused it). Raises DoesNotFit (nothing
    changed) when it cannot fit."""
    messages = window(history)
    tokens = estimate_tokens(_with(base, messages))
    if tokens <= budget.tokens and not force:
        return Fitted(messages, tokens)
    fixed = estimate_tokens(_with(base, []))
    cut = _cut(messages, int(budget.tokens * KEEP_SHARE) - fixed)
    if cut is None:  # a long last step: keep less room for the summary
        cut = _cut(messages, budget.tokens - fixed - _summary_tokens(budget))
    if cut is None:
        raise DoesNotFit(
            f"the conversation needs about {tokens} tokens and the model's context budget is "
            f"{_budget_words(budget)}; even its last step alone does not fit, so nothing "
            f"older can be summarized away")
    older, kept = messages[:cut], messages[cut:]
    summary = await _summarize(model, older, kept, budget)
    fitted = [summary, *kept]
    new_tokens = estimate_tokens(_with(base, fitted))
    if new_tokens > budget.tokens:
        raise DoesNotFit(
            f"the conversation needs about {tokens} tokens and the model's context budget is "
            f"{_budget_words(budget)}; summarizing the older part still left about "
            f"{new_tokens}")
    return Fitted(fitted, new_tokens, summary, len(history) - len(kept))


def _with(base: ModelRequest, messages: list[Message]) -> ModelRequest:
    return ModelRequest(system=base.system, messages=messages, tools=base.tools,
                        max_tokens=base.max_tokens)


def _cut(messages: list[Message], room: int) -> int | None:
    """The first index where a verbatim tail can start (an assistant step or a user turn,
    so every tool result stays with its call) whose tail fits in `room` tokens."""
    starts = [i for i in range(1, len(messages))
              if isinstance(messages[i], AssistantMessage) or _is_turn(messages[i])]
    tail = 0
    best = None
    for i in range(len(messages) - 1, 0, -1):
        tail += _message_tokens(messages[i])
        if tail > room:
            break
        if i in starts:
            best = i
    return best


COMPACT_SYSTEM = (
    "You compact the earlier part of a coding agent's conversation so that it can go on "
    "with less context. Write a summary the agent can continue from: the user's requests "
    "and constraints, what was done and found (files, commands, results, errors, decisions), "
    "and what is still open. Be specific and brief; no preamble.")


async def _summarize(model: Model, older: list[Message], kept: list[Message],
                     budget: ContextBudget) -> Summary:
    room_chars = int(budget.tokens * KEEP_SHARE) * 4
    transcript = _transcript(older)
    if len(transcript) > room_chars:
        transcript = "[... earlier part left out ...]\n" + transcript[-room_chars:]
    request = ModelRequest(system=COMPACT_SYSTEM,
                           messages=[UserMessage([Text(transcript)])],
                           max_tokens=_summary_tokens(budget))
    reply = await model.complete(request, {}, None)
    text = reply.text.strip()
    if not text:
        raise DoesNotFit("the model returned an empty summary when asked to compact the "
                              "conversation")
    prompt = _open_request(older, kept)
    if prompt is not None:
        # The request being worked on is kept word for word: a summary may lose it.
        text += f"\n\nThe user's current request, verbatim:\n{prompt}"
    return Summary(text)


def _summary_tokens(budget: ContextBudget) -> int:
    return min(SUMMARY_TOKENS, max(256, budget.tokens // 8))


def _open_request(older: list[Message], kept: list[Message]) -> str | None:
    if any(_is_turn(m) for m in kept):
        return None
    for m in reversed(older):
        if _is_turn(m):
            return "\n".join(p.text for p in m.content if isinstance(p, Text))
    return None


def _transcript(messages: list[Message]) -> str:
    lines = []
    for m in messages:
        if isinstance(m, Summary):
            lines.append(m.text)
        elif isinstance(m, UserMessage):
            who = "Attached" if m.attachment else "User"
            lines.append(f"{who}: " + " ".join(
                p.text if isinstance(p, Text) else f"[image {p.path}]" for p in m.content))
        elif isinstance(m, AssistantMessage):
            calls = " ".join(f"[called {c.name} {json.dumps(c.arguments)[:500]}]"
                             for c in m.tool_calls)
            lines.append(f"Assistant: {m.text} {calls}".rstrip())
        elif isinstance(m, ToolResult):
            lines.append(f"Result of {m.name}: {m.text}")
    return "\n\n".join(_cap(line, TRANSCRIPT_MESSAGE_CHARS) for line in lines)
