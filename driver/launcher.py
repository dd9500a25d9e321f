# Sections of this file, in order:
#   the channel's format and the launcher's design (the docstring below)
#   constants: JSON escapes, prctl numbers, message sizes, signals, names, the shared SLOT
#   the C library through _ctypes: libc_function, prctl, set_name, set_command_line_name,
#     dup_above, ioprio
#   framing: to_json, send, pack_fds, fds_of, refuse_truncated, recv_into, recv
#   process helpers: which, child_map, descendants, reap_nohang, children_left, signal_pid,
#     kill_everything
#   limits: StartError, SELF_FILES, keep_self_files, read_self, own_state, quick_state,
#     state_items, REFERENCE, Tampered, ProcessLimits
#   the shim's job: start_command, WARMUP_REQUEST, warm_up, claim, take_job, exit_message,
#     exit_message_of_status, tell, run_job, wait_release, set_policy
#   run_shim: a shim's body, job after job
#   Shim: the launcher's hold on one forked shim
#   SandboxInit: fork_shim, promote, refill, replace_reader, read_words, reap, kill_orphans,
#     serve_waiting_request, serve
#   main
"""The launcher: first process of a toolsd sandbox. Standard library only; run as
`python3 -I -S launcher.py FD SPAWN_FD`, FD being our end of the control channel and SPAWN_FD
our end of the spawn channel: two SOCK_SEQPACKET socketpairs whose other ends the daemon holds.

Each datagram is one object, with file descriptors riding along with SCM_RIGHTS: marshal from
the daemon (which we trust; marshal is built into the interpreter), JSON to the daemon (which
must not trust what comes out of a sandbox). Seqpacket keeps datagrams whole, so the launcher
and every shim write to the control channel without a lock.

    daemon -> reader shim, spawn channel: spawn (fds: the child's fds 0, 1, 2, ...)
    daemon -> launcher:  ping, connect (port.forward: driver/port_connect.py); helper (fds:
                         the helper's socket; see start_helper)
    launcher -> daemon:  ready (fds: pidfd of the launcher), pong, error, connected
    shim -> daemon:      started (fds: pidfd of the shim, hold pipe, the pidfd of the command
                         unless the request said "ack": false, and the terminal's master side
                         for a "tty" request), error, exited ("done": true when nothing of the
                         tree is left), done
    shim -> launcher:    "took", "idle" or "retire" on its private socketpair; the job it
                         takes in shared memory, and that the job is over (see run_shim)
    launcher -> standby: "go" + the marshalled list of jobs to drop, on its private socketpair

A shim is a forked copy of the launcher that is the subreaper ancestor of one command's tree at
a time: whatever the command leaves behind (setsid, double fork) reparents to the shim, so the
tree stays findable and the shim reports `done` only when nothing of it is left.

Shims are reused: one whose tree is done, and whose job the daemon has released, goes back to
the launcher as a standby. Forking a copy of a Python process and tearing it down costs more
CPU than the command `true` itself, so a fork happens only when no idle shim is there.

The reader is the only process reading the spawn channel, so a spawn wakes one process, the
one that runs it: no fork and no relay on its critical path. The reader peeks at the next
request, writes its job number to memory it shares with the launcher, receives the request and
says "took" once the command runs; a standby then becomes the reader (see SandboxInit for when
forks happen). A reader killed before writing the job number leaves the request queued for the
next reader; one killed later, before it started the command, is reported as an "unstarted"
error for that job by the launcher (the daemon sends the request again, as a new job), and later
readers drop the job if they find it still queued: a request is never lost and never run twice.
The launcher reads a waiting request itself only to fail it, when it cannot fork a shim.

The hold pipe: `started` carries its write end. Unless the request said "ack": false, the
daemon writes a byte once it has read the host pids from the pidfds (until then the shim keeps
an exited command unreaped, or its pid would read as -1, but reports the exit at once). The
daemon closes the pipe when it will no longer touch the shim's tree by pid (the job is done and
no kill of it is under way): only then may the shim take another job. EOF counts as both.

Resource limits are applied to the shim before it spawns (posix_spawn cannot set them), and a
raised hard limit cannot be lowered back: a shim only takes jobs asking the limits it already
has, and retires when a request asks others.

When the daemon's end closes (the daemon exited, even by SIGKILL) the launcher kills every
descendant and exits.

Signals from the session's code: in bwrap the launcher is pid 1 of the pid namespace, which
gets no signal from inside that it does not handle, and it handles only SIGCHLD. It and its
shims ignore every signal that can be ignored; the commands get the defaults back. A shim
stopped by SIGSTOP is resumed by the launcher (waitpid reports the stop to its parent); a shim
killed with SIGKILL is replaced, and the job it ran ends (see SandboxInit.reap). The names in
`ps` (and the command line's first word) are toolsd-init and toolsd-shim, not the
interpreter's, so that `pkill -9 -f python` passes them by.
"""

# Modules are chosen for the launcher's start time, which every session.open waits for: the
# C modules under socket, signal and json, since their Python layers import enum and re, which
# cost more than what they are used for.
import _signal
import _ctypes
import _socket as socket
import errno
import marshal
import mmap
import os
import resource
import select
import sys

# JSON string escapes: control characters, the quote and the backslash. (Not _json's encoder:
# loading an extension module adds to the launcher's start, and our strings are short.)
_JSON_ESCAPES = {i: "\\u%04x" % i for i in range(0x20)}
_JSON_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def json_string(text):
    """`text` as a JSON string. Lone surrogates (bytes a file name decoded with
    surrogateescape) are escaped too: they could not be encoded as UTF-8 otherwise."""
    text = text.translate(_JSON_ESCAPES)
    if not text.isascii():
        text = "".join("\\u%04x" % ord(c) if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return '"%s"' % text


PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
MAX_MSG = 1 << 20
MAX_FDS = 64
FD_SIZE = 4  # a C int
ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * FD_SIZE)
SIGCHLD, SIGCONT, SIGKILL = _signal.SIGCHLD, _signal.SIGCONT, _signal.SIGKILL
# Every signal that would end or stop a process by default, less the two nobody can ignore:
# the launcher and its shims ignore them all, so that what the session's code sends to
# everything (pkill, killall, kill -TERM -1) cannot end the sandbox's machinery (SIGKILL and
# SIGSTOP: see SandboxInit.reap). SIGCHLD and SIGCONT keep their meaning.
IGNORED_SIGNALS = tuple(sorted(
    set(_signal.valid_signals()) - {SIGKILL, _signal.SIGSTOP, SIGCHLD, SIGCONT,
                                    _signal.SIGURG, _signal.SIGWINCH}))
