"""The daemon's error messages as a person at the CLI should read them.

The daemon writes for any client, naming its methods ("process.list shows the known ones");
at the command line the same advice is a command to type."""

from __future__ import annotations

from toolsd.wire.protocol import ToolsdError

# A method named in a daemon's message -> what a person types for it.
COMMAND_FOR = {
    "process.list": "`toolsd ps`",
    "session.list": "`toolsd status`",
    "session.open": "`toolsd open`",
}


def for_person(error: ToolsdError) -> str:
    """`code: message`, the methods in the message named by their commands. A refusal
    of the open itself ("session.open: ...") loses that prefix: the person ran exec, repl
    or open, and knows which."""
    message = error.message.removeprefix("session.open: ")
    for method, command in COMMAND_FOR.items():
        message = message.replace(method, command)
    return f"{error.code}: {message}"
