"""Interpreter starts are bounded across sessions (`--interpreter-starts`): a burst of new
turns, each starting its first REPL, takes its turn for the CPU instead of taking all of it
from the sessions already running. Each start holds its place until its driver has started."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from conftest import needs_bwrap, wait_for, wait_gone
from toolsd.client import Client
from toolsd.tools.repl_priority import StartPriority

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


# Runs in each interpreter of the session before its code: the python3 asked for its real
# path, then the driver. Each notes the priority it waits for: the lowest, which the daemon
# sets when it hears of the start (its first instructions may run before), then, in the
# driver, its own again, given back before the driver has answered (a start the calls leave
# no CPU for still ends at its own priority). The priority is its process group's nice value
# and, where the kernel groups processes by session for the scheduler, its autogroup's: there
# a nice value weighs only against the processes of the same session.
WATCH_PRIORITY = """\
import os, sys, time
def note(what):
    with open(os.path.join(os.path.dirname(__file__), "priority.log"), "a") as f:
        f.write(what + "\\n")
def priority():
    nice = str(os.getpriority(os.PRIO_PGRP, 0))
    if not {groups}:
        return nice
    with open("/proc/self/autogroup") as f:
        return nice + " group " + f.read().split()[-1]
def priority_once(wanted):
    give_up = time.monotonic() + {stuck_s}
    while not wanted(priority()) and time.monotonic() < give_up:
        time.sleep(0.001)
    return priority()
what = "driver" if sys.argv and sys.argv[0].endswith("python_repl.py") else "asked"
lowest = lambda p: not {lowers} or p.split(' group ') == ['19'] * {parts}
note(f"{{what}} at {{priority_once(lowest)}}")
if what == "driver":
    raised = lambda p: not {lowers} or '19' not in p.split(' group ')
    note(f"driver then at {{priority_once(raised)}}")
"""


def test_an_interpreter_starts_lowered_and_runs_the_code_at_the_daemons_priority(
        daemon, client):
    site = os.path.join(daemon.workspace, "site")
    os.makedirs(site)
    # The daemon runs as this test does: it lowers starts, and their autogroups, where this
    # finds it can. Where it cannot (autogroups on, and no CAP_SYS_ADMIN to give one's
    # priority back at once, as in a container), starts run at its own priority throughout.
    found = StartPriority.find()
    groups = found.autogroups
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(WATCH_PRIORITY.format(stuck_s=STUCK_S, groups=groups, parts=2 if groups else 1,
                                      lowers=found.lowers))
    own = os.getpriority(os.PRIO_PROCESS, daemon.proc.pid)
    code = ("import os, subprocess\n"
            "print(os.getpriority(os.PRIO_PROCESS, 0))\n"
            "print(subprocess.run(['nice'], capture_output=True, text=True).stdout)")
    # One start given back when half its slot went by (it waits for that), one as soon as it
    # answered.
    for env in ({"PYTHONPATH": site}, {}):
        s = client.session_open(daemon.workspace, env=env)["session"]
        r = client.repl_exec(s, client.turn_begin(s)["turn"], code)
        assert r["status"] == "ok" and r["output"].split() == [str(own), str(own)], r
    with open(os.path.join(site, "priority.log")) as f:
        notes = f.read().splitlines()
    lowered, given_back = ("19 group 19", f"{own} group 0") if groups else ("19", f"{own}")
    if not found.lowers:
        lowered = given_back
    driver = [f"driver at {lowered}", f"driver then at {given_back}"]
    # The real path is asked only where the sandbox has a python3 of its own.
    assert notes in (driver, [f"asked at {lowered}", *driver]), notes


def test_asking_python3_for_its_real_path_runs_none_of_the_sites_code(daemon, client):
    # The sandbox's python3 here is a wrapper script, as pyenv's is: the session asks it once
    # for the interpreter behind it. That start is CPU spent before the REPL's own, and the
    # site's code (.pth files, sitecustomize) has no say in the answer: it runs in the
    # driver's interpreter only.
    bin_dir, site = os.path.join(daemon.workspace, "bin"), os.path.join(daemon.workspace, "site")
    os.makedirs(bin_dir)
    os.makedirs(site)
    calls, site_ran = os.path.join(bin_dir, "calls.log"), os.path.join(site, "ran.log")
    wrapper = os.path.join(bin_dir, "python3")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {calls}\nexec {sys.executable} "$@"\n')
    os.chmod(wrapper, 0o755)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(f"import sys\nwith open({site_ran!r}, 'a') as f:\n"
                f"    f.write(' '.join(sys.argv) + '\\n')\n")
    s = client.session_open(daemon.workspace, env={
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": site})["session"]
    r = client.repl_exec(s, client.turn_begin(s)["turn"], "import sys; sys.executable")
    assert r["status"] == "ok" and r["output"] == f"{sys.executable!r}\n", r
    with open(calls) as f:
        assert "sys.executable" in f.read()  # asked; the driver runs on the answer
    with open(site_ran) as f:
        ran = f.read().splitlines()
    assert len(ran) == 1 and ran[0].split()[0].endswith("python_repl.py"), ran