# An ignored disposition survives exec (Python itself ignores SIGPIPE and SIGXFSZ), so a
# command would never see SIGPIPE (`yes | head` would spin) or SIGTERM unless we put the
# defaults back.
DEFAULT_SIGNALS = IGNORED_SIGNALS
# Names of the machinery in `ps`, and none that `pkill python` or `killall python` matches:
# shorter than the 15 characters at which killall goes by the command line instead.
LAUNCHER_NAME = b"toolsd-init"
SHIM_NAME = b"toolsd-shim"  # as long as LAUNCHER_NAME: see COMMAND_LINE
PR_SET_NAME = 15
# Readers dying in a row with a request waiting, without taking a job (killed from inside the
# sandbox as soon as they are forked), before the launcher fails the request instead of forking
# again.
MAX_READER_DEATHS = 3
# Shared between the launcher and one shim: (taken, job, command), the job written by the shim
# as the reader before it receives the request, the command's pid once it runs. The launcher
# reads it when the shim says "took" or dies. `taken` is CLAIMED, then SPAWNING from just
# before the shim starts the command: a shim killed before that never ran it.
CLAIMED, SPAWNING = 1, 2
class _Slot:
    """Three int64 in shared memory, written in one copy (struct's packing, without the
    struct module: each extension module loaded adds to the launcher's start)."""

    size = 24

    @staticmethod
    def pack_into(buf, offset, *values):
        buf[offset:offset + 24] = b"".join(v.to_bytes(8, sys.byteorder, signed=True)
                                           for v in values)

    @staticmethod
    def unpack_from(buf):
        data = buf[0:24]
        return tuple(int.from_bytes(data[i:i + 8], sys.byteorder, signed=True)
                     for i in (0, 8, 16))


SLOT = _Slot

class Long(_ctypes._SimpleCData):
    _type_ = "l"


def libc_function(name):
    """A function of the C library returning int, through _ctypes: the ctypes package would
    add its Python layer, all we skip here, to the launcher's start."""
    class Int(_ctypes._SimpleCData):
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    return Function(_ctypes.dlsym(_ctypes.dlopen(None, os.RTLD_NOW), name))


_prctl = libc_function("prctl")
_fcntl = libc_function("fcntl")
F_DUPFD_CLOEXEC = 1030  # the same on every Linux architecture
_syscall = libc_function("syscall")
# ioprio_get(2) has no wrapper in the C library nor in Python.
SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine)
IOPRIO_WHO_PROCESS = 1


def prctl(option, value):
    if _prctl(option, Long(value), Long(0), Long(0), Long(0)) != 0:
        err = _ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def set_name(name):
    """Our name in /proc/PID/comm, which ps, pgrep and killall show and match."""
    _prctl(PR_SET_NAME, name, Long(0), Long(0), Long(0))


_memmove = libc_function("memmove")  # returns a pointer, which we do not use


def set_command_line_name(name):
    """`name` in place of argv[0], the interpreter's path, in the command line that `ps` and
    `pkill -f` read, the rest kept (driver/launcher.py and the fds). The kernel reads it from
    the bytes of argv in our own memory, which we may rewrite (setproctitle does so). Best
    effort: left as it is if anything looks unusual."""
    stat, cmdline = read_self("stat", 4096), read_self("cmdline", 1 << 16)
    if stat is None or cmdline is None:
        return
    try:
        # Fields 48 and 49 of stat: where argv's bytes start and end.
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])
    except (ValueError, IndexError):
        return
    new = name + cmdline[cmdline.find(b"\0"):]
    if end - start != len(cmdline) or not cmdline.endswith(b"\0") or len(new) > len(cmdline):
        return
    new = new.ljust(len(cmdline), b"\0")
    _memmove(Long(start), new, Long(len(new)))
    global COMMAND_LINE
    COMMAND_LINE = start


# Where our argv[0] starts in memory, once set_command_line_name has put the launcher's name
# there: a shim puts its own there, of the same length.
COMMAND_LINE = None


def dup_above(fd, floor):
    """A close-on-exec copy of `fd` numbered `floor` or more (fcntl's F_DUPFD_CLOEXEC)."""
    new = _fcntl(fd, F_DUPFD_CLOEXEC, floor)
    if new < 0:
        err = _ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return new


def ioprio(pid=0):
    if SYS_IOPRIO_GET is None:
        return None
    return _syscall(Long(SYS_IOPRIO_GET), Long(IOPRIO_WHO_PROCESS), Long(pid))


