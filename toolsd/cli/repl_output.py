"""What `toolsd repl` shows of one input's result: its output (live where the daemon streams,
protocol 1.1 "stream"), its figures saved to a host folder, and its whole output kept in a
file when the answer had to cut it ("spill")."""

from __future__ import annotations

import os
import sys
import tempfile

from toolsd.cli.notices import print_notices
from toolsd.cli.session_files import CopyFailed, copy_out

_SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif",
             "image/webp": ".webp"}


class ReplOutput:
    """The person's view of the results of one `toolsd repl` run. `figures`: the host folder
    figures are saved to (None: only said where they are in the session). Whole outputs go
    there too, else to a folder of this run made under $TMPDIR on first need (kept: it is
    the person's)."""

    def __init__(self, figures: str | None):
        self.figures = figures
        self._kept_dir = figures
        self._last_live = ""  # the last text printed live for the input under way

    def start(self) -> None:
        """An input is sent: nothing of it printed yet."""
        self._last_live = ""

    def on_event(self, event) -> None:
        # Flushed at once: a person watches it.
        sys.stdout.write(event.data)
        sys.stdout.flush()
        self._last_live = event.data

    def show(self, client, session: str, result: dict, live: bool) -> None:
        shown = self._last_live if live else result["output"]
        if not live:
            sys.stdout.write(shown)
        if shown and not shown.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        for image in result.get("images") or []:
            self._figure(client, session, image)
        if result.get("output_file"):
            self._whole_output(client, session, result)
        print_notices("repl", result, session_kept=True)

    def _figure(self, client, session: str, image: dict) -> None:
        size = f"{image['width']}x{image['height']}"
        if self.figures is None:
            say(f"figure {size} at {image['path']} in the session; --figures DIR saves them")
            return
        try:
            dest = self._free_name(self.figures, "figure",
                                   _SUFFIXES.get(image["media_type"], ""))
        except OSError as e:
            say(f"figure {size} at {image['path']} in the session: not saved in "
                f"{self.figures} ({e.strerror})")
            return
        try:
            copy_out(client, session, image["path"], dest)
        except (CopyFailed, OSError) as e:
            _remove(dest)
            say(f"figure {size}: not saved: {e}")
            return
        say(f"figure {size} saved to {dest}")

    def _whole_output(self, client, session: str, result: dict) -> None:
        try:
            if self._kept_dir is None:
                self._kept_dir = tempfile.mkdtemp(prefix="toolsd-repl-")
            dest = self._free_name(self._kept_dir, "output", ".txt")
        except OSError as e:
            say(f"the output was cut; its whole text is at {result['output_file']} in the "
                f"session (not copied: {e.strerror})")
            return
        try:
            copied = copy_out(client, session, result["output_file"], dest)
        except (CopyFailed, OSError) as e:
            _remove(dest)
            say(f"the output was cut; its whole text is at {result['output_file']} in the "
                f"session (not copied: {e})")
            return
        say(f"the whole output ({copied} bytes) is in {dest}")

    @staticmethod
    def _free_name(folder: str, stem: str, suffix: str) -> str:
        """A new file `folder/stem-N.suffix` (created empty): never over a file already
        there."""
        n = 1
        while True:
            path = os.path.join(folder, f"{stem}-{n}{suffix}")
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                return path
            except FileExistsError:
                n += 1


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def say(message: str) -> None:
    print(f"[toolsd repl: {message}]", file=sys.stderr, flush=True)
