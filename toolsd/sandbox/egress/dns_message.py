"""The few DNS messages the session's stub resolver reads and writes (RFC 1035): one question
in, an answer of A or AAAA records, or an error code, out. Pure."""

from __future__ import annotations

import dataclasses

from toolsd.sandbox.egress.addresses import IPAddress

A, AAAA = 1, 28
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
CLASS_IN = 1
TTL = 30


class BadQuery(ValueError):
    """Not a query the stub can answer at all (too short, a compressed question...). `id`
    and `rcode` say how to answer, when a header was readable."""

    def __init__(self, reason: str, query_id: int | None = None, rcode: int = FORMERR):
        super().__init__(reason)
        self.query_id = query_id
        self.rcode = rcode


@dataclasses.dataclass(frozen=True)
class Query:
    id: int
    flags: int
    name: str  # lowercase, no trailing dot; labels that are not text are escaped (\\DDD)
    qtype: int
    qclass: int
    question: bytes  # as sent: echoed in the answer


def parse_query(data: bytes) -> Query:
    if len(data) < 12:
        raise BadQuery("shorter than a DNS header")
    query_id = int.from_bytes(data[0:2], "big")
    flags = int.from_bytes(data[2:4], "big")
    if flags & 0x8000:
        raise BadQuery("a response, not a query")  # never answered: no loops
    if (flags >> 11) & 0xF != 0:
        raise BadQuery("only standard queries are answered", query_id, NOTIMP)
    if int.from_bytes(data[4:6], "big") != 1:
        raise BadQuery("a query must ask exactly one question", query_id)
    pos, labels = 12, []
    while True:
        if pos >= len(data):
            raise BadQuery("a truncated question", query_id)
        size = data[pos]
        if size & 0xC0:
            raise BadQuery("a compressed name in a question", query_id)
        pos += 1
        if size == 0:
            break
        labels.append(data[pos:pos + size])
        pos += size
    if pos + 4 > len(data) or len(labels) > 127:
        raise BadQuery("a truncated question", query_id)
    name = ".".join("".join(chr(b) if 0x21 <= b < 0x7F and b not in b".\\" else f"\\{b:03d}"
                            for b in label) for label in labels).lower()
    return Query(query_id, flags, name, int.from_bytes(data[pos:pos + 2], "big"),
                 int.from_bytes(data[pos + 2:pos + 4], "big"), data[12:pos + 4])


def answer(query: Query, rcode: int, addresses: list[IPAddress] = ()) -> bytes:
    """The reply to `query`: `rcode`, and one record per address of the type asked."""
    wanted = 4 if query.qtype == A else 16
    records = [a.packed for a in addresses if len(a.packed) == wanted] if rcode == NOERROR \
        else []
    flags = 0x8000 | (query.flags & 0x0100) | 0x0080 | rcode  # QR, RD echoed, RA, RCODE
    out = bytearray(query.id.to_bytes(2, "big") + flags.to_bytes(2, "big"))
    out += (1).to_bytes(2, "big") + len(records).to_bytes(2, "big") + bytes(4)
    out += query.question
    for rdata in records:
        out += b"\xc0\x0c" + query.qtype.to_bytes(2, "big") + CLASS_IN.to_bytes(2, "big")
        out += TTL.to_bytes(4, "big") + len(rdata).to_bytes(2, "big") + rdata
    return bytes(out)


def error_reply(data: bytes, error: BadQuery) -> bytes | None:
    """The reply to an unreadable query, or None when not even its id could be read."""
    if error.query_id is None:
        return None
    flags = 0x8000 | 0x0080 | error.rcode
    return error.query_id.to_bytes(2, "big") + flags.to_bytes(2, "big") + bytes(8)
