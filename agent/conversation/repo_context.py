"""The repository context a request carries in its system prompt: a summary of the package
metadata, the README and the top-level folder, each capped, all capped again at CONTEXT_CHARS;
no file listing (the agent has tools to find files). Read through the session
(`gather_context`), so a README that is a symlink to a secret outside the session's view is not
read either. The history sent with it: agent/conversation/window.py; compaction:
agent/conversation/compaction.py.
"""

from __future__ import annotations

import json
import tomllib

__all__ = ["CONTEXT_CHARS", "assemble_context", "cap", "gather_context", "summarize_metadata"]

CONTEXT_CHARS = 8000
METADATA_CHARS = 2000
README_CHARS = 4000
TOP_LEVEL_CHARS = 2000
TOP_LEVEL_ENTRIES = 200
METADATA_FILES = ("pyproject.toml", "package.json", "Cargo.toml", "go.mod", "setup.cfg")
README_NAMES = ("README.md", "README.rst", "README.txt", "README", "readme.md", "Readme.md")


# ---------------------------------------------------------------- pure


def cap(text: str, limit: int) -> str:
    """`text` stripped, within `limit` characters: cut at its end, with a line saying so."""
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
    return cap(text, METADATA_CHARS // 2)


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
        parts.append("## Package metadata\n" + cap(summaries, METADATA_CHARS))
    if readme:
        parts.append(f"## README ({readme[0]})\n" + cap(readme[1], README_CHARS))
    if top_level:
        shown = top_level[:TOP_LEVEL_ENTRIES]
        more = f" ... and {len(top_level) - len(shown)} more" if len(top_level) > len(shown) \
            else ""
        parts.append("## Top-level folder\n" + cap(" ".join(shown) + more, TOP_LEVEL_CHARS))
    return cap("\n\n".join(parts), CONTEXT_CHARS)


# ---------------------------------------------------------------- read through the session


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
