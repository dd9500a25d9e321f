"""Plan mode's early refusal of shell text: the first plain write in it, or None.

Pure: text in, a reason (what writes) or None out. Shell text is read with shlex after
arithmetic and tests are set aside (`$((x >> 16))` is no redirect); the programs it runs
inline (`python3 -c`, `node -e`, `sh -c`, here-documents fed to them) are read as what they
are (agent/gates/code_writes.py). A write whose every target is plainly in the session's scratch
folder (`> /tmp/out.txt`) is no write to the workspace, and passes. These are no guard
(agent/gates/modes.py says what is): a write they miss is refused by the operating system.
"""

from __future__ import annotations

import re
import shlex

from agent.gates.code_writes import harmless, node_write, python_write

__all__ = ["shell_write"]


# Commands that change files whatever their arguments.
WRITERS = frozenset("""rm rmdir mv cp mkdir touch ln chmod chown chgrp truncate shred unlink
mkfifo mknod install rsync patch dd tee""".split())
# Subcommands that write, for commands that also have reading ones.
WRITING_SUBCOMMANDS = {
    "git": frozenset("""add am apply checkout cherry-pick clean clone commit fetch gc init merge
        mv pull push rebase reset restore revert rm stash switch worktree""".split()),
    "pip": frozenset(["install", "uninstall", "download", "wheel"]),
    "pip3": frozenset(["install", "uninstall", "download", "wheel"]),
    "npm": frozenset(["install", "i", "ci", "add", "uninstall", "remove", "rm", "update",
                      "link", "publish"]),
    "yarn": frozenset(["add", "install", "remove", "upgrade", "link"]),
    "pnpm": frozenset(["add", "install", "i", "remove", "rm", "update", "link"]),
    "apt": frozenset(["install", "remove", "purge", "upgrade"]),
    "apt-get": frozenset(["install", "remove", "purge", "upgrade", "dist-upgrade"]),
    "cargo": frozenset(["install", "add", "remove", "new", "init"]),
    "go": frozenset(["install", "get", "mod"]),
}
# Words that run the command after them, and those of their options that take a value (the
# command is after it).
WRAPPERS = frozenset("""sudo doas env nice nohup time command exec builtin stdbuf ionice xargs
timeout""".split())
WRAPPER_OPTION_VALUES = {
    "sudo": frozenset("-u -g -C -h -p -r -t -U -D".split()),
    "doas": frozenset(["-u", "-C"]),
    "env": frozenset(["-u", "-C", "--unset", "--chdir"]),
    "nice": frozenset(["-n", "--adjustment"]),
    "ionice": frozenset(["-c", "-n", "-p", "--class", "--classdata"]),
    "timeout": frozenset(["-s", "-k", "--signal", "--kill-after"]),
    "xargs": frozenset("-I -n -P -L -d -E -s -a".split()),
    "stdbuf": frozenset(["-i", "-o", "-e"]),
    "time": frozenset(["-f", "-o", "--format", "--output"]),
}
# git's options before its subcommand that take a value.
GIT_OPTION_VALUES = frozenset(["-C", "-c", "--git-dir", "--work-tree", "--namespace"])
SHELLS = frozenset("sh bash dash zsh ksh".split())
PYTHONS = re.compile(r"^python(\d+(\.\d+)?)?$")
NODES = frozenset(["node", "nodejs"])
SEPARATORS = frozenset([";", ";;", "&", "&&", "|", "||", "|&", "(", ")", "\n"])

# Set aside before reading: arithmetic ($((..)), ((..))) and [[ .. ]] tests, where > and >>
# are comparisons and shifts, not redirections.
_ARITHMETIC = re.compile(r"\$?\(\(.*?\)\)|\[\[.*?\]\]", re.S)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def shell_write(command: str, depth: int = 0) -> str | None:
    """The first plain write in shell text, as a short reason, or None."""
    if depth > 3:
        return None
    command, bodies = _split_heredocs(command)
    try:
        words = _shell_words(_ARITHMETIC.sub(" 0 ", command))
    except ValueError:
        return None  # unbalanced quotes: bash will say so
    for i, word in enumerate(words):
        if word in (">", ">>", ">|", "&>", "&>>", "<>", ">&"):
            target = words[i + 1] if i + 1 < len(words) else ""
            if word == ">&" and (target.isdigit() or target == "-"):
                continue  # 2>&1: a descriptor, not a file
            if not harmless(target):
                return f"`{word} {target}` writes a file"
    for simple in _simple_commands(words):
        reason = _command_write(simple, depth)
        if reason:
            return reason
    for program, body in bodies:
        if program == "python":
            reason = python_write(body)
        elif program == "shell":
            reason = shell_write(body, depth + 1)
        else:
            reason = None
        if reason:
            return reason
    return None


