"""The command line against a daemon on TLS (protocol 1.2): `--url` and its options on every
subcommand, the TOOLSD_URL/TOKEN/FINGERPRINT environment, `toolsd token`, and `toolsd mcp`
on a remote daemon."""

from __future__ import annotations

import os
import subprocess
import sys

import json

import pytest
from mcp import Client as McpClient
from mcp.client.stdio import StdioServerParameters, stdio_client

import agentkit
from conftest import needs_bwrap
from model_server import Call, ModelServer, openai_stream

place = agentkit.place

pytestmark = pytest.mark.daemon(shared=True, tls=True)


def toolsd(daemon, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in daemon.env.items() if not k.startswith("TOOLSD_")}
    return subprocess.run([sys.executable, "-m", "toolsd", *args], capture_output=True,
                          text=True, env={**base, **(env or {})}, cwd=daemon.workspace,
                          timeout=120)


def remote_env(daemon) -> dict:
    return {"TOOLSD_URL": daemon.url, "TOOLSD_TOKEN": daemon.token,
            "TOOLSD_FINGERPRINT": daemon.fingerprint}


def test_status_and_exec_reach_the_daemon_from_the_environment(daemon):
    out = toolsd(daemon, "status", env=remote_env(daemon))
    assert out.returncode == 0, out.stderr
    assert f"on {daemon.url} (as tenant default)" in out.stdout
    out = toolsd(daemon, "exec", "--workspace", daemon.workspace, "--", "echo", "far",
                 env=remote_env(daemon))
    assert out.returncode == 0 and out.stdout == "far\n", out.stderr


def test_url_token_file_and_fingerprint_options(daemon):
    token_file = os.path.join(daemon.workspace, "token")
    with open(token_file, "w") as f:
        f.write(daemon.token + "\n")
    out = toolsd(daemon, "--url", daemon.url, "--token-file", token_file,
                 "--fingerprint", daemon.fingerprint.upper().replace("SHA256:", ""), "ps")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["ID", "SESSION"]
    # Without the token: the daemon's own refusal, said plainly.
    out = toolsd(daemon, "--url", daemon.url, "--fingerprint", daemon.fingerprint, "ps")
    assert out.returncode == 1 and "unauthorized" in out.stderr and "no token" in out.stderr
    out = toolsd(daemon, "--url", "tls://127.0.0.1", "ps")
    assert out.returncode == 1 and "tls://HOST:PORT" in out.stderr
    # The local socket by URL too.
    out = toolsd(daemon, "--url", f"unix://{daemon.socket}", "status")
    assert out.returncode == 0 and "as tenant local" in out.stdout, out.stderr


def test_token_prints_what_a_client_needs(daemon):
    out = toolsd(daemon, "token", "--state-dir", daemon.state_dir)
    assert out.returncode == 0, out.stderr
    assert daemon.url in out.stdout and daemon.fingerprint in out.stdout
    assert f"TOOLSD_TOKEN={daemon.token}" in out.stdout
    out = toolsd(daemon, "token", "--state-dir", daemon.workspace)
    assert out.returncode == 1 and "--listen" in out.stderr


@needs_bwrap
async def test_mcp_runs_its_tools_on_a_remote_daemon(daemon):
    base = {k: v for k, v in daemon.env.items() if not k.startswith("TOOLSD_")}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "toolsd", "mcp", "--workspace", daemon.workspace, "--url", daemon.url,
              "--fingerprint", daemon.fingerprint],
        env={**base, "TOOLSD_TOKEN": daemon.token})
    with open(os.path.join(daemon.workspace, "mcp.log"), "a") as log:
        async with McpClient(stdio_client(params, errlog=log)) as client:
            result = await client.call_tool("run_terminal", {"command": "echo from-afar"})
    assert "from-afar" in "".join(c.text for c in result.content if c.type == "text")


@needs_bwrap
def test_agent_runs_its_tools_on_a_remote_daemon(daemon, place):
    logged = len(daemon.read_log())
    with ModelServer() as server:
        server.push(openai_stream(calls=[Call("run_terminal", {"command": "echo far-agent"})]),
                    openai_stream(text="bye"))
        done = subprocess.run(
            [sys.executable, "-m", "toolsd", "agent", "--base-url", server.openai_url,
             "--model", "scripted", "--workspace", place.workspace, "--mode", "auto", "--json",
             "--url", daemon.url, "--fingerprint", daemon.fingerprint, "go"],
            env={**place.env, "TOOLSD_TOKEN": daemon.token}, capture_output=True, text=True,
            timeout=180)
    assert done.returncode == 0, done.stderr
    results = [e for e in map(json.loads, done.stdout.splitlines())
               if e["type"] == "tool_result"]
    assert results[0]["text"] == "far-agent\n[exit code 0]"
    assert "started one for this run" not in done.stderr  # the remote one, not its own
    assert "tenant default connected" in daemon.read_log()[logged:]
