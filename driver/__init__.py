"""Code that runs inside the sandbox, standard library only; the host finds it by these paths.

Nothing here is imported in the sandbox: the launcher and the REPL drivers run there as
scripts (`python -I -S launcher.py`), so this module is the host's side only.
"""

import os.path

DRIVER_DIR = os.path.dirname(os.path.abspath(__file__))
LAUNCHER_PY = os.path.join(DRIVER_DIR, "launcher.py")
PYTHON_REPL = os.path.join(DRIVER_DIR, "python_repl.py")
NODE_REPL = os.path.join(DRIVER_DIR, "node_repl.js")
FILE_HELPER_PY = os.path.join(DRIVER_DIR, "file_helper.py")
