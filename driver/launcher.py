"""The launcher: first process of a toolsd sandbox. Standard library only; run as
`python3 -I -S launcher.py FD SPAWN_FD`, FD being our end of the control channel and SPAWN_FD
our end of the spawn channel: two SOCK_SEQPACKET socketpairs whose other ends the daemon holds.

Each datagram is one JSON object; file descriptors ride along with SCM_RIGHTS. Seqpacket keeps
datagrams whole, so the launcher and every shim write to the control channel without a lock.

    daemon -> spare shim, spawn channel: spawn (fds: the child's fds 0, 1, 2, ...)
    daemon -> launcher:  ping
    launcher -> daemon:  ready (fds: pidfd of the launcher), pong, error
    shim -> daemon:      started (fds: pidfd of the command, pidfd of the shim, ack pipe),
                         error, exited ("done": true when nothing of the tree is left), done
    spare -> launcher:   "took" on its private socketpair; the job it takes in shared memory
    launcher -> standby: "go" + the JSON list of jobs to drop, on its private socketpair

A shim is a forked copy of the launcher that is the subreaper ancestor of exactly one command's
tree: whatever the command leaves behind (setsid, double fork) reparents to the shim, so the
tree stays findable and the shim reports `done` only when nothing of it is left.

A spare shim is forked ahead of time and is the only reader of the spawn channel, so a spawn
wakes one process, the one that runs it: no fork and no relay on its critical path. The reader
peeks at the next request, writes its job number to memory it shares with the launcher,
receives the request, closes its copy of the channel, and says "took" once the command runs;
a standby spare then becomes the reader (see Launcher for when forks happen). A spare killed
before writing the job number leaves the request queued for the next reader; one killed
later is reported as an error for that job by the launcher, and later readers drop the job
if they find it still queued: a request is never lost and never run twice. The launcher
reads a waiting request itself only to fail it, when it cannot fork a spare.

The ack: `started` carries the write end of a pipe, which the daemon closes once it has read
the host pids from the pidfds. Until then the shim keeps an exited command unreaped (its pid
would read as -1), but reports the exit at once.

When the daemon's end closes (the daemon exited, even by SIGKILL) the launcher kills every
descendant and exits.
"""

import _signal
import array
import ctypes
import fcntl
import json
import mmap
import os
import resource
import select
import signal
import socket
import struct
import sys
import traceback

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
MAX_MSG = 1 << 20
MAX_FDS = 64
ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
# Python ignores these at startup; an ignored disposition survives exec, so a command would
# never see SIGPIPE (`yes | head` would spin) unless we put the defaults back.
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
SIGCHLD, SIGTERM = int(signal.SIGCHLD), int(signal.SIGTERM)
# Spares dying in a row without taking a job (killed from inside the sandbox as soon as they
# are forked) before the launcher fails the waiting request instead of forking again.
MAX_SPARE_DEATHS = 3
# Shared between the launcher and one spare: (taken, job), written by the spare before it
# receives the request. The launcher reads it when the spare says "took" or dies.
SLOT = struct.Struct("qq")

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option, value):
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def send(sock, obj, fds=()):
    data = json.dumps(obj, separators=(",", ":")).encode()
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], anc)


def fds_of(anc):
    fds = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    return fds


def refuse_truncated(flags, fds):
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise OSError("message or its file descriptors truncated (over %d bytes or %d fds)"
                      % (MAX_MSG, MAX_FDS))


def recv_into(sock, buf):
    """One datagram into buf: (its size, fds). The size is 0 at end of file."""
    size, anc, flags, _ = sock.recvmsg_into([buf], ANC_SIZE, socket.MSG_CMSG_CLOEXEC)
    fds = fds_of(anc)
    refuse_truncated(flags, fds)
    return size, fds


def recv(sock):
    """One datagram: (bytes, fds). bytes is b"" at end of file."""
    data, anc, flags, _ = sock.recvmsg(MAX_MSG, ANC_SIZE, socket.MSG_CMSG_CLOEXEC)
    fds = fds_of(anc)
    refuse_truncated(flags, fds)
    return data, fds


