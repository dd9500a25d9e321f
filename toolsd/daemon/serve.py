"""`toolsd serve`: bring the daemon up, serve until SIGTERM/SIGINT, then end everything; the
listening socket, its peer check, and a Connection for each client. cli/serve.py builds the
call from what is here (Config, hidden_and_shown, run).

Shutdown order: stop accepting, remove the socket, close every session (each ends its
processes and REPLs: SIGTERM, grace, SIGKILL), exit 0.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import resource
import shutil
import signal
import socket
import stat
import struct
import sys

import trio

from toolsd.daemon.connection import Connection
from toolsd.daemon.workspaces import check_work_root  # noqa: F401  (for cli/serve.py)
from toolsd.daemon.state_folder import StateInUse, ensure_private_dir
from toolsd.daemon.supervisor import Config, Supervisor
from toolsd.sandbox.bwrap import home
from toolsd.sandbox.git_watch import inotify
from toolsd.sandbox.bwrap import overlay
from toolsd.sandbox.launch.probe import probe_bwrap
from toolsd.tools.ports import check_forward_binds  # noqa: F401 (for cli/serve.py)

log = logging.getLogger("toolsd")

# Connections the kernel queues for us before we accept them (it caps this at
# net.core.somaxconn). Past it, a connect is refused at once with EAGAIN (the client library
# tries again for a while): hundreds of agents connecting in the same moment must fit.
LISTEN_BACKLOG = 4096


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


def hidden_and_shown(hide: list[str], show: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`--hide` paths (absolute) and `--show` entries (relative to the home), checked;
    ValueError says what cannot be done and why."""
    hidden = tuple(os.path.abspath(os.path.expanduser(h)) for h in hide)
    for path in hidden:
        try:
            home.check_hideable(os.path.realpath(path))
        except ValueError as e:
            raise ValueError(f"--hide {path}: {e}") from None
    own_home = os.path.realpath(os.path.expanduser("~"))
    shown = tuple(dict.fromkeys(home.shown_entry(os.path.expanduser(s), own_home)
                                for s in show))
    for rel in shown:
        path = os.path.join(own_home, rel)
        if any(os.path.realpath(h) == path for h in hidden):
            raise ValueError(f"{path} is given to both --hide and --show; keep one")
    return hidden, shown


def take_lock(socket_path: str) -> int:
    """One daemon per socket: an flock beside the socket, released by the kernel if we die."""
    lock_path = socket_path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartupError(f"another toolsd is already serving on {socket_path}; stop it first "
                           f"(toolsd status --socket {socket_path}) or pass another --socket")
    return fd


