"""How many tokens a model's context takes, when nobody configured it. Pure.

Only hosted models whose window every caller gets are in the table. An open-weights model's
window is whatever its server was started with (llama.cpp's `-c`, Ollama's `num_ctx`), which
its name does not tell, so those get the guess, labelled as one.
"""

from __future__ import annotations

from agent.models.base import ContextBudget

GUESS_TOKENS = 32_768

# Longest prefix first wins. gpt-5's window is 400k, of which at most 272k may be input.
_KNOWN: tuple[tuple[str, int], ...] = (
    ("claude-", 200_000),
    ("gpt-5", 272_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1-mini", 128_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
)


def context_budget(model: str, configured: int | None = None) -> ContextBudget:
    """The configured size, else the table's for `model` (a gateway's `vendor/` prefix
    ignored), else a guess marked `guessed`; each with its source. (What the endpoint itself
    reports, asked at start, comes before the table: agent/models/probe.py.)"""
    if configured is not None:
        if configured <= 0:
            raise ValueError(f"a context size must be a positive number of tokens, "
                             f"not {configured}")
        return ContextBudget(configured, source="configured", detail="--context-tokens")
    name = model.lower().rsplit("/", 1)[-1]
    for prefix, tokens in sorted(_KNOWN, key=lambda k: -len(k[0])):
        if name.startswith(prefix):
            return ContextBudget(tokens, source="catalog", detail=f"{prefix}*")
    return ContextBudget(GUESS_TOKENS, guessed=True, source="fallback", detail="unknown model")