def which(name, path):
    """Resolve a program like execvp would, but against the command's own PATH."""
    if "/" in name:
        return name
    for folder in (path or os.defpath).split(":"):
        candidate = os.path.join(folder or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def child_map():
    """parent pid -> child pids, from /proc (no /proc/PID/task/*/children on every kernel)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open("/proc/%s/stat" % name, os.O_RDONLY)
            try:
                stat = os.read(fd, 1024)
            finally:
                os.close(fd)
            ppid = int(stat[stat.rindex(b")") + 2:].split(None, 2)[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    return children


def descendants(pid):
    children = child_map()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def reap_nohang():
    """[(pid, wait status)] of the children that have exited."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def children_left():
    """Reap the children that have exited; True if some child still runs."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def kill_everything():
    """SIGKILL every descendant until none is left. We are a subreaper, so whatever a dying
    process forked meanwhile reparents to us and shows up in the next round."""
    me = os.getpid()
    while True:
        tree = descendants(me)
        if not tree:
            return
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            pass
        reap_nohang()


class StartError(Exception):
    pass


def start_command(req, fds):
    """chdir, rlimits, posix_spawn. Runs in the shim, so the chdir and the limits touch only
    this command. Returns the command's pid."""
    argv = req["argv"]
    env = req["env"]
    cwd = req["cwd"]
    if not argv:
        raise StartError("empty argv: give at least the program to run")
    try:
        os.chdir(cwd)
    except OSError as e:
        raise StartError("cannot use working directory %r: %s; create it or choose another cwd"
                         % (cwd, e.strerror))
    program = which(argv[0], env.get("PATH"))
    if program is None:
        raise StartError("no such program: %r is not on PATH=%s; check the name or give a full "
                         "path" % (argv[0], env.get("PATH", os.defpath)))
    # Received fds may already sit on 0..n-1; dup them all above the targets first so no dup2
    # overwrites a source still needed, and none is a no-op dup2 that would keep CLOEXEC.
    floor = max(10, len(fds))
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    try:
        for name, (soft, hard) in (req.get("rlimits") or {}).items():
            which_limit = getattr(resource, "RLIMIT_" + name.upper(), None)
            if which_limit is None:
                raise StartError("unknown resource limit %r (use e.g. as, fsize, cpu, nofile, "
                                 "core, nproc)" % name)
            try:
                resource.setrlimit(which_limit, (soft, hard))
            except (OSError, ValueError) as e:
                raise StartError("cannot set resource limit %s to %r: %s"
                                 % (name, (soft, hard), e))
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(moved)]
        try:
            return os.posix_spawn(program, argv, env, file_actions=actions, setsid=True,
                                  setsigdef=DEFAULT_SIGNALS, setsigmask=())
        except OSError as e:
            raise StartError("cannot run %r: %s" % (program, e.strerror))
    finally:
        for fd in moved:
            os.close(fd)


# Shaped like the daemon's requests: the objects parsing it makes land in the same memory pools
# as those of a real one.
WARMUP_REQUEST = json.dumps({
    "op": "spawn", "job": 0, "argv": ["/bin/bash", "-c", "true"], "cwd": "/nonexistent",
    "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
            "TERM": "dumb", "NO_COLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat",
            "PYTHONUNBUFFERED": "1"},
    "rlimits": {"as": [1 << 33, 1 << 33], "fsize": [1 << 30, 1 << 30], "cpu": [600, 600],
                "nofile": [1024, 1024], "core": [0, 0], "nproc": [512, 512]},
}).encode()


def warm_up():
    """Run the spawn path's Python once on a made-up request while we wait for a real one. A
    forked spare shares its memory with the launcher and the first write to each shared page
    copies it (about 6 us a page here): paid now, not on the spawn's critical path."""
    req = json.loads(WARMUP_REQUEST)
    which("warm-up-no-such-program", req["env"]["PATH"])
    for name in req["rlimits"]:
        getattr(resource, "RLIMIT_" + name.upper(), None)
    json.dumps({"op": "started", "job": 0, "pid": 0}, separators=(",", ":")).encode()
    array.array("i", [0, 1, 2])
    json.dumps(exit_message_of_status(0, 0), separators=(",", ":")).encode()
    select.poll()


def claim(slot, job):
    """Tell the launcher, through the memory we share, that we take `job`: done before
    receiving it, so that whenever we die the launcher knows whether a job was ours."""
    # Job first, then the flag: a spare killed between the two leaves no half-written claim.
    SLOT.pack_into(slot, 0, 0, job)
    SLOT.pack_into(slot, 0, 1, job)


