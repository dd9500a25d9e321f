"""What a new user meets first: the daemon's banner names a command that runs here, every
subcommand's --help gives each option's default, and `toolsd doctor` reports each check on
its own line and whether a daemon answers on the socket."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys

import pytest

from _cli import STUCK_S, toolsd
from conftest import needs_bwrap
from toolsd.cli.main import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)


def subcommands() -> dict:
    parser = build_parser()
    [sub] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return sub.choices


def option_entries(help_text: str) -> dict[str, str]:
    """Each option's entry in a --help text, by its option strings' first."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        m = re.match(r"^  (-[^\s,]+)", line)
        if m:
            current = m.group(1)
            entries[current] = line
        elif current and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_option_of_every_subcommand_says_what_it_does_and_its_default(name):
    parser = subcommands()[name]
    entries = option_entries(parser.format_help())
    for action in parser._actions:
        if not action.option_strings or action.dest == "help" or action.help == argparse.SUPPRESS:
            continue  # hidden options (tests only) are not shown
        entry = entries[action.option_strings[0]]
        described = entry.split(None, 1 + (action.nargs != 0))[-1]
        assert action.help and len(described) > 10, f"toolsd {name} {entry!r}: no description"
        if action.nargs != 0 and not action.required:  # takes a value
            assert "default" in entry, f"toolsd {name} {entry!r}: no default"


def test_a_default_is_shown_as_the_parser_has_it():
    entries = option_entries(subcommands()["exec"].format_help())
    assert "(default: 120)" in entries["--timeout"]
    assert "(default: none)" in entries["--network"]


def banner(path_env: str, socket: str) -> list[str]:
    env = {**os.environ, "PATH": path_env}
    env.pop("TOOLSD_SOCKET", None)
    proc = subprocess.Popen([sys.executable, "-m", "toolsd", "serve", "--socket", socket,
                             "--no-warm-spare"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STUCK_S) == 0
        proc.stdout.close()
    return lines


def test_the_banner_names_the_command_as_it_can_be_typed_here(daemon_root):
    socket = os.path.join(daemon_root, "toolsd.sock")
    without = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                              if os.path.realpath(p) != os.path.realpath(VENV_BIN))
    listening, try_line = banner(without, socket)
    assert "listening on" in listening
    script = os.path.relpath(os.path.join(VENV_BIN, "toolsd"), ROOT)
    if script.startswith(".."):  # a virtualenv outside the checkout: named whole
        script = os.path.join(VENV_BIN, "toolsd")
    assert try_line == f"try: {script} --socket {socket} exec -- echo hello\n"
    assert script.endswith("toolsd") and "/" in script  # runs from a shell as it is
    _, on_path = banner(VENV_BIN + os.pathsep + without, socket)
    assert on_path == f"try: toolsd --socket {socket} exec -- echo hello\n"


def doctor_lines(daemon, socket: str) -> dict[str, str]:
    r = toolsd(daemon, "doctor", socket=socket)
    assert r.returncode == 0, r.stderr  # bwrap works here
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
            for line in r.stdout.splitlines()}


@needs_bwrap
def test_doctor_reports_each_check_and_the_daemon_on_the_socket_it_is_given(daemon):
    lines = doctor_lines(daemon, daemon.socket)
    assert list(lines) == ["daemon", "bwrap", "user namespaces", "cgroup memory",
                           "cgroup pids", "overlay", "inotify", "sandbox"]
    assert lines["sandbox"].startswith("bwrap: sessions run in their own user, pid")
    assert lines["daemon"].startswith("ok") and f"answers on {daemon.socket}" in lines["daemon"]
    assert lines["bwrap"].startswith("ok")
    assert lines["user namespaces"].startswith("ok")  # bwrap ran: they are there
    for name in ("cgroup memory", "cgroup pids", "overlay", "inotify"):
        assert re.match(r"(ok|NO) +\S", lines[name]), lines[name]
    assert "max_user_watches" in lines["inotify"]

    elsewhere = os.path.join(daemon.root, "nobody.sock")
    lines = doctor_lines(daemon, elsewhere)
    assert lines["daemon"].startswith("NO") and f"none answers on {elsewhere}" in lines["daemon"]
    assert lines["bwrap"].startswith("ok")  # the checks do not need a daemon


def test_a_refused_open_is_not_worded_as_another_command():
    from toolsd.cli.messages import for_person
    from toolsd.client import ToolsdError

    refused = ToolsdError("bad_params", "session.open: workspace /tmp is the host's shared "
                                        "/tmp; open a folder inside it")
    assert for_person(refused) == ("bad_params: workspace /tmp is the host's shared /tmp; "
                                   "open a folder inside it")
    hint = ToolsdError("not_found", "no session 's9'; open one with session.open")
    assert for_person(hint) == "not_found: no session 's9'; open one with `toolsd open`"
