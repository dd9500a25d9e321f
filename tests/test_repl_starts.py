"""Interpreter starts are bounded across sessions (`--interpreter-starts`): a burst of new
turns, each starting its first REPL, takes its turn for the CPU instead of taking all of it
from the sessions already running. Each start holds its place until its driver has started."""

from __future__ import annotations

import os
import threading

import pytest

from conftest import needs_bwrap, wait_for, wait_gone
from toolsd.client import Client

pytestmark = [needs_bwrap, pytest.mark.daemon("--interpreter-starts", "1")]


@pytest.fixture(autouse=True)
def no_interpreter_left(daemon, client):
    """Once the test's sessions are closed, none of their interpreters is left."""
    yield
    for s in client.session_list()["sessions"]:
        client.session_close(s["session"])
    assert wait_gone(daemon.running("python_repl.py"), timeout=30) == []

SESSIONS = 4
STUCK_S = 60  # a safety net against a hang, not a timing assertion
# Runs in each driver's interpreter before it reads its first request: it logs when that
# start begins and ends, with the machine's monotonic clock (shared by every sandbox), and
# takes a moment in between, so that starts let run together would overlap.
SITECUSTOMIZE = """\
import os, sys, time
if sys.argv and sys.argv[0].endswith("python_repl.py"):
    def note(what):
        with open(os.path.join(os.path.dirname(__file__), "starts.log"), "a") as f:
            f.write(f"{time.monotonic_ns()} {what} {os.environ['START_TAG']}\\n")
    note("begin")
    time.sleep(0.3)
    note("end")
"""


def test_first_repl_execs_at_once_start_their_interpreters_one_at_a_time(daemon, client):
    site = os.path.join(daemon.workspace, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    pairs = []
    for i in range(SESSIONS):
        s = client.session_open(daemon.workspace,
                                env={"PYTHONPATH": site, "START_TAG": str(i)})["session"]
        pairs.append((s, client.turn_begin(s)["turn"]))
    results: list[dict] = []

    def first_exec(pair) -> None:
        with daemon.client() as c:
            results.append(c.repl_exec(*pair, "x = 6 * 7\nx"))

    threads = [threading.Thread(target=first_exec, args=(pair,)) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["status"] for r in results] == ["ok"] * SESSIONS, results
    assert all(r["output"] == "42\n" and r["fresh"] for r in results), results
    with open(os.path.join(site, "starts.log")) as f:
        events = [line.split()[1:] for line in sorted(f, key=lambda line: int(line.split()[0]))]
    # Each start ends before the next begins: never two at once.
    tags = [tag for _, tag in events[::2]]
    assert events == [e for tag in tags for e in (["begin", tag], ["end", tag])], events
    assert sorted(tags) == [str(i) for i in range(SESSIONS)]


def test_a_start_that_waits_does_not_hold_up_the_others(daemon, client):
    # An interpreter whose start blocks (here until a file appears) gives its place up after
    # a while: the other session's first repl.exec is answered meanwhile.
    site = os.path.join(daemon.workspace, "site")
    os.makedirs(site)
    go, waiting = os.path.join(site, "go"), os.path.join(site, "waiting")
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write("import os, sys, time\n"
                "if sys.argv and sys.argv[0].endswith('python_repl.py') "
                "and os.environ.get('START_TAG') == 'stuck':\n"
                f"    open({waiting!r}, 'w').close()\n"
                f"    while not os.path.exists({go!r}):\n"
                "        time.sleep(0.05)\n")
    stuck = client.session_open(daemon.workspace,
                                env={"PYTHONPATH": site, "START_TAG": "stuck"})["session"]
    other = client.session_open(daemon.workspace, env={"PYTHONPATH": site})["session"]
    answers: dict[str, dict] = {}

    def first_exec(session: str) -> None:
        # Bounded so that a start which kept its place fails the test instead of hanging it.
        with Client(daemon.socket, timeout=STUCK_S) as c:
            answers[session] = c.repl_exec(session, c.turn_begin(session)["turn"], "1 + 1")

    blocked = threading.Thread(target=first_exec, args=(stuck,))
    blocked.start()
    try:
        wait_for(lambda: os.path.exists(waiting))  # its start holds the one place now
        first_exec(other)  # answered while the stuck start still waits
        assert answers[other]["output"] == "2\n"
        assert stuck not in answers
    finally:
        open(go, "w").close()
        blocked.join()
    assert answers[stuck]["status"] == "ok" and answers[stuck]["output"] == "2\n"
