"""The agent's config file and the options that add to it: outside MCP servers and language
servers.

    toolsd agent --mcp NAME=COMMAND ...  [--config FILE]

The file is TOML, `--config FILE`, else `$XDG_CONFIG_HOME/toolsd/agent.toml`
(~/.config/toolsd/agent.toml) when it exists:

    [mcp]                        # outside MCP servers: NAME = command line
    tickets = "tickets-mcp --stdio"
    files = ["node", "/opt/files-server/index.js"]

    [lsp]                        # language servers, per language (a command, or false: none)
    python = "pylsp"
    typescript = "typescript-language-server --stdio"

A command is a string split as a shell would (shlex), or a list of words. `--mcp` adds
servers (repeatable) and wins over the file for the same NAME. A NAME is letters, digits,
`-` and `_` (it becomes part of tool names). Every mistake is a `SettingsError` whose
message says what to fix.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from agent.lsp.servers import KNOWN

__all__ = ["Settings", "SettingsError", "add_arguments", "load_settings", "default_path"]

NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class SettingsError(Exception):
    pass


@dataclass(frozen=True)
class Settings:
    """`mcp`: server name -> argv. `lsp`: language -> argv, or [] for "none, do not detect".
    (A dataclass, and tomllib imported when a file is read: this module is imported with
    every `toolsd` command line.)"""

    mcp: dict[str, list[str]] = field(default_factory=dict)
    lsp: dict[str, list[str]] = field(default_factory=dict)


def add_arguments(parser) -> None:
    parser.add_argument("--mcp", action="append", default=[], metavar="NAME=COMMAND",
                        help="an outside MCP server (stdio) whose tools the model can find "
                             "with tool_search; COMMAND is split as a shell would "
                             "(repeatable; default: none)")
    parser.add_argument("--config", metavar="FILE",
                        help="the agent's config file (TOML; default: "
                             "$XDG_CONFIG_HOME/toolsd/agent.toml when it exists)")


def default_path() -> str:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(config, "toolsd", "agent.toml")


def _command(where: str, value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as e:
            raise SettingsError(f"{where}: {value!r} cannot be split as a shell would ({e}); "
                                f"check its quotes") from None
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise SettingsError(f"{where}: give a command line (a string) or a list of words, "
                            f"not {value!r}")
    if not words or not words[0]:
        raise SettingsError(f"{where}: the command is empty; give the server's command line")
    return words


def _name(where: str, name: str) -> str:
    if not NAME.match(name):
        raise SettingsError(f"{where}: the name {name!r} must be 1 to 32 letters, digits, "
                            f"'-' or '_'")
    return name


def parse_file(path: str, text: str) -> Settings:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path} is not valid TOML ({e}); fix it or give another "
                            f"--config") from None
    unknown = sorted(set(data) - {"mcp", "lsp"})
    if unknown:
        raise SettingsError(f"{path}: unknown section {unknown[0]!r}; the sections are [mcp] "
                            f"and [lsp]")
    mcp, lsp = {}, {}
    for section, out in (("mcp", mcp), ("lsp", lsp)):
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise SettingsError(f"{path}: [{section}] must be a table of NAME = command")
        for name, value in table.items():
            where = f"{path}: {section}.{name}"
            _name(where, name)
            if section == "lsp" and name not in KNOWN:
                raise SettingsError(f"{where}: no language {name!r} has diagnostics; the "
                                    f"languages are {', '.join(KNOWN)}")
            out[name] = [] if section == "lsp" and value is False else _command(where, value)
    return Settings(mcp=mcp, lsp=lsp)


def load_settings(args) -> Settings:
    """The file's settings (if any) with the command line's `--mcp` over them."""
    path = getattr(args, "config", None)
    settings = Settings()
    if path is not None or os.path.exists(default_path()):
        path = path or default_path()
        try:
            with open(path, encoding="utf-8") as f:
                settings = parse_file(path, f.read())
        except OSError as e:
            raise SettingsError(f"--config {path}: {e.strerror}; give a readable TOML "
                                f"file") from None
    mcp = dict(settings.mcp)
    for given in getattr(args, "mcp", None) or []:
        name, sep, command = given.partition("=")
        if not sep:
            raise SettingsError(f"--mcp {given!r}: give NAME=COMMAND, e.g. --mcp "
                                f"tickets='tickets-mcp --stdio'")
        mcp[_name(f"--mcp {given!r}", name.strip())] = _command(f"--mcp {name}", command)
    if mcp:
        import importlib.util

        if importlib.util.find_spec("mcp") is None:
            raise SettingsError("--mcp needs the MCP SDK, an optional extra: pip install "
                                "'toolsd[mcp]'") from None
    return Settings(mcp=mcp, lsp=settings.lsp)
