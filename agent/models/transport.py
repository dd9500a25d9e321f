"""One streamed POST to a model server, with the retry path and the errors a person reads.

What a reply's bytes mean is the adapter's (an `Assembler`, pure); this module only carries
them. A request is tried again only while nothing of its reply has been taken in (a 429 or
5xx status, a connection closed or reset before the first event, or a transient error event
ahead of any content), so a retry never shows the same text twice. Every failure that is
final becomes a `ModelError` of one line that names what to check.

Errors:

    ModelError              final; the turn fails with its work kept
     +-- ContextOverflow    the request is over the model's window: compact and ask again
     +-- Unreachable        the connection was refused: nothing was sent
    Transient               (internal) worth another try, until the policy gives up
"""

from __future__ import annotations

import email.utils
import json
import random
import re
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import msgspec
import trio

from agent.models.base import ContextOverflow, ModelError, ModelReply, Unreachable
from agent.models.stream import SSEDecoder

RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx; as the official SDKs retry
# What is read of a reply at most: a model's answer is bounded by its max_tokens, so a reply
# (or an error body) past these is a misdirected or hostile server, not held in memory.
MAX_REPLY_CHARS = 16 * 2**20
MAX_ERROR_BYTES = 64 * 2**10


class Transient(Exception):
    """A failure another try may not meet; `status` is the HTTP status where there was one,
    `retry_after` the seconds the server asked to wait, `connection` whether the connection
    itself failed."""

    def __init__(self, detail: str, status: int | None = None,
                 retry_after: float | None = None, *, connection: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.retry_after = retry_after
        self.connection = connection


class Assembler(Protocol):
    """Builds one reply from a stream's events. `started` is true once content (text or a
    tool call) was taken in, and so perhaps shown: from then on the request is not repeated."""

    started: bool

    def feed(self, event: str, data: str) -> None: ...

    def reply(self) -> ModelReply: ...


class RetryPolicy(msgspec.Struct, frozen=True):
    """At most `tries` requests; between them a full-jitter backoff (a random wait up to
    `base_s` * 2^n, at most `cap_s`), or the server's Retry-After where it sent one and it is
    at most `max_retry_after_s` (a longer one is not waited out: the error says so)."""

    tries: int = 4
    base_s: float = 1.0
    cap_s: float = 30.0
    max_retry_after_s: float = 60.0

    def delay(self, failures: int, retry_after: float | None) -> float | None:
        """Seconds to wait before the next try, or None to give up now."""
        if failures >= self.tries:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after_s else None
        return random.uniform(0, min(self.cap_s, self.base_s * 2 ** (failures - 1)))


class Timeouts(msgspec.Struct, frozen=True):
    connect_s: float = 15.0
    # Between two bytes of the reply: a local server may take minutes to read a long prompt
    # before its first token.
    read_s: float = 300.0


class Endpoint(msgspec.Struct, frozen=True):
    """Where requests go and what to name in errors: `key_hint` says where the key comes
    from (e.g. "$OPENAI_API_KEY")."""

    url: str
    headers: dict[str, str]
    model: str
    key_hint: str


Sleep = Callable[[float], Awaitable[None]]


class HTTPOptions(msgspec.Struct, frozen=True):
    """How an adapter's requests go. Resource handling: `client`, when given, stays the
    caller's; otherwise each request opens a client and closes it before returning. `sleep`
    is what the retry path waits with (a test passes one that records the waits instead)."""

    client: httpx.AsyncClient | None = None
    policy: RetryPolicy = RetryPolicy()
    timeouts: Timeouts = Timeouts()
    sleep: Sleep = trio.sleep


async def post_streamed(endpoint: Endpoint, body: dict[str, Any],
                        new_assembler: Callable[[], Assembler],
                        http: HTTPOptions = HTTPOptions()) -> ModelReply:
    """POST `body` as JSON and assemble the streamed reply, retrying as `http.policy` allows."""
    if http.client is None:
        async with httpx.AsyncClient(timeout=_httpx_timeout(http.timeouts)) as own:
            return await post_streamed(endpoint, body, new_assembler,
                                       msgspec.structs.replace(http, client=own))
    failures = 0
    while True:
        assembler = new_assembler()
        try:
            await _post_once(http.client, endpoint, body, assembler, http.timeouts)
            return assembler.reply()
        except Transient as t:
            if assembler.started:
                raise ModelError(f"the reply from {endpoint.url} broke off midway ({t.detail}); "
                                 "ask again") from None
            failures += 1
            wait = http.policy.delay(failures, t.retry_after)
            if wait is None:
                raise ModelError(_gave_up(endpoint, t, failures)) from None
            await http.sleep(wait)


async def _post_once(client: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any],
                     assembler: Assembler, timeouts: Timeouts) -> None:
    try:
        async with client.stream("POST", endpoint.url, json=body, headers=endpoint.headers,
                                 timeout=_httpx_timeout(timeouts)) as response:
            if response.status_code >= 400:
                text = (await _read_capped(response, MAX_ERROR_BYTES)).decode("utf-8", "replace")
                raise status_failure(endpoint, response.status_code, text, response.headers)
            if "json" in response.headers.get("content-type", ""):
                # A server that does not stream answers with the whole reply at once.
                body = await _read_capped(response, MAX_REPLY_CHARS + 1)
                if len(body) > MAX_REPLY_CHARS:
                    raise ModelError(_too_long(endpoint))
                assembler.feed("", body.decode("utf-8", "replace"))
                return
            decoder, size = SSEDecoder(), 0
            async for text in response.aiter_text():
                size += len(text)
                if size > MAX_REPLY_CHARS:
                    raise ModelError(_too_long(endpoint))
                for event in decoder.feed_text(text):
                    assembler.feed(event.event, event.data)
            event = decoder.close()
            if event is not None:
                assembler.feed(event.event, event.data)
    except httpx.ConnectTimeout:
        raise Transient(f"no connection within {timeouts.connect_s:g} s",
                        connection=True) from None
    except httpx.ConnectError as e:
        refused = any(isinstance(c, ConnectionRefusedError) for c in causes(e))
        raise (Unreachable if refused else ModelError)(_connect_failure(endpoint.url, e)) \
            from None
    except httpx.ReadTimeout:
        raise ModelError(f"{endpoint.url} sent nothing for {timeouts.read_s:g} s; check that "
                         "the server is up and not overloaded, or allow a longer read timeout"
                         ) from None
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
        raise Transient(f"connection lost: {_one_line(str(e)) or type(e).__name__}",
                        connection=True) from None


