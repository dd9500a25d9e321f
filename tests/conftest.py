"""A real daemon on a temporary socket, with its own HOME and state folder, for each test that
asks for one; at the end it is stopped with SIGTERM and nothing it started may be left."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from _launchers import BWRAP, ENV, bwrap_prefix, tree_pids
from toolsd.client import AsyncClient, Client
from toolsd.sandbox.launch.launcher_client import Launcher

HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) is not installed")


STARTED: list[RunningDaemon] = []


@pytest.fixture(scope="session", autouse=True)
def no_daemon_outlives_the_tests():
    """Whatever a failing test skipped, no daemon (and so no sandbox: --die-with-parent) is
    left running after the run."""
    yield
    for d in STARTED:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


class RunningDaemon:
    """A daemon on a temporary socket. Without a warm spare unless `warm_spare=True`: the
    many tests that check that a closed session leaves no process would otherwise find the
    spare (tests/test_warm_spare.py tests it)."""

    def __init__(self, root: str, extra_args: tuple[str, ...] = (), env: dict | None = None,
                 warm_spare: bool = False, prefix: tuple[str, ...] = (), tls: bool = False):
        self.root = root
        # With `tls`, it also listens on tls://127.0.0.1:<a free port> (docs/remote.md):
        # `url`, `fingerprint` and `token` (tenant default) say how to reach it.
        self.tls = tls
        self.url = self.fingerprint = self.token = None
        self.socket = os.path.join(root, "run", "toolsd.sock")
        self.state_dir = os.path.join(root, "state")
        self.home = os.path.join(root, "home")
        self.workspace = os.path.join(root, "ws")
        os.makedirs(os.path.join(self.home, ".ssh"), exist_ok=True)
        with open(os.path.join(self.home, ".ssh", "id_rsa"), "w") as f:
            f.write("SECRET-KEY\n")
        with open(os.path.join(self.home, "notes.txt"), "w") as f:
            f.write("PUBLIC-NOTE\n")  # not hidden: proves HOME itself is in the session's view
        os.makedirs(self.workspace, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("TOOLSD_SOCKET", "XDG_RUNTIME_DIR")}
        self.env["HOME"] = self.home
        self.env.update(env or {})
        self.extra_args = (*extra_args, *(() if warm_spare else ("--no-warm-spare",)),
                           *(("--listen", "tls://127.0.0.1:0") if tls else ()))
        self.prefix = prefix  # a command that ends by exec'ing the daemon's argv after it
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(root, "daemon.log")

    def start(self) -> RunningDaemon:
        STARTED.append(self)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", "toolsd", "serve", "--socket", self.socket,
             "--state-dir", self.state_dir, *self.extra_args],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL, env=self.env)
        # The daemon prints its first line once the socket accepts: wait on that, not a sleep.
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            self.proc.wait(timeout=30)
            raise RuntimeError(f"toolsd did not start: {line!r}\n{self.read_log()}")
        if self.tls:
            self.read_tls_lines()
        return self

    def read_tls_lines(self) -> None:
        """The URL and fingerprint the daemon printed, and the token of tenant default."""
        while True:
            line = self.proc.stdout.readline().decode()
            if not line or line.startswith("try:"):
                break
            if "tls://" in line:
                words = line.split()
                self.url = next(w for w in words if w.startswith("tls://"))
                self.fingerprint = next(w for w in words if w.startswith("sha256:")).rstrip(";")
        token_file = os.path.join(self.state_dir, "token")
        if os.path.exists(token_file):
            with open(token_file) as f:
                self.token = f.read().split()[1]
        assert self.url and self.fingerprint, "the daemon printed no TLS listener"

    def read_log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def client(self, transport: str = "unix", token: str | None = None) -> Client:
        if transport == "tls":
            return Client(self.url, token=token or self.token, fingerprint=self.fingerprint)
        return Client(self.socket)

    async def async_client(self, transport: str = "unix",
                           token: str | None = None) -> AsyncClient:
        if transport == "tls":
            return await AsyncClient.connect(self.url, token=token or self.token,
                                             fingerprint=self.fingerprint)
        return await AsyncClient.connect(self.socket)

    def tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def running(self, text: str) -> list[psutil.Process]:
        """Live processes of the daemon's tree whose command line contains `text`."""
        found = []
        for p in self.tree():
            try:
                if not has_ended(p) and text in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.Error:
                pass  # ended while we looked
        return found

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        left = self.tree()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # a daemon that hangs on SIGTERM is a failure, never a leftover
            self.proc.wait()
            raise AssertionError(f"toolsd did not stop within 60 s of {sig!r}\n"
                                 f"{self.read_log()[-3000:]}") from None
        finally:
            self.proc.stdout.close()
            self.log.close()
        alive = wait_gone(left, timeout=10)
        assert not alive, f"toolsd left processes behind: {alive}"
        return code


