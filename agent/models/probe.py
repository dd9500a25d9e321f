"""Two questions an agent asks a model endpoint besides requests, each bounded in time:
whether it answers at all (`unreachable`: the offline queue, agent/turns/offline.py), and what
context window it reports for the model (`reported_budget`, agent/models/limits.py reads the
reply). Neither ever raises for a server that is down, slow or odd: it says so, or None.

`route_budget` is where a route's budget is settled, once, as an agent opens: the configured
size, else what the endpoint reports, else the adapter's catalog entry or its fallback.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from agent.models.base import ContextBudget, Model
from agent.models.limits import endpoint_budget, reported_context
from agent.models.transport import causes

__all__ = ["PROBE_TIMEOUT", "reported_budget", "route_budget", "unreachable"]

# A probe is not a request a person waits for: it gives up quickly.
PROBE_TIMEOUT = httpx.Timeout(connect=3.0, read=5.0, write=5.0, pool=3.0)
MAX_PROBE_BYTES = 4 * 2**20  # a model list of a big gateway is a few hundred kB


def _headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() != "accept"} | \
        {"Accept": "application/json"}


async def unreachable(url: str, headers: dict[str, str]) -> str | None:
    """None when `url` gets any HTTP answer (even an error status: something serves there),
    else why not, in a few words ("connection refused", "no answer within 3 s")."""
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT) as client:
            async with client.stream("GET", url, headers=_headers(headers)):
                return None
    except httpx.ConnectTimeout:
        return f"no connection within {PROBE_TIMEOUT.connect:g} s"
    except httpx.TimeoutException:
        return f"no answer within {PROBE_TIMEOUT.read:g} s"
    except httpx.ConnectError as e:
        if any(isinstance(c, ConnectionRefusedError) for c in causes(e)):
            return "connection refused"
        return str(e) or "cannot connect"
    except (httpx.HTTPError, OSError) as e:
        return str(e) or type(e).__name__


async def _get_json(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> Any:
    try:
        async with client.stream("GET", url, headers=_headers(headers)) as response:
            if response.status_code != 200:
                return None
            data = b""
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > MAX_PROBE_BYTES:
                    return None
        return json.loads(data)
    except (httpx.HTTPError, OSError, ValueError):
        return None


async def reported_budget(urls: list[str], headers: dict[str, str],
                          model: str) -> ContextBudget | None:
    """The first window one of `urls` reports for `model` (agent/models/limits.py), or
    None."""
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT) as client:
        for url in urls:
            found = reported_context(await _get_json(client, url, headers), model)
            if found is not None:
                return endpoint_budget(*found)
    return None


async def route_budget(configured: int | None, model: Model) -> ContextBudget:
    """The configured size, else the endpoint's report (for an adapter that can ask it), else
    the adapter's own budget (its configured size, catalog entry or fallback)."""
    if configured:
        return ContextBudget(configured, source="configured", detail="context_tokens")
    own = model.context_budget()
    if own.origin == "configured":
        return own
    ask = getattr(model, "reported_budget", None)
    if ask is not None:
        reported = await ask()
        if reported is not None:
            return reported
    return own
