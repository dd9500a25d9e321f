"""The egress filter's pure parts: rules, addresses, and the wire formats the proxy reads."""

from __future__ import annotations

import ipaddress
import ssl

import pytest

from toolsd.sandbox.egress import dns_message as dns
from toolsd.sandbox.egress import http_head, sni, socks
from toolsd.sandbox.egress.addresses import parse_ip, why_refused
from toolsd.sandbox.egress.connlog import ConnectionLog
from toolsd.sandbox.egress.rules import BadRule, normalize_name, parse_rule
from toolsd.wire.egress import PRESETS, network_of


@pytest.mark.parametrize("text, address", [
    ("127.0.0.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f.1", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"), ("127.1", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
    ("[::1]", "::1"), ("::ffff:127.0.0.1", "::ffff:127.0.0.1"), ("169.254.169.254.",
                                                                  "169.254.169.254"),
])
def test_every_literal_form_of_an_address_is_an_address(text, address):
    assert parse_ip(text) == ipaddress.ip_address(address)


@pytest.mark.parametrize("text", ["evil.test", "1.2.3.4.5", "08.1.1.1", "256.1.1.1.test",
                                  "0x7g.1", ""])
def test_names_are_not_addresses(text):
    assert parse_ip(text) is None


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("172.16.0.1", "private"),
    ("192.168.1.1", "private"), ("169.254.169.254", "link-local"), ("224.0.0.1", "multicast"),
    ("0.0.0.0", "unspecified"), ("::1", "loopback"), ("fe80::1", "link-local"),
    ("fd00::2", "private"), ("::ffff:10.0.0.1", "private"), ("2002:7f00:1::", "loopback"),
    ("64:ff9b::a9fe:a9fe", "link-local"), ("ff02::1", "multicast"),
])
def test_refused_addresses_say_why(address, why):
    assert why in why_refused(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["192.0.2.10", "198.51.100.7", "203.0.113.80",
                                     "198.18.0.1", "100.64.0.1", "2001:db8::1"])
def test_documentation_and_benchmark_ranges_are_not_refused_by_the_rule(address):
    # Python's is_private takes these in; the rule does not, and real names may resolve there.
    assert ipaddress.ip_address(address).is_private or address.startswith("100.")
    assert why_refused(ipaddress.ip_address(address)) is None


def test_the_hosts_own_addresses_are_refused():
    own = {ipaddress.ip_address("192.0.2.2")}
    assert why_refused(ipaddress.ip_address("192.0.2.2"), own) == "an address of this host"
    assert why_refused(ipaddress.ip_address("::ffff:192.0.2.2"), own) == "an address of this host"


def test_names_are_compared_lowercased_idna_encoded_without_trailing_dot():
    assert normalize_name("Bücher.Example.") == "xn--bcher-kva.example"
    assert normalize_name("bücher。example") == "xn--bcher-kva.example"
    assert normalize_name("EVIL.test.") == "evil.test"


def test_a_wildcard_does_not_allow_its_suffix_and_deny_wins():
    rule = parse_rule(["*.example.test", "exact.test"], ["no.example.test"], [443])
    assert rule.why_name_refused("a.b.example.test", 443) is None
    assert "not in the session's allow list" in rule.why_name_refused("example.test", 443)
    assert "not in the session's allow list" in rule.why_name_refused("xexample.test", 443)
    assert "deny list" in rule.why_name_refused("no.example.test", 443)
    assert "port 80" in rule.why_name_refused("exact.test", 80)


def test_a_denied_international_name_is_denied_in_every_spelling():
    rule = parse_rule(["*.idn.test"], ["bücher.idn.test"])
    for spelling in ("xn--bcher-kva.idn.test", "BÜCHER.idn.test.", "xn--BCHER-kva.idn.test."):
        assert "deny list" in rule.why_name_refused(normalize_name(spelling), 443)


def test_addresses_need_a_cidr_and_a_deny_cidr_wins():
    rule = parse_rule(["192.0.2.0/24", "198.51.100.7"], ["192.0.2.128/25"])
    assert rule.why_address_refused(ipaddress.ip_address("192.0.2.1")) is None
    assert rule.why_address_refused(ipaddress.ip_address("198.51.100.7")) is None
    assert "deny" in rule.why_address_refused(ipaddress.ip_address("192.0.2.200"))
    assert "CIDR" in rule.why_address_refused(ipaddress.ip_address("203.0.113.1"))


