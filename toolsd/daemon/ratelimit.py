"""Failed authentications per source address: a token bucket each (pure: the caller passes
the time).

An address may fail BURST times at once, then one more time every REFILL_S; while its bucket
is empty every attempt from it is refused without its token being looked at, so guessing
runs at one try per REFILL_S however many connections are made. Success costs nothing. At
most MAX_ADDRESSES are remembered (the longest-idle forgotten first), so a flood of source
addresses cannot grow the table.
"""

from __future__ import annotations

import collections

__all__ = ["FailureLimiter"]


class FailureLimiter:
    def __init__(self, burst: int = 10, refill_s: float = 2.0, max_addresses: int = 10_000):
        self.burst = burst
        self.refill_s = refill_s
        self.max_addresses = max_addresses
        # address -> (tokens left, when counted); oldest use first
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = \
            collections.OrderedDict()

    def _level(self, address: str, now: float) -> float:
        left, at = self._buckets.get(address, (float(self.burst), now))
        return min(float(self.burst), left + (now - at) / self.refill_s)

    def wait_s(self, address: str, now: float) -> float:
        """0 if `address` may try now, else how long until it may."""
        level = self._level(address, now)
        return 0.0 if level >= 1 else (1 - level) * self.refill_s

    def failed(self, address: str, now: float) -> None:
        level = max(0.0, self._level(address, now) - 1)
        self._buckets[address] = (level, now)
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)
