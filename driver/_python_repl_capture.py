"""Figure capture for the Python driver: the pictures a call makes, saved by python_figures.py.

Matplotlib is never imported here: an import hook sets the backend when the user's code
imports it (unless MPLBACKEND says otherwise), and a displayed value is checked by the name
of its type. python_figures.py is loaded on first need. Standard library only.
"""

import os
import sys

from _python_repl_stdlib import stdlib_module

_FIGURES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_figures.py")
_FIGURES_MODULE = "_toolsd_figures"  # python_figures.MODULE_NAME, without loading it


class FigureCapture:
    """The pictures of the calls of one driver process, saved in `folder`; `note(text)`
    writes a line of toolsd's to the call's output."""

    def __init__(self, folder, note):
        self._folder = folder
        self._note = note
        self._pid = os.getpid()
        self._figures = None  # python_figures.Figures, once loaded

    def install(self):
        sys.displayhook = self._displayhook
        sys.meta_path.insert(0, _MatplotlibHook(self._matplotlib_imported))

    def show_open(self):
        """Save the figures the cell left open or showed (after it ran or failed)."""
        if os.getpid() != self._pid:
            return  # a forked child: its copies of the figures are the parent's to show
        if self._figures is not None and "matplotlib.pyplot" in sys.modules:
            try:
                self._figures.show_open()
            except Exception as exc:
                self._note(f"the open figures could not be saved: {type(exc).__name__}: {exc}")

    def take(self):
        """The pictures of the call that ends (or None): what it left open is closed."""
        if self._figures is None:
            return None
        try:
            self._figures.close_open()  # left by an interrupt or exit(): not kept for later
        except Exception:
            pass
        return self._figures.take()

    def _load(self):
        """driver/python_figures.py, loaded on first need."""
        if self._figures is None:
            util = stdlib_module("importlib.util")
            spec = util.spec_from_file_location(_FIGURES_MODULE, _FIGURES_FILE)
            module = util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[_FIGURES_MODULE] = module  # matplotlib imports it as its backend
            self._figures = module.configure(self._folder, self._note)
        return self._figures

    def _matplotlib_imported(self, matplotlib):
        if os.environ.get("MPLBACKEND"):
            return  # the user's choice
        self._load()
        matplotlib.rcParams["backend"] = "module://" + _FIGURES_MODULE

    def _displayhook(self, value):
        sys.__displayhook__(value)
        if value is not None and _may_be_picture(value):
            self._load().add_value(value)


class _MatplotlibHook:
    """A meta path finder that sees matplotlib's first import and then calls `imported(it)`
    (which sets toolsd's figure backend). The driver itself never imports matplotlib: a call
    that does not plot pays nothing for figures, and an interpreter without matplotlib
    works as before."""

    def __init__(self, imported):
        self._imported = imported
        self._finding = False

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib" or self._finding:
            return None
        self._finding = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None) if finder is not self else None
                spec = find(name, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._finding = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenCall(spec.loader, self._imported)
        return spec


class _ThenCall:
    """A module's own loader, and then `after(module)` once the module has run."""

    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._after(module)
        except Exception:
            pass  # no figures then; the user's import still works

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _may_be_picture(value):
    """Whether a displayed value may be a picture, without importing anything."""
    kind = type(value)
    module = getattr(kind, "__module__", None)
    if isinstance(module, str) and module.startswith(("PIL.", "matplotlib.")):
        return True
    try:
        return callable(getattr(kind, "_repr_png_", None))
    except Exception:
        return False