@pytest.mark.parametrize("allow, ports, named", [
    (["exa mple.test"], [443], "exa mple.test"), (["*."], [443], "*."),
    (["10.0.0.0/33"], [443], "10.0.0.0/33"), ([""], [443], "''"), ([5], [443], "5"),
    (["ok.test"], [0], "0"), (["ok.test"], [], "ports"), ("ok.test", [443], "list"),
])
def test_a_bad_entry_is_named(allow, ports, named):
    with pytest.raises(BadRule, match=named.replace("*", r"\*").replace(".", r"\.")):
        parse_rule(allow, [], ports)


def test_presets_expand_to_their_names():
    assert network_of([], ["pypi"]) == {"allow": list(PRESETS["pypi"])}
    assert network_of([], []) == "none"
    with pytest.raises(ValueError, match="npm"):
        network_of([], ["nope"])


# ---------------------------------------------------------------- HTTP heads


def test_connect_and_absolute_form_heads():
    head = http_head.parse_head(b"CONNECT [::1]:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (head.connect, head.host, head.port) == (True, "::1", 443)
    head = http_head.parse_head(b"GET http://Allowed.test:8080/a?b=1 HTTP/1.1\r\n"
                                b"Host: allowed.test:8080\r\nProxy-Authorization: secret\r\n"
                                b"Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\n\r\n")
    assert (head.host, head.port, head.path) == ("Allowed.test", 8080, b"/a?b=1")
    sent = head.for_origin()
    assert sent.startswith(b"GET /a?b=1 HTTP/1.1\r\n")
    assert b"Proxy-Authorization" not in sent and b"X-Drop" not in sent
    assert sent.endswith(b"Connection: close\r\n\r\n")


@pytest.mark.parametrize("data, status", [
    (b"GET / HTTP/1.1\r\n\r\n", 400), (b"GET https://a.test/ HTTP/1.1\r\n\r\n", 400),
    (b"CONNECT a.test HTTP/1.1\r\n\r\n", 400), (b"garbage\r\n\r\n", 400),
    (b"GET http://u:p@a.test/ HTTP/1.1\r\n\r\n", 400),
])
def test_heads_the_proxy_cannot_serve(data, status):
    with pytest.raises(http_head.BadHead) as e:
        http_head.parse_head(data)
    assert e.value.status == status


# ---------------------------------------------------------------- SOCKS5


def test_socks_greeting_and_requests():
    assert socks.parse_greeting(b"\x05") is None
    assert socks.parse_greeting(b"\x05\x01\x00") == (3, True)
    name = b"\x05\x01\x00\x03\x0aallowed.ok\x01\xbb"
    assert socks.parse_request(name[:-1]) is None
    used, req = socks.parse_request(name)
    assert (used, req.host, req.port, req.is_name) == (len(name), "allowed.ok", 443, True)
    used, req = socks.parse_request(b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50")
    assert (req.host, req.port, req.is_name) == ("127.0.0.1", 80, False)
    with pytest.raises(socks.BadSocks) as e:
        socks.parse_request(b"\x05\x03\x00\x01\x7f\x00\x00\x01\x00\x50")
    assert e.value.code == socks.COMMAND_NOT_SUPPORTED


# ---------------------------------------------------------------- TLS ClientHello


def client_hello(server_name: str | None) -> bytes:
    """A real ClientHello, as Python's ssl writes it, with no network."""
    context = ssl.create_default_context()
    if server_name is None:
        context.check_hostname = False
    obj = context.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(),
                           server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def test_the_server_name_of_a_client_hello():
    hello = client_hello("Allowed.Test")
    assert sni.looks_like_tls(hello)
    assert sni.client_hello(hello[:40]) is None  # more is needed
    assert sni.client_hello(hello).server_name == "allowed.test"
    assert sni.client_hello(client_hello(None)).server_name is None


def test_a_client_hello_split_over_records_is_read_whole():
    hello = client_hello("allowed.test")
    body = hello[5:]
    half = len(body) // 2
    records = b"".join(b"\x16\x03\x01" + len(part).to_bytes(2, "big") + part
                       for part in (body[:half], body[half:]))
    assert sni.client_hello(records).server_name == "allowed.test"


def test_what_is_no_client_hello():
    with pytest.raises(sni.NotTLS):
        sni.client_hello(b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00")
    assert not sni.looks_like_tls(b"GET / HTTP/1.1\r\n")


# ---------------------------------------------------------------- DNS


def query(name: bytes, qtype: int = dns.A, query_id: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p for p in name.split(b"."))
    return (query_id.to_bytes(2, "big") + b"\x01\x00\x00\x01" + bytes(6) + labels + b"\x00"
            + qtype.to_bytes(2, "big") + b"\x00\x01")


def test_a_dns_query_and_its_answers():
    q = dns.parse_query(query(b"Allowed.TEST"))
    assert (q.id, q.name, q.qtype) == (0x1234, "allowed.test", dns.A)
    reply = dns.answer(q, dns.NOERROR, [ipaddress.ip_address("127.0.0.2"),
                                        ipaddress.ip_address("::1")])
    assert reply[:2] == b"\x12\x34" and reply[3] & 0x0F == dns.NOERROR
    assert int.from_bytes(reply[6:8], "big") == 1  # only the A record
    assert reply.endswith(bytes([127, 0, 0, 2]))
    refused = dns.answer(q, dns.REFUSED)
    assert refused[3] & 0x0F == dns.REFUSED and int.from_bytes(refused[6:8], "big") == 0


def test_unreadable_dns_queries():
    with pytest.raises(dns.BadQuery):
        dns.parse_query(b"\x00\x01")
    with pytest.raises(dns.BadQuery) as e:
        dns.parse_query(query(b"a.test")[:14])
    assert dns.error_reply(b"", e.value)[3] & 0x0F == dns.FORMERR


# ---------------------------------------------------------------- the log


def test_the_log_is_bounded_and_counts_what_it_dropped():
    log = ConnectionLog(max_entries=3)
    for n in range(5):
        log.denied(f"h{n}.test", 443, "no")
    entries, next_, dropped = log.read(0)
    assert [e.host for e in entries] == ["h2.test", "h3.test", "h4.test"]
    assert (next_, dropped) == (5, 2)
    assert log.read(4)[0][0].host == "h4.test" and log.read(4)[2] == 0
    assert log.read(5)[0] == []


def test_refusals_of_a_call_are_listed_once_each():
    log = ConnectionLog()
    log.add("old.test", 80, "denied", "no", now=1.0)
    for _ in range(3):
        log.add("evil.test", 80, "denied", "not allowed", now=10.0)
    log.add("ok.test", 80, "allowed", "allowed", now=10.0)
    assert log.denied_since(5.0) == ["evil.test:80: not allowed"]


def test_a_listening_policy_gets_one_capability_and_its_resolv_conf_last():
    from toolsd.sandbox.bwrap.policy import Policy, bwrap_argv
    policy = Policy(workspace="/w", scratch="/s", network="none", hidden_dirs=("/h",),
                    resolv_conf="/state/resolv.conf", listens=True)
    argv = bwrap_argv(policy)
    assert argv[argv.index("--cap-drop") + 1:argv.index("--cap-drop") + 4] == [
        "ALL", "--cap-add", "CAP_NET_BIND_SERVICE"]
    binds = [i for i, a in enumerate(argv) if a in ("--ro-bind", "--bind", "--tmpfs")]
    assert argv[binds[-1]:binds[-1] + 3] == ["--ro-bind", "/state/resolv.conf",
                                             "/etc/resolv.conf"]
    with pytest.raises(ValueError, match="network must be none"):
        Policy(workspace="/w", scratch="/s", network="host", listens=True)


# ---------------------------------------------------------------- the order of checks


class FakeResolver:
    def __init__(self, names, exempt=()):
        self.names = {n: [ipaddress.ip_address(a) for a in addrs] for n, addrs in names.items()}
        self.exempt = frozenset(ipaddress.ip_address(a) for a in exempt)
        self.asked = []

    async def resolve(self, name, family=0):
        self.asked.append(name)
        return self.names[name]


async def test_the_gate_checks_names_before_resolving_and_addresses_after():
    from toolsd.sandbox.egress.gate import Gate, Refused
    resolver = FakeResolver({"ok.test": ["203.0.113.5"], "rebind.test": ["203.0.113.5",
                                                                         "10.0.0.1"],
                             "here.test": ["127.0.0.2"]}, exempt=["127.0.0.2"])
    gate = Gate(parse_rule(["ok.test", "rebind.test", "here.test", "192.0.2.0/24"]), resolver)
    target = await gate.target("OK.test.", 443, tunnel=True)
    assert (target.label, target.addrs) == ("ok.test", (ipaddress.ip_address("203.0.113.5"),))
    assert (await gate.target("here.test", 80, tunnel=False)).addrs[0].is_loopback
    for host, port, why in [("evil.test", 443, "not in the session's allow list"),
                            ("ok.test", 22, "port 22"),
                            ("rebind.test", 443, "resolves to 10.0.0.1, a private address"),
                            ("127.0.0.2", 80, "allowed only by a CIDR entry"),
                            ("0xc0.0.2.1", 22, "port 22")]:
        with pytest.raises(Refused, match=why):
            await gate.target(host, port, tunnel=True)
    assert "evil.test" not in resolver.asked
    assert str((await gate.target("3221225985", 80, tunnel=False)).addrs[0]) == "192.0.2.1"
    await gate.target("ok.test", 443, tunnel=True)
    assert resolver.asked.count("ok.test") == 1  # a short cache: the same checked answer