def has_ended(proc: psutil.Process) -> bool:
    # A zombie has ended: it only waits for its parent to collect it (for bwrap's pid 1, the
    # host's init, which may take a second).
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def alive(pids) -> list[int]:
    """The pids still running (a zombie has exited: only its parent's wait is pending)."""
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def assert_gone(pids) -> None:
    """Every pid has exited (a zombie has exited too: only its parent's wait is pending). A
    process SIGKILLed a moment ago that has not had a CPU since is not a zombie yet: it gets
    a few seconds to become one (on a loaded 2-core machine it waits its turn)."""
    deadline = time.monotonic() + 5
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not left, f"still running: {left}"


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait (bounded) for every process to end; returns those still alive."""
    import time

    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not has_ended(p)]
    while alive and time.monotonic() < deadline:
        psutil.wait_procs(alive, timeout=0.05)
        alive = [p for p in alive if not has_ended(p)]
    return alive


def wait_for(condition, timeout: float = 30) -> None:
    """Until `condition()` holds; a safety net against a hang, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still not so after {timeout:g} s"
        time.sleep(0.05)


def short_tempdir() -> str:
    # AF_UNIX paths are limited to 107 bytes: pytest's tmp_path can be longer than that.
    # Not under /tmp: a session gets a private /tmp, which would hide a HOME kept there and
    # make every "the credentials are hidden" test pass for the wrong reason.
    return tempfile.mkdtemp(prefix="toolsd-t-", dir="/var/tmp")


def daemon_without_bash(root: str, tools=("sh", "echo", "cat", "python3", "bwrap")):
    """A daemon, not yet started, whose PATH (and so its sessions') has sh but no bash: a folder
    inside the workspace, so that the sandbox sees it where the daemon does, with links to
    `tools` only."""
    d = RunningDaemon(root)
    bin_dir = os.path.join(d.workspace, "bin-no-bash")
    os.makedirs(bin_dir)
    for tool in tools:
        real = shutil.which(tool)
        if real:
            os.symlink(os.path.realpath(real), os.path.join(bin_dir, tool))
    d.env["PATH"] = bin_dir
    return d


def start_daemon(root: str, mark: pytest.Mark | None) -> RunningDaemon:
    """A daemon in `root` started as the `daemon` mark says: its positional arguments are
    added to `toolsd serve`; `env`, `tls`, `warm_spare` and `prefix` are RunningDaemon's;
    `prepare(d)` runs before the start (to put files in its HOME, change d.env, ...)."""
    options = dict(mark.kwargs) if mark else {}
    options.pop("shared", None)
    prepare = options.pop("prepare", None)
    d = RunningDaemon(root, tuple(mark.args) if mark else (), **options)
    if prepare is not None:
        prepare(d)
    return d.start()


@pytest.fixture
def daemon_root():
    root = short_tempdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "daemon(*serve_args, shared=False, env=None, tls=False, warm_spare=False, "
        "prefix=(), prepare=None): which daemon the `daemon` fixture is, the closest mark "
        "deciding (a test's over its module's; options are not merged). With shared=True "
        "(as a module's pytestmark) the module's tests share one daemon, each with a "
        "workspace of its own; after each test its sessions are closed and the daemon's tree "
        "must be empty. Otherwise each test has a daemon of its own, started with the options.")
    config.addinivalue_line(
        "markers", "cluster_heavy: the 150-session Ray cluster test (minutes); run it alone "
        "with -m cluster_heavy, or leave it out with -m 'not cluster_heavy'")


