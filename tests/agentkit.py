"""What the agent tests share: a module's daemon, a fresh workspace and conversation store per
test, and Agents on a scripted model that are closed at the test's end, leaving no process."""

from __future__ import annotations

import os
import shutil
import tempfile

import psutil
import pytest

from agent.models.scripted import ScriptedModel
from agent.turn import Agent, AgentConfig
from conftest import module_daemon as shared_daemon, wait_gone


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


@pytest.fixture(scope="module")
def module_daemon():
    """One daemon per test module that takes it (`module_daemon = agentkit.module_daemon`):
    its tests get a workspace and a conversation store each."""
    yield from shared_daemon()


@pytest.fixture
async def kit(module_daemon):
    k = Kit(module_daemon)
    yield k
    await k.close()


def texts(request) -> list[str]:
    """The text parts of a ModelRequest's messages, in order (tool results included)."""
    from agent.history import AssistantMessage, Summary, Text, ToolResult, UserMessage

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