def raise_open_files_limit() -> None:
    """Our soft RLIMIT_NOFILE up to the hard limit: each session holds a few descriptors and
    each connection one, and the usual soft limit of 1024 would cap a daemon at a few hundred
    sessions. Sandboxed commands do not inherit it: the launcher sets the session's own limit
    (Limits.nofile) on every command it starts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        # The kernel refuses an infinite soft limit for open files: its ceiling is nr_open.
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            return
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as e:
        log.warning("could not raise the open files limit from %d to %d (%s); the daemon may "
                    "run out of descriptors with many sessions", soft, target, e)


def run(config: Config, *, announce=print) -> None:
    raise_open_files_limit()
    ensure_private_dir(os.path.dirname(config.socket_path))
    lock_fd = take_lock(config.socket_path)
    bwrap, why_not = probe_bwrap()
    overlay.report(bwrap)
    if bwrap is None:
        if config.require_sandbox:
            raise StartupError(f"--require-sandbox: no sandbox is possible here: {why_not}")
        log.warning("sessions will run UNSANDBOXED (sandbox: none): %s", why_not)
    try:
        # Taken at start: made at the first session, it could find the user's inotify
        # instances all taken by other programs by then.
        inotify.shared().open()
    except OSError as e:
        log.warning("host_exec: %s; sessions will report that their workspace is not "
                    "watched until one can be made (fs.inotify.max_user_instances)", e)
    try:
        trio.run(_main, config, bwrap, why_not, announce)
    except BaseExceptionGroup as group:
        raise _startup_error(group) from None
    finally:
        os.close(lock_fd)


def _startup_error(group: BaseExceptionGroup) -> BaseException:
    """The StartupError a nursery wrapped, plain, so `toolsd serve` prints its message; the
    group itself when it holds anything else."""
    found, rest = group.split(StartupError)
    if found is None or rest is not None:
        return group
    error: BaseException = found
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def _main(config: Config, bwrap, why_not: str, announce) -> None:
    try:
        sock = bind_socket(config.socket_path)
    except AlreadyServing as e:
        raise StartupError(str(e)) from None
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            try:
                supervisor = Supervisor(config, nursery, bwrap, why_not)
            except StateInUse as e:
                sock.close()
                _unlink(config.socket_path)
                raise StartupError(str(e)) from None
            # Connections live in the accepting nursery: cancelling it stops accepting and
            # cancels every in-flight request (sessions are the supervisor's, not theirs).
            async with trio.open_nursery() as accepting:
                await accepting.start(serve, supervisor, sock, config.max_frame)
                try:
                    remote_lines = await listen_tls(config, supervisor, accepting)
                except StartupError:
                    sock.close()
                    _unlink(config.socket_path)
                    await supervisor.aclose()
                    raise
                announce(f"toolsd listening on {config.socket_path} "
                         f"(sandbox: {supervisor.host.sandbox_kind})", flush=True)
                for line in remote_lines:
                    announce(line, flush=True)
                announce(f"try: {typed_command()} --socket {config.socket_path} exec -- echo "
                         f"hello", flush=True)
                async for signum in signals:
                    log.info("%s: shutting down", signal.Signals(signum).name)
                    break
                accepting.cancel_scope.cancel()
            sock.close()
            _unlink(config.socket_path)
            await supervisor.aclose()
            nursery.cancel_scope.cancel()


def typed_command() -> str:
    """What a person types here to run this toolsd: `toolsd` where PATH finds this one, else
    its script's path (relative to the working folder when inside it: `.venv/bin/toolsd`),
    else `python -m toolsd` on this interpreter."""
    script = os.path.join(os.path.dirname(sys.executable), "toolsd")
    if not os.access(script, os.X_OK):
        return f"{sys.executable} -m toolsd"
    found = shutil.which("toolsd")
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "toolsd"
    relative = os.path.relpath(script)
    return relative if not relative.startswith("..") else script
async def listen_tls(config: Config, supervisor: Supervisor,
                     nursery: trio.Nursery) -> list[str]:
    """Start a TLS listener for each --listen URL; the lines that say where (none without)."""
    if not config.listen:
        return []
    from toolsd.daemon import remote_setup, tls_serve  # cryptography: only for TCP

    try:
        addresses = [remote_setup.parse_listen(url) for url in config.listen]
        remote = remote_setup.prepare(
            supervisor.state.path, [a.host for a in addresses], cert=config.tls_cert,
            key=config.tls_key, tokens_file=config.tokens_file)
    except remote_setup.SetupError as e:
        raise StartupError(str(e)) from None
    urls = []
    for address in addresses:
        try:
            bound = await nursery.start(tls_serve.serve_tls, supervisor, remote, address.host,
                                        address.port, config.max_frame)
        except OSError as e:
            raise StartupError(f"--listen {address}: cannot listen there ({e.strerror}); "
                               f"pick another port or host") from None
        urls += [str(type(address)("tls", host=host, port=port)) for host, port in bound]
    fingerprint = remote.certificate.fingerprint
    remote_setup.write_info(supervisor.state.path, urls, fingerprint, config.tokens_file,
                            config.socket_path)
    tenants = ", ".join(remote.tokens.table.tenants) or "none yet"
    return [f"toolsd listening on {url} (TLS 1.3, fingerprint {fingerprint}; tenants: "
            f"{tenants}; `toolsd token` prints what a client needs)" for url in urls]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


def peer_uid(sock: trio.socket.SocketType) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class AlreadyServing(Exception):
    pass


def bind_socket(path: str) -> trio.socket.SocketType:
    """Bind the listening socket at `path`, 0600, replacing a stale file left by a dead daemon
    and refusing when a live daemon answers there."""
    if os.path.lexists(path) and not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise AlreadyServing(f"{path} exists and is not a socket; remove it or pass another "
                             f"--socket")
    if os.path.lexists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                raise
            log.info("replacing a stale socket file at %s", path)
            os.unlink(path)
        else:
            raise AlreadyServing(
                f"another toolsd is already serving on {path}; stop it first or pass "
                f"another --socket"
            )
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    sock.listen(LISTEN_BACKLOG)
    return trio.socket.from_stdlib_socket(sock)


async def serve(supervisor: Supervisor, sock: trio.socket.SocketType, max_frame: int,
                *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Accept connections until cancelled."""
    listener = trio.SocketListener(sock)
    my_uid = os.getuid()

    async def handle(stream: trio.SocketStream) -> None:
        try:
            uid = peer_uid(stream.socket)
        except OSError:
            uid = -1
        if uid not in (my_uid, 0):
            log.warning("refused a connection from uid %s", uid)
            await trio.aclose_forcefully(stream)
            return
        async with stream:
            try:
                await Connection(stream, supervisor, max_frame).serve()
            except Exception:
                # Whatever one client did, the daemon and everyone else's sessions stay up.
                log.exception("a connection failed; closing it")

    async with trio.open_nursery() as nursery:
        task_status.started()
        await trio.serve_listeners(handle, [listener], handler_nursery=nursery)
