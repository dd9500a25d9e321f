"""How a shell command reaches its shell: `bash -c COMMAND` (or `sh -c`), or, for a command too
big to travel as one argument, a short bootstrap that reads it from a descriptor. Pure.

Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN), and a spawn request to the launcher is
one datagram, bounded by the socket's send buffer (some 200 KiB by default). A command of more
than INLINE_MAX bytes is therefore handed to the shell as a file on a descriptor (the caller
puts the bytes there: fd 3, or the one after the caller's own), and the shell runs BOOTSTRAP,
which reads the whole text, closes the descriptor and evaluates the text in the same shell
process:

- `$0` is the shell's path as for `-c COMMAND` (the bootstrap's first argument), `$#` is 0;
- `set -e`, traps, `exit` and the exit status are the command's own: it runs in that shell;
- the descriptor is closed before the command's first line runs, so nothing it starts
  inherits it;
- the shell's messages about the command name `eval` (bash: "eval: line 3: ...");
- trailing newlines of the text are dropped (command substitution), which no shell syntax
  depends on;
- if the text cannot be read (no `cat` on the command's PATH), the shell says why and exits
  127, as for a missing command.
"""

from __future__ import annotations

INLINE_MAX = 64 * 1024
BOOTSTRAP = 'eval "exec {fd}<&-; $(cat <&{fd} || echo exit 127)"'


def shell_argv(shell_path: str, command: str, script_fd: int = 3
               ) -> tuple[list[str], bytes | None]:
    """(argv, script): `script` is None when the command travels in argv, else the bytes the
    shell must find on `script_fd`. ValueError for a command no shell can take."""
    if "\0" in command:
        raise ValueError("command contains a NUL byte, which no shell can take; remove it")
    # Most commands are short enough to be sure of without encoding them (at most 4 bytes a
    # character).
    data = None if len(command) <= INLINE_MAX // 4 else command.encode()
    if data is None or len(data) <= INLINE_MAX:
        return [shell_path, "-c", command], None
    return [shell_path, "-c", BOOTSTRAP.format(fd=script_fd), shell_path], data
