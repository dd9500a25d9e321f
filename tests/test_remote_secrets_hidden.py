"""The files that let a client in (`--tokens FILE`, `--tls-key FILE`) are hidden from every
session when they live outside the state folder: a tenant's session reads the read-only root,
so a tokens file kept beside it would hand that tenant every other tenant's token."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import RunningDaemon, short_tempdir
from test_tenants import ALICE, BOB, TWO, connect, write_tokens
from test_tls import make_ca_and_server


def tokens_and_certificate(d) -> None:
    """Tenants and a TLS certificate of the daemon's own, in a folder beside its state."""
    keys = os.path.join(d.root, "keys")  # beside the state folder, not in it
    os.makedirs(keys)
    tokens = os.path.join(keys, "tokens")
    write_tokens(tokens, TWO)
    _ca, cert, key = make_ca_and_server(keys)
    d.extra_args += ("--tokens", tokens, "--tls-cert", cert, "--tls-key", key)
    d.fingerprint_files = (tokens, key)


pytestmark = pytest.mark.daemon(shared=True, tls=True, prepare=tokens_and_certificate)


def _client(d, token):
    from toolsd.client import Client
    return Client(d.url, token=token, cafile=os.path.join(d.root, "keys", "ca.pem"))


def test_a_tenant_session_cannot_read_the_tokens_file_or_the_tls_key(daemon):
    tokens, key = daemon.fingerprint_files
    with _client(daemon, BOB) as bob:
        s = bob.session_open()["session"]
        try:
            for path in (tokens, key):
                out = bob.shell_run(s, f"cat {path}; echo rc=$?")["output"]
                assert ALICE not in out and "PRIVATE KEY" not in out, out
                with pytest.raises(Exception) as e:
                    bob.file_read(s, path)
                assert getattr(e.value, "code", None) == "not_found", e.value
        finally:
            bob.session_close(s)


def test_a_session_cannot_be_opened_on_the_folder_holding_them(daemon):
    tokens, _ = daemon.fingerprint_files
    with _client(daemon, BOB) as bob:
        s = bob.session_open(os.path.dirname(tokens))["session"]
        try:
            out = bob.shell_run(s, "cat tokens; echo rc=$?")["output"]
            assert ALICE not in out, out
            with pytest.raises(Exception) as e:
                bob.file_read(s, "tokens")
            assert getattr(e.value, "code", None) == "not_found", e.value
        finally:
            bob.session_close(s)



def test_replacing_a_tokens_file_hidden_alone_ends_open_sessions_clearly(daemon):
    """Hidden alone, the file is covered by a mount that replacing it removes: the session
    is ended (and says why) rather than shown the new tokens."""
    tokens, _ = daemon.fingerprint_files
    with _client(daemon, BOB) as bob:
        s = bob.session_open()["session"]
        carol = "carol-token-0123456789abcdef"
        try:
            write_tokens(tokens, TWO + f"carol {carol}\n")
            with pytest.raises(Exception) as e:
                out = bob.shell_run(s, f"cat {tokens}; echo rc=$?")["output"]
                assert carol not in out and ALICE not in out, out
            assert "changed on the host" in str(e.value), e.value
        finally:
            write_tokens(tokens, TWO)


def test_a_tokens_file_in_a_hidden_folder_can_be_replaced_under_open_sessions():
    root = short_tempdir()
    keys = os.path.join(root, "keys")
    os.makedirs(keys)
    tokens = os.path.join(keys, "tokens")
    write_tokens(tokens, TWO)
    d = RunningDaemon(root, extra_args=("--tokens", tokens, "--hide", keys), tls=True)
    try:
        d.start()
        with connect(d, BOB) as bob:
            s = bob.session_open()["session"]
            carol = "carol-token-0123456789abcdef"
            write_tokens(tokens, TWO + f"carol {carol}\n")
            with connect(d, carol) as c:
                assert c.server_hello["tenant"] == "carol"
            out = bob.shell_run(s, f"cat {tokens}; echo rc=$?")["output"]
            assert carol not in out and ALICE not in out and "rc=1" in out, out
            with pytest.raises(Exception) as e:
                bob.file_read(s, tokens)
            assert getattr(e.value, "code", None) == "not_found", e.value
            bob.session_close(s)
    finally:
        assert d.stop() == 0, d.read_log()
        shutil.rmtree(root, ignore_errors=True)
