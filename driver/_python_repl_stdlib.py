"""The standard library's modules for the Python driver's late imports, never a user's module
of the same name (a `textwrap.py` or `asyncio.py` in the workspace). Standard library only."""

import importlib
import os
import sys

_STDLIB = os.path.dirname(os.path.abspath(os.__file__))


def _is_stdlib_dir(path):
    if not path:
        return False  # "": the current folder, the user's
    path = os.path.abspath(path)
    return path == _STDLIB or path.startswith(_STDLIB + os.sep) or (
        path.endswith(".zip") and path.startswith(sys.base_prefix))


def stdlib_module(name):
    """The standard library's `name`. The driver imports some modules only when first needed,
    when the user's folders come first on sys.path: a module of theirs must not stand in for
    the standard one (theirs raising at import would end the driver). A user's module already
    imported under that name stays theirs in sys.modules."""
    module = sys.modules.get(name)
    if module is not None and _is_stdlib_dir(os.path.dirname(getattr(module, "__file__", None)
                                                             or _STDLIB)):
        return module
    saved_path = sys.path[:]
    users = sys.modules.pop(name, None)
    sys.path[:] = [p for p in saved_path if _is_stdlib_dir(p)]
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved_path
        if users is not None:
            sys.modules[name] = users
