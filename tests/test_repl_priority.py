"""How a starting REPL interpreter's priority is chosen (tools/repl_priority.py), without a
daemon: what the host lets the daemon do decides whether starts are lowered at all. The
lowering itself, in a real sandbox, is test_repl_starts.py's."""

import os

from toolsd.tools import repl_priority
from toolsd.tools.repl_priority import StartPriority


def test_starts_run_at_the_daemons_priority_where_an_autogroup_cannot_be_given_back(
        monkeypatch):
    # Autogroups on and no CAP_SYS_ADMIN (a container): a start lowered by its nice value
    # alone would gain nothing, and its autogroup could be given back only a tenth of a
    # second later, so starts are not lowered at all.
    monkeypatch.setattr(repl_priority, "_autogroups_on", lambda: True)
    monkeypatch.setattr(repl_priority, "_can_restore_autogroup", lambda: False)
    monkeypatch.setattr(repl_priority, "_can_restore", lambda normal: True)
    monkeypatch.setattr(os, "getpriority", lambda which, who: 0)
    assert StartPriority.find() == StartPriority(0, lowers=False, autogroups=False)
    monkeypatch.setattr(repl_priority, "_can_restore_autogroup", lambda: True)
    assert StartPriority.find() == StartPriority(0, lowers=True, autogroups=True)