def to_json(obj):
    """JSON text of a message of ours (dicts, lists, str, int, bool, None)."""
    if obj is None:
        return "null"
    if obj is True or obj is False:
        return "true" if obj else "false"
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, str):
        return json_string(obj)
    if isinstance(obj, dict):
        return "{%s}" % ",".join("%s:%s" % (json_string(k), to_json(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return "[%s]" % ",".join(map(to_json, obj))
    raise TypeError("cannot send %r" % (obj,))


def send(sock, obj, fds=()):
    data = to_json(obj).encode()
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, pack_fds(fds))] if fds else []
    sock.sendmsg([data], anc)


def pack_fds(fds):
    return b"".join(fd.to_bytes(FD_SIZE, sys.byteorder, signed=True) for fd in fds)


def fds_of(anc):
    fds = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(int.from_bytes(payload[i:i + FD_SIZE], sys.byteorder, signed=True)
                       for i in range(0, len(payload) - FD_SIZE + 1, FD_SIZE))
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


_port_connect = None


def connect_inside(host, msg):
    """port.forward's connect, made here in the sandbox's network namespace by
    driver/port_connect.py, loaded from beside this file on first use (the launcher's start
    does without it)."""
    global _port_connect
    if _port_connect is None:
        folder = os.path.dirname(main.__code__.co_filename)
        sys.path.insert(0, folder)
        try:
            import port_connect
        except ImportError as e:
            send(host, {"op": "connected", "n": msg.get("n"), "errno": 0,
                        "error": "the launcher could not load port_connect.py: %s" % e})
            return
        finally:
            sys.path.remove(folder)
        _port_connect = port_connect
    _port_connect.answer(host, msg, send)


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


def reap_nohang(flags=0):
    """[(pid, wait status)] of the children that have exited (and with `flags`, WUNTRACED
    and WCONTINUED, of those that were stopped or continued)."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG | flags)
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


def signal_pid(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


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
                os.kill(pid, SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            pass
        reap_nohang()


class StartError(Exception):
    def __init__(self, message, limit=False):
        super().__init__(message)
        self.limit = limit  # a resource limit refused it (EAGAIN): the daemon says so


RLIMITS = tuple(getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_"))


# /proc/self files that a shim reads for each quick_state(), twice a job, kept open from its
# start: a pread at offset 0 gets the kernel's text afresh, without an open and a close each
# time. Empty in the launcher (see keep_self_files).
SELF_FILES = {}


def keep_self_files(names):
    """Open /proc/self/NAME for each of `names`, for read_self. In a shim only: opened in the
    launcher, they would go on naming the launcher in the shims it forks."""
    for name in names:
        try:
            SELF_FILES[name] = os.open("/proc/self/" + name, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            pass  # read_self opens it each time instead


def read_self(name, size=64, pid=0):
    """/proc/self/NAME (of process `pid` when given), at most `size` bytes; None if not
    readable."""
    try:
        if not pid and name in SELF_FILES:
            return os.pread(SELF_FILES[name], size, 0)
        fd = os.open("/proc/%s/%s" % (pid or "self", name), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, size)
        finally:
            os.close(fd)
    except OSError:
        return None


def own_state(pid=0):
    """What of a launcher or shim process a command can change from outside, being of the
    same uid (prlimit, renice, chrt, taskset, ionice, /proc/PID/oom_score_adj and
    coredump_filter), and what a shim would hand on to every command it starts. Of process
    `pid` (a shim's command) when given; OSError if it is gone."""
    return {
        "rlimits": {r: resource.prlimit(pid, r) for r in RLIMITS},
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "policy": (os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority),
        "affinity": os.sched_getaffinity(pid),
        "ioprio": ioprio(pid),
        "oom_score_adj": read_self("oom_score_adj", pid=pid),
        "coredump_filter": read_self("coredump_filter", pid=pid),
    }


def quick_state():
    """What own_state() covers, as a value to compare only, with fewer system calls and less
    Python: the resource limits as the kernel's text (one pread for all of them, and limits
    Python has no name for), in place of one prlimit each."""
    limits = read_self("limits", 4096)
    if limits is None:
        limits = tuple(resource.prlimit(0, r) for r in RLIMITS)
    return (limits, os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0),
            os.sched_getparam(0).sched_priority, os.sched_getaffinity(0), ioprio(),
            read_self("oom_score_adj"), read_self("coredump_filter"))


def state_items(state):
    """An own_state as (what, value) pairs, each resource limit a pair of its own."""
    for key, value in state.items():
        if key == "rlimits":
            yield from (((key, r), limit) for r, limit in value.items())
        else:
            yield key, value


# The launcher's state when it started, before any command of the session could touch it
# (set by main()). Shims compare theirs with it, not with what they inherited: the launcher
# itself may have been changed since.
REFERENCE = None


class Tampered(Exception):
    """The launcher's own state is no longer REFERENCE: every shim it forked would carry the
    change to the session's commands."""


class ProcessLimits:
    """The resource limits this shim has set on itself for its commands (posix_spawn cannot
    set them on the child). None: the ones it inherited, which fit any request."""

    def __init__(self):
        self.applied = None
        self.unknown = False  # a setrlimit failed midway: retire after this job
        self.expected = REFERENCE
        self.expected_quick = self.vouched_quick_state()

    def vouched_quick_state(self):
        """quick_state() now, which tampered() compares with from here on, if own_state()
        read after it is what we expect; else None, which makes every check see a change.
        Read in this order, a change made between the two reads is seen by the second; one
        undone between them leaves a value no later read matches: we retire, never miss it."""
        quick = quick_state()
        return quick if own_state() == self.expected else None

    def tampered(self):
        """Whether our limits, priority, policy, affinity, I/O priority or OOM settings differ
        from the session's start (plus the limits we set): we retire rather than start a
        command with them. Twice a job, so by quick_state(), against the one vouched for."""
        return quick_state() != self.expected_quick

    def handed_on(self, pid):
        """Whether command `pid`, started by us, carries what changed in us (see tampered):
        forked after the change. A change made after its fork, by the command itself as soon
        as it runs say, is not in it, and is no reason to kill it."""
        ours = own_state()
        try:
            theirs = dict(state_items(own_state(pid)))
        except OSError:
            return True  # unreadable: not known to be clean
        expected = dict(state_items(self.expected))
        return any(value != expected.get(key) and theirs.get(key) == value
                   for key, value in state_items(ours))

    def fits(self, rlimits):
        return self.applied is None or self.applied == rlimits

    def apply(self, rlimits):
        if rlimits == self.applied:
            return
        self.unknown = True
        for name, (soft, hard) in rlimits.items():
            which_limit = getattr(resource, "RLIMIT_" + name.upper(), None)
            if which_limit is None:
                raise StartError("unknown resource limit %r (use e.g. as, fsize, cpu, nofile, "
                                 "core, nproc)" % name)
            try:
                resource.setrlimit(which_limit, (soft, hard))
            except (OSError, ValueError) as e:
                raise StartError("cannot set resource limit %s to %r: %s"
                                 % (name, (soft, hard), e))
        self.applied = rlimits
        self.unknown = False
        expected = dict(REFERENCE, rlimits=dict(REFERENCE["rlimits"]))
        for name, (soft, hard) in rlimits.items():
            expected["rlimits"][getattr(resource, "RLIMIT_" + name.upper())] = (soft, hard)
        self.expected = expected
        self.expected_quick = self.vouched_quick_state()

    def cpu_nearly_spent(self):
        """Whether our own CPU time has used half the CPU limit we set on ourselves: the
        kernel would kill us at the limit, in the middle of some later job."""
        limit = (self.applied or {}).get("cpu")
        if not limit or limit[0] < 0:
            return False
        times = os.times()
        return times.user + times.system >= limit[0] / 2


def open_terminal(size):
    """A new pseudo-terminal of the sandbox's own /dev/pts, sized [cols, rows]: (master fd,
    the terminal's path). Made here, inside the sandbox, so that the program's terminal is
    one the session's devpts holds; the daemon gets the master side. StartError if none can
    be made."""
    import fcntl  # only now: a terminal is rare, and each module costs every shim's start
    import termios
    try:
        cols, rows = (int(n) for n in size)
        master, slave = os.openpty()
    except (OSError, ValueError, TypeError) as e:
        raise StartError("cannot open a terminal in the sandbox: %s" % (e,))
    try:
        fcntl.ioctl(master, termios.TIOCSWINSZ,
                    rows.to_bytes(2, sys.byteorder) + cols.to_bytes(2, sys.byteorder)
                    + bytes(4))
        return master, os.ttyname(slave)
    except (OSError, OverflowError) as e:
        os.close(master)
        raise StartError("cannot set up a terminal in the sandbox: %s" % (e,))
    finally:
        # The program opens it again by path, which makes it its controlling terminal.
        os.close(slave)


def start_command(req, fds, limits, slot, terminal=None):
    """chdir, rlimits, posix_spawn. Runs in the shim, so the chdir and the limits touch only
    the shim and its commands. Closes fds. Returns the command's pid. With `terminal` (a
    path) the command's fds 0, 1 and 2 are that terminal instead of the first three fds."""
    moved = []
    try:
        argv = req["argv"]
        env = req["env"]
        cwd = req["cwd"]
        if not argv:
            raise StartError("empty argv: give at least the program to run")
        try:
            os.chdir(cwd)
        except OSError as e:
            raise StartError("cannot use working directory %r: %s; create it or choose another "
                             "cwd" % (cwd, e.strerror))
        program = which(argv[0], env.get("PATH"))
        if program is None:
            raise StartError("no such program: %r is not on PATH=%s; check the name or give a "
                             "full path" % (argv[0], env.get("PATH", os.defpath)))
        limits.apply(req.get("rlimits") or {})
        # A received fd may sit on one of the targets 0..n-1 (seldom: the shim's own 0, 1
        # and 2 are open): then all are dup'ed above the targets first, so that no dup2
        # overwrites a source still needed, and none is a no-op dup2 that would keep
        # CLOEXEC. Else they go to their targets as they are, a dup and a close each spared.
        sources = fds
        if any(fd < len(fds) for fd in fds):
            floor = max(10, len(fds))
            for fd in fds:
                moved.append(dup_above(fd, floor))
            sources = moved
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(sources)
                   if terminal is None or target > 2]
        if terminal is not None:
            # Opened after setsid (glibc runs the file actions after it) and without
            # O_NOCTTY: the program, a session leader, gets it as its controlling terminal.
            actions += [(os.POSIX_SPAWN_OPEN, 0, terminal, os.O_RDWR, 0),
                        (os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]
        SLOT.pack_into(slot, 0, SPAWNING, req["job"], 0)
        try:
            return os.posix_spawn(program, argv, env, file_actions=actions, setsid=True,
                                  setsigdef=DEFAULT_SIGNALS, setsigmask=())
        except OSError as e:
            raise StartError("cannot run %r: %s" % (program, e.strerror),
                             limit=e.errno == errno.EAGAIN)
    finally:
        for fd in (*fds, *moved):
            os.close(fd)


# Shaped like the daemon's requests: the objects parsing it makes land in the same memory pools
# as those of a real one.
WARMUP_REQUEST = marshal.dumps({
    "op": "spawn", "job": 0, "argv": ["/bin/bash", "-c", "true"], "cwd": "/nonexistent",
    "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
            "TERM": "dumb", "NO_COLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat",
            "PYTHONUNBUFFERED": "1"},
    "rlimits": {"as": [1 << 33, 1 << 33], "fsize": [1 << 30, 1 << 30], "cpu": [600, 600],
                "nofile": [1024, 1024], "core": [0, 0], "nproc": [512, 512]},
})


