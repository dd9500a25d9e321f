"""repl.exec through a real daemon: pictures come back as `images` (protocol 1.1 "figures"),
readable with image.read; and the REPL's friendliness (dedent, top-level await, import() of
ESM packages) as a caller sees it."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from PIL import Image

from conftest import needs_bwrap
from toolsd.tools.repl_run import _images
from toolsd.tools.sentinel import Sentinel

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]

HAVE_MATPLOTLIB = subprocess.run([sys.executable, "-c", "import matplotlib"],
                                 capture_output=True).returncode == 0
needs_matplotlib = pytest.mark.skipif(
    not HAVE_MATPLOTLIB, reason="matplotlib is not installed (the test extra has it)")
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")
# The tests' own interpreter, first on the session's PATH: it has matplotlib and Pillow. A
# config folder of its own: the home's ~/.config is read-only in the sandbox, and matplotlib
# says so at every import.
WITH_PACKAGES = {"PATH": os.path.dirname(sys.executable) + ":" + os.environ["PATH"],
                 "MPLCONFIGDIR": "/tmp/matplotlib"}


@pytest.fixture
def workspace(daemon):
    return daemon.workspace


def open_turn(client, workspace, env):
    session = client.session_open(workspace, env=env)["session"]
    return session, client.turn_begin(session)["turn"]


@pytest.fixture
def session_turn(daemon, client, workspace):
    session, turn = open_turn(client, workspace, WITH_PACKAGES)
    yield session, turn
    client.session_close(session)
    assert not daemon.tree(), daemon.tree()


def read_back(client, session, image) -> Image.Image:
    """The picture through image.read, at its full size, decoded."""
    r = client.image_read(session, image["path"], max_dim=8192, max_bytes=8 << 20)
    assert (r["original"]["format"], r["resized"]) == ("PNG", False)
    picture = Image.open(io.BytesIO(r["data"]))
    picture.load()
    assert picture.size == (image["width"], image["height"])
    return picture


# ------------------------------------------------------------------ matplotlib


@needs_matplotlib
def test_a_plot_comes_back_as_one_png_that_image_read_decodes(client, session_turn):
    session, turn = session_turn
    assert "figures" in client.hello()["features"]
    r = client.repl_exec(session, turn, "import matplotlib.pyplot as plt\n"
                                        "plt.plot([1, 4, 9])\nplt.show()")
    assert r["status"] == "ok", r["output"]
    [image] = r["images"]
    assert image["path"].startswith("/tmp/toolsd-figures/")
    assert (image["media_type"], image["width"], image["height"]) == ("image/png", 640, 480)
    picture = read_back(client, session, image)
    assert len(picture.convert("RGB").getcolors(1 << 16)) > 2  # a line drawn on white axes
    # Shown, hence closed: nothing of it comes with the next call.
    after = client.repl_exec(session, turn, "plt.get_fignums()")
    assert (after["output"], after["images"]) == ("[]\n", [])


@needs_matplotlib
def test_a_figure_left_open_without_show_comes_back(client, session_turn):
    session, turn = session_turn
    r = client.repl_exec(session, turn, "import matplotlib.pyplot as plt\n"
                                        "fig, ax = plt.subplots(figsize=(3, 2), dpi=100)\n"
                                        "ax.bar(['a', 'b'], [1, 2]);")
    assert r["status"] == "ok", r["output"]
    [image] = r["images"]
    assert (image["width"], image["height"]) == (300, 200)
    read_back(client, session, image)
    assert client.repl_exec(session, turn, "plt.get_fignums()")["output"] == "[]\n"


@needs_matplotlib
def test_two_figures_come_back_in_order_as_two_files(client, session_turn):
    session, turn = session_turn
    r = client.repl_exec(session, turn, "import matplotlib.pyplot as plt\n"
                                        "plt.figure(figsize=(2, 2)); plt.plot([1, 2]); plt.show()\n"
                                        "plt.figure(figsize=(4, 1)); plt.plot([2, 1])\n"
                                        "print('done')")
    assert (r["status"], r["output"]) == ("ok", "done\n")
    sizes = [(i["width"], i["height"]) for i in r["images"]]
    assert sizes == [(200, 200), (400, 100)]
    assert len({i["path"] for i in r["images"]}) == 2
    for image in r["images"]:
        read_back(client, session, image)


@needs_matplotlib
def test_a_20000_px_figure_is_scaled_before_it_is_rendered(client, session_turn):
    session, turn = session_turn
    r = client.repl_exec(session, turn, "import matplotlib.pyplot as plt\n"
                                        "plt.figure(figsize=(200, 200), dpi=100)\n"
                                        "plt.plot([1, 2]);")
    assert r["status"] == "ok", r["output"]
    [image] = r["images"]
    assert max(image["width"], image["height"]) <= 4096
    assert "20000 x 20000 px" in r["output"] and "scaled" in r["output"]
    read_back(client, session, image)


@needs_matplotlib
def test_a_figure_of_a_call_that_failed_still_comes_back(client, session_turn):
    session, turn = session_turn
    r = client.repl_exec(session, turn, "import matplotlib.pyplot as plt\n"
                                        "plt.plot([1, 2])\n1 / 0")
    assert r["status"] == "error" and "ZeroDivisionError" in r["output"]
    assert len(r["images"]) == 1


# ------------------------------------------------------------------ other pictures


def test_a_pil_image_as_last_expression_comes_back(client, session_turn):
    session, turn = session_turn
    r = client.repl_exec(session, turn, "from PIL import Image\n"
                                        "Image.new('RGB', (30, 20), (255, 0, 0))")
    assert r["status"] == "ok", r["output"]
    assert r["output"].startswith("<PIL.Image.Image image mode=RGB size=30x20")
    [image] = r["images"]
    assert read_back(client, session, image).convert("RGB").getpixel((5, 5)) == (255, 0, 0)


# A PNG made with the standard library only, so that it works in any interpreter.
TINY_PNG_CLASS = """
import struct, zlib
def _chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
class Swatch:
    def __init__(self, w, h): self.w, self.h = w, h
    def _repr_png_(self):
        rows = b''.join(b'\\x00' + b'\\x00\\x80\\xff' * self.w for _ in range(self.h))
        return (b'\\x89PNG\\r\\n\\x1a\\n'
                + _chunk(b'IHDR', struct.pack('>IIBBBBB', self.w, self.h, 8, 2, 0, 0, 0))
                + _chunk(b'IDAT', zlib.compress(rows)) + _chunk(b'IEND', b''))