def take_job(spawn, private, lost, slot, buf):
    """Wait for the next request on the spawn channel and take it (see the module docstring).
    Returns (request, fds), or None once the daemon or the launcher is gone."""
    poller = select.poll()
    poller.register(spawn.fileno(), select.POLLIN)
    poller.register(private.fileno(), select.POLLIN)
    while True:
        events = dict(poller.poll())
        if private.fileno() in events:
            return None  # the launcher never writes to a spare: this is its end closing
        size, _anc, flags, _addr = spawn.recvmsg_into([buf], 0, socket.MSG_PEEK)
        if not size:
            return None
        refuse_truncated(flags & socket.MSG_TRUNC, ())
        req = json.loads(buf[:size])
        job = req["job"]
        if job in lost:
            # Claimed by a spare that died before receiving it, and already failed.
            _size, fds = recv_into(spawn, buf)
            for fd in fds:
                os.close(fd)
            continue
        claim(slot, job)
        # We are the channel's only reader: what we receive is what we peeked.
        _size, fds = recv_into(spawn, buf)
        return req, fds


def exit_message(job, waited):
    """`exited` for an os.waitid result."""
    if waited.si_code == os.CLD_EXITED:
        return {"op": "exited", "job": job, "code": waited.si_status, "signal": None}
    return {"op": "exited", "job": job, "code": None, "signal": waited.si_status}


def exit_message_of_status(job, status):
    if os.WIFSIGNALED(status):
        return {"op": "exited", "job": job, "code": None, "signal": os.WTERMSIG(status)}
    return {"op": "exited", "job": job, "code": os.waitstatus_to_exitcode(status),
            "signal": None}


def tell_took(private):
    """Tell the launcher we are no longer its spare: from now on it watches the spawn channel
    for requests nobody reads, and knows our job if we die. Sent before `started`, so that a
    request the daemon sends after `started` never waits on a launcher that thinks we read."""
    try:
        private.send(b"took")
    except OSError:
        pass  # the launcher is gone; the sandbox goes with it
    private.close()


def run_job(host, private, req, fds, self_fd, ack_r, ack_w):
    """Start the command, report it, reap its tree. Never returns: ends in os._exit."""
    job = req["job"]
    try:
        pid = start_command(req, fds)
    except Exception as e:
        message = str(e) if isinstance(e, StartError) else "launcher error: %r" % (e,)
        tell_took(private)
        send(host, {"op": "error", "job": job, "message": message})
        os._exit(1)
    child_fd = os.pidfd_open(pid)
    tell_took(private)
    send(host, {"op": "started", "job": job, "pid": pid}, [child_fd, self_fd, ack_w])
    os.close(self_fd)
    os.close(ack_w)
    # The daemon reads our and the command's host pids from the pidfds, then closes the ack
    # pipe; until then a quick command must stay an unreaped zombie or its pid would read as
    # -1. Its exit is reported without waiting for that (WNOWAIT leaves it unreaped).
    exited = None
    poller = select.poll()
    poller.register(child_fd, select.POLLIN)
    poller.register(ack_r, select.POLLIN)
    acked = False
    while not acked:
        for fd, _event in poller.poll():
            if fd == ack_r:
                acked = True
            elif exited is None:
                exited = exit_message(job, os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT))
                send(host, exited)
                poller.unregister(child_fd)
    os.close(ack_r)
    os.close(child_fd)
    if exited is None:
        # Acked while the command runs (the usual case): reap orphans of its tree as they
        # come, and report the command's exit when it comes.
        while True:
            done_pid, status = os.waitpid(-1, 0)
            if done_pid == pid:
                break
        exited = exit_message_of_status(job, status)
        if not children_left():
            exited["done"] = True  # one message, one wakeup of the daemon
            send(host, exited)
            os._exit(0)
        send(host, exited)
    else:
        os.waitpid(pid, 0)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    send(host, {"op": "done", "job": job})
    os._exit(0)


def set_policy(policy):
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        pass  # only a matter of latency


