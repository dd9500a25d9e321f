"""A model's tool call -> a toolsd request -> a result string the model reads.

`Backend` owns one toolsd session (opened by `Backend.open`, closed by `aclose`) and what the
tools keep in it between calls: the terminal's folder (a `cd` holds for the next
`run_terminal`, as in a person's terminal), the REPL turn, and the background processes this
backend started (the only ids it lets the model touch: ids are daemon-wide, and a model must
never reach another session's process by guessing `bg1`).

One toolsd request per call; what the model reads of its result is agent/calls/results.py's
(pure), the arguments are read by agent/calls/arguments.py. Every request goes through the
session's SessionKeeper (agent/calls/toolsd_session.py), which tells the model once, with the
next tool result, what the session added that the host's git would run, and replaces a lost
session: what lived in the old one is forgotten here (`_forget`: its process ids answer as
stale). A call cut by the loss is not run again (it may have done part of its work): the model
decides. A fresh session lost too within the same call raises `SessionLost`: never a loop.

Resource handling: the session and everything in it (REPLs, background processes) end at
`aclose()` (SessionKeeper.close); the REPLs of a turn end at `end_turn()`, which the turn loop
calls in its `finally`.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from agent.calls.arguments import (ProcessOutput, ProcessStart, ProcessStop, ReadImage,
                                   ReplArguments, RunTerminal, parse_arguments)
from agent.calls.file_tools import FileTools
from agent.calls.process_input import ProcessInputTools
from agent.calls.results import (
    NOTES_ROOM,
    RESULT_CHARS,
    ToolOutcome,
    clip_text,
    not_finished_note,
    process_text,
    quoted,
    repl_text,
    shell_text,
    stale_text,
    status_words,
)
from agent.calls.toolsd_session import Gone, SessionKeeper, SessionLost
from agent.history.messages import ImageRef, LoadedImage, ToolCall
from agent.models.providers import image_limits, within_request
from toolsd.client import AsyncClient, ToolsdError

__all__ = ["Backend", "SessionLost"]

MAX_TIMEOUT_S = 600.0
MAX_WAIT_S = 300.0
UNTIL_WAIT_S = 30.0  # process_output's wait when only `until` is given
# image.read's errors that are about the file, not the session: the model is told.
IMAGE_ERRORS = ("not_found", "not_an_image", "image_too_large", "limit_exceeded")


class Backend(ProcessInputTools, FileTools):
    """See the module docstring. Made by `Backend.open`; the turn loop and `toolsd mcp` both
    drive it: `begin_turn`, `call` per tool call, `load_images` for a request, `end_turn`,
    `aclose`."""

    def __init__(self, keeper: SessionKeeper, *, features: list[str], provider: str,
                 repl_timeout_s: float):
        self.keeper = keeper
        keeper.on_replaced = self._forget
        self._ask = keeper.ask
        self.workspace = keeper.workspace
        self.sandbox = keeper.sandbox  # "bwrap", or "none" where the daemon cannot sandbox
        self.features = frozenset(features)
        self.provider = provider
        self.repl_timeout_s = repl_timeout_s
        self.cwd = self.workspace  # the terminal's folder, as the session sees it
        self.turn: str | None = None
        # Held while the turn changes: a repl call never sees a turn that is ending.
        self._turn_lock = trio.Lock()
        self._repl_languages: set[str] = set()  # used in this turn
        # Background processes this backend started: id -> command (the only ones it touches).
        self.processes: dict[str, str] = {}
        self.names: dict[str, str] = {}  # process_start's `name` -> the latest id of that name
        # Pictures read this turn, by (ref, the max_dim they were fitted to).
        self._images: dict[tuple[ImageRef, int], LoadedImage] = {}
        # Processes of sessions that were lost: id -> command (answered as stale).
        self.stale: dict[str, str] = {}

    @classmethod
    async def open(cls, client: AsyncClient, workspace: str, *, writable: bool = True,
                   network: str = "none", env: dict[str, str] | None = None,
                   provider: str = "anthropic", repl_timeout_s: float = 120.0) -> Backend:
        hello = await client.hello("toolsd-agent")
        keeper = await SessionKeeper.open(client, workspace, writable=writable, network=network,
                                   env=env or {})
        return cls(keeper, features=hello.get("features", []), provider=provider,
                   repl_timeout_s=repl_timeout_s)

    async def aclose(self) -> dict:
        """session.close: every process and REPL of the session ends. Idempotent."""
        return await self.keeper.close()

    # The keeper's, for the owner and for tests.
    @property
    def client(self) -> AsyncClient:
        return self.keeper.client

    @client.setter
    def client(self, client: AsyncClient) -> None:
        self.keeper.client = client

    @property
    def session(self) -> str:
        return self.keeper.id

    @property
    def report(self) -> Callable[[str, dict], None] | None:
        return self.keeper.report

    @report.setter
    def report(self, report: Callable[[str, dict], None] | None) -> None:
        self.keeper.report = report

    def take_notes(self) -> list[str]:
        """Notes for the model besides a result, once (SessionKeeper.take_notes)."""
        return self.keeper.take_notes()

    def _forget(self) -> list[str]:
        """A fresh session replaced a lost one: nothing of the old one is reachable; the ids
        of its background processes, which now answer as stale."""
        self.cwd = self.workspace
        self.turn = None  # the next repl call begins one on the new session
        self._repl_languages = set()
        self._images = {}
        stale = list(self.processes)
        self.stale.update(self.processes)
        self.processes = {}
        self.names = {}
        return stale

    # ------------------------------------------------------------ turns

    async def begin_turn(self) -> str:
        async with self._turn_lock:
            return await self._begin()

    async def end_turn(self) -> int:
        """turn.end, shielded: the turn's interpreters end whatever ended the turn."""
        with trio.CancelScope(shield=True):
            async with self._turn_lock:
                return await self._end()

    async def reset_turn(self) -> int:
        """End the turn's interpreters and begin the next turn as one step, so that a repl
        call arriving meanwhile waits for the new turn instead of beginning one of its own
        (which the reset would then replace, its interpreter left running)."""
        with trio.CancelScope(shield=True):
            async with self._turn_lock:
                ended = await self._end()
                await self._begin()
        return ended

    async def _begin(self) -> str:
        try:
            r = await self._ask("turn_begin", self.session)
        except Gone as e:
            self.keeper.note(await self.keeper.replace(e))
            try:
                r = await self._ask("turn_begin", self.session)
            except Gone as again:
                raise again.twice() from None
        self.turn = r["turn"]
        self._repl_languages = set()
        self._images = {}  # a file may have changed or vanished between turns
        return self.turn

    async def _end(self) -> int:
        turn, self.turn = self.turn, None
        if turn is None:
            return 0
        try:
            return (await self._ask("turn_end", self.session, turn))["repls_stopped"]
        except ToolsdError:
            return 0  # the session or the daemon is gone, and the REPLs with it

    # ------------------------------------------------------------ calls

    async def call(self, call: ToolCall, change=None) -> ToolOutcome:
        """Run one tool call (a write_file or edit_file call as its prepared, approved Change
        where one is given: agent/calls/file_tools.py). A mistake of the model (bad arguments, a
        stale id, a file that is not there) is a ToolOutcome with is_error; only a lost
        daemon raises. Every outcome, an error's too, is within RESULT_CHARS."""
        outcome = await self._run(call, change)
        text = outcome.text
        notes = "\n".join(self.take_notes())
        if notes:
            text = clip_text(text, max(0, RESULT_CHARS - len(notes) - 1)) + "\n" + notes
        if text != outcome.text or len(text) > RESULT_CHARS:
            outcome = msgspec.structs.replace(outcome, text=clip_text(text, RESULT_CHARS))
        return outcome

    async def _run(self, call: ToolCall, change=None) -> ToolOutcome:
        args = parse_arguments(call) if change is None else change
        if isinstance(args, ToolOutcome):
            return args
        run = getattr(self, "_" + call.name) if change is None else self.apply
        session = self.session
        try:
            return await run(args)
        except Gone as e:
            if e.session != session:  # this call's session was already a replacement
                raise e.twice() from None
            told = await self.keeper.replace(e)
            return ToolOutcome(f"{told}\n{not_finished_note(call.name)}", is_error=True)
        except ToolsdError as e:
            if e.code == "connection_lost":
                raise
            return ToolOutcome(f"{call.name} failed: {e.message}", is_error=True)

    def _in_cwd(self, command: str) -> tuple[str, dict[str, Any]]:
        """(command, params) that run `command` in the terminal's folder. toolsd takes a cwd
        inside the workspace; one outside it (a `cd /tmp` earlier) is entered by the
        command itself, on the same line so line numbers in errors do not move."""
        if self.cwd == self.workspace:
            return command, {}
        if self.cwd.startswith(self.workspace + "/"):
            return command, {"cwd": self.cwd}
        return f"cd -- {shlex.quote(self.cwd)} || exit; {command}", {}

    def _shown(self, path: str) -> str:
        if path == self.workspace:
            return "the workspace root"
        if path.startswith(self.workspace + "/"):
            return path[len(self.workspace) + 1:] + "/"
        return path

    async def _run_terminal(self, a: RunTerminal) -> ToolOutcome:
        timeout_s = min(a.timeout_s, MAX_TIMEOUT_S)
        command, where = self._in_cwd(a.command)
        params = {"timeout_s": timeout_s, "max_output_chars": RESULT_CHARS - NOTES_ROOM,
                  **where, **self._asks("spill", spill=True), **self._asks("cwd", report_cwd=True)}
        moved = ""
        try:
            r = await self._ask("shell_run", self.session, command, **params)
        except ToolsdError as e:
            if not (e.code == "bad_params" and "cwd" in e.message and "cwd" in where):
                raise
            # The terminal's folder is gone (removed, or replaced by a file or a symlink).
            moved = f"[could not enter {self.cwd} ({e.message}): this ran in the workspace root]"
            self.cwd = self.workspace
            r = await self._ask("shell_run", self.session, a.command,
                                **{k: v for k, v in params.items() if k != "cwd"})
        before = self.cwd
        after = r.get("cwd_after")
        if after:
            self.cwd = after.rstrip("/") or "/"
        text = shell_text(r, timeout_s, self._shown(self.cwd) if self.cwd != before else None)
        return ToolOutcome(f"{moved}\n{text}" if moved else text)

    def _asks(self, feature: str, **params: Any) -> dict[str, Any]:
        """Params of a 1.1 feature, only where the daemon has it (an older one refuses them)."""
        return params if feature in self.features else {}

    async def _repl(self, a: ReplArguments) -> ToolOutcome:
        async with self._turn_lock:
            turn = self.turn or await self._begin()
            first = a.language not in self._repl_languages
            self._repl_languages.add(a.language)
        r = await self._ask(
            "repl_exec", self.session, turn, a.code, language=a.language,
            timeout_s=self.repl_timeout_s, max_output_chars=RESULT_CHARS - NOTES_ROOM,
            **self._asks("spill", spill=True))
        refs, shown, unread = [], [], []
        for image in r.get("images") or []:
            try:
                ref, read = await self._fit(image["path"])
            except ToolsdError as e:
                if e.code not in IMAGE_ERRORS:
                    raise
                unread.append(f"the figure {image['path']} could not be read: {e.message}")
                continue
            refs.append(ref)
            shown.append((ref.path, read["width"], read["height"]))
        return ToolOutcome(repl_text(r, first, shown, unread), images=refs)

    async def _process_start(self, a: ProcessStart) -> ToolOutcome:
        command, where = self._in_cwd(a.command)
        r = await self._ask("process_start", self.session, command, name=a.name, **where,
                            **self._input_options(a))
        return self._started(r, a)  # agent/calls/process_input.py

    def _unknown(self, pid: str) -> ToolOutcome | None:
        if pid in self.processes:
            return None
        mine = ", ".join(f"{k} ({clip_text(v, 40)})" for k, v in self.processes.items()) \
            if self.processes else "none"
        if pid in self.stale:
            return ToolOutcome(stale_text(pid, mine), is_error=True)
        return ToolOutcome(f"There is no background process {quoted(pid)} of yours. Processes "
                           f"you started: {mine}.", is_error=True)

    def _stale(self, pid: str, e: ToolsdError) -> ToolOutcome:
        if e.code == "not_found":
            return ToolOutcome(f"{pid} is gone: toolsd was restarted since it was started, "
                               f"and its processes with it. Start it again with "
                               f"process_start.", is_error=True)
        raise e

    async def _process_output(self, a: ProcessOutput) -> ToolOutcome:
        pid = self._own(a.id)
        if (refusal := self._unknown(pid)) is not None:
            return refusal
        wait_s = a.wait_s if a.wait_s is not None else (UNTIL_WAIT_S if a.until else 0.0)
        params: dict[str, Any] = {"wait_s": min(wait_s, MAX_WAIT_S),
                                  "max_output_chars": RESULT_CHARS - NOTES_ROOM,
                                  **self._output_options(pid)}
        if a.until is not None:
            params["until"] = a.until
        try:
            r = await self._ask("process_output", pid, **params)
        except ToolsdError as e:
            return self._stale(pid, e)
        return ToolOutcome(process_text(r))

    async def _process_stop(self, a: ProcessStop) -> ToolOutcome:
        pid = self._own(a.id)
        if (refusal := self._unknown(pid)) is not None:
            return refusal
        try:
            r = await self._ask("process_stop", pid)
        except ToolsdError as e:
            return self._stale(pid, e)
        ended = f"; {r['ended']} process(es) ended" if r["ended"] else ""
        return ToolOutcome(f"{pid} {status_words(r)}{ended}.")

    def resolve(self, path: str) -> str:
        """A path the model gave, as the session sees it: relative to the terminal's folder."""
        return posixpath.normpath(posixpath.join(self.cwd, path))

    async def _read_image(self, a: ReadImage) -> ToolOutcome:
        path = self.resolve(a.path)
        try:
            ref, r = await self._fit(path)
        except ToolsdError as e:
            if e.code in IMAGE_ERRORS:
                return ToolOutcome(f"read_image: {e.message}", is_error=True)
            raise
        o = r["original"]
        resized = f", downscaled from {o['width']}x{o['height']}" if r["resized"] else ""
        return ToolOutcome(f"{path}: {o['format']} image, shown {r['width']}x{r['height']}"
                           f"{resized}. It is attached below.", images=[ref])

    async def _fit(self, path: str) -> tuple[ImageRef, dict]:
        """A picture to ride below the results: read now, fitted to the provider's limits
        for one picture (kept for the request, which fits it again if it holds many), and
        its ref, the path. Raises the ToolsdError of image.read."""
        max_dim, max_bytes = image_limits(self.provider)
        r = await self._ask("image_read", self.session, path, max_dim=max_dim,
                            max_bytes=max_bytes)
        ref = ImageRef(path=path, max_dim=max_dim, max_bytes=max_bytes)
        self._images[ref, max_dim] = _loaded(r)
        return ref, r

    # ------------------------------------------------------------ images for a request

    async def load_images(self, refs: list[ImageRef]) -> dict[ImageRef, LoadedImage]:
        """The pictures a request carries, read now with the session's view and fitted to
        the provider's limits for a request holding that many, then as many of the most
        recent as one request can carry; a file that vanished or changed into something
        else, or a picture left out, is a LoadedImage saying so (the renderer tells the
        model). Read once per turn: the cache is emptied by begin_turn."""
        wanted = list(dict.fromkeys(refs))
        request_dim, _ = image_limits(self.provider, len(wanted))
        kept = {}
        for ref in wanted:
            key = ref, min(ref.max_dim, request_dim)
            if key not in self._images:
                self._images[key] = await self._load(ref, key[1])
            kept[key] = self._images[key]
        self._images = kept
        return within_request(self.provider,
                              [(ref, image) for (ref, _dim), image in kept.items()])

    async def _load(self, ref: ImageRef, max_dim: int) -> LoadedImage:
        try:
            r = await self._ask("image_read", self.session, ref.path, max_dim=max_dim,
                                max_bytes=ref.max_bytes)
        except ToolsdError as e:
            if e.code == "connection_lost":
                raise
            return LoadedImage(missing=f"it could not be read any more ({e.message}); the file "
                                       f"may have been moved or deleted since it was read")
        return _loaded(r)


def _loaded(r: dict) -> LoadedImage:
    return LoadedImage(media_type=r["media_type"], data=r["data"], width=r["width"],
                       height=r["height"])
