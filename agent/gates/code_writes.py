"""Plan mode's early refusal of code: the first plain write in Python or Node source, or None.

Pure: text in, a reason (what writes) or None out. Python is read through its AST (`value >>
16` is arithmetic, `open(p, m)` with a mode only known at run time counts as a write); Node by
a few patterns. A write whose every target is plainly in the session's scratch folder
(`open('/tmp/x', 'w')`) is no write to the workspace, and passes: the system prompt offers /tmp
as scratch space. These are no guard (agent/gates/modes.py says what is): a write they miss is
refused by the operating system.
"""

from __future__ import annotations

import ast
import posixpath
import re

__all__ = ["python_write", "node_write", "harmless"]

HARMLESS_TARGETS = frozenset(["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"])
# The session's scratch folder: writable in plan mode too, and the system prompt says so.
SCRATCH = "/tmp/"


def harmless(path: str) -> bool:
    """A path written to that is no file of the workspace: a device, or the scratch folder."""
    return path in HARMLESS_TARGETS or \
        posixpath.normpath(path).startswith(SCRATCH) and path.startswith(SCRATCH)


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
        isinstance(a, ast.Constant) and isinstance(a.value, str) and harmless(a.value)
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
