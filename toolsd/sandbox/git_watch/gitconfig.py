"""Git config files read as git reads them, and the settings in them that run a program.

A session can write the config of any repository in its workspace except the top-level
one's; the host's git, run there later by a person, would execute what some settings name
(`core.fsmonitor`, `core.hooksPath`, an `alias.x = !cmd`, a filter, ...). `parse` reads the
syntax of git-config(1) (sections, subsections, quoting, escapes, continuations, comments);
`runs_code` says which settings name something git executes or a file it reads more
settings from. Pure: text in, entries out.
"""

from __future__ import annotations

import fnmatch

__all__ = ["ConfigError", "parse", "runs_code", "RUNS_CODE"]


class ConfigError(ValueError):
    """Text that git would refuse too ("bad config line N")."""


# Keys (section[.subsection].name, lowercased but for the subsection, which is "*" here)
# whose value git runs as a command, or a file or folder of more config or hooks. alias.*
# only with a value starting with "!" (else it is a git subcommand), submodule.*.update
# likewise.
RUNS_CODE: tuple[str, ...] = (
    "core.hookspath", "core.fsmonitor", "core.sshcommand", "core.pager", "core.editor",
    "core.askpass", "core.gitproxy", "core.alternaterefscommand", "sequence.editor",
    "diff.external", "diff.*.command", "diff.*.textconv", "merge.*.driver",
    "difftool.*.cmd", "mergetool.*.cmd", "filter.*.*", "pager.*", "alias.*",
    "credential.helper", "credential.*.helper", "gpg.program", "gpg.*.program",
    "include.path", "includeif.*.path", "init.templatedir", "remote.*.uploadpack",
    "remote.*.receivepack", "uploadpack.packobjectshook", "protocol.allow",
    "protocol.*.allow", "web.browser", "browser.*.cmd", "man.*.cmd", "submodule.*.update",
    "sendemail.smtpserver", "sendemail.*cmd",
)


def runs_code(key: str, value: str | None) -> bool:
    """Whether the host's git would run something because of this setting (see RUNS_CODE).
    `key` as `parse` gives it."""
    section, _, rest = key.partition(".")
    sub, _, name = rest.rpartition(".")
    shape = f"{section}.{'*.' if sub else ''}{name}"
    if section in ("alias", "submodule") and not (value or "").lstrip().startswith("!"):
        return False
    if section == "filter":
        return bool(sub)
    if section == "pager" and not sub:
        return (value or "").strip().lower() not in ("", "true", "false", "yes", "no", "on",
                                                     "off", "1", "0")
    return any(fnmatch.fnmatchcase(shape, p) for p in RUNS_CODE)


def parse(text: str) -> list[tuple[str, str | None]]:
    """[(key, value)] in file order: key is `section.name` or `section.subsection.name`
    (section and name lowercased, the subsection as written); value is None for a bare
    `name` (git's boolean true). ConfigError where git would stop too."""
    return _Parser(text).entries()


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_SECTION_CHARS = _NAME_CHARS | {"."}
_ESCAPES = {"n": "\n", "t": "\t", "b": "\b", "\\": "\\", '"': '"'}


class _Parser:
    def __init__(self, text: str):
        self.s = text[1:] if text.startswith("\ufeff") else text
        self.i = 0
        self.line = 1

    def error(self, what: str) -> ConfigError:
        return ConfigError(f"bad config line {self.line}: {what}")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def take(self) -> str:
        c = self.peek()
        self.i += 1
        if c == "\n":
            self.line += 1
        return c

    def skip_blank(self) -> None:
        while self.peek() in (" ", "\t"):
            self.take()

    def skip_line(self) -> None:
        while self.peek() not in ("", "\n"):
            self.take()

    def entries(self) -> list[tuple[str, str | None]]:
        out: list[tuple[str, str | None]] = []
        section: str | None = None
        while self.i < len(self.s):
            c = self.peek()
            if c in (" ", "\t", "\r", "\n"):
                self.take()
            elif c in ("#", ";"):
                self.skip_line()
            elif c == "[":
                section = self.section()
            elif c.isalpha():
                if section is None:
                    raise self.error("a setting before any [section]")
                name, value = self.setting()
                out.append((f"{section}.{name}", value))
            else:
                raise self.error(f"unexpected {c!r}")
        return out

    def section(self) -> str:
        self.take()  # [
        name = ""
        while self.peek() in _SECTION_CHARS and self.peek():
            name += self.take()
        if not name:
            raise self.error("empty section name")
        if self.peek() == "]":
            self.take()
            if "." in name:  # [section.subsection], the old form: lowercased throughout
                head, _, sub = name.partition(".")
                return f"{head.lower()}.{sub.lower()}"
            return name.lower()
        if self.peek() not in (" ", "\t"):
            raise self.error("bad section header")
        if "." in name:
            raise self.error("a dotted section name with a quoted subsection")
        self.skip_blank()
        if self.take() != '"':
            raise self.error("a subsection must be quoted")
        sub = ""
        while True:
            c = self.take()
            if c in ("", "\n"):
                raise self.error("unterminated subsection")
            if c == '"':
                break
            if c == "\\":
                c = self.take()
                if c in ("", "\n"):
                    raise self.error("unterminated subsection")
            sub += c
        if self.take() != "]":
            raise self.error("bad section header")
        return f"{name.lower()}.{sub}"

    def setting(self) -> tuple[str, str | None]:
        name = ""
        while self.peek() and self.peek() in _NAME_CHARS:
            name += self.take()
        self.skip_blank()
        c = self.peek()
        if c in ("", "\n", "\r", "#", ";"):
            return name.lower(), None
        if c != "=":
            raise self.error(f"bad setting {name!r}")
        self.take()
        return name.lower(), self.value()

    def value(self) -> str:
        out: list[str] = []
        pending_space = ""  # blanks kept only if something follows them on the line
        quoted = False
        while True:
            c = self.peek()
            if c == "":
                if quoted:
                    raise self.error("unterminated quote")
                break
            if c == "\n":
                if quoted:
                    raise self.error("unterminated quote")
                break
            self.take()
            if not quoted and c in (" ", "\t"):
                if out:
                    pending_space += c
                continue
            if not quoted and c in ("#", ";"):
                self.skip_line()
                break
            if c == "\r" and self.peek() == "\n":
                continue
            if pending_space:
                out.append(pending_space)
                pending_space = ""
            if c == "\\":
                e = self.take()
                if e == "\n":
                    continue  # a continuation line
                if e == "\r" and self.peek() == "\n":
                    self.take()
                    continue
                if e not in _ESCAPES:
                    raise self.error(f"bad escape \\{e}")
                out.append(_ESCAPES[e])
            elif c == '"':
                quoted = not quoted
            else:
                out.append(c)
        return "".join(out)
