"""process_start with `tty` and process_write: the agent answers a program's prompt, on a
real daemon; the output it reads is plain text (no `\\r\\n`, no escape codes)."""

from __future__ import annotations

import pytest

import agentkit
from agent.calls.results import process_text
from agent.history.messages import ToolResult
from agent.models.scripted import call, reply
from agent.turns.rules import AgentConfig
from conftest import needs_bwrap, wait_gone

pytestmark = pytest.mark.daemon(shared=True)
kit = agentkit.kit

ASKS = ("import sys; name = input('name? '); "
        "print('\\x1b[1mhello\\x1b[0m', name, sys.stdin.isatty()); input('again? ')")


def results(request) -> list[str]:
    return [m.text for m in request.messages if isinstance(m, ToolResult)]


def started_id(request) -> str:
    """The id in the result of the process_start this conversation made."""
    return next(t.split()[1] for t in results(request) if t.startswith("Started bg"))


def on_it(name: str, **arguments):
    """A scripted step calling `name` on the process started earlier (its id is the
    daemon's, known once it started)."""
    return lambda request: reply("", call(name, id=started_id(request), **arguments))


@needs_bwrap
async def test_the_agent_types_an_answer_into_a_program_on_a_terminal(kit):
    agent = await kit.open([
        reply("", call("process_start", command=f'python3 -c "{ASKS}"', tty=True)),
        on_it("process_output", until="name\\? ", wait_s=30),
        on_it("process_write", data="Ada\n"),
        on_it("process_output", until="again\\? ", wait_s=30),
        on_it("process_write", data="", eof=True),
        on_it("process_output", until="EOFError", wait_s=30),
        reply("answered"),
    ], config=AgentConfig(nudge_after=99))
    result = await agent.run_turn("answer its questions")
    assert result.outcome == "completed", result
    last = agent.model.requests[-1]
    pid = started_id(last)
    started, asked, typed, said, ended, told = results(last)
    assert started == (f"Started {pid} on a terminal. Type into it with process_write, read "
                       f"it with process_output, stop it with process_stop; it keeps running "
                       f"until then.")
    assert asked.startswith("name? ")
    assert typed == (f"Typed 4 bytes into {pid}. Read what it says with process_output "
                     f"(wait_s or until for its answer).")
    # Plain: the bold codes and the terminal's \r\n are gone; it ran on a terminal.
    assert "Ada\nhello Ada True\nagain? " in said and "\x1b" not in said and "\r" not in said
    assert ended.startswith(f"Typed 0 bytes and Ctrl-D into {pid}.")
    assert "EOFError" in told  # Ctrl-D reached input() as the end of input
    assert wait_gone(kit.daemon.running("again? "), timeout=30) == []


@needs_bwrap
async def test_process_write_refuses_what_it_cannot_type_into(kit):
    agent = await kit.open([], mode="auto")
    backend = agent.backend
    started = await backend.call(call("process_start", command="exec sleep 5151"))
    pid = started.text.split()[1].rstrip(".")
    no_tty = await backend.call(call("process_write", id=pid, data="x\n"))
    assert no_tty.is_error and no_tty.text == (
        f"{pid} was started without a terminal, so it takes no input; start it again with "
        f"tty: true to type into it.")
    stranger = await backend.call(call("process_write", id="bg999", data="x"))
    assert stranger.is_error and stranger.text.startswith("There is no background process "
                                                          "'bg999' of yours.")
    missing = await backend.call(call("process_write", id=pid))
    assert missing.is_error and missing.text == \
        "process_write: Object missing required field `data`"
    await backend.call(call("process_stop", id=pid))
    assert kit.daemon.running("sleep 5151") == []


def test_the_model_is_told_when_a_process_waits_for_input():
    r = {"id": "bg3", "status": "running", "exit_code": None, "signal": None,
         "output": "Password: ", "dropped_bytes": 0, "waiting_for_input": True}
    assert process_text(r) == "Password: \n[bg3 is running, waiting for input (process_write)]"
    assert process_text({**r, "waiting_for_input": False}) == "Password: \n[bg3 is running]"


@needs_bwrap
async def test_the_model_names_its_process_by_the_name_it_gave(kit):
    # process_start's `name` stands for the id in process_output, process_write and
    # process_stop, as it does in the daemon and the CLI.
    agent = await kit.open([
        reply("", call("process_start", command=f'python3 -c "{ASKS}"', tty=True,
                       name="greeter")),
        reply("", call("process_output", id="greeter", until="name\\? ", wait_s=30)),
        reply("", call("process_write", id="greeter", data="Ada\n")),
        reply("", call("process_output", id="greeter", until="again\\? ", wait_s=30)),
        reply("", call("process_stop", id="greeter")),
        reply("", call("process_output", id="nobody")),
        reply("done"),
    ], config=AgentConfig(nudge_after=99))
    result = await agent.run_turn("use its name")
    assert result.outcome == "completed", result
    last = agent.model.requests[-1]
    pid = started_id(last)
    _, asked, typed, said, stopped, unknown = results(last)
    assert asked.startswith("name? ")
    assert typed.startswith(f"Typed 4 bytes into {pid}.")
    assert "hello Ada True" in said
    assert stopped.startswith(f"{pid} ")
    assert "There is no background process" in unknown and pid in unknown
    assert wait_gone(kit.daemon.running("again? "), timeout=30) == []
