"""Figures for the Python REPL driver: pictures a call produced, saved as PNG files in a folder
of the session's scratch and listed in the call's answer (protocol 1.1 "figures").

driver/python_repl.py loads this module only when a call may have a picture: when the user's
code imports matplotlib (the module is then also matplotlib's backend, BACKEND), or when the
last expression looks like a picture. It never imports matplotlib or PIL itself: it uses the
parts of them that the user's code has already loaded. Standard library only.

What becomes a picture:
- every pyplot figure shown (plt.show(), fig.show()) or still open when the call ends; a
  figure is closed once it has been saved, so none is carried into the next call;
- a last expression that is a matplotlib Figure, a PIL image, or an object with an
  IPython-style `_repr_png_()`.

Bounds, so that no figure and no flood of them can hurt the session:
- a figure is rendered at most MAX_SIDE pixels a side: a bigger one is rendered at a lower
  dpi (the pixels are bounded before rendering) and a note says so; a ready-made PNG
  (`_repr_png_`) over MAX_SIDE x MAX_SIDE is not saved, and a note says so;
- at most MAX_PER_CALL pictures a call, MAX_FILE_BYTES each;
- the folder keeps at most MAX_FILES files and MAX_FOLDER_BYTES bytes besides those of the
  call in progress: the oldest are removed first.

The folder is opened with O_NOFOLLOW and every file is created in it with O_EXCL |
O_NOFOLLOW, so a symlink planted in the scratch by the session's code is never written
through.
"""

import io
import os
import sys

MODULE_NAME = "_toolsd_figures"
BACKEND = "module://" + MODULE_NAME

MAX_SIDE = 4096
MAX_PER_CALL = 8
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_FILES = 64
MAX_FOLDER_BYTES = 128 * 1024 * 1024
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The PNG modes PIL writes as they are; any other is converted first.
_PNG_MODES = {"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"}
_NAME_TRIES = 64

_figures = None  # the driver's Figures, set by configure()


def configure(folder, note):
    """Called by the driver once this module is loaded: pictures go to `folder` (as the
    session sees it); `note(text)` writes a line of toolsd's to the call's output."""
    global _figures
    _figures = Figures(folder, note)
    return _figures


