"""What the agent tests share: a fresh workspace and conversation store per
test, and Agents on a scripted model that are closed at the test's end, leaving no process;
for `toolsd agent` and `toolsd mcp` run as commands, a `place` (workspace, HOME, state and
environment of a test's own) and the processes a command left."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import psutil
import pytest

from agent.models.scripted import ScriptedModel
from agent.turns.agent import Agent
from agent.turns.rules import AgentConfig
from model_server import ModelServer
from conftest import has_ended, short_tempdir, wait_for, wait_gone
from test_idle import sandbox_of


class Kit:
    def __init__(self, daemon):
        self.daemon = daemon
        self.root = tempfile.mkdtemp(prefix="agent-", dir=daemon.root)
        self.workspace = os.path.join(self.root, "ws")
        self.store = os.path.join(self.root, "store")
        os.makedirs(self.workspace)
        self.agents: list[Agent] = []

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.workspace, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    async def open(self, script=(), *, model=None, mode="auto", config=None, **options) -> Agent:
        agent = await Agent.open(self.workspace, model or ScriptedModel(script), mode=mode,
                                 config=config or AgentConfig(), socket=self.daemon.socket,
                                 store_root=self.store, **options)
        self.agents.append(agent)
        return agent

    def sandbox_processes(self) -> list[psutil.Process]:
        return self.daemon.running("bwrap")

    async def close(self) -> None:
        for agent in self.agents:
            await agent.aclose()
        assert wait_gone(self.sandbox_processes(), timeout=30) == [], \
            "an agent left its sandbox running"
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
async def kit(daemon):
    """Agents on the test's daemon (the module's shared one, in the agent tests), with a
    workspace and a conversation store of their own."""
    k = Kit(daemon)
    yield k
    await k.close()


def texts(request) -> list[str]:
    """The text parts of a ModelRequest's messages, in order (tool results included)."""
    from agent.history.messages import AssistantMessage, Summary, Text, ToolResult, UserMessage

    out = []
    for m in request.messages:
        if isinstance(m, UserMessage):
            out += [p.text for p in m.content if isinstance(p, Text)]
        elif isinstance(m, ToolResult):
            out.append(m.text)
        elif isinstance(m, AssistantMessage) and m.text:
            out.append(m.text)
        elif isinstance(m, Summary):
            out.append(m.text)
    return out


# ------------------------------------------------ `toolsd agent` and `toolsd mcp` as commands


class Place:
    """A workspace, a HOME and a conversation store of the test's own; `env` for the command
    (no key, no daemon socket from the environment: `none.sock` answers nothing)."""

    def __init__(self) -> None:
        self.root = short_tempdir()
        self.workspace = os.path.join(self.root, "ws")
        os.makedirs(self.workspace)
        os.makedirs(os.path.join(self.root, "home"))
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("TOOLSD_SOCKET", "XDG_RUNTIME_DIR", "OPENAI_API_KEY",
                                 "ANTHROPIC_API_KEY")}
        # TMPDIR: a daemon started for a run lives in a folder there, which a killed run
        # cannot remove (its processes end all the same).
        self.env.update(HOME=os.path.join(self.root, "home"), TERM="xterm",
                        XDG_STATE_HOME=os.path.join(self.root, "state"),
                        TOOLSD_SOCKET=os.path.join(self.root, "none.sock"), TMPDIR=self.root)


@pytest.fixture
def place():
    p = Place()
    yield p
    shutil.rmtree(p.root, ignore_errors=True)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def running(procs: list[psutil.Process], text: str) -> list[psutil.Process]:
    found = []
    for p in procs:
        try:
            if not has_ended(p) and text in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def kill_sandbox(daemon, session: str) -> None:
    """SIGKILL `session`'s sandbox from the host (as an OOM kill or an admin would), and wait
    until the daemon has seen it die (`alive: false`)."""
    with daemon.client() as c:
        os.kill(sandbox_of(daemon, c, session), signal.SIGKILL)

        def dead() -> bool:
            return not {s["session"]: s for s in c.session_list()["sessions"]}[session]["alive"]

        wait_for(dead, timeout=60)


@pytest.fixture
def server():
    """A scripted model endpoint of the test's own, stopped after it."""
    with ModelServer() as s:
        yield s
