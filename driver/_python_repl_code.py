"""A cell's code for the Python driver: dedented, compiled, and its traceback the user's.

No I/O: text in, code objects or text out. Standard library only.
"""

import ast
import traceback

from _python_repl_stdlib import stdlib_module

CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect at startup


def dedent(source):
    """An indented cell, dedented (models send them); one whose first line is not indented,
    as it is."""
    if source.lstrip("\r\n")[:1] not in (" ", "\t"):
        return source
    return stdlib_module("textwrap").dedent(source)


def compile_cell(source, filename):
    """Code objects for one request: the body, then a last expression in "single" mode."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return [compile(tree, filename, "exec", flags, dont_inherit=True)]
    body = ast.Module(body=tree.body[:-1], type_ignores=[])
    last = ast.Interactive(body=tree.body[-1:])
    return [
        compile(body, filename, "exec", flags, dont_inherit=True),
        compile(last, filename, "single", flags, dont_inherit=True),
    ]


def awaits(codes):
    """Whether a cell's code awaits at its top level."""
    return any(code.co_flags & CO_COROUTINE for code in codes)


def format_user_exception(exc, driver_files):
    """The traceback without the frames of `driver_files` (nor asyncio's, ahead of the
    user's)."""
    te = traceback.TracebackException.from_exception(exc)
    seen = set()
    pending = [te]
    while pending:
        item = pending.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        frames = [f for f in item.stack if f.filename not in driver_files]
        first_user = next(
            (i for i, f in enumerate(frames) if f.filename.startswith("<repl-")), None
        )
        if first_user is None:
            # No frame of the user's. An interrupt that came while the asyncio loop waited
            # has only the loop's frames: none of them helps the user.
            first_user = len(frames) if item.exc_type is KeyboardInterrupt else 0
        item.stack = traceback.StackSummary.from_list(frames[first_user:])
        pending += [item.__cause__, item.__context__, *(item.exceptions or ())]
    return te.format()


def exit_code(code):
    """The status a process ends with for SystemExit(code)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
