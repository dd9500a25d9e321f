"""A background process's `name` is accepted wherever its id is (docs/protocol.md, "Names"):
ids win, a name means the one running process of that name (in the call's session, when it
gives one), several is a clear error, none running the latest of that name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import needs_bwrap
from test_processes import assert_all_gone, command_tree
from toolsd.client import ToolsdError

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


def test_a_name_reads_writes_and_stops_its_process(client, session):
    bg = client.process_start(session, "read line; echo got $line; sleep 1000",
                              name="echoer", stdin="pipe")
    tree = command_tree(bg["pid"])
    assert client.process_write("echoer", "hello\n")["written"] == 6
    out = client.process_output("echoer", wait_s=60, until="got hello")
    assert out["id"] == bg["id"] and "got hello" in out["output"]
    stopped = client.process_stop("echoer")
    assert stopped["id"] == bg["id"] and stopped["survivors"] == 0
    assert_all_gone(tree)
    # Ended, it is still found by its name: a crashed server's last words can be read.
    assert client.process_output("echoer", since=0)["status"] == "stopped"


def test_a_name_held_by_two_running_processes_is_refused_naming_both(client, session):
    one = client.process_start(session, "sleep 1000", name="twin")
    two = client.process_start(session, "sleep 1000", name="twin")
    with pytest.raises(ToolsdError) as e:
        client.process_stop("twin")
    assert e.value.code == "bad_params"
    assert one["id"] in e.value.message and two["id"] in e.value.message
    assert client.process_list(session)["processes"][0]["status"] == "running"
    # By id, each is its own.
    for bg in (one, two):
        assert client.process_stop(bg["id"])["survivors"] == 0
    # Once one runs again under the name, the name is that one.
    three = client.process_start(session, "echo third; sleep 1000", name="twin")
    assert client.process_output("twin", wait_s=60, until="third")["id"] == three["id"]
    client.process_stop(three["id"])


def test_a_session_given_keeps_a_name_to_that_session(daemon, client, session):
    other = client.session_open(daemon.workspace)["session"]
    mine = client.process_start(session, "echo mine; sleep 1000", name="web")
    theirs = client.process_start(other, "echo theirs; sleep 1000", name="web")
    assert client.process_output("web", session=session, wait_s=60,
                                 until="mine")["id"] == mine["id"]
    assert client.process_output("web", session=other, wait_s=60,
                                 until="theirs")["id"] == theirs["id"]
    with pytest.raises(ToolsdError) as e:
        client.process_output("web")  # every session's: two run under that name
    assert e.value.code == "bad_params" and "use one of these ids" in e.value.message
    with pytest.raises(ToolsdError) as e:
        client.process_output(mine["id"].replace("bg", "bg9"), session=session)
    assert e.value.code == "not_found"
    client.session_close(other)
    assert client.process_stop("web", session=session)["id"] == mine["id"]


def test_ids_win_and_a_name_shaped_like_an_id_is_refused(client, session):
    with pytest.raises(ToolsdError) as e:
        client.process_start(session, "sleep 1000", name="bg1")
    assert e.value.code == "bad_params" and "looks like a process id" in e.value.message
    assert client.process_list(session)["processes"] == []
    with pytest.raises(ToolsdError) as e:
        client.process_output("no-such-name", session=session)
    assert e.value.code == "not_found" and "no-such-name" in e.value.message


def test_the_cli_takes_a_name_where_it_takes_an_id(daemon, client, session):
    bg = client.process_start(session, "echo hello from web; sleep 1000", name="web")
    client.process_output(bg["id"], wait_s=60, until="hello from web")
    tree = command_tree(bg["pid"])
    toolsd = [sys.executable, "-m", "toolsd"]
    logs = subprocess.run([*toolsd, "logs", "--socket", daemon.socket, "web"],
                          capture_output=True, text=True, timeout=60)
    assert logs.returncode == 0 and "hello from web" in logs.stdout, logs.stderr
    kill = subprocess.run([*toolsd, "kill", "--socket", daemon.socket, "web"],
                          capture_output=True, text=True, timeout=60)
    assert kill.returncode == 0 and kill.stdout.startswith(f"{bg['id']}: stopped"), kill
    assert_all_gone(tree)