def warm_up():
    """Run the spawn path's Python once on a made-up request while we wait for a real one. A
    forked shim shares its memory with the launcher and the first write to each shared page
    copies it: paid now, not on the spawn's critical path."""
    req = marshal.loads(WARMUP_REQUEST)
    which("warm-up-no-such-program", req["env"]["PATH"])
    quick_state() != REFERENCE
    for name in req["rlimits"]:
        getattr(resource, "RLIMIT_" + name.upper(), None)
    to_json({"op": "started", "job": 0, "pid": 0}).encode()
    pack_fds([0, 1, 2])
    to_json(exit_message_of_status(0, 0)).encode()
    select.poll()


def readable(sock):
    """Whether `sock` has something to read now. poll, not select: our channels keep the
    numbers they had in the daemon, which may be 1024 or more (FD_SETSIZE)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def claim(slot, job):
    """Tell the launcher, through the memory we share, that we take `job`: done before
    receiving it, so that whenever we die the launcher knows whether a job was ours."""
    # Job first, then the flag: a shim killed between the two leaves no half-written claim.
    SLOT.pack_into(slot, 0, 0, job, 0)
    SLOT.pack_into(slot, 0, CLAIMED, job, 0)


RETIRE = "retire"


def take_job(spawn, private, lost, slot, buf, limits):
    """Wait for the next request on the spawn channel and take it (see the module docstring).
    Returns (request, fds); None once the daemon or the launcher is gone; RETIRE, leaving the
    request queued, if it asks for resource limits other than the ones we have set."""
    poller = select.poll()
    poller.register(spawn.fileno(), select.POLLIN)
    poller.register(private.fileno(), select.POLLIN)
    while True:
        events = dict(poller.poll())
        if private.fileno() in events:
            return None  # the launcher never writes to a reader: this is its end closing
        size, _anc, flags, _addr = spawn.recvmsg_into([buf], 0, socket.MSG_PEEK)
        if not size:
            return None
        refuse_truncated(flags & socket.MSG_TRUNC, ())
        req = marshal.loads(buf[:size])
        job = req["job"]
        if job in lost:
            # Claimed by a shim that died before receiving it, and already failed.
            _size, fds = recv_into(spawn, buf)
            for fd in fds:
                os.close(fd)
            continue
        if not limits.fits(req.get("rlimits") or {}) or limits.tampered():
            return RETIRE
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


def tell(private, word):
    """A word to the launcher on our private socketpair."""
    try:
        private.send(word)
    except OSError:
        pass  # the launcher is gone; the sandbox goes with it


def run_job(host, private, slot, req, fds, self_fd, hold_r, hold_w, limits):
    """Start the command, report it, reap its tree, wait for the daemon's release (see the
    module docstring). Returns whether this shim may take another job."""
    job = req["job"]
    master = None
    try:
        terminal = None
        if req.get("tty"):
            master, terminal = open_terminal(req["tty"])
        pid = start_command(req, fds, limits, slot, terminal)
    except Exception as e:
        if master is not None:
            os.close(master)
        message = str(e) if isinstance(e, StartError) else "launcher error: %r" % (e,)
        # "took" before any word to the daemon: a request the daemon sends after hearing
        # from us must never wait on a launcher that thinks we still read.
        tell(private, b"took")
        send(host, {"op": "error", "job": job, "message": message,
                    "limit": getattr(e, "limit", False)})
        os.close(hold_r)
        os.close(hold_w)
        return isinstance(e, StartError) and not limits.unknown
    # Should we die, the launcher ends what we started.
    SLOT.pack_into(slot, 0, SPAWNING, job, pid)
    # Without "ack" the daemon does not want the command's pid: it gets no pidfd of it, and we
    # may reap it at once.
    acked = not req.get("ack", True)
    child_fd = None if acked else os.pidfd_open(pid)
    tell(private, b"took")
    send(host, {"op": "started", "job": job, "pid": pid},
         [self_fd, hold_w] + ([] if acked else [child_fd]) + ([] if master is None else [master]))
    os.close(hold_w)
    if master is not None:
        os.close(master)  # the daemon's now: no copy of ours keeps the terminal open
    # Reported first: the command may stop us as soon as it runs. Then, if something changed
    # us between take_job's check and the spawn, the command may have inherited it: it is
    # killed (too young to have started anything; its exit is reported as SIGKILL), and we
    # retire after this job. Changed since its fork (by itself, say), it runs on.
    tainted = limits.tampered()
    if tainted and limits.handed_on(pid):
        signal_pid(pid, SIGKILL)
    # The daemon reads our and the command's host pids from the pidfds, then writes to the
    # hold pipe; until then a quick command must stay an unreaped zombie or its pid would read
    # as -1. Its exit is reported without waiting for that (WNOWAIT leaves it unreaped).
    exited = None
    released = False
    if not acked:
        poller = select.poll()
        poller.register(child_fd, select.POLLIN)
        poller.register(hold_r, select.POLLIN)
    while not acked:
        for fd, _event in poller.poll():
            if fd == hold_r:
                acked = True
                released = not os.read(hold_r, 64)
            elif exited is None:
                exited = exit_message(job, os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT))
                send(host, exited)
                poller.unregister(child_fd)
    if child_fd is not None:
        os.close(child_fd)
    if exited is None:
        # Acked while the command runs (the usual case): reap orphans of its tree as they
        # come, and report the command's exit when it comes. With "resume" (a REPL's
        # interpreter, which must be running whenever a request reaches it), a stop of the
        # command is undone as soon as we hear of it, so the daemon need not send SIGCONT
        # before each request.
        flags = os.WUNTRACED if req.get("resume") else 0
        while True:
            done_pid, status = os.waitpid(-1, flags)
            if done_pid == pid:
                if os.WIFSTOPPED(status):
                    signal_pid(pid, SIGCONT)
                    continue
                break
        exited = exit_message_of_status(job, status)
        if not children_left():
            exited["done"] = True  # one message, one wakeup of the daemon
            send(host, exited)
            return wait_release(hold_r, released) and not tainted
        send(host, exited)
    else:
        os.waitpid(pid, 0)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    send(host, {"op": "done", "job": job})
    return wait_release(hold_r, released) and not tainted


def wait_release(hold_r, released):
    """Until the daemon closes the hold pipe: before that it may still kill what it takes for
    this job's tree, everything below us. True (we may be reused) unless the pipe misbehaves."""
    try:
        while not released:
            released = not os.read(hold_r, 64)
    except OSError:
        return False
    finally:
        os.close(hold_r)
    return True


