"""Errors a user can act on: an environment too big for any command says its size and the
limit; a call cut off by session.close or turn.end says so, whatever tool it was."""

from __future__ import annotations

import pytest

from conftest import module_daemon
from toolsd.client import ToolsdError
from toolsd.sandbox import ENV_MAX_BYTES

MB = 1 << 20


@pytest.fixture(scope="module")
def daemon():
    yield from module_daemon()


def test_session_open_with_a_1_mb_env_value_is_bad_params_naming_size_and_limit(daemon,
                                                                               client):
    before = client.session_list()["sessions"]
    with pytest.raises(ToolsdError) as e:
        client.session_open(daemon.workspace, env={"BIG": "x" * MB})
    assert e.value.code == "bad_params"
    assert f"{MB + 5:,}" in e.value.message  # BIG=, the value and its NUL
    assert f"{ENV_MAX_BYTES:,}" in e.value.message
    assert "'BIG'" in e.value.message
    assert client.session_list()["sessions"] == before


def test_a_command_env_over_the_limit_is_bad_params_for_shell_and_process(client, session):
    for call in (client.shell_run, client.process_start):
        with pytest.raises(ToolsdError) as e:
            call(session, "echo never", env={"BIG": "x" * MB})
        assert e.value.code == "bad_params"
        assert f"{ENV_MAX_BYTES:,}" in e.value.message and "'BIG'" in e.value.message
    assert client.process_list(session)["processes"] == []


def test_an_env_under_the_limit_reaches_the_command(daemon, client):
    value = "v" * (ENV_MAX_BYTES // 2)
    s = client.session_open(daemon.workspace, env={"HALF": value})["session"]
    assert client.shell_run(s, "echo ${#HALF}")["output"] == f"{len(value)}\n"
    r = client.shell_run(s, "echo ${#MORE}", env={"MORE": "m" * (ENV_MAX_BYTES // 4)})
    assert r["output"] == f"{ENV_MAX_BYTES // 4}\n"
    client.session_close(s)
