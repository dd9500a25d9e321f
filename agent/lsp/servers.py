"""Which language server checks a file: by its name's ending, the language's server from the
agent's config (`[lsp]`, agent/turns/settings.py), else the first of the known ones the session
has on its PATH. Pure (the looking is agent/lsp/diagnostics.py's, in the session).

    python      pyright-langserver --stdio, else pylsp
    typescript  typescript-language-server --stdio   (.ts .tsx .mts .cts)
    javascript  typescript-language-server --stdio   (.js .jsx .mjs .cjs)

A language configured `false` gets no server and no detection.
"""

from __future__ import annotations

import os
import shlex

__all__ = ["KNOWN", "language_of", "choices", "detect_command"]

KNOWN: dict[str, list[list[str]]] = {
    "python": [["pyright-langserver", "--stdio"], ["pylsp"]],
    "typescript": [["typescript-language-server", "--stdio"]],
    "javascript": [["typescript-language-server", "--stdio"]],
}

_ENDINGS = {".py": "python", ".pyi": "python", ".ts": "typescript", ".tsx": "typescript",
            ".mts": "typescript", ".cts": "typescript", ".js": "javascript",
            ".jsx": "javascript", ".mjs": "javascript", ".cjs": "javascript"}


def language_of(path: str) -> str | None:
    """The config key of the language `path` is written in, or None (no server for it)."""
    return _ENDINGS.get(os.path.splitext(path)[1].lower())


def choices(language: str, configured: dict[str, list[str]]) -> list[list[str]]:
    """The commands to try for `language`, in order: the configured one alone, or the
    known ones ([] for a language configured `false`)."""
    if language in configured:
        return [configured[language]] if configured[language] else []
    return KNOWN.get(language, [])


def detect_command(candidates: list[list[str]]) -> str:
    """A shell command that prints the index of the first candidate whose program is on
    the PATH (or found at its path), and nothing when none is."""
    tests = [f"command -v {shlex.quote(c[0])} >/dev/null 2>&1 && {{ echo {i}; exit 0; }}"
             for i, c in enumerate(candidates)]
    return "; ".join(tests) + "; exit 0"
