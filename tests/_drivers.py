"""A REPL driver (driver/python_repl.py, driver/node_repl.js) wired as the host wires it, for the
tests that drive one without a daemon."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import uuid as uuidlib

import psutil

from conftest import alive as _alive
from toolsd.tools.sentinel import SentinelScanner

# Safety net against a hung driver, not a timing assertion.
STUCK_S = 30


class DriverProcess:
    """One REPL driver with the host's wiring: stdin /dev/null, stdout+stderr one pipe,
    the command pipe on fd 3, the interrupt pipe on fd 4. Owns the process; close() ends it
    and checks it is gone."""

    def __init__(self, argv):
        self.uuid = uuidlib.uuid4().hex
        read_end, write_end = os.pipe()
        interrupt_read, interrupt_write = os.pipe()

        def put_command_pipe_on_fd3():
            # Above every target first, so that no dup2 overwrites a source still needed.
            high = [os.dup(fd) for fd in (read_end, interrupt_read)]
            for target, fd in zip((3, 4), high):
                os.dup2(fd, target)

        # The driver must not rely on the sandbox's PYTHONUNBUFFERED for its output order.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        # close_fds=False so the fd 3 made in the child survives; every other fd of ours is
        # close-on-exec (PEP 446).
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=put_command_pipe_on_fd3,
            close_fds=False,
        )
        os.close(read_end)
        os.close(interrupt_read)
        self.commands = os.fdopen(write_end, "wb", buffering=0)
        self.interrupts = os.fdopen(interrupt_write, "wb", buffering=0)
        self.commands.write(self.uuid.encode() + b"\n")
        self.scanner = SentinelScanner(self.uuid)
        self.seq = 0
        self.status = None  # the last sentinel's whole status (with "images", if any)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)

    def send(self, code: str) -> int:
        self.seq += 1
        self.scanner.expect(self.seq)
        self.commands.write(json.dumps(code).encode() + b"\n")
        return self.seq

    def read_reply(self) -> tuple[str | None, bytes]:
        """Output up to the sentinel of the request in flight; status None at EOF."""
        out = []
        fd = self.proc.stdout.fileno()
        while True:
            data, sentinel = self.scanner.feed(b"")
            out.append(data)
            if sentinel is not None:
                assert sentinel.seq == self.seq
                self.status = sentinel.status
                return sentinel.status["status"], b"".join(out)
            if not self.selector.select(STUCK_S):
                raise AssertionError(f"driver sent nothing for {STUCK_S}s; output so far {out!r}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                out.append(self.scanner.flush())
                return None, b"".join(out)
            data, sentinel = self.scanner.feed(chunk)
            out.append(data)
            if sentinel is not None:
                assert sentinel.seq == self.seq
                self.status = sentinel.status
                return sentinel.status["status"], b"".join(out)

    def exec(self, code: str) -> tuple[str | None, bytes]:
        self.send(code)
        return self.read_reply()

    def interrupt(self, seq: int | None = None) -> None:
        """As the host interrupts request `seq` (by default the last one sent)."""
        self.interrupts.write(b"%d\n" % (self.seq if seq is None else seq))
        os.kill(self.proc.pid, signal.SIGURG)

    def wait_for_output(self, text: bytes) -> None:
        """Read (and drop) output until `text` has come: the code has got that far."""
        fd = self.proc.stdout.fileno()
        seen = b""
        while text not in seen:
            assert self.selector.select(STUCK_S), f"no {text!r} within {STUCK_S}s"
            chunk = os.read(fd, 1024)
            assert chunk, f"the driver ended before printing {text!r}"
            data, sentinel = self.scanner.feed(chunk)
            assert sentinel is None, f"the request ended before printing {text!r}"
            seen += data

    def close(self):
        try:
            family = [self.proc.pid] + [
                p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)
            ]
        except psutil.NoSuchProcess:
            family = [self.proc.pid]
        self.interrupts.close()
        self.commands.close()  # EOF on fd 3: the driver exits by itself
        try:
            self.proc.wait(STUCK_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("driver did not exit at end of its command pipe")
        finally:
            self.selector.close()
            self.proc.stdout.close()
        alive = [p for p in _alive(family)]
        assert not alive, f"processes left behind: {alive}"


def fd_targets(pid):
    folder = f"/proc/{pid}/fd"
    targets = set()
    for name in os.listdir(folder):
        try:
            targets.add(os.readlink(os.path.join(folder, name)))
        except FileNotFoundError:
            pass  # closed between the listing and the look (the driver is still starting)
    return targets
