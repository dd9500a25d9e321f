"""The layers the folders show: who may import whom, and how long a module may be.

Read from the source with ast, so a rule holds for imports inside functions and under
`if TYPE_CHECKING:` too (except where a rule names that as allowed)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 400
# The one long module the issue allows: the launcher runs in the sandbox as one file.
LONG_ALLOWED = {"driver/launcher.py"}

LAYERS = ("wire", "runtime", "client", "sandbox", "tools", "daemon", "cluster", "cli")
# Layer of the importing module -> layers it may import at all.
ALLOWED = {
    "wire": {"wire"},
    "runtime": {"runtime"},
    "client": {"wire", "client"},
    "sandbox": {"runtime", "sandbox", "driver"},
    "tools": {"wire", "runtime", "sandbox", "tools", "driver"},
    "daemon": {"wire", "runtime", "sandbox", "tools", "daemon", "driver"},
    # The cluster starts daemons as processes (`toolsd serve`) and talks to them as a client.
    "cluster": {"wire", "client", "cluster"},
    "cli": {"wire", "client", "cli"},
}
# `toolsd serve` starts the daemon and `toolsd doctor` probes bubblewrap: both import inside
# the command's function, so the other subcommands load none of it.
EXCEPTIONS = {("toolsd.cli.serve", "toolsd.daemon.serve"),
              ("toolsd.cli.doctor", "toolsd.sandbox.launch.probe"),
              ("toolsd.cli.doctor", "toolsd.sandbox.launch.host_checks"),
              ("toolsd.cli.cluster", "toolsd.cluster")}
# The agent's subpackages, lowest first: a module may import its own subpackage and those
# before it, never one after it (no circle between them), and nothing of the agent lives
# outside them (a flat module beside them would be a layer of no known place).
AGENT_LAYERS = ("history", "models", "conversation", "calls", "lsp", "gates", "turns",
                "terminal", "mcp")
# sandbox/'s subsystems, bottom up: each imports only the ones before it (and errors.py).
SANDBOX_PARTS = ("bwrap", "git_watch", "egress", "launch")
# The server: what reads the socket and routes requests. Tools never see it.
SERVER = ("toolsd.daemon.serve", "toolsd.daemon.connection", "toolsd.daemon.dispatch",
          "toolsd.daemon.requests")


def python_files(*patterns: str) -> list[pathlib.Path]:
    return sorted(p for pattern in patterns for p in ROOT.glob(pattern))


def module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports(path: pathlib.Path):
    """(imported module, line, whether under `if TYPE_CHECKING:`) for every import in the
    file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                up = parts[: len(parts) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from a import b` imports module a.b when there is one, else a name of a.
            targets = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            yield target, node.lineno, id(node) in typing_only


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "driver":
        return "driver"
    if parts[0] == "toolsd" and len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return None


def agent_layer(module: str) -> str | None:
    """The agent subpackage a module of the agent's is in ("" for a flat module)."""
    parts = module.split(".")
    if parts[0] != "agent" or len(parts) == 1:
        return None
    return parts[1] if _is_package(".".join(parts[:2])) else ""


def _is_package(name: str) -> bool:
    return (ROOT.joinpath(*name.split(".")) / "__init__.py").is_file()


def ours(module: str) -> bool:
    return layer(module) is not None or module.split(".")[0] == "agent"


def where(path: pathlib.Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_no_flat_modules_left():
    flat = sorted(p.name for p in (ROOT / "toolsd").glob("*.py"))
    assert flat == ["__init__.py", "__main__.py"], flat


def test_every_import_follows_the_layers():
    bad = []
    for path in python_files("toolsd/**/*.py"):
        name = module_name(path)
        mine = layer(name)
        if mine is None:
            continue
        for target, line, _ in imports(path):
            theirs = layer(target)
            if theirs is None or (name, target) in EXCEPTIONS:
                continue
            if mine == "tools" and target.startswith(SERVER):
                bad.append(f"{where(path, line)}: tools may not import the server ({target})")
            elif theirs not in ALLOWED[mine]:
                bad.append(f"{where(path, line)}: {mine} may not import {target}")
    assert bad == [], "\n".join(bad)


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (under TYPE_CHECKING and inside functions
    too): a package's import of `a.b.c` counts as importing the module a.b.c."""
    graph: dict[str, set[str]] = {}
    for path in python_files("toolsd/**/*.py", "driver/*.py", "agent/**/*.py"):
        graph[module_name(path)] = {t for t, _, _ in imports(path) if ours(t) and _is_module(t)}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def folder(module: str) -> str:
    """The package a module is in (a package is its own)."""
    if (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file():
        return module
    return module.rpartition(".")[0]


def test_no_import_circle_spans_two_folders():
    # A circle inside one folder is one job split in files; across folders, a layer that
    # depends on the one above it.
    wide = [sorted(c) for c in strongly_connected(import_graph())
            if len({folder(m) for m in c}) > 1]
    assert wide == [], "import circles across folders:\n" + "\n".join(map(str, wide))


def test_no_import_circle_in_the_agent():
    # The agent's jobs are small enough to need none even inside a folder: the turn loop once
    # imported the Agent that runs it (under TYPE_CHECKING), and the Agent the loop.
    circles = [sorted(c) for c in strongly_connected(import_graph())
               if any(m.split(".")[0] == "agent" for m in c)]
    assert circles == [], "import circles in agent/:\n" + "\n".join(map(str, circles))


def test_no_import_circle_in_the_daemon():
    # The Supervisor owns sessions, the spare pool and the tenants' check, and each of them
    # once imported it back (under TYPE_CHECKING) to read a dozen of its fields: they take
    # what they need of it as a Protocol (SessionOwner, SpareOwner, tenants.Registry), so
    # that each can change, and be read, without the Supervisor.
    circles = [sorted(c) for c in strongly_connected(import_graph())
               if any(m.startswith("toolsd.daemon.") for m in c)]
    assert circles == [], "import circles in toolsd/daemon:\n" + "\n".join(map(str, circles))


def test_the_agent_is_in_its_subpackages():
    flat = sorted(p.name for p in (ROOT / "agent").glob("*.py"))
    folders = sorted(p.parent.name for p in (ROOT / "agent").glob("*/*.py"))
    assert flat == ["__init__.py"], flat
    assert set(folders) == set(AGENT_LAYERS), set(folders) ^ set(AGENT_LAYERS)
    # Each is a package, so that the install (`agent*` in pyproject.toml) takes it.
    missing = [f for f in AGENT_LAYERS if not _is_package(f"agent.{f}")]
    assert missing == [], missing


def test_agent_subpackages_import_only_downward():
    bad = []
    for path in python_files("agent/**/*.py"):
        mine = agent_layer(module_name(path))
        if not mine:
            continue
        for target, line, _ in imports(path):
            theirs = agent_layer(target)
            if theirs is None or theirs == mine:
                continue
            if theirs not in AGENT_LAYERS:
                bad.append(f"{where(path, line)}: {mine} imports {target}, in no subpackage")
            elif AGENT_LAYERS.index(theirs) > AGENT_LAYERS.index(mine):
                bad.append(f"{where(path, line)}: {mine} may not import {theirs} ({target})")
    assert bad == [], "\n".join(dict.fromkeys(bad))


def test_the_sandbox_is_in_its_subsystems():
    # It was 28 flat files mixing the bwrap policy, the launcher and the host_exec watch.
    sandbox = ROOT / "toolsd" / "sandbox"
    flat = sorted(p.name for p in sandbox.glob("*.py"))
    assert flat == ["__init__.py", "errors.py", "session_sandbox.py"], flat
    parts = sorted(p.parent.name for p in sandbox.glob("*/__init__.py"))
    assert parts == sorted(SANDBOX_PARTS), parts


def test_sandbox_subsystems_import_only_downward():
    bad = []
    for path in python_files("toolsd/sandbox/*/*.py"):
        mine = module_name(path).split(".")[2]
        for target, line, _ in imports(path):
            parts = target.split(".")
            if parts[:2] != ["toolsd", "sandbox"] or len(parts) < 3 or parts[2] == mine:
                continue
            theirs = parts[2]
            if theirs == "errors":
                continue
            if theirs not in SANDBOX_PARTS or (SANDBOX_PARTS.index(theirs)
                                               > SANDBOX_PARTS.index(mine)):
                bad.append(f"{where(path, line)}: sandbox/{mine} may not import {target}")
    assert bad == [], "\n".join(dict.fromkeys(bad))


def test_the_exceptions_import_inside_their_function():
    # At module level they would load the daemon for every subcommand.
    bad = []
    for name, target in sorted(EXCEPTIONS):
        path = ROOT / (name.replace(".", "/") + ".py")
        top = {stmt.lineno for stmt in ast.parse(path.read_text()).body
               if isinstance(stmt, (ast.Import, ast.ImportFrom))}
        bad += [f"{where(path, line)}: imports {target} at module level"
                for t, line, _ in imports(path) if t == target and line in top]
    assert bad == [], "\n".join(bad)


def test_driver_and_agent_stay_on_their_side():
    bad = []
    # The drivers run in the sandbox under `python -I -S`: at module level the standard
    # library only. Inside a function a driver may reach the user's packages (the figure
    # hook imports the user's matplotlib), never toolsd's own code or its dependencies.
    ours = {"toolsd", "agent", "msgspec", "psutil", "trio", "re2", "PIL"}
    # A driver's own parts (driver/_python_repl_*.py) are modules beside it.
    parts = {p.stem for p in python_files("driver/_*.py")} - {"__init__"}
    for path in python_files("driver/*.py"):
        top_lines = _module_level_imports(path)
        for target, line, _ in imports(path):
            top = target.split(".")[0]
            if top in ours or (line in top_lines and top not in sys.stdlib_module_names
                               and top != "driver" and top not in parts):
                bad.append(f"{where(path, line)}: a driver may not import {target}")
    # The agent speaks to the daemon only through the client (and the wire it speaks).
    for path in python_files("agent/**/*.py"):
        for target, line, _ in imports(path):
            theirs = layer(target)
            if target.split(".")[0] == "toolsd" and theirs not in ("client", "wire") and (
                    target != "toolsd"):
                bad.append(f"{where(path, line)}: the agent may not import {target}")
    assert bad == [], "\n".join(bad)


def _module_level_imports(path: pathlib.Path) -> set[int]:
    """The lines of the imports that run when the module loads (also under `try:` or `if`),
    not those inside a function or class."""
    lines, pending = set(), list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines.add(node.lineno)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            pending += [n for n in ast.iter_child_nodes(node)
                        if isinstance(n, (ast.stmt, ast.excepthandler))]
    return lines


def _line_counts() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
            for p in python_files("toolsd/**/*.py", "driver/*.py", "agent/**/*.py")}


def test_no_module_over_400_lines():
    long = [f"{rel}: {n} lines" for rel, n in _line_counts().items()
            if n > MAX_LINES and rel not in LONG_ALLOWED]
    assert long == [], f"over {MAX_LINES} lines (split by job):\n" + "\n".join(long)


def test_the_cli_and_the_client_load_no_daemon_machinery():
    # What `toolsd ps` costs to start: the cli once pulled trio, psutil and re2 (through the
    # daemon's processes module) for one constant of the wire format.
    code = ("import sys, toolsd.cli.main, toolsd.client; "
            "print(sorted(m for m in ('trio', 'psutil', 're2', 'PIL', 'toolsd.daemon', "
            "'toolsd.sandbox', 'toolsd.tools') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_every_module_imports_on_its_own():
    # An import cycle shows as an ImportError when a module of the cycle is imported first.
    names = [module_name(p) for p in python_files("toolsd/**/*.py", "agent/**/*.py")
             if p.name != "__main__.py"]
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    for m in [k for k in sys.modules if k.split('.')[0] in ('toolsd', 'agent')]:\n"
            "        del sys.modules[m]\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except Exception as e:\n"
            "        print(f'{name}: {type(e).__name__}: {e}')\n")
    out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "", out.stdout


# Folders whose modules mirror the contract's names on purpose (wire/files.py holds the
# shapes of the file.* methods tools/files.py carries out; cli/serve.py is `toolsd serve`).
MIRRORS = ("toolsd/wire/", "toolsd/cli/")


def _names_used_twice(paths, name_of) -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for path in paths:
        for name in name_of(path):
            where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return {name: places for name, places in where.items() if len(places) > 1}


def _classes(path: pathlib.Path) -> list[str]:
    return [node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)]


def test_no_two_classes_share_a_name():
    # One name, one class: a reader (or a grep) who meets `Gate` or `Launcher` knows which
    # one it is (there were two Launchers, the daemon's handle and the sandbox's init).
    twice = _names_used_twice(python_files("toolsd/**/*.py", "driver/*.py", "agent/**/*.py"),
                              _classes)
    assert twice == {}, "\n".join(f"class {n}: {', '.join(p)}" for n, p in twice.items())


def test_no_two_modules_share_a_name():
    # job.py next to jobs.py, two launcher.py, two relay.py: a name that says the job once.
    # (agent/ is read by subpackage, agent/mcp/server.py; it is held to one class a name.)
    paths = [p for p in python_files("toolsd/**/*.py", "driver/*.py")
             if p.name != "__init__.py"
             and not str(p.relative_to(ROOT)).startswith(MIRRORS)]
    # A plural counts as its singular: jobs.py was the spawning of job.py's Job.
    twice = _names_used_twice(paths, lambda p: [p.stem.removesuffix("s")])
    assert twice == {}, "\n".join(f"{n}.py: {', '.join(p)}" for n, p in twice.items())