def _split_heredocs(text: str) -> tuple[str, list[tuple[str, str]]]:
    """Text without here-document bodies, and the bodies fed to python or a shell (which are
    read as such); other bodies are data, never commands."""
    lines = text.split("\n")
    kept, bodies = [], []
    i = 0
    while i < len(lines):
        line = lines[i]
        kept.append(line)
        i += 1
        for m in _HEREDOC.finditer(line):
            body = []
            while i < len(lines) and lines[i].strip() != m.group(2):
                body.append(lines[i])
                i += 1
            i += 1  # the delimiter
            first = line.split()[0] if line.split() else ""
            program = "python" if PYTHONS.match(first.rsplit("/", 1)[-1]) else \
                "shell" if first.rsplit("/", 1)[-1] in SHELLS else ""
            bodies.append((program, "\n".join(body)))
    return "\n".join(kept), bodies


def _shell_words(text: str) -> list[str]:
    lex = shlex.shlex(text, posix=True, punctuation_chars="();<>|&\n")
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def _simple_commands(words: list[str]) -> list[list[str]]:
    commands, current = [], []
    for word in words:
        if word in SEPARATORS:
            if current:
                commands.append(current)
            current = []
        elif word in ("-exec", "-execdir", "-ok"):  # find: what follows is a command
            commands.append(current + [word])
            current = []
        else:
            current.append(word)
    if current:
        commands.append(current)
    return commands


def _after_options(words: list[str], takes_value: frozenset[str]) -> list[str]:
    """`words` from the first that is not an option (nor the value of one)."""
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        i += 2 if words[i] in takes_value else 1
    return words[i:]


def _command_write(words: list[str], depth: int) -> str | None:
    words = _strip_redirections(words)
    while words:  # what runs the command: assignments, wrappers and their options
        first = words[0]
        if _ASSIGNMENT.match(first):
            words = words[1:]
        elif first == "command" and words[1:2] in (["-v"], ["-V"]):
            return None  # a lookup: it runs nothing
        elif first in WRAPPERS:
            words = _after_options(words[1:], WRAPPER_OPTION_VALUES.get(first, frozenset()))
            if first == "timeout":
                words = words[1:]  # its duration
        else:
            break
    if not words:
        return None
    name = words[0].rsplit("/", 1)[-1]
    args = words[1:]
    if name in WRITERS:
        if name == "dd":
            targets = [a[3:] for a in args if a.startswith("of=")]
        else:
            targets = [a for a in args if not a.startswith("-")]
        if all(harmless(t) for t in targets) and (targets or name in ("tee", "dd")):
            return None  # tee to the terminal, dd to stdout, or only the scratch folder
        return f"`{name}` changes files"
    if name == "sed" and any(a == "-i" or a.startswith("-i") or a == "--in-place" for a in args):
        return "`sed -i` edits files in place"
    if name == "perl" and any(a.startswith("-i") or a.startswith("-pi") for a in args):
        return "`perl -i` edits files in place"
    if name == "find" and any(a in ("-delete", "-fprint", "-fprintf") for a in args):
        return "`find -delete` removes files"
    if name in WRITING_SUBCOMMANDS:
        rest = _after_options(args, GIT_OPTION_VALUES if name == "git" else frozenset())
        sub = rest[0] if rest else ""
        if sub in WRITING_SUBCOMMANDS[name]:
            return f"`{name} {sub}` changes files"
        if name == "git" and sub in ("branch", "tag") and \
                sum(1 for a in rest if not a.startswith("-")) > 1:
            return f"`git {sub} NAME` changes the repository"
    if PYTHONS.match(name):
        if args[:2] == ["-m", "pip"] and len(args) > 2 and args[2] in WRITING_SUBCOMMANDS["pip"]:
            return f"`pip {args[2]}` changes files"
        code = _inline_program(args, "c")
        if code is not None:
            return python_write(code)
    if name in NODES:
        code = _inline_program(args, "ep", ("--eval", "--print"))
        if code is not None:
            return node_write(code)
    if name in SHELLS:
        code = _inline_program(args, "c")
        if code is not None:
            return shell_write(code, depth + 1)
    if name == "eval":
        return shell_write(" ".join(args), depth + 1)
    return None


def _inline_program(args: list[str], letters: str, long: tuple[str, ...] = ()) -> str | None:
    """The program text of `sh -c TEXT`, `bash -lc TEXT`, `python3 -Ic TEXT`, `node -e TEXT`:
    the word after the first option that is one of `long` or ends in one of `letters`."""
    for i, a in enumerate(args[:-1]):
        if a in long or (a.startswith("-") and not a.startswith("--") and len(a) > 1
                         and a[-1] in letters):
            return args[i + 1]
        if not a.startswith("-"):
            return None  # a script file: its arguments are not options of the interpreter
    return None


def _strip_redirections(words: list[str]) -> list[str]:
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word and set(word) <= set("<>&") and word not in ("&",):
            skip = True  # its target
            # "2>" comes as "2", ">": the descriptor before a redirection is no word either
            # (though in `echo 2 > f` it is: dropped all the same, as the redirection is seen).
            if out and out[-1].isdigit():
                out.pop()
            continue
        out.append(word)
    return out
