"""--tokens FILE is read again when it changes (toolsd/daemon/token_reload.py): what
toolsd.cluster's node agents rely on to add and withdraw a lease's token."""

from __future__ import annotations

import os

import pytest

from toolsd.daemon.token_reload import ReloadingTokens
from toolsd.daemon.tokens import TokenFileError

ALICE, BOB = "a" * 24, "b" * 24


def write(path: str, text: str, mode: int = 0o600) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def test_a_token_added_or_withdrawn_counts_at_the_next_check(tmp_path):
    path = str(tmp_path / "tokens")
    write(path, f"alice {ALICE}\n")
    table = ReloadingTokens(path)
    assert table.match(ALICE) == "alice" and table.match(BOB) is None
    write(path, f"alice {ALICE}\nbob {BOB}\n")
    assert table.match(BOB) == "bob" and table.tenants == ["alice", "bob"]
    write(path, f"bob {BOB}\n")
    assert table.match(ALICE) is None and table.match(BOB) == "bob"


def test_a_broken_or_open_file_keeps_the_tokens_read_before(tmp_path):
    path = str(tmp_path / "tokens")
    write(path, f"alice {ALICE}\n")
    table = ReloadingTokens(path)
    write(path, f"bob {BOB}\n", mode=0o644)  # readable by others: refused
    assert table.match(ALICE) == "alice" and table.match(BOB) is None
    write(path, "just one field\n")
    assert table.match(ALICE) == "alice"
    os.unlink(path)
    assert table.match(ALICE) == "alice"


def test_the_first_read_still_refuses_a_bad_file(tmp_path):
    path = str(tmp_path / "tokens")
    write(path, f"alice {ALICE}\n", mode=0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        ReloadingTokens(path)