class Figures:
    """The pictures of the call in progress, and the folder they are saved in."""

    def __init__(self, folder, note):
        self.folder = folder
        self._note = note
        self._token = os.urandom(4).hex()  # file names unique across interpreters
        self._count = 0
        self._images = []  # of the call in progress: the answer's `images`
        self._names = set()  # their file names, never pruned during the call
        self._over = 0  # pictures beyond MAX_PER_CALL in this call

    # ------------------------------------------------------------ the driver's calls

    def take(self):
        """The call's `images`; the next call starts with none."""
        images, self._images = self._images, []
        self._names = set()
        if self._over:
            self._note(f"{self._over} more picture(s) of this call were not saved: at most "
                       f"{MAX_PER_CALL} a call")
            self._over = 0
        return images

    def show_open(self):
        """Save every pyplot figure still open, in the order they were made, and close it."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        for number in pyplot.get_fignums():
            figure = _pyplot_figure(number)
            if figure is None:
                continue
            try:
                self.add_figure(figure)
            finally:
                pyplot.close(figure)

    def close_open(self):
        """Close the pyplot figures left open without saving them (the call was stopped)."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None and pyplot.get_fignums():
            pyplot.close("all")

    def add_value(self, value):
        """The last expression's value, if it is a picture."""
        figure_mod = sys.modules.get("matplotlib.figure")
        if figure_mod is not None and isinstance(value, figure_mod.Figure):
            if not _managed_by_pyplot(value):  # else it is saved with the open figures
                self.add_figure(value)
            return
        pil = sys.modules.get("PIL.Image")
        if pil is not None and isinstance(value, pil.Image):
            self.add_pil(value)
            return
        repr_png = getattr(type(value), "_repr_png_", None)
        if callable(repr_png):
            try:
                data = value._repr_png_()
            except Exception:
                return  # as IPython: an object that cannot draw itself shows its text only
            self.add_png_data(data)

    # ------------------------------------------------------------ one picture each

    def add_figure(self, figure):
        """Render a matplotlib figure, at most MAX_SIDE pixels a side."""
        if not self._room():
            return
        dpi = figure.dpi
        w_in, h_in = figure.get_size_inches()
        width, height = w_in * dpi, h_in * dpi
        scale = 1.0
        if max(width, height) > MAX_SIDE:
            scale = MAX_SIDE / max(width, height)
        import matplotlib  # loaded already: the figure is one of its objects

        out = io.BytesIO()
        try:
            # The full figure, whatever savefig.bbox says: "tight" could grow the canvas past
            # the bound to reach artists placed far outside the figure.
            with matplotlib.rc_context({"savefig.bbox": "standard"}):
                figure.savefig(out, format="png", dpi=dpi * scale)
        except Exception as exc:
            self._note(f"a figure could not be rendered: {type(exc).__name__}: {exc}")
            return
        data = out.getvalue()
        size = _png_size(data)
        if scale < 1.0 and size is not None:
            self._note(f"a figure of {width:.0f} x {height:.0f} px is more than toolsd renders "
                       f"({MAX_SIDE} px a side): saved scaled to {size[0]} x {size[1]} px "
                       f"(dpi {dpi * scale:.3g} instead of {dpi:.3g})")
        self._save(data, size)

    def add_pil(self, image):
        """A PIL image, scaled down to MAX_SIDE pixels a side if bigger."""
        if not self._room():
            return
        try:
            width, height = image.size
            if max(width, height) > MAX_SIDE:
                image = image.copy()
                image.thumbnail((MAX_SIDE, MAX_SIDE))
                self._note(f"an image of {width} x {height} px is more than toolsd saves "
                           f"({MAX_SIDE} px a side): saved scaled to {image.size[0]} x "
                           f"{image.size[1]} px")
            if image.mode not in _PNG_MODES:
                image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
            out = io.BytesIO()
            image.save(out, format="PNG")
        except Exception as exc:
            self._note(f"an image could not be saved as PNG: {type(exc).__name__}: {exc}")
            return
        data = out.getvalue()
        self._save(data, _png_size(data))

    def add_png_data(self, data):
        """What a `_repr_png_()` gave: PNG bytes (or bytes and metadata, as IPython allows)."""
        if isinstance(data, tuple) and data:
            data = data[0]
        if not isinstance(data, (bytes, bytearray)) or not data.startswith(PNG_SIGNATURE):
            return
        if not self._room():
            return
        size = _png_size(data)
        if size is None:
            return
        if size[0] * size[1] > MAX_SIDE * MAX_SIDE:
            self._note(f"a PNG of {size[0]} x {size[1]} px from _repr_png_() was not saved: "
                       f"more than toolsd keeps ({MAX_SIDE} x {MAX_SIDE} px)")
            return
        self._save(bytes(data), size)

    # ------------------------------------------------------------ the folder

    def _room(self):
        if len(self._images) < MAX_PER_CALL:
            return True
        self._over += 1
        return False

    def _save(self, data, size):
        if size is None:
            self._note("a picture was not saved: it did not render as a PNG")
            return
        if len(data) > MAX_FILE_BYTES:
            self._note(f"a picture of {size[0]} x {size[1]} px was not saved: its PNG is "
                       f"{len(data)} bytes, over toolsd's {MAX_FILE_BYTES} (make it smaller)")
            return
        try:
            folder_fd = self._open_folder()
        except OSError as exc:
            self._note(f"pictures cannot be saved in {self.folder}: {exc.strerror or exc}; it "
                       f"must be a folder, not a symlink (remove it to let toolsd make it)")
            return
        try:
            name = self._write(folder_fd, data)
            if name is None:
                return
            self._names.add(name)
            self._images.append({"path": os.path.join(self.folder, name),
                                 "media_type": "image/png", "width": size[0],
                                 "height": size[1]})
            self._prune(folder_fd)
        finally:
            os.close(folder_fd)

    def _open_folder(self):
        try:
            os.mkdir(self.folder, 0o700)
        except FileExistsError:
            pass
        return os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def _write(self, folder_fd, data):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(_NAME_TRIES):
            self._count += 1
            name = f"figure-{self._token}-{self._count}.png"
            try:
                fd = os.open(name, flags, 0o644, dir_fd=folder_fd)
            except FileExistsError:
                continue  # planted by the session's code: never opened, never followed
            except OSError as exc:
                self._note(f"a picture could not be saved: {exc.strerror or exc}")
                return None
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError as exc:
                os.close(fd)
                _unlink(folder_fd, name)
                self._note(f"a picture could not be saved: {exc.strerror or exc} (the "
                           f"session's file size limit or a full disk?)")
                return None
            os.close(fd)
            return name
        self._note("a picture could not be saved: no free file name")
        return None

    def _prune(self, folder_fd):
        """Remove the oldest pictures beyond MAX_FILES or MAX_FOLDER_BYTES (not this call's)."""
        kept = []
        try:
            with os.scandir(folder_fd) as entries:
                for entry in entries:
                    if not (entry.name.startswith("figure-") and entry.name.endswith(".png")):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    kept.append((st.st_mtime_ns, entry.name, st.st_size))
        except OSError:
            return
        kept.sort()
        count = len(kept)
        total = sum(size for _, _, size in kept)
        for _, name, size in kept:
            if count <= MAX_FILES and total <= MAX_FOLDER_BYTES:
                break
            if name in self._names:
                continue
            _unlink(folder_fd, name)
            count -= 1
            total -= size


# ---------------------------------------------------------------- matplotlib's backend
#
# matplotlib loads BACKEND by importing this module: `show` for plt.show(), and the canvas
# and manager classes, made on first use so that loading this module never imports
# matplotlib (PEP 562 module __getattr__).


def show(*args, **kwargs):
    """plt.show(): every open figure becomes a picture of the call, and is closed."""
    if _figures is not None:
        _figures.show_open()


def __getattr__(name):
    if name in ("FigureCanvas", "FigureManager"):
        _define_backend()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _define_backend():
    from matplotlib.backend_bases import FigureManagerBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    class FigureManager(FigureManagerBase):
        def show(self):
            # fig.show(): this figure only.
            if _figures is not None:
                try:
                    _figures.add_figure(self.canvas.figure)
                finally:
                    sys.modules["matplotlib.pyplot"].close(self.canvas.figure)

        @classmethod
        def pyplot_show(cls, *args, **kwargs):
            show()

    class FigureCanvas(FigureCanvasAgg):
        manager_class = FigureManager

    globals().update(FigureCanvas=FigureCanvas, FigureManager=FigureManager)


# ---------------------------------------------------------------- helpers


def _pyplot_figure(number):
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    manager = helpers.Gcf.figs.get(number) if helpers is not None else None
    return manager.canvas.figure if manager is not None else None


def _managed_by_pyplot(figure):
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    if helpers is None:
        return False
    return any(m.canvas.figure is figure for m in list(helpers.Gcf.figs.values()))


def _png_size(data):
    """(width, height) from a PNG's header, or None if it is not one."""
    if len(data) < 24 or not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _unlink(folder_fd, name):
    try:
        os.unlink(name, dir_fd=folder_fd)
    except OSError:
        pass
