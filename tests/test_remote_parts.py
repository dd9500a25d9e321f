"""The pure parts of remote access: URLs and fingerprints, the tokens file, the failure
limiter, and the client's target from its arguments and the environment."""

from __future__ import annotations

import hashlib
import os

import pytest

from toolsd.client.remote import resolve_target
from toolsd.daemon.ratelimit import FailureLimiter
from toolsd.daemon.tls_serve import address_key
from toolsd.daemon.tokens import TokenFileError, default_token, load_file
from toolsd.wire.urls import normalize_fingerprint, parse_url

FP = "sha256:" + "0123456789abcdef" * 4


def test_urls():
    assert str(parse_url("tls://127.0.0.1:7433")) == "tls://127.0.0.1:7433"
    assert parse_url("tls://[::1]:7433").host == "::1"
    assert parse_url("unix:///run/t.sock").path == "/run/t.sock"
    assert parse_url("/run/t.sock").path == "/run/t.sock"
    assert parse_url("tls://127.0.0.1:0", listening=True).port == 0
    for bad, says in [("tls://127.0.0.1", "tls://HOST:PORT"), ("unix://run.sock", "three"),
                      ("http://a.test:80", "unknown scheme"), ("tls://a.test:0", "port 0"),
                      ("", "empty")]:
        with pytest.raises(ValueError, match=says):
            parse_url(bad)


def test_fingerprints_are_read_as_openssl_prints_them():
    assert normalize_fingerprint(FP.upper()) == FP
    colons = ":".join(FP[7:][i:i + 2].upper() for i in range(0, 64, 2))
    assert normalize_fingerprint(f"SHA256 Fingerprint={colons}") == FP
    with pytest.raises(ValueError, match="toolsd token"):
        normalize_fingerprint("sha1:abcd")


def test_target_from_the_environment():
    env = {"TOOLSD_URL": "tls://127.0.0.1:9", "TOOLSD_TOKEN": "t" * 20,
           "TOOLSD_FINGERPRINT": FP}
    target = resolve_target(environ=env)
    assert target.tls and target.token == "t" * 20 and target.fingerprint == FP
    assert resolve_target("tls://127.0.0.1:9", token="mine", environ=env).token == "mine"
    assert resolve_target("tls://127.0.0.1:9", cafile="/ca.pem", environ=env).fingerprint is None
    assert not resolve_target("/x/t.sock", environ=env).tls


def write(tmp_path, text: str, mode: int = 0o600) -> str:
    path = str(tmp_path / "tokens")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def test_tokens_file_plain_and_hashed(tmp_path):
    hashed = hashlib.sha256(b"bob-secret-token-1234").hexdigest()
    table = load_file(write(tmp_path, f"# ours\n\nalice alice-secret-token-1\nbob sha256:{hashed}\n"))
    assert table.match("alice-secret-token-1") == "alice"
    assert table.match("bob-secret-token-1234") == "bob"
    assert table.match("alice-secret-token-2") is None and table.tenants == ["alice", "bob"]


@pytest.mark.parametrize("text,says", [
    ("alice\n", "two fields"), ("local aaaaaaaaaaaaaaaaaaaa\n", "Unix socket"),
    ("al/ce aaaaaaaaaaaaaaaaaaaa\n", "letters"), ("alice short\n", "shorter than"),
    ("alice sha256:xyz\n", "64 hex"),
    ("a aaaaaaaaaaaaaaaaaaaa\nb aaaaaaaaaaaaaaaaaaaa\n", "same token as line 1"),
])
def test_tokens_file_mistakes_are_named(tmp_path, text, says):
    with pytest.raises(TokenFileError, match=says):
        load_file(write(tmp_path, text))


def test_a_tokens_file_without_tokens_lets_nobody_in_yet(tmp_path):
    table = load_file(write(tmp_path, "# tokens are added here as leases begin\n"))
    assert table.tenants == [] and table.match("anything-at-all-1234") is None


def test_a_tokens_file_others_can_read_is_refused(tmp_path):
    with pytest.raises(TokenFileError, match="chmod 600"):
        load_file(write(tmp_path, "alice alice-secret-token-1\n", 0o640))


def test_the_default_token_is_made_once_and_kept(tmp_path):
    table, token = default_token(str(tmp_path))
    assert table.match(token) == "default"
    assert os.stat(tmp_path / "token").st_mode & 0o777 == 0o600
    assert default_token(str(tmp_path))[1] == token


def test_failures_drain_a_bucket_per_address_and_refill():
    limiter = FailureLimiter(burst=3, refill_s=2.0, max_addresses=2)
    for _ in range(3):
        assert limiter.wait_s("192.0.2.1", 0.0) == 0
        limiter.failed("192.0.2.1", 0.0)
    assert limiter.wait_s("192.0.2.1", 0.0) == pytest.approx(2.0)
    assert limiter.wait_s("192.0.2.2", 0.0) == 0  # another address is not held back
    assert limiter.wait_s("192.0.2.1", 2.0) == 0  # one more try after refill_s
    limiter.failed("192.0.2.2", 0.0)
    limiter.failed("192.0.2.3", 0.0)  # past max_addresses: the oldest is forgotten
    assert limiter.wait_s("192.0.2.1", 0.0) == 0


def test_failures_count_against_an_ipv6_slash_64():
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff") == "2001:db8::/64"
    assert address_key("::ffff:192.0.2.1") == "192.0.2.1"