def run_spare(host, spawn, private, lost, slot, standby):
    """Body of a spare shim. Never returns: every path ends in os._exit."""
    code = 0
    try:
        # Made before a job comes, off the spawn's critical path. The buffer's pages are only
        # touched as far as a request fills them.
        self_fd = os.pidfd_open(os.getpid())
        ack_r, ack_w = os.pipe2(os.O_CLOEXEC)
        buf = mmap.mmap(-1, MAX_MSG, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if standby or not select.select([spawn], [], [], 0)[0]:
            warm_up()  # it would only delay a request already there
        # The launcher's batch policy was right for forking us; from here on we are on the
        # critical path of a spawn, and the command inherits our policy.
        set_policy(os.SCHED_OTHER)
        if standby:
            word = private.recv(MAX_MSG)
            if not word.startswith(b"go"):
                os._exit(0)  # the launcher is gone
            lost = set(json.loads(word[2:]))
        taken = take_job(spawn, private, lost, slot, buf)
        if taken is None:
            os._exit(0)
        spawn.close()
        buf.close()
        slot.close()
        run_job(host, private, taken[0], taken[1], self_fd, ack_r, ack_w)
    except BaseException:
        code = 70
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
    os._exit(code)


class Spare:
    """The launcher's hold on a pre-forked shim."""

    def __init__(self, pid, sock, slot):
        self.pid = pid
        self.sock = sock  # our end of its private socketpair
        self.slot = slot  # memory shared with it: see SLOT
        self.closed = False  # its socket said EOF: it is exiting, reap() will see it

    def job(self):
        """The job it has taken, or None."""
        taken, job = SLOT.unpack_from(self.slot)
        return job if taken else None

    def close(self):
        self.sock.close()
        self.slot.close()


class Launcher:
    """Keeps two spares: the reader, the only process reading the spawn channel, and a
    standby waiting to be told "go". When the reader takes a job the standby becomes the
    reader at once (a message, no fork); both are refilled when a shim exits, the likeliest
    quiet moment, since a fork costs about 1 ms of CPU and on a spawn's critical path it slows
    the command and the daemon's reply. We run with the batch policy, so that a fork never
    preempts a spawn's processes on wakeup; spares switch back before they wait."""

    def __init__(self, host, spawn):
        self.host = host
        self.spawn_channel = spawn
        self.reader = None
        self.standby = None
        self.spare_deaths = 0  # spares that died in a row without taking a job
        self.shim_jobs = {}  # shim pid -> its job
        self.lost_jobs = set()  # taken by spares that died before "took": maybe still queued
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fork_spare(self, standby):
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        slot = mmap.mmap(-1, SLOT.size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        try:
            pid = os.fork()
        except OSError:
            parent_end.close()
            child_end.close()
            slot.close()
            raise
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                # _signal, not signal: the wrapper turns the old handler (ours, a function)
                # into an enum through a raised ValueError, which costs a spare ~100 copied
                # pages (0.5 ms) of the memory it shares with us.
                _signal.signal(SIGCHLD, _signal.SIG_DFL)
                _signal.signal(SIGTERM, _signal.SIG_DFL)
                os.close(self.wake_r)
                os.close(self.wake_w)
                parent_end.close()
                # The other spare's socket: holding it would keep it from seeing our EOF.
                for other in (self.reader, self.standby):
                    if other is not None:
                        other.close()
                prctl(PR_SET_CHILD_SUBREAPER, 1)
            except BaseException:
                os._exit(70)
            run_spare(self.host, self.spawn_channel, child_end, self.lost_jobs, slot, standby)
            os._exit(70)  # not reached: run_spare always exits
        child_end.close()
        parent_end.setblocking(False)
        spare = Spare(pid, parent_end, slot)
        if standby:
            self.standby = spare
        else:
            self.reader = spare

    def promote(self):
        """Make the standby the reader, if there is no reader."""
        if self.reader is not None or self.standby is None:
            return
        spare, self.standby = self.standby, None
        try:
            spare.sock.send(b"go" + json.dumps(sorted(self.lost_jobs)).encode())
        except OSError:
            spare.close()  # it died; reap() takes it
            return
        self.reader = spare

    def refill(self):
        """A reader, then a standby, by promotion or fork; retried later if a fork fails."""
        self.promote()
        try:
            if self.reader is None:
                self.fork_spare(standby=False)
            if self.standby is None:
                self.fork_spare(standby=True)
        except OSError:
            pass

    def read_reader(self):
        """Act on what the reader said."""
        while self.reader is not None and not self.reader.closed:
            try:
                word = self.reader.sock.recv(64)
            except BlockingIOError:
                return
            except OSError:
                word = b""
            if word == b"took":
                self.shim_jobs[self.reader.pid] = self.reader.job()
                self.reader.close()
                self.reader = None
                self.spare_deaths = 0
                self.promote()
                if self.reader is None:
                    # No standby: requests in a burst. Fork now rather than when one waits.
                    try:
                        self.fork_spare(standby=False)
                    except OSError:
                        pass  # retried when a request waits
            else:
                self.reader.closed = True  # exiting: stop polling it, SIGCHLD follows

    def reap(self):
        shim_exited = False
        for pid, status in reap_nohang():
            if self.standby is not None and pid == self.standby.pid:
                self.standby.close()
                self.standby = None
                continue
            if self.reader is not None and pid == self.reader.pid:
                self.read_reader()  # what it said before dying: "took" makes it a shim
            if self.reader is not None and pid == self.reader.pid:
                job = self.reader.job()
                if job is not None:
                    self.lost_jobs.add(job)
                    self.shim_jobs[pid] = job
                self.spare_deaths += 1
                self.reader.close()
                self.reader = None
                self.promote()
            job = self.shim_jobs.pop(pid, None)
            shim_exited = shim_exited or job is not None
            if job is not None and status != 0:
                # The shim failed or was killed, maybe before it said started: say so, or the
                # daemon would wait for `started` forever (it ignores this if it has heard).
                send(self.host, {"op": "error", "job": job,
                                 "message": "the launcher's shim died before starting the "
                                            "command"})
        if shim_exited and self.spare_deaths == 0:
            self.refill()

    def serve_waiting_request(self):
        """A request waits and no reader exists: make one, or fail the request if we cannot.
        False once the daemon has closed the channel."""
        self.promote()
        if self.reader is not None:
            return True
        if self.spare_deaths < MAX_SPARE_DEATHS:
            try:
                self.fork_spare(standby=False)
                return True
            except OSError as e:
                reason = "the launcher could not fork: %s" % e.strerror
        else:
            reason = ("the launcher's shims were killed before they could start the command; "
                      "stop what kills them in the sandbox, or open a new session")
            self.spare_deaths = 0
        data, fds = recv(self.spawn_channel)
        for fd in fds:
            os.close(fd)
        if not data:
            return False
        try:
            job = json.loads(data)["job"]
        except (ValueError, KeyError, TypeError):
            return True
        if job in self.lost_jobs:
            self.lost_jobs.discard(job)  # already failed
        else:
            send(self.host, {"op": "error", "job": job, "message": reason})
        return True

    def serve(self):
        set_policy(os.SCHED_BATCH)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.reap()
        self_fd = os.pidfd_open(os.getpid())
        send(self.host, {
            "op": "ready", "pid": os.getpid(),
            "bash": which("bash", os.environ.get("PATH")),
            "sh": which("sh", os.environ.get("PATH")),
            "python3": which("python3", os.environ.get("PATH")),
            "node": which("node", os.environ.get("PATH")),
        }, [self_fd])
        os.close(self_fd)
        self.refill()
        host_fd, spawn_fd = self.host.fileno(), self.spawn_channel.fileno()
        while True:
            poller = select.poll()
            poller.register(host_fd, select.POLLIN)
            poller.register(self.wake_r, select.POLLIN)
            reader_fd = -1
            if self.reader is not None and not self.reader.closed:
                reader_fd = self.reader.sock.fileno()
                poller.register(reader_fd, select.POLLIN)
            if self.reader is None:
                # Nobody reads the spawn channel: watch it for a request left waiting.
                poller.register(spawn_fd, select.POLLIN)
            events = dict(poller.poll())
            if self.wake_r in events:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            # Every round, not only on a wakeup byte: a SIGCHLD delivered as poll returns
            # writes its byte too late for this round, and the daemon may count on a shim it
            # saw exit having been replaced before our next answer.
            self.reap()
            if reader_fd in events:
                self.read_reader()
            if spawn_fd in events and self.reader is None:
                if not self.serve_waiting_request():
                    return  # the daemon is gone
            if host_fd not in events:
                continue
            data, fds = recv(self.host)
            for fd in fds:
                os.close(fd)
            if not data:
                return  # the daemon is gone
            msg = json.loads(data)
            op = msg.get("op")
            if op == "ping":
                send(self.host, {"op": "pong", "n": msg.get("n")})
            else:
                print("launcher: ignoring unknown message %r" % (op,), file=sys.stderr)


def main():
    if len(sys.argv) != 3 or not all(arg.isdigit() for arg in sys.argv[1:]):
        print("usage: launcher.py FD SPAWN_FD (ends of two SOCK_SEQPACKET socketpairs: the "
              "control channel and the spawn channel)", file=sys.stderr)
        return 2
    host = socket.socket(fileno=int(sys.argv[1]))
    spawn = socket.socket(fileno=int(sys.argv[2]))
    host.set_inheritable(False)
    spawn.set_inheritable(False)
    # Sandboxed code runs as our uid: without this it could ptrace us or open our fds (the
    # daemon's sockets) through /proc.
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    # SIGTERM ends us like EOF does: through the finally below, taking the tree along.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        Launcher(host, spawn).serve()
    finally:
        kill_everything()
    return 0


if __name__ == "__main__":
    sys.exit(main())
