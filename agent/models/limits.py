"""What a route's context window is said to be, and by whom, in words for a person. Pure.

A budget's source (agent/models/base.py ContextBudget) is one of: `configured`
(`--context-tokens` or the agent's config), `endpoint` (the server reported it: vLLM's and
OpenRouter's model list, llama.cpp's `/props`), `catalog` (a known hosted model,
agent/models/budget.py) or `fallback` (nobody said: a guess). Unknown or unverified limits stay
labelled as such, in the status line (`context 32k (fallback: unknown model)`) and in each
request's event.
"""

from __future__ import annotations

from typing import Any

from agent.models.base import ContextBudget

__all__ = ["budget_label", "reported_context", "endpoint_budget"]

# The fields a model list entry reports its served window in: vLLM, OpenRouter and others,
# LM Studio, Groq. (llama.cpp's model list has only the training window, `n_ctx_train`, not
# what the server was started with: that is in its /props.)
_LIST_FIELDS = ("max_model_len", "context_length", "max_context_length", "context_window")


def tokens_words(tokens: int) -> str:
    """32768 -> "32k", 128000 -> "128k", 1047576 -> "1.0M"."""
    if tokens >= 1_000_000:
        return f"{tokens / 1_000_000:.1f}M"
    if tokens >= 1000:
        if tokens % 1000 and tokens % 1024 == 0:  # a power-of-two size: 32768 is "32k"
            return f"{tokens // 1024}k"
        return f"{round(tokens / 1000)}k"
    return str(tokens)


def budget_label(budget: ContextBudget) -> str:
    """`context 32k (fallback: unknown model)`: the size and where it came from."""
    detail = f": {budget.detail}" if budget.detail else ""
    return f"context {tokens_words(budget.tokens)} ({budget.origin}{detail})"


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def reported_context(body: Any, model: str) -> tuple[int, str] | None:
    """The window a server's reply reports for `model`, and the field it came in: an
    OpenAI-style model list (`{"data": [{"id": ..., "max_model_len": ...}]}`, the entry of
    that id, or the only one), or llama.cpp's `/props`
    (`{"default_generation_settings": {"n_ctx": ...}}`). None when it says nothing usable."""
    if not isinstance(body, dict):
        return None
    settings = body.get("default_generation_settings")
    if isinstance(settings, dict) and _positive(settings.get("n_ctx")):
        return settings["n_ctx"], "/props n_ctx"
    entries = [e for e in body.get("data") or [] if isinstance(e, dict)] \
        if isinstance(body.get("data"), list) else []
    mine = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in mine[:1]:
        for name in _LIST_FIELDS:
            if _positive(entry.get(name)):
                return entry[name], f"/models {name}"
        top = entry.get("top_provider")  # OpenRouter: the provider's own limit
        if isinstance(top, dict) and _positive(top.get("context_length")):
            return top["context_length"], "/models top_provider.context_length"
    return None


def endpoint_budget(tokens: int, field: str) -> ContextBudget:
    return ContextBudget(tokens, source="endpoint", detail=field)
