"""Git config text read as git reads it, and which settings run a program (pure)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from toolsd.sandbox.git_watch.gitconfig import ConfigError, parse, runs_code


def test_sections_subsections_and_case():
    text = ('[Core]\n\tFSMonitor = ./watch\n[remote "Origin"]\n\turl = x\n'
            '[branch.Main]\n\tremote = origin\n')
    assert parse(text) == [("core.fsmonitor", "./watch"), ("remote.Origin.url", "x"),
                           ("branch.main.remote", "origin")]


def test_values_quotes_escapes_comments_and_continuations():
    text = ('[a]\n'
            '  k1 = plain value   ; a comment\n'
            '  k2 = "  kept  " # comment\n'
            '  k3 = a\\tb\\nc\\\\d\\"e\n'
            '  k4 = one \\\n two\n'
            '  k5 = "semi;colon#hash"\n'
            '  flag\n'
            '[b] inline = yes\n')
    assert parse(text) == [("a.k1", "plain value"), ("a.k2", "  kept  "),
                           ("a.k3", 'a\tb\nc\\d"e'), ("a.k4", "one  two"),
                           ("a.k5", "semi;colon#hash"), ("a.flag", None), ("b.inline", "yes")]


@pytest.mark.parametrize("text", [
    "k = v\n",  # before any section
    "[a\n", "[a \"x\n", '[a "x"\nk = "open\n', "[a]\nk = \\q\n", "[a]\n= v\n",
])
def test_what_git_refuses_is_refused(text):
    with pytest.raises(ConfigError, match="bad config line"):
        parse(text)


@pytest.mark.parametrize("key,value,runs", [
    ("core.fsmonitor", "./x", True), ("core.hookspath", "h", True),
    ("core.sshcommand", "ssh", True), ("core.pager", "less", True),
    ("core.editor", "vi", True), ("diff.external", "d", True),
    ("filter.lfs.smudge", "git-lfs smudge", True), ("filter.lfs.required", "true", True),
    ("alias.st", "status", False), ("alias.x", "!rm -rf /", True),
    ("alias.y", "  !sh", True), ("include.path", "../x", True),
    ("includeif.gitdir:/x/.path", "y", True), ("credential.helper", "store", True),
    ("credential.https://x.helper", "!evil", True), ("diff.pdf.textconv", "pdftotext", True),
    ("merge.ours.driver", "true", True), ("pager.log", "false", False),
    ("pager.diff", "delta", True), ("submodule.s.update", "checkout", False),
    ("submodule.s.update", "!evil", True), ("user.email", "a@b", False),
    ("remote.origin.url", "x", False), ("remote.origin.uploadpack", "evil", True),
    ("core.bare", "false", False), ("gpg.ssh.program", "x", True),
])
def test_runs_code(key, value, runs):
    assert runs_code(key, value) is runs


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_parse_agrees_with_git_itself(tmp_path):
    text = ('[core]\n\tpager = "less -R"  # c\n\teditor = vi \\\n  -n\n'
            '[alias]\n\tx = "!f() { echo \\"a;b\\"; }; f"\n'
            '[remote "Up Stream"]\n\turl = ssh://h/p\n[section.Sub]\n\tk\n')
    path = tmp_path / "config"
    path.write_text(text)
    out = subprocess.run(["git", "config", "--file", str(path), "--list", "-z"],
                         capture_output=True, check=True,
                         env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}).stdout.decode()
    theirs = []
    for item in out.split("\0")[:-1]:
        key, sep, value = item.partition("\n")
        theirs.append((key, value if sep else None))
    assert parse(text) == theirs
