"""Images for a model: fitting is pure (fit.py, and sniff.py: which fitting is cheap), reading
goes through the sandbox (read.py)."""

from toolsd.tools.images.fit import MIN_MAX_BYTES, Fitted, ImageTooLarge, NotAnImage, fit_image
from toolsd.tools.images.read import MAX_PIXELS, read

__all__ = ["Fitted", "ImageTooLarge", "NotAnImage", "fit_image", "MIN_MAX_BYTES", "MAX_PIXELS",
           "read"]
