"""The launcher: first process of a toolsd sandbox. Standard library only; run as
`python3 -I -S launcher.py FD`, FD being our end of a SOCK_SEQPACKET socketpair whose other end
the daemon holds.

Each datagram is one JSON object; file descriptors ride along with SCM_RIGHTS. Seqpacket keeps
datagrams whole, so the launcher and every shim write to the same socket without a lock.

    daemon -> launcher: spawn (fds: the child's fds 0, 1, 2, ...), ack, ping
    launcher -> daemon: ready (fds: pidfd of the launcher), pong
    shim -> daemon:     started (fds: pidfd of the command, pidfd of the shim), error,
                        exited, done

A shim is a forked copy of the launcher that is the subreaper ancestor of exactly one command's
tree: whatever the command leaves behind (setsid, double fork) reparents to the shim, so the
tree stays findable and the shim reports `done` only when nothing of it is left. One spare shim
is forked ahead of time, so a spawn costs no fork on its critical path.

When the daemon's end closes (the daemon exited, even by SIGKILL) the launcher kills every
descendant and exits.
"""

import array
import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import socket
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

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option, value):
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def send(sock, obj, fds=()):
    data = json.dumps(obj, separators=(",", ":")).encode()
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], anc)


def recv(sock):
    """One datagram: (bytes, fds). bytes is b"" at end of file."""
    data, anc, flags, _ = sock.recvmsg(MAX_MSG, ANC_SIZE, socket.MSG_CMSG_CLOEXEC)
    fds = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise OSError("message or its file descriptors truncated (over %d bytes or %d fds)"
                      % (MAX_MSG, MAX_FDS))
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
    reaped = []
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)


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


def run_shim(host, private):
    """Body of a shim. Never returns: every path ends in os._exit."""
    code = 0
    try:
        data, fds = recv(private)
        if not data:
            os._exit(0)  # the launcher went away before handing us a job
        req = json.loads(data)
        job = req["job"]
        try:
            pid = start_command(req, fds)
        except Exception as e:
            message = str(e) if isinstance(e, StartError) else "launcher error: %r" % (e,)
            send(host, {"op": "error", "job": job, "message": message})
            os._exit(1)
        child_fd = os.pidfd_open(pid)
        self_fd = os.pidfd_open(os.getpid())
        send(host, {"op": "started", "job": job, "pid": pid}, [child_fd, self_fd])
        os.close(child_fd)
        os.close(self_fd)
        # The daemon reads our and the command's host pids from the pidfds; until it acks, a
        # quick command must stay an unreaped zombie or its pid would read as -1.
        private.recv(16)
        private.close()
        while True:
            try:
                done_pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if done_pid == pid:
                if os.WIFSIGNALED(status):
                    exit_code, sig = None, os.WTERMSIG(status)
                else:
                    exit_code, sig = os.waitstatus_to_exitcode(status), None
                send(host, {"op": "exited", "job": job, "code": exit_code, "signal": sig})
        send(host, {"op": "done", "job": job})
    except BaseException:
        code = 70
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
    os._exit(code)


class Launcher:
    def __init__(self, host):
        self.host = host
        self.spare = None  # (pid, private socket) of the pre-forked shim
        self.job_sockets = {}  # job -> private socket of its shim, until the daemon acks
        self.shim_jobs = {}  # shim pid -> job
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fork_shim(self):
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.close(self.wake_r)
                os.close(self.wake_w)
                parent_end.close()
                # Other shims' private sockets: holding them would keep them from seeing EOF.
                for sock in self.job_sockets.values():
                    sock.close()
                if self.spare is not None:
                    self.spare[1].close()
                prctl(PR_SET_CHILD_SUBREAPER, 1)
            except BaseException:
                os._exit(70)
            run_shim(self.host, child_end)
            os._exit(70)  # not reached: run_shim always exits
        child_end.close()
        return pid, parent_end

    def spawn(self, data, fds):
        req = json.loads(data)
        job = req["job"]
        try:
            for _attempt in range(2):
                if self.spare is None:
                    self.spare = self.fork_shim()
                pid, sock = self.spare
                self.spare = None
                try:
                    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                           array.array("i", fds))])
                except OSError:
                    sock.close()  # the spare died (killed from inside); fork a fresh one
                    continue
                self.job_sockets[job] = sock
                self.shim_jobs[pid] = job
                break
            else:
                send(self.host, {"op": "error", "job": job,
                                 "message": "the launcher could not hand the command to a shim"})
        except OSError as e:
            send(self.host, {"op": "error", "job": job,
                             "message": "the launcher could not fork: %s" % e.strerror})
        finally:
            for fd in fds:
                os.close(fd)
        try:
            self.spare = self.fork_shim()
        except OSError:
            self.spare = None  # retried at the next spawn

    def ack(self, job):
        sock = self.job_sockets.pop(job, None)
        if sock is not None:
            try:
                sock.send(b"ack")
            except OSError:
                pass
            sock.close()

    def reap(self):
        for pid in reap_nohang():
            if self.spare is not None and self.spare[0] == pid:
                self.spare[1].close()
                self.spare = None
            job = self.shim_jobs.pop(pid, None)
            sock = self.job_sockets.pop(job, None)
            if sock is not None:
                # Not acked: the shim failed or was killed before its command was confirmed
                # started. Say so, or the daemon would wait for `started` forever (it ignores
                # this if the shim already reported).
                sock.close()
                send(self.host, {"op": "error", "job": job,
                                 "message": "the launcher's shim died before starting the "
                                            "command"})

    def serve(self):
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
        self.spare = self.fork_shim()
        poller = select.poll()
        poller.register(self.host.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            events = dict(poller.poll())
            if self.wake_r in events:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                self.reap()
            if self.host.fileno() not in events:
                continue
            data, fds = recv(self.host)
            if not data:
                return  # the daemon is gone
            msg = json.loads(data)
            op = msg.get("op")
            if op == "spawn":
                self.spawn(data, fds)
                continue
            for fd in fds:
                os.close(fd)
            if op == "ack":
                self.ack(msg["job"])
            elif op == "ping":
                send(self.host, {"op": "pong", "n": msg.get("n")})
            else:
                print("launcher: ignoring unknown message %r" % (op,), file=sys.stderr)


def main():
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print("usage: launcher.py FD (one end of a SOCK_SEQPACKET socketpair)", file=sys.stderr)
        return 2
    host = socket.socket(fileno=int(sys.argv[1]))
    host.set_inheritable(False)
    # Sandboxed code runs as our uid: without this it could ptrace us or open our fds (the
    # daemon's socket) through /proc.
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    # SIGTERM ends us like EOF does: through the finally below, taking the tree along.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        Launcher(host).serve()
    finally:
        kill_everything()
    return 0


if __name__ == "__main__":
    sys.exit(main())
