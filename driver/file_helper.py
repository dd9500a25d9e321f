"""The session's file helper: the file.* methods done inside the sandbox, so that every rule of
the session's view holds for them (its mounts, its uid and umask, its file size limit).
Standard library only; started by the launcher on the daemon's request as
`python3 -I -S file_helper.py 3`, fd 3 being its end of a stream socketpair whose other end the
daemon holds. It is a child of the launcher, like the shims, and ignores the signals they do:
`pkill python` in the session passes it by; a SIGKILL ends it, and the daemon starts another
on the next call.

Frames both ways: 4-byte big-endian length of a JSON header, 4-byte length of raw data, the
header, the data. The daemon sends {"id", "op", ...} (data: a write's bytes, streamed to the
file as it arrives, never held whole); the helper answers {"id", "ok": {...}} or
{"id", "error": {"code", "message"}} (data: a read's bytes; or, for a large part, `"fd": true`
in the result and the file's descriptor by SCM_RIGHTS, which the daemon reads), and for a
watch sends
{"id", "events": [[kind, path, to], ...], "dropped": n} until the watch ends. The first frame
is the daemon's config; the helper answers it with its pid (and its pidfd by SCM_RIGHTS).
Requests are served one at a time, in order; watches are served between them.
"""

import ctypes
import json
import os
import resource
import select
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _file_ops as ops  # noqa: E402
from _file_watch import Watcher  # noqa: E402

del sys.path[0]

HEADER = struct.Struct(">II")
PR_SET_NAME, PR_SET_DUMPABLE = 15, 4
NAME = b"toolsd-files"
# How long an IN_MOVED_FROM waits for its IN_MOVED_TO before it counts as a removal.
MOVE_PAIR_MS = 20
# Data up to this size goes out with its header in one send.
SMALL_DATA = 1 << 16


class HelperChannel:
    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self, n):
        while len(self.buf) < n:
            data = self.sock.recv(max(1 << 16, n - len(self.buf)))
            if not data:
                return False
            self.buf += data
        return True

    def frame(self):
        """(header, data size) of the next request; None at EOF."""
        if not self._fill(HEADER.size):
            return None
        head, size = HEADER.unpack_from(self.buf)
        if not self._fill(HEADER.size + head):
            return None
        meta = json.loads(bytes(self.buf[HEADER.size:HEADER.size + head]))
        del self.buf[:HEADER.size + head]
        return meta, size

    def data(self, size):
        """The next `size` bytes, in chunks as they arrive."""
        while size:
            if self.buf:
                chunk = bytes(self.buf[:size])
                del self.buf[:len(chunk)]
            else:
                chunk = self.sock.recv(min(size, ops.CHUNK))
                if not chunk:
                    raise EOFError
            size -= len(chunk)
            yield chunk

    def send(self, meta, data=b"", fds=()):
        # A lone surrogate (a file name that is not UTF-8) cannot travel as text: it becomes
        # "?" rather than a header the daemon would refuse.
        head = json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "replace")
        frame = HEADER.pack(len(head), len(data)) + head
        if data and len(data) <= SMALL_DATA:
            # One send, so the daemon wakes once for the whole answer.
            frame, data = frame + bytes(data), b""
        if fds:
            sent = self.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                struct.pack("%di" % len(fds), *fds))])
            frame = frame[sent:]
        self.sock.sendall(frame)
        if data:
            self.sock.sendall(data)


def prctl(option, value):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(option, value, 0, 0, 0)


def serve_one(channel, view, watcher, meta, size):
    rid = meta.get("id")
    op = meta.get("op")
    chunks = channel.data(size)
    data = b""
    passed = None
    try:
        if op == "read":
            result, data, passed = ops.read(view, meta)
        elif op == "write":
            meta["size"] = size
            result = ops.write(view, meta, chunks)
        elif op == "stat":
            result = ops.stat_(view, meta)
        elif op == "list":
            result = ops.listing(view, meta)
        elif op == "mkdir":
            result = ops.mkdir(view, meta)
        elif op == "remove":
            result = ops.remove(view, meta)
        elif op == "rename":
            result = ops.rename(view, meta)
        elif op == "watch":
            shown, real = view.resolve(meta["path"])
            try:
                watcher.start(rid, shown, real, meta.get("recursive", True))
            except OSError as e:
                raise ops.fail(e, shown, "watch")
            channel.send({"id": rid, "events": [], "dropped": 0, "started": True})
            return
        elif op == "unwatch":
            end_watch(channel, watcher, meta.get("watch"))
            return
        else:
            raise ops.FileError("bad_params", "unknown file operation %r" % (op,))
    except ops.FileError as e:
        channel.send({"id": rid, "error": {"code": e.code, "message": e.message}})
        return
    except OSError as e:
        error = ops.fail(e, meta.get("path", "?"), op or "use")
        channel.send({"id": rid, "error": {"code": error.code, "message": error.message}})
        return
    except Exception as e:
        channel.send({"id": rid, "error": {"code": "io_error", "message": "the file helper "
                                           "failed on %s: %r" % (op, e)}})
        return
    finally:
        for _rest in chunks:
            pass  # what an operation that failed early did not read
    try:
        channel.send({"id": rid, "ok": result}, data, fds=[passed] if passed is not None
                     else ())
    finally:
        if passed is not None:
            os.close(passed)


def send_events(channel, watcher):
    for watch in list(watcher.watches.values()):
        events = watch.take()
        if events or watch.dropped:
            channel.send({"id": watch.id, "events": events, "dropped": watch.dropped})
        if watch.ended:
            end_watch(channel, watcher, watch.id)


def end_watch(channel, watcher, wid):
    watch = watcher.stop(wid)
    if watch is not None:
        channel.send({"id": wid, "ok": {"dropped": watch.dropped, "ended": watch.ended},
                      "events": watch.take()})


def main():
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print("usage: file_helper.py FD (its end of a stream socketpair with the daemon)",
              file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(sock.fileno(), False)
    # Sandboxed code runs as our uid: without this it could ptrace us or take our socket.
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_NAME, NAME)
    try:
        # The launcher's batch policy is for its forks; we answer requests.
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass
    channel = HelperChannel(sock)
    first = channel.frame()
    if first is None:
        return 0
    view = ops.FileView(first[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = view.file_limit if hard == resource.RLIM_INFINITY else min(hard, view.file_limit)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    watcher = Watcher(view)
    pidfd = os.pidfd_open(os.getpid())
    channel.send({"id": first[0].get("id", 0), "ok": {"pid": os.getpid()}}, fds=[pidfd])
    os.close(pidfd)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    registered = False
    while True:
        if watcher.fd is not None and not registered:
            poller.register(watcher.fd, select.POLLIN)
            registered = True
        if not channel.buf:
            ready = dict(poller.poll(0))
            if not ready:
                view.forget()  # a burst is over: see FileView._real_dirs
                ready = dict(poller.poll(MOVE_PAIR_MS if watcher.pending else None))
            if watcher.fd is not None and watcher.fd in ready:
                watcher.read()
            elif not ready:
                watcher.flush_move()
            send_events(channel, watcher)
            if sock.fileno() not in ready:
                continue
        request = channel.frame()
        if request is None:
            return 0  # the daemon is gone, or done with us
        serve_one(channel, view, watcher, *request)
        if watcher.watches:
            watcher.read()
            send_events(channel, watcher)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BrokenPipeError, ConnectionResetError, EOFError):
        sys.exit(0)
