"""Egress by domain (PROTOCOL.md 1.2, "egress"): what a session with a filtered network may
reach, decided outside its sandbox.

Pure parts: `rules` (names, CIDRs, ports), `addresses` (IP literals, which addresses are
refused), `http_head`, `socks`, `sni`, `dns_message` (the wire formats), `connlog` (the
bounded log), `proxy_env` (what the sandbox's programs read). I/O parts: `resolver`,
`dial`, `splice_relay`, `proxy` and `dns_stub`, run by the daemon in the session's nursery.
"""
