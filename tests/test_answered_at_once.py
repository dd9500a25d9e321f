"""Requests that cannot block are answered at once, in the task that read them, without a
task of their own (dispatch.py: `instant` rows, and `now` for turn.begin, process.output
that waits for nothing and process.list of finished processes): pipelined behind one another, their answers
come back in the order asked, and they are the answers a task would have given."""

from __future__ import annotations

import pytest

from _pipelined import frame, pipelined
from conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.daemon(shared=True)]


def wait_exited(client, bg: str) -> None:
    """Until `bg` has exited: each read waits for more output or for the exit."""
    for _ in range(100):
        if client.process_output(bg, wait_s=30)["status"] != "running":
            return
    raise AssertionError(f"{bg} still runs")


@pytest.fixture
def session(daemon, client):
    session = client.session_open(daemon.workspace)["session"]
    yield session
    client.session_close(session)


def test_output_reads_that_wait_for_nothing_answer_in_the_order_asked(daemon, client,
                                                                       session):
    done = client.process_start(session, "echo done")["id"]
    wait_exited(client, done)
    running = client.process_start(session, "echo up; exec sleep 1000")["id"]
    assert client.process_output(running, wait_s=30, until="up")["output"] == "up\n"

    replies = pipelined(daemon, frame(1, "process.output", id=done, since=0),
                        frame(2, "process.output", id=running, since=0, plain=True),
                        frame(3, "hello"))
    assert [r["id"] for r in replies] == [1, 2, 3]
    first, second = replies[0]["result"], replies[1]["result"]
    assert (first["output"], first["status"], first["exit_code"]) == ("done\n", "exited", 0)
    assert (second["output"], second["status"], second["next"]) == ("up\n", "running", 3)
    assert second["waiting_for_input"] is False


def test_reads_at_once_take_the_shared_mark_as_reads_in_a_task_do(daemon, client, session):
    bg = client.process_start(session, "echo one; echo two")["id"]
    client.process_output(bg, since=0, wait_s=30, until="two")  # since: the mark stays
    replies = pipelined(daemon, frame(1, "process.output", id=bg),
                        frame(2, "process.output", id=bg), frame(3, "hello"))
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert replies[0]["result"]["output"] == "one\ntwo\n"
    assert replies[1]["result"]["output"] == ""  # the first read took it
    assert client.process_output(bg, since=0)["output"] == "one\ntwo\n"


def test_a_read_whose_answer_needs_a_task_still_gets_it(daemon, client, session):
    # Over the size rendered in the event loop (processes.INLINE_RENDER_BYTES): the same
    # head and tail around the marker as ever.
    bg = client.process_start(session, "head -c 200000 /dev/zero | tr '\\0' x; echo; "
                                       "echo end")["id"]
    client.process_output(bg, wait_s=30, until="end", max_output_chars=0)
    result = client.process_output(bg, since=0, max_output_chars=1000)
    assert result["truncated"] and result["output"].startswith("x" * 100)
    assert result["output"].endswith("x\nend\n") and len(result["output"]) <= 1000


def test_a_listing_of_finished_processes_answers_in_the_order_asked(daemon, client):
    session = client.session_open(daemon.workspace)["session"]
    bg = client.process_start(session, "echo done")["id"]
    wait_exited(client, bg)
    client.session_close(session)  # and with its sandbox every tree in it: none to measure
    replies = pipelined(daemon, frame(1, "process.list"), frame(2, "hello"))
    assert [r["id"] for r in replies] == [1, 2]
    [info] = [i for i in replies[0]["result"]["processes"] if i["id"] == bg]
    assert (info["session"], info["status"], info["exit_code"]) == (session, "exited", 0)
    assert (info["cpu_percent"], info["rss_bytes"], info["descendants"]) == (0.0, 0, 0)


def test_a_listing_of_running_processes_still_measures_them(daemon, client, session):
    bg = client.process_start(session, "exec sleep 1000")["id"]
    [info] = client.process_list(session)["processes"]
    assert info["id"] == bg and info["status"] == "running" and info["rss_bytes"] > 0
    client.process_stop(bg)


def test_a_turn_begins_in_the_order_asked(daemon, client, session):
    replies = pipelined(daemon, frame(1, "turn.begin", session=session), frame(2, "hello"),
                        frame(3, "turn.begin", session=session))
    assert [r["id"] for r in replies] == [1, 2, 3]
    first, second = replies[0]["result"]["turn"], replies[2]["result"]["turn"]
    assert first != second
    assert client.turn_end(session, first)["repls_stopped"] == 0
    assert client.turn_end(session, second)["repls_stopped"] == 0
