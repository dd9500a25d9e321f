"""`toolsd attach ID`: a person's terminal on a background process started with `tty: true`.

Keys go to the process as typed (raw mode: Ctrl-C reaches the program, not this command);
its output is shown as it comes; a resize of the person's terminal resizes the process's.
The detach key (Ctrl-] unless --detach-key says otherwise) leaves, and the process runs on.

Two connections: one follows the output (`follow`), one carries keys and resizes, so a key
is never queued behind a read that waits for output. Output is read with explicit `since`
offsets, so attaching never moves the read mark the agent's process.output calls share.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import threading
import time
import tty

from toolsd.cli.common import CommandFailed, connect
from toolsd.cli.logs import CHUNK_CHARS, next_piece
from toolsd.client import ConnectionLost, ToolsdError

DETACH_DEFAULT = "^]"
# How long one output read waits on the daemon for something new before asking again.
FOLLOW_WAIT_S = 10.0
# Output shown when attaching: the end of what the process printed before, so a prompt
# that is waiting shows.
SHOW_BEFORE_BYTES = 4096
# A key the process did not take at once (its terminal is full) is tried again this often.
RETRY_S = 0.05


def add_parser(sub, common) -> None:
    p = sub.add_parser("attach", parents=[common],
                       help="attach this terminal to a background process started with a "
                            "terminal (tty: true); the detach key leaves it running")
    p.add_argument("id", help="process id or name, e.g. bg3 or web")
    p.add_argument("--detach-key", default=DETACH_DEFAULT, metavar="KEY",
                   help="the key that detaches: ^X for Ctrl-X (default ^], Ctrl-])")
    p.set_defaults(func=cmd_attach)


def detach_byte(key: str) -> bytes | None:
    """The byte of a `^X` key name (Ctrl-X), or None if it is not one."""
    if len(key) == 2 and key[0] == "^" and 0x40 <= ord(key[1].upper()) <= 0x5f:
        return bytes([ord(key[1].upper()) - 0x40])
    return None


def cmd_attach(args) -> int:
    key = detach_byte(args.detach_key)
    if key is None:
        print(f"toolsd attach: --detach-key {args.detach_key!r} is not a control key; give "
              f"one like ^] or ^Q", file=sys.stderr)
        return 2
    if not os.isatty(sys.stdin.fileno()):
        print("toolsd attach: stdin is not a terminal; run it in one (process.write sends "
              "input from a script)", file=sys.stderr)
        return 2
    with connect(args) as keys, connect(args) as reader:
        cols, rows = os.get_terminal_size(sys.stdin.fileno())
        try:
            keys.process_resize(args.id, cols, rows)  # refused without a terminal
        except ToolsdError as e:
            if e.code != "bad_params" or "no terminal" not in e.message:
                raise
            raise CommandFailed("attach", f"{args.id} has no terminal (it was started without "
                                          f"tty: true), so nothing can be typed into it; "
                                          f"`toolsd logs -f {args.id}` follows its output") \
                from None
        start = max(0, keys.process_output(args.id, since=0, max_output_chars=0)["next"]
                    - SHOW_BEFORE_BYTES)
        print(f"[toolsd attach: {args.id}; {args.detach_key} detaches, the process runs on]",
              file=sys.stderr, flush=True)
        wake_r, wake_w = os.pipe()
        outcome: dict = {}
        follower = threading.Thread(target=follow, daemon=True,
                                    args=(reader, args.id, start, outcome, wake_w))
        follower.start()
        try:
            detached = forward_keys(keys, args.id, key, wake_r)
        finally:
            reader.close()  # ends the follower's read, if one is under way
            os.close(wake_r)
    if detached:
        print(f"\r\n[toolsd attach: detached; {args.id} runs on]", file=sys.stderr)
        return 0
    follower.join(timeout=FOLLOW_WAIT_S)
    if "error" in outcome:
        print(f"\r\ntoolsd attach: {outcome['error']}", file=sys.stderr)
        return 1
    how = (f"killed by {outcome['signal']}" if outcome.get("signal")
           else f"exit code {outcome.get('exit_code')}")
    print(f"\r\n[toolsd attach: {args.id} {outcome.get('status', 'ended')} ({how})]",
          file=sys.stderr)
    return 0


def forward_keys(client, process_id: str, key: bytes, wake_r: int) -> bool:
    """Raw mode; keys to the process and resizes after SIGWINCH, until the detach key (True)
    or the follower says the process ended (False)."""
    fd = sys.stdin.fileno()
    resized = threading.Event()
    old_handler = signal.signal(signal.SIGWINCH, lambda *_: resized.set())
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        while True:
            ready, _, _ = select.select([fd, wake_r], [], [], 1.0)
            if resized.is_set():
                resized.clear()
                cols, rows = os.get_terminal_size(fd)
                client.process_resize(process_id, cols, rows)
            if wake_r in ready:
                return False
            if fd not in ready:
                continue
            data = os.read(fd, 4096)
            if key in data:
                send(client, process_id, data[: data.index(key)])
                return True
            send(client, process_id, data)
    except ToolsdError as e:
        if "exited" in e.message:
            return False  # the follower shows how it ended
        raise
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_handler)


def send(client, process_id: str, data: bytes) -> None:
    """All of `data` to the process, trying again while its terminal is full. The wire takes
    text: bytes that are not UTF-8 go as U+FFFD."""
    rest = data.decode(errors="replace").encode()
    while rest:
        written = client.process_write(process_id, rest.decode(errors="replace"))["written"]
        rest = rest[written:]
        if not written:
            time.sleep(RETRY_S)


def follow(client, process_id: str, pos: int, outcome: dict, wake_w: int) -> None:
    """Write the process's output to stdout from `pos` until it ends (then fill `outcome`
    and wake forward_keys through `wake_w`), or until `client` is closed."""
    out = sys.stdout.buffer
    try:
        while True:
            r = client.process_output(process_id, since=pos, wait_s=FOLLOW_WAIT_S,
                                      max_output_chars=CHUNK_CHARS)
            text, pos, whole = next_piece(r)
            out.write(text.encode(errors="surrogateescape"))
            out.flush()
            if whole and r["status"] != "running" and not text:
                outcome.update(r)
                break
    except ConnectionLost:
        return  # closed by cmd_attach on detach, or the daemon went away
    except ToolsdError as e:
        outcome["error"] = f"{e.code}: {e.message}"
    try:
        os.write(wake_w, b"x")
        os.close(wake_w)
    except OSError:
        pass