def set_policy(policy, priority=0):
    try:
        os.sched_setscheduler(0, policy, os.sched_param(priority))
    except OSError:
        pass  # only a matter of latency


# After this many jobs a shim retires and a fresh fork replaces it, so that its memory does not
# grow for ever. (It retires sooner when its own CPU time nears the session's RLIMIT_CPU.)
MAX_JOBS_PER_SHIM = 1000


def run_shim(host, spawn, private, lost, slot, census, standby):
    """Body of a shim. Never returns: every path ends in os._exit."""
    code = 0
    try:
        # Made before a job comes, off the spawn's critical path. The buffer's pages are only
        # touched as far as a request fills them.
        self_fd = os.pidfd_open(os.getpid())
        keep_self_files(("limits", "oom_score_adj", "coredump_filter"))  # for quick_state
        buf = mmap.mmap(-1, MAX_MSG, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if standby or not readable(spawn):
            warm_up()  # it would only delay a request already there
        # The launcher's batch policy was right for forking us; from here on we are on the
        # critical path of a spawn, and the command inherits our policy: the session's own.
        set_policy(*REFERENCE["policy"])
        limits = ProcessLimits()
        for jobs in range(1, MAX_JOBS_PER_SHIM + 1):
            hold_r, hold_w = os.pipe2(os.O_CLOEXEC)
            if standby:
                # Into buf: recv(MAX_MSG) would map a fresh MiB, and remap and unmap it,
                # for each job. A reset is the launcher letting us go with our "idle" unread.
                try:
                    word = buf[:private.recv_into(buf)]
                except ConnectionResetError:
                    os._exit(0)
                if not word.startswith(b"go"):
                    os._exit(0)  # the launcher is gone, or has standbys enough
                lost = set(marshal.loads(word[2:]))
            taken = take_job(spawn, private, lost, slot, buf, limits)
            if taken is None:
                os._exit(0)
            if taken is RETIRE:
                tell(private, b"retire")
                os._exit(0)
            if not run_job(host, private, slot, taken[0], taken[1], self_fd, hold_r, hold_w,
                           limits):
                os._exit(0)
            if jobs == MAX_JOBS_PER_SHIM or limits.cpu_nearly_spent():
                os._exit(0)
            SLOT.pack_into(slot, 0, 0, 0, 0)
            # The cleared slot says that we are idle; the launcher reads it when it next
            # wants a standby (at the next "took"), so a command after another wakes it once,
            # not twice. Only where more shims live than a reader and its standbys is it told
            # at once: it may have to let some go.
            if int.from_bytes(census[0:8], sys.byteorder) > MAX_STANDBYS + 1:
                tell(private, b"idle")
            standby = True
    except BaseException:
        code = 70
        try:
            import traceback  # only now: it would add to the launcher's start
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
    os._exit(code)


class Shim:
    """The launcher's hold on a forked shim: the reader, a standby, or busy with a job."""

    def __init__(self, pid, sock, slot):
        self.pid = pid
        self.sock = sock  # our end of its private socketpair
        self.slot = slot  # memory shared with it: see SLOT
        self.job = None  # while busy
        self.closed = False  # its socket said EOF: it is exiting, reap() will see it

    def claimed(self):
        """The job it has claimed as the reader, or None."""
        taken, job, _command = SLOT.unpack_from(self.slot)
        return job if taken else None

    def command(self):
        """The pid of the command it started for its job, or 0."""
        return SLOT.unpack_from(self.slot)[2]

    def spawning(self):
        """Whether it may have started the command of the job it took (see SPAWNING)."""
        return SLOT.unpack_from(self.slot)[0] == SPAWNING

    def close(self):
        self.sock.close()
        self.slot.close()


# Idle shims kept as standbys; more go away.
MAX_STANDBYS = 2


class SandboxInit:
    """Keeps a reader, the only process reading the spawn channel, and standbys waiting to be
    told "go". When the reader takes a job a standby becomes the reader at once (a message, no
    fork), and a shim whose job is over becomes a standby. A fork happens when there is no
    standby to promote: at start, when jobs overlap, or when shims died or retired; the
    standby is then refilled when a shim exits, the likeliest quiet moment, since a fork costs
    CPU and on a spawn's critical path it slows the command and the daemon's
    reply. We run with the batch policy, so that a fork never preempts a spawn's processes on
    wakeup; shims switch back before they wait."""

    def __init__(self, host, spawn):
        self.host = host
        self.spawn_channel = spawn
        self.reader = None
        self.standbys = []
        self.busy = {}  # pid -> Shim running a job
        self.reader_deaths = 0  # readers that died in a row without taking a job
        self.lost_jobs = set()  # taken by readers that died before "took": maybe still queued
        self.helpers = set()  # pids of the daemon's helpers (start_helper)
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # How many shims live, for them to read (see run_shim), written by us only.
        self.census = mmap.mmap(-1, 8, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)

    def shims(self):
        return [s for s in (self.reader, *self.standbys, *self.busy.values()) if s is not None]

    def count_shims(self):
        self.census[0:8] = len(self.shims()).to_bytes(8, sys.byteorder)

    def fork_shim(self, standby):
        state = own_state()
        state["policy"] = REFERENCE["policy"]  # ours is the batch policy, on purpose
        if state != REFERENCE:
            raise Tampered("a command of the session changed the launcher itself (its limits, "
                           "priority, affinity or OOM settings); every command it started "
                           "would carry that, so the session ends")
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
                _signal.set_wakeup_fd(-1)
                # _signal, not signal: the wrapper turns the old handler (ours, a function)
                # into an enum through a raised ValueError, which costs a shim copied pages
                # of the memory it shares with us.
                _signal.signal(SIGCHLD, _signal.SIG_DFL)
                set_name(SHIM_NAME)
                if COMMAND_LINE is not None:
                    _memmove(Long(COMMAND_LINE), SHIM_NAME, Long(len(SHIM_NAME)))
                os.close(self.wake_r)
                os.close(self.wake_w)
                parent_end.close()
                # The other shims' sockets: holding them would keep them from seeing our EOF.
                for other in self.shims():
                    other.close()
                prctl(PR_SET_CHILD_SUBREAPER, 1)
            except BaseException:
                os._exit(70)
            run_shim(self.host, self.spawn_channel, child_end, self.lost_jobs, slot,
                     self.census, standby)
            os._exit(70)  # not reached: run_shim always exits
        child_end.close()
        parent_end.setblocking(False)
        shim = Shim(pid, parent_end, slot)
        if standby:
            self.standbys.append(shim)
        else:
            self.reader = shim
        self.count_shims()

    def collect_idle(self):
        """Busy shims whose job is over (their slot cleared, see run_shim) become standbys,
        as many as MAX_STANDBYS; the others are let go."""
        for pid, shim in list(self.busy.items()):
            if shim.closed or shim.claimed() is not None:
                continue
            del self.busy[pid]
            shim.job = None
            if len(self.standbys) < MAX_STANDBYS:
                self.standbys.append(shim)
            else:
                shim.closed = True
                shim.close()  # EOF instead of "go": it exits

    def promote(self):
        """Make a standby the reader, if there is no reader. The last to arrive goes first:
        its memory is the likeliest to be cached."""
        self.collect_idle()
        while self.reader is None and self.standbys:
            shim = self.standbys.pop()
            try:
                shim.sock.send(b"go" + marshal.dumps(sorted(self.lost_jobs)))
            except OSError:
                shim.close()  # it died; reap() sees it
                continue
            self.reader = shim

    def refill(self):
        """A reader, then a standby, by promotion or fork; retried later if a fork fails."""
        self.promote()
        try:
            if self.reader is None:
                self.fork_shim(standby=False)
            if not self.standbys:
                self.fork_shim(standby=True)
        except OSError:
            pass

    def replace_reader(self):
        self.reader = None
        self.promote()
        if self.reader is None:
            # No standby: jobs overlap. Fork now rather than when a request waits.
            try:
                self.fork_shim(standby=False)
            except OSError:
                pass  # retried when a request waits

    def read_words(self, shim, drain=True):
        """Act on what a shim said: all of it, or with `drain` False the one word that woke
        us (poll reports a word left over in its next round; one more recv each wakeup, to
        find the socket empty, would be a system call in vain on every spawn)."""
        while not shim.closed:
            try:
                word = shim.sock.recv(64)
            except BlockingIOError:
                return
            except OSError:
                word = b""
            if word == b"took" and shim is self.reader:
                shim.job = shim.claimed()
                self.busy[shim.pid] = shim
                self.reader_deaths = 0
                self.replace_reader()
            elif word == b"retire" and shim is self.reader:
                shim.closed = True  # exiting
                shim.close()
                self.replace_reader()
            elif word == b"idle":
                # Unless its cleared slot got it collected already (then maybe made the
                # reader since): a late word, not a sign that it exits.
                if self.busy.get(shim.pid) is shim:
                    self.promote()  # which collects it, and any other whose job is over
            else:
                shim.closed = True  # exiting: stop polling it, SIGCHLD follows
            if not drain:
                return

    def reap(self):
        """Collect exited children and act on them; resume shims that something stopped."""
        reaped = False
        dead = []  # (job, command or 0, spawning) of shims killed in the middle of a job
        others = {}  # pid -> wait status of children that were no shim
        for pid, status in reap_nohang(os.WUNTRACED | os.WCONTINUED):
            if os.WIFSTOPPED(status) or os.WIFCONTINUED(status):
                # SIGSTOP cannot be ignored: a command may stop any shim (kill -STOP -1),
                # which would then never take, report or end a job. Its own processes the
                # session may stop as it likes.
                if os.WIFSTOPPED(status) and (pid in self.helpers
                                              or any(s.pid == pid for s in self.shims())):
                    signal_pid(pid, SIGCONT)
                continue
            reaped = True
            self.helpers.discard(pid)
            if pid not in {shim.pid for shim in self.shims()}:
                others[pid] = status  # something a dead shim left, reparented to us
            for shim in self.standbys:
                if shim.pid == pid:
                    self.standbys.remove(shim)
                    shim.close()
                    break
            if self.reader is not None and pid == self.reader.pid:
                self.read_words(self.reader)  # what it said before dying: "took" makes it busy
            if self.reader is not None and pid == self.reader.pid:
                job = self.reader.claimed()
                if job is not None:
                    self.lost_jobs.add(job)
                    self.busy[pid] = self.reader
                    self.reader.job = job
                else:
                    self.reader.close()
                # Only readers killed while a request waits count towards giving up on it:
                # a session's `kill -9 -1` that killed idle shims costs it nothing.
                if readable(self.spawn_channel):
                    self.reader_deaths += 1
                self.reader = None
                self.promote()
            shim = self.busy.pop(pid, None)
            if shim is None:
                continue
            if not shim.closed:
                self.read_words(shim)  # an "idle" said before dying
            over = shim.claimed() is None  # its slot cleared: killed between jobs
            command, spawning = shim.command(), shim.spawning()
            shim.close()
            if status != 0 and shim.job is not None and not over:
                dead.append((shim.job, command, spawning))
        if dead:
            # Whatever the dead shims started has reparented to us: it goes, and nothing
            # tells one dead shim's tree from another's.
            others.update(self.kill_orphans())
            for job, command, spawning in dead:
                if not command and spawning:
                    # Killed between starting its command and writing its pid down (the
                    # command can stop it that soon): if it ran, we just ended it.
                    command = -1
                if command:
                    # A wait status of SIGKILL (9) where its own went unseen.
                    message = exit_message_of_status(job, others.get(command, SIGKILL))
                    message["done"] = True
                else:
                    # Killed before starting the command: say so, or the daemon would wait
                    # for `started` for ever. It never ran, so the daemon may send it again.
                    message = {"op": "error", "job": job, "unstarted": True,
                               "message": "the launcher's shim died before starting the "
                                          "command"}
                send(self.host, message)
        if reaped and self.reader_deaths == 0:
            self.refill()

    def kill_orphans(self):
        """SIGKILL everything below us that no live shim holds (what dead shims left: it
        reparented to us, the subreaper) until nothing is left; {pid: wait status} of our
        direct children among it."""
        me = os.getpid()
        shims = {shim.pid for shim in self.shims()} | self.helpers
        statuses = {}
        while True:
            children = child_map()
            direct = [pid for pid in children.get(me, ()) if pid not in shims]
            if not direct:
                return statuses
            todo, targets = list(direct), []
            while todo:
                pid = todo.pop()
                targets.append(pid)
                todo.extend(children.get(pid, ()))
            for pid in targets:
                try:
                    os.kill(pid, SIGKILL)
                except ProcessLookupError:
                    pass
            for pid in direct:
                try:
                    _pid, status = os.waitpid(pid, 0)
                    statuses[pid] = status
                except ChildProcessError:
                    pass

    def serve_waiting_request(self):
        """A request waits and no reader exists: make one, or fail the request if we cannot.
        False once the daemon has closed the channel."""
        self.promote()
        if self.reader is not None:
            return True
        limit = False
        if self.reader_deaths < MAX_READER_DEATHS:
            try:
                self.fork_shim(standby=False)
                return True
            except OSError as e:
                reason = "the launcher could not fork: %s" % e.strerror
                limit = e.errno == errno.EAGAIN
        else:
            reason = ("the launcher's shims were killed before they could start the command; "
                      "stop what kills them in the sandbox, or open a new session")
            self.reader_deaths = 0
        data, fds = recv(self.spawn_channel)
        for fd in fds:
            os.close(fd)
        if not data:
            return False
        try:
            job = marshal.loads(data)["job"]
        except (ValueError, EOFError, KeyError, TypeError):
            return True
        if job in self.lost_jobs:
            self.lost_jobs.discard(job)  # already failed
        else:
            send(self.host, {"op": "error", "job": job, "message": reason, "limit": limit})
        return True

    def serve(self):
        set_policy(os.SCHED_BATCH)
        _signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        _signal.signal(SIGCHLD, lambda *_: None)
        self.reap()
        # The reader first: the session's first command comes right after "ready", and would
        # otherwise wait for this fork.
        try:
            self.fork_shim(standby=False)
        except OSError:
            pass  # refill() and serve_waiting_request() try again
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
            self.count_shims()
            poller = select.poll()
            poller.register(host_fd, select.POLLIN)
            poller.register(self.wake_r, select.POLLIN)
            talking = {}  # fd -> shim whose words we wait for
            for shim in (self.reader, *self.busy.values()):
                if shim is not None and not shim.closed:
                    talking[shim.sock.fileno()] = shim
                    poller.register(shim.sock.fileno(), select.POLLIN)
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
            for fd, shim in talking.items():
                if fd in events and not shim.closed:
                    self.read_words(shim, drain=False)
            if spawn_fd in events and self.reader is None:
                if not self.serve_waiting_request():
                    return  # the daemon is gone
            if host_fd not in events:
                continue
            data, fds = recv(self.host)
            try:
                if not data:
                    return  # the daemon is gone
                msg = marshal.loads(data)
                op = msg.get("op")
                if op == "ping":
                    send(self.host, {"op": "pong", "n": msg.get("n")})
                elif op == "connect":
                    connect_inside(self.host, msg)
                elif op == "helper":
                    self.start_helper(msg, fds)
                else:
                    print("launcher: ignoring unknown message %r" % (op,), file=sys.stderr)
            finally:
                for fd in fds:
                    os.close(fd)

    def start_helper(self, msg, fds):
        """A helper of the daemon's (the file helper, driver/file_helper.py): argv run with
        fds[0] as its fd 3, our child like the shims, ignoring the signals we ignore;
        kill_orphans spares it and reap resumes it, as a shim."""
        try:
            moved = dup_above(fds[0], 10)
            try:
                pid = os.posix_spawn(msg["argv"][0], msg["argv"], msg["env"], setsid=True,
                                     file_actions=[(os.POSIX_SPAWN_DUP2, moved, 3)])
            finally:
                os.close(moved)
            self.helpers.add(pid)
        except (OSError, KeyError, IndexError, TypeError) as e:
            # The daemon sees its end of the socket close.
            print("launcher: cannot start a helper: %s" % (e,), file=sys.stderr)


def listen_inside(host, spec):
    """The egress proxy's listeners (`listen=tcp:3128,udp:53,...`, all on 127.0.0.1), made
    here in the session's network namespace and handed to the daemon, which serves them:
    nothing of the proxy is left inside for the session's code to kill. Then the one
    capability the sandbox was given for it (binding port 53) is dropped."""
    made = []
    try:
        for item in spec.split(","):
            kind, port = item.split(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM if kind == "tcp"
                                 else socket.SOCK_DGRAM)
            made.append(sock)
            sock.bind(("127.0.0.1", int(port)))
            if kind == "tcp":
                sock.listen(4096)
        send(host, {"op": "listening", "names": spec.split(",")}, [s.fileno() for s in made])
    except OSError as e:
        send(host, {"op": "listening", "error": "%s: %s" % (spec, e)})
    finally:
        for sock in made:
            sock.close()
    # capset(2): no capability left, in any set; then none in the ambient set.
    header = (0x20080522).to_bytes(4, sys.byteorder) + bytes(4)
    libc_function("capset")(header, bytes(24))
    _prctl(47, Long(4), Long(0), Long(0), Long(0))  # PR_CAP_AMBIENT_CLEAR_ALL


def main():
    listen = sys.argv.pop() if len(sys.argv) == 4 and sys.argv[3].startswith("listen=") else None
    if len(sys.argv) != 3 or not all(arg.isdigit() for arg in sys.argv[1:]):
        print("usage: launcher.py FD SPAWN_FD [listen=tcp:PORT,udp:PORT,...] (ends of two "
              "SOCK_SEQPACKET socketpairs: the control channel and the spawn channel)",
              file=sys.stderr)
        return 2
    # Our stdin may be the code we run (see BOOTSTRAP in toolsd/sandbox/launch/bootstrap.py):
    # shims and their commands get nothing of it.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    host = socket.socket(fileno=int(sys.argv[1]))
    spawn = socket.socket(fileno=int(sys.argv[2]))
    os.set_inheritable(host.fileno(), False)
    os.set_inheritable(spawn.fileno(), False)
    # Sandboxed code runs as our uid: without this it could ptrace us or open our fds (the
    # daemon's sockets) through /proc.
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    global REFERENCE
    REFERENCE = own_state()
    # Nothing but the daemon's channel ends us (EOF): no signal the session's code can send.
    # In the sandbox we are pid 1 of its pid namespace, whom the kernel spares every signal
    # from inside that we do not handle, SIGKILL and SIGSTOP included; ignoring the rest
    # (SIGINT would raise KeyboardInterrupt) keeps it so, and the shims inherit it.
    for sig in IGNORED_SIGNALS:
        _signal.signal(sig, _signal.SIG_IGN)
    set_name(LAUNCHER_NAME)
    set_command_line_name(LAUNCHER_NAME)
    if listen is not None:
        listen_inside(host, listen[len("listen="):])
    try:
        SandboxInit(host, spawn).serve()
    except Tampered as e:
        print("launcher: %s" % e, file=sys.stderr)
    finally:
        kill_everything()
    return 0


if __name__ == "__main__":
    sys.exit(main())
