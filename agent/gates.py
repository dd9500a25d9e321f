"""Approval modes, and the classifiers that refuse a write early in plan mode.

- `auto`: every call runs.
- `ask`: reading tools run at once; shell, REPL and process calls wait for a person's answer
  (the `approve` callback: yes, no, or "always" for that tool from then on).
- `plan`: read-only. The session itself is opened with `writable: false` (Agent does it), so
  the operating system refuses every write to the workspace whatever the code looks like.
  The classifiers below only give the model an early, clear refusal for what plainly writes;
  they are not the guard (the seeds' agent relied on classifiers that failed open: a mode in
  a variable slipped through).

The classifiers are pure: text in, a reason (what writes) or None out. Shell text is read
with shlex after arithmetic and tests are set aside (`$((x >> 16))` is no redirect); Python
through its AST (`value >> 16` is arithmetic, `open(p, m)` with a mode only known at run
time counts as a write); Node by a few patterns. A write whose every target is plainly in the
session's scratch folder (`> /tmp/out.txt`, `open('/tmp/x', 'w')`) is no write to the
workspace, and passes: the system prompt offers /tmp as scratch space.
"""

from __future__ import annotations

import ast
import enum
import posixpath
import re
import shlex
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from agent.history import ToolCall
from agent.tools import READ_ONLY, spec

__all__ = ["Mode", "Gate", "Decision", "Approver", "shell_write", "python_write", "node_write",
           "plan_refusal"]


class Mode(enum.Enum):
    PLAN = "plan"
    ASK = "ask"
    AUTO = "auto"


Answer = bool | Literal["always"]
Approver = Callable[[ToolCall], Awaitable[Answer]]


class Decision(msgspec.Struct, frozen=True):
    """`message` is what the model is told instead of a result when the call does not run;
    `asked`: a person answered (the answer is `allowed`)."""

    allowed: bool
    message: str = ""
    asked: bool = False


class Gate:
    """Decides, per call, whether it runs. Owns the "always" answers of its conversation."""

    def __init__(self, mode: Mode | str, approve: Approver | None = None):
        self.mode = Mode(mode)
        if self.mode is Mode.ASK and approve is None:
            raise ValueError("ask mode needs an approve callback (or use mode 'auto' or 'plan')")
        self.approve = approve
        self.always: set[str] = set()

    async def check(self, call: ToolCall) -> Decision:
        if call.name in READ_ONLY or self.mode is Mode.AUTO:
            return Decision(True)
        if call.error is not None or spec(call.name) is None:
            return Decision(True)  # nothing runs: the backend tells the model what is wrong
        if self.mode is Mode.PLAN:
            reason = plan_refusal(call)
            if reason is None:
                return Decision(True)
            return Decision(False, f"Plan mode is read-only, and this would write ({reason}). "
                                   f"Do not try another way: describe the change instead.")
        if call.name in self.always:
            return Decision(True)
        answer = await self.approve(call)
        if answer == "always":
            self.always.add(call.name)
        if answer:
            return Decision(True, asked=True)
        return Decision(False, "The user declined this call. Ask them, or do something else.",
                        asked=True)


def plan_refusal(call: ToolCall) -> str | None:
    """What in the call plainly writes, or None (it may still write: the OS refuses then)."""
    args = call.arguments
    if call.name in ("run_terminal", "process_start") and isinstance(args.get("command"), str):
        return shell_write(args["command"])
    if call.name == "repl" and isinstance(args.get("code"), str):
        if args.get("language") == "node":
            return node_write(args["code"])
        return python_write(args["code"])
    return None


# ---------------------------------------------------------------- shell

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
HARMLESS_TARGETS = frozenset(["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"])
# The session's scratch folder: writable in plan mode too, and the system prompt says so.
SCRATCH = "/tmp/"
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
            if not _harmless(target):
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


def _harmless(path: str) -> bool:
    """A path written to that is no file of the workspace: a device, or the scratch folder."""
    return path in HARMLESS_TARGETS or \
        posixpath.normpath(path).startswith(SCRATCH) and path.startswith(SCRATCH)


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
        if all(_harmless(t) for t in targets) and (targets or name in ("tee", "dd")):
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


# ---------------------------------------------------------------- python