async def _read_capped(response: httpx.Response, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


def _too_long(endpoint: Endpoint) -> str:
    return (f"the reply from {endpoint.url} went past {MAX_REPLY_CHARS:,} characters, far "
            "more than a model's answer; check that the base URL is a model server")


def endpoint_url(base_url: str, path: str) -> str:
    """`base_url` with the API's `path` appended, unless it already ends in it."""
    try:
        url = httpx.URL(base_url.strip())
    except httpx.InvalidURL as e:
        raise ModelError(f"the base URL {base_url!r} is not a URL ({e})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ModelError(f"the base URL {base_url!r} is not an http:// or https:// URL; "
                         "give one like http://127.0.0.1:8080/v1")
    text = str(url).rstrip("/")
    return text if text.endswith(path) else text + path


def _httpx_timeout(t: Timeouts) -> httpx.Timeout:
    return httpx.Timeout(connect=t.connect_s, read=t.read_s, write=60.0, pool=t.connect_s)


# --- What a failure means (pure) -----------------------------------------------------------

_CONTEXT_WORDS = re.compile(
    r"context[ _]length|context[ _]window|context size|maximum context|prompt is too long|"
    r"too many (input )?tokens|exceeds? the (available )?context", re.I)
_MODEL_WORDS = re.compile(
    r"not[ _]found|does not exist|doesn't exist|no such|unknown|invalid|not supported|"
    r"not available|try pulling", re.I)


def status_failure(endpoint: Endpoint, status: int, text: str,
                   headers: httpx.Headers | dict[str, str]) -> Exception:
    """The exception for an error status: Transient for those worth another try, else a
    ModelError whose one line names what to check."""
    detail = error_detail(text)
    said = f"HTTP {status}" + (f": {detail}" if detail else "")
    if status in RETRY_STATUSES or status >= 500:
        return Transient(said, status, retry_after(headers))
    if status in (401, 403):
        return ModelError(f"{endpoint.url} refused the API key ({said}); check the key in "
                          f"{endpoint.key_hint}")
    if status in (400, 404, 413, 422) and _CONTEXT_WORDS.search(detail):
        return ContextOverflow(f"the request is larger than {endpoint.model}'s context window "
                               f"({said}); compact the history or shorten the prompt")
    if status in (400, 404, 422) and _names_model(detail, endpoint.model, status):
        return ModelError(f"{endpoint.url} does not serve the model {endpoint.model!r} "
                          f"({said}); check the model name")
    if status in (404, 405):
        return ModelError(f"{endpoint.url} is not a model endpoint ({said}); check the base "
                          "URL (an OpenAI-compatible server's usually ends in /v1)")
    return ModelError(f"{endpoint.url} rejected the request ({said})")


def _names_model(detail: str, model: str, status: int) -> bool:
    lowered = detail.lower()
    if model and model.lower() in lowered:
        return True
    return "model" in lowered and (status == 404 or bool(_MODEL_WORDS.search(detail)))


def error_detail(text: str) -> str:
    """The server's own words from an error body, on one line: OpenAI's and Anthropic's
    `{"error": {"message": ...}}`, `{"error": "..."}`, `{"message"|"detail": ...}`, or the
    text itself."""
    try:
        body = json.loads(text)
    except ValueError:
        return _one_line(text)
    found: Any = body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            found = err.get("message") or err.get("type") or err
        else:
            found = err or body.get("message") or body.get("detail") or body
    return _one_line(found if isinstance(found, str) else json.dumps(found))


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def retry_after(headers: httpx.Headers | dict[str, str]) -> float | None:
    """Seconds the server asked to wait: `retry-after-ms` (OpenAI), else `retry-after` as
    seconds or as an HTTP date."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        if "retry-after-ms" in lowered:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000)
        value = lowered.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (ValueError, TypeError):
        return None


def _gave_up(endpoint: Endpoint, t: Transient, failures: int) -> str:
    tries = f"{failures} {'try' if failures == 1 else 'tries'}"
    if t.status == 429:
        asked = (f"; it asks to wait {t.retry_after:g} s" if t.retry_after is not None else "")
        return (f"{endpoint.url} is rate limiting ({t.detail}) after {tries}{asked}; wait and "
                "try again, or check the account's limits")
    if t.connection:
        return (f"{endpoint.url} kept dropping the connection ({t.detail}) after {tries}; "
                "check the base URL and the server")
    return f"{endpoint.url} kept failing ({t.detail}) after {tries}; try again later"


def _connect_failure(url: str, e: httpx.ConnectError) -> str:
    found = list(causes(e))
    for cause in found:
        if isinstance(cause, socket.gaierror):
            return f"cannot find the host of {url} ({cause.strerror}); check the base URL"
    if any(isinstance(c, ConnectionRefusedError) for c in found):
        return (f"cannot connect to {url}: connection refused; check the base URL and that the "
                "server is running")
    return f"cannot connect to {url} ({_one_line(str(e)) or type(e).__name__}); check the base URL"


def causes(e: BaseException):
    """The exception, what it was raised from, and the members of any group among them (a
    refused connection reaches httpx as a group of one try per address)."""
    seen: set[int] = set()
    todo = [e]
    while todo:
        cause = todo.pop()
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        yield cause
        todo += [c for c in (cause.__cause__, cause.__context__) if c is not None]
        todo += list(getattr(cause, "exceptions", ()))
