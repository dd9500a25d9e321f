"""The keyword options each named client call takes: the fields of its method's params in
the wire contract, less those the call takes by position. A keyword that is none of them is
refused with TypeError, naming the nearest (`timeout=` -> `timeout_s`), before anything is
sent: the daemon ignores unknown params (forward compatibility), so a misspelt option would
otherwise be dropped without a word. `call(method, **params)` sends what it is given."""

from __future__ import annotations

import difflib
from typing import Any

import msgspec

from toolsd.wire import files, ports, process_input, protocol

# Options of the client itself, not of the method.
CLIENT_OPTIONS = frozenset({"on_event"})
_PARAMS: dict[str, type[msgspec.Struct]] = {
    "session.open": protocol.SessionOpenParams,
    "shell.run": protocol.ShellRunParams,
    "repl.exec": protocol.ReplExecParams,
    "process.start": protocol.ProcessStartParams,
    "process.output": protocol.ProcessOutputParams,
    "process.stop": protocol.ProcessStopParams,
    "process.write": process_input.ProcessWriteParams,
    "image.read": protocol.ImageReadParams,
    "port.forward": ports.PortForwardParams,
    "file.read": files.FileReadParams,
    "file.write": files.FileWriteParams,
    "file.list": files.FileListParams,
    "file.mkdir": files.FileMkdirParams,
    "file.remove": files.FileRemoveParams,
    "file.rename": files.FileRenameParams,
    "file.watch": files.FileWatchParams,
}
_NAMES = {method: frozenset(f.encode_name for f in msgspec.structs.fields(params))
          for method, params in _PARAMS.items()}


def checked(method: str, options: dict[str, Any], *positional: str) -> dict[str, Any]:
    """`options` for `method`'s named call, or TypeError naming the first unknown one."""
    known = _NAMES[method] | CLIENT_OPTIONS
    for name in options:
        if name not in known:
            helper = method.replace(".", "_")
            choices = sorted(known - set(positional))
            near = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise TypeError(f"{helper}() got an unexpected keyword argument {name!r}{hint} "
                            f"(it takes {', '.join(choices)})")
    return options