_OPEN = frozenset(["open", "io.open", "builtins.open", "codecs.open"])
_CALL_WRITES = frozenset("""os.remove os.unlink os.rmdir os.removedirs os.rename os.renames
os.replace os.mkdir os.makedirs os.chmod os.lchmod os.chown os.lchown os.link os.symlink
os.truncate os.ftruncate os.mkfifo os.mknod os.utime os.system os.popen os.execv os.execve
os.execvp os.execvpe os.execl os.execle os.execlp os.execlpe os.spawnv os.spawnve os.spawnvp
os.spawnvpe os.spawnl os.spawnle os.spawnlp os.spawnlpe os.posix_spawn os.posix_spawnp
shutil.copy shutil.copy2 shutil.copyfile shutil.copytree shutil.move shutil.rmtree
shutil.make_archive shutil.unpack_archive shutil.chown shutil.copymode shutil.copystat
subprocess.run subprocess.call subprocess.check_call subprocess.check_output subprocess.Popen
subprocess.getoutput subprocess.getstatusoutput pty.spawn
numpy.save numpy.savez numpy.savez_compressed numpy.savetxt torch.save joblib.dump
tempfile.mkdtemp""".split())
# Method names that write whatever they are called on.
_METHOD_WRITES = frozenset("""write_text write_bytes unlink rmdir touch mkdir symlink_to
hardlink_to link_to savefig""".split())
# pandas-style writers: with a path, they write a file; without one they return text.
_TO_FILE = frozenset("""to_csv to_json to_excel to_parquet to_pickle to_feather to_hdf
to_html to_latex to_markdown to_stata to_orc""".split())
_PATH_TYPES = frozenset(["pathlib.Path", "pathlib.PosixPath", "pathlib.PurePath", "Path"])
# Of those, the ones that run a program (its first argument is a command, not a path), and
# those that write their second path argument.
_RUNS = ("os.system", "os.popen", "os.exec", "os.spawn", "os.posix_spawn", "subprocess.",
         "pty.")
_TWO_PATHS = frozenset("""os.rename os.renames os.replace os.link os.symlink shutil.copy
shutil.copy2 shutil.copyfile shutil.copytree shutil.move shutil.copymode
shutil.copystat""".split())


def python_write(code: str) -> str | None:
    """The first plain write in Python source, as a short reason, or None."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        return None  # the interpreter will say what is wrong
    return _PythonReader().read(tree)


class _PythonReader:
    def __init__(self):
        self.aliases: dict[str, str] = {"np": "numpy", "pd": "pandas"}
        self.paths: set[str] = set()  # names bound to a pathlib.Path

    def read(self, tree: ast.AST) -> str | None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = \
                        a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Assign) and self._is_path(node.value):
                self.paths.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                reason = self._call(node)
                if reason:
                    return reason
        return None

    def _name(self, node: ast.AST) -> str | None:
        """A dotted name with its import resolved: `o.remove` -> `os.remove`."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self._name(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "__import__" and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            return node.args[0].value
        return None

    def _is_path(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            return self._name(node.func) in _PATH_TYPES
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return self._is_path(node.left)
        if isinstance(node, ast.Name):
            return node.id in self.paths
        return False

    def _call(self, node: ast.Call) -> str | None:
        name = self._name(node.func)
        if name in _OPEN:
            return None if _in_scratch(node, 1) else _open_mode_writes(node, 1, name)
        if name == "os.open":
            flags = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(flags, ast.Attribute) and flags.attr == "O_RDONLY"):
                return "os.open with flags other than O_RDONLY"
        if name in _CALL_WRITES:
            if not name.startswith(_RUNS) and _in_scratch(node, 2 if name in _TWO_PATHS else 1):
                return None
            return f"{name}()"
        if name in ("exec", "eval", "builtins.exec") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            return python_write(node.args[0].value)
        if not isinstance(node.func, ast.Attribute):
            return None
        method = node.func.attr
        if method == "savefig" and _in_scratch(node, 1):
            return None
        if method in _METHOD_WRITES:
            return f".{method}()"
        if method == "open" and self._is_path(node.func.value):
            return _open_mode_writes(node, 0, "Path.open")
        if method in ("rename", "replace", "chmod") and self._is_path(node.func.value):
            return f"Path.{method}()"
        if method in _TO_FILE and not _in_scratch(node, 1) and (node.args or any(
                k.arg in ("path", "path_or_buf", "excel_writer", "buf") for k in node.keywords)):
            return f".{method}(path)"
        return None


def _in_scratch(node: ast.Call, paths: int) -> bool:
    """Whether the call's first `paths` arguments are literal paths in the scratch folder (or
    devices)."""
    found = node.args[:paths]
    return len(found) == paths and all(
        isinstance(a, ast.Constant) and isinstance(a.value, str) and _harmless(a.value)
        for a in found)


def _open_mode_writes(node: ast.Call, index: int, name: str) -> str | None:
    mode = node.args[index] if len(node.args) > index else None
    for k in node.keywords:
        if k.arg == "mode":
            mode = k.value
    if mode is None:
        return None
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return f"{name}(..., {mode.value!r})" if set(mode.value) & set("wax+") else None
    return f"{name}(...) with a mode only known at run time"


# ---------------------------------------------------------------- node

_NODE_WRITES = re.compile(
    r"\b(writeFile|writeFileSync|appendFile|appendFileSync|unlink|unlinkSync|rm|rmSync|rmdir|"
    r"rmdirSync|mkdir|mkdirSync|rename|renameSync|copyFile|copyFileSync|cp|cpSync|"
    r"createWriteStream|truncate|truncateSync|symlink|symlinkSync|chmod|chmodSync|execSync|"
    r"spawnSync|execFileSync|exec|spawn|execFile|fork)\s*\(")


def node_write(code: str) -> str | None:
    m = _NODE_WRITES.search(code)
    return f"{m.group(1)}()" if m else None