class DaemonView:
    """The module's daemon, seen with a workspace of the test's own: everything else (socket,
    home, state, tree, client) is the shared daemon's."""

    def __init__(self, daemon: RunningDaemon, workspace: str):
        self._daemon = daemon
        self.workspace = workspace

    def __getattr__(self, name):
        return getattr(self._daemon, name)


class ModuleDaemon:
    """One daemon for a module's tests, started on first use. A test that leaves a process
    behind or kills the daemon fails itself, and the next test gets a new daemon: a leftover
    never shows up in another test's check."""

    def __init__(self, mark: pytest.Mark | None):
        self.root: str | None = None
        self.daemon: RunningDaemon | None = None
        self.mark = mark

    def get(self) -> RunningDaemon:
        if self.daemon is None:
            root = short_tempdir()
            try:
                self.daemon = start_daemon(root, self.mark)
            except BaseException:
                shutil.rmtree(root, ignore_errors=True)
                raise
            self.root = root
        return self.daemon

    def discard(self, check: bool = True) -> None:
        """Stop the daemon; `check`: it must stop cleanly (else it is already failing a test,
        and only its processes must go)."""
        d, root, self.daemon, self.root = self.daemon, self.root, None, None
        try:
            if d is not None:
                code = d.stop()
                assert not check or code == 0, d.read_log()
        finally:
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)

    def check_after(self, test: str) -> None:
        """Close what the test left open, then nothing may be left in the daemon's tree."""
        d = self.daemon
        try:
            with d.client() as c:
                for s in c.session_list()["sessions"]:
                    c.session_close(s["session"])
            left = wait_gone([p for p in d.tree() if not has_ended(p)], timeout=10)
            assert not left, f"{test} left processes behind: {left}"
        except Exception as e:
            ended = d.proc.poll() is not None
            log = d.read_log()[-3000:]
            self.discard(check=False)
            if ended:
                raise AssertionError(f"the module's daemon ended during {test}\n{log}") from e
            raise


@pytest.fixture(scope="module")
def shared_module_daemon(request):
    """The daemon the tests of a module marked `daemon(shared=True)` share."""
    shared = ModuleDaemon(request.node.get_closest_marker("daemon"))
    try:
        yield shared
    finally:
        shared.discard()


@pytest.fixture
def daemon(request):
    """The test's daemon, as the closest `daemon` mark says: the module's shared daemon with a
    workspace of the test's own, or a daemon of the test's own (the default)."""
    mark = request.node.get_closest_marker("daemon")
    if mark is not None and mark.kwargs.get("shared"):
        shared = request.getfixturevalue("shared_module_daemon")
        d = shared.get()
        workspace = tempfile.mkdtemp(prefix="ws-", dir=d.root)
        yield DaemonView(d, workspace)
        shared.check_after(request.node.nodeid)
        shutil.rmtree(workspace, ignore_errors=True)
        return
    d = start_daemon(request.getfixturevalue("daemon_root"), mark)
    yield d
    assert d.stop() == 0, d.read_log()


@pytest.fixture
def client(daemon):
    with daemon.client() as c:
        yield c


@pytest.fixture
def session(daemon, client):
    """An open sandboxed session on the daemon's workspace."""
    return client.session_open(daemon.workspace)["session"]


@pytest.fixture(params=["bwrap", "none"])
def wrapper(request, tmp_path):
    """The argv a Launcher is started under: a bare bwrap sandbox, or nothing."""
    if request.param == "none":
        return []
    if BWRAP is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    return bwrap_prefix(str(tmp_path))


@pytest.fixture
async def launcher(nursery, wrapper):
    """A Launcher in each wrapper; at the end it is closed and nothing of its tree is left."""
    launcher = await Launcher.start(nursery, wrapper=wrapper, env=ENV)
    try:
        yield launcher
    finally:
        pids = tree_pids(launcher)
        await launcher.aclose()
        assert_gone(pids)
