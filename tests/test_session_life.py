"""A session's lifecycle as one state with its allowed moves, and the one question of whether
it can run a call (toolsd/daemon/session_life.py)."""

from __future__ import annotations

from toolsd.daemon.session_life import MOVES, SessionLife, refusal


def reachable(start: SessionLife) -> set[SessionLife]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in MOVES[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_state_is_reached_and_every_one_ends_closed():
    assert reachable(SessionLife.STARTING) == set(SessionLife)
    for life in SessionLife:
        assert SessionLife.CLOSED in reachable(life)
    assert MOVES[SessionLife.CLOSED] == frozenset()
    # Nothing goes back: once closing, a session never opens (or ends) again.
    assert reachable(SessionLife.CLOSING) == {SessionLife.CLOSING, SessionLife.CLOSED}
    assert SessionLife.OPEN not in reachable(SessionLife.FAILED) | reachable(SessionLife.ENDED)


def test_only_an_open_session_with_its_sandbox_runs_calls():
    assert refusal("s1", SessionLife.OPEN, None, sandbox_dead=False) is None
    assert "died" in refusal("s1", SessionLife.OPEN, None, sandbox_dead=True)
    for life in (SessionLife.FAILED, SessionLife.CLOSING, SessionLife.CLOSED):
        assert refusal("s1", life, None, sandbox_dead=False) == \
            "session s1 is closed; open a new session"
    assert "starting" in refusal("s1", SessionLife.STARTING, None, sandbox_dead=False)
    # Why toolsd ended it is said for as long as anyone asks, closed or not.
    for life in (SessionLife.ENDED, SessionLife.CLOSING, SessionLife.CLOSED):
        why = refusal("s1", life, "/w/.git/config changed on the host", sandbox_dead=False)
        assert why == "session s1 was ended: /w/.git/config changed on the host; open a new " \
                      "session"