"""


def test_an_object_with_repr_png_comes_back(client, session_turn):
    session, turn = session_turn
    assert client.repl_exec(session, turn, TINY_PNG_CLASS)["status"] == "ok"
    r = client.repl_exec(session, turn, "Swatch(7, 3)")
    [image] = r["images"]
    assert (image["width"], image["height"]) == (7, 3)
    assert read_back(client, session, image).convert("RGB").getpixel((0, 0)) == (0, 128, 255)
    # Not the last expression: not a picture.
    assert client.repl_exec(session, turn, "s = Swatch(2, 2)")["images"] == []


def python_without_matplotlib():
    for candidate in (shutil.which("python3"), "/usr/bin/python3"):
        if candidate and subprocess.run([candidate, "-c", "import matplotlib"],
                                        capture_output=True).returncode != 0:
            return candidate
    return None


def test_an_interpreter_without_matplotlib_works_as_before(daemon, client, workspace):
    python = python_without_matplotlib()
    if python is None:
        pytest.skip("every python3 here has matplotlib")
    session, turn = open_turn(client, workspace,
                              {"PATH": os.path.dirname(python) + ":/usr/bin:/bin"})
    try:
        r = client.repl_exec(session, turn, "import sys\nx = 41\nx + 1")
        assert (r["status"], r["output"], r["images"]) == ("ok", "42\n", [])
        r = client.repl_exec(session, turn, "import matplotlib")
        assert r["status"] == "error" and "ModuleNotFoundError" in r["output"]
        # The driver imported nothing of matplotlib's, nor its figure module, for that.
        r = client.repl_exec(session, turn, "sorted(m for m in sys.modules if 'matplotlib' in "
                                            "m or 'figures' in m)")
        assert r["output"] == "[]\n"
        # Pictures that need no matplotlib still come back.
        client.repl_exec(session, turn, TINY_PNG_CLASS)
        r = client.repl_exec(session, turn, "Swatch(4, 4)")
        assert [(i["width"], i["height"]) for i in r["images"]] == [(4, 4)]
    finally:
        client.session_close(session)


def test_a_forged_images_list_is_dropped_not_passed_on():
    # The sentinel comes from inside the sandbox: code there can forge one.
    good = {"path": "/tmp/toolsd-figures/a.png", "media_type": "image/png", "width": 1,
            "height": 2}
    assert [i.path for i in _images(Sentinel(1, {"status": "ok", "images": [good]}))] == \
        ["/tmp/toolsd-figures/a.png"]
    for forged in ([{"path": 5}], "x", [good, None], {"a": 1}, [{**good, "width": "big"}]):
        assert _images(Sentinel(1, {"status": "ok", "images": forged})) == []


# ------------------------------------------------------------------ friendliness


def test_an_indented_cell_is_dedented(client, session_turn):
    session, turn = session_turn
    r = client.repl_exec(session, turn, "    x = 2\n    if x:\n        print('ran', x)\n")
    assert (r["status"], r["output"]) == ("ok", "ran 2\n")


def test_an_interrupt_during_a_top_level_await_keeps_the_state(client, session_turn):
    session, turn = session_turn
    client.repl_exec(session, turn, "import asyncio\nkept = 'here'")
    r = client.repl_exec(session, turn, "await asyncio.sleep(60)", timeout_s=1)
    assert (r["status"], r["state_lost"]) == ("timeout", False)
    after = client.repl_exec(session, turn, "await asyncio.sleep(0)\nkept")
    assert (after["output"], after["fresh"]) == ("'here'\n", False)


@needs_node
def test_node_imports_an_esm_package_of_the_workspace(client, session_turn, workspace):
    session, turn = session_turn
    package = os.path.join(workspace, "node_modules", "tiny-esm")
    os.makedirs(package)
    with open(os.path.join(package, "package.json"), "w") as f:
        json.dump({"name": "tiny-esm", "type": "module", "exports": "./index.js"}, f)
    with open(os.path.join(package, "index.js"), "w") as f:
        f.write("export const greet = (name) => `hello ${name}`;\nexport default 42;\n")
    r = client.repl_exec(session, turn, "const m = await import('tiny-esm')\nm.greet('esm')",
                         language="node")
    assert (r["status"], r["output"]) == ("ok", "'hello esm'\n")
    # The declaration persists; the experimental loader's warning is not shown.
    r = client.repl_exec(session, turn, "m.default + 1", language="node")
    assert (r["status"], r["output"]) == ("ok", "43\n")
