"""Clients of the toolsd daemon: a blocking `Client` and an `AsyncClient` for trio or asyncio.

The logic without I/O (request ids and frames, reading replies, mapping errors to exceptions)
lives once in core.py (ClientCore); the two clients only move bytes. Exceptions::

    ToolsdError (code, message)        every error reply, and:
     └── ConnectionLost                the daemon closed the connection or could not be reached

`call(method, **params)` returns the result map. The named helpers (`shell_run`, ...) are the
same call with the contract's names; on AsyncClient they are awaited. A named helper refuses a
keyword its method does not take with TypeError naming the nearest one (options.py), before
anything is sent; `call` sends whatever it is given.

Live output (protocol 1.1 "stream"): `call(..., on_event=fn)` (and so `shell_run(...,
on_event=fn)`) asks for the request's events and calls `fn(event)` with each, in order, in the
caller's own thread or task, before returning the result; `AsyncClient.stream(method, ...)`
gives them as an async iterator instead. An `Event` has `event` ("output") and `data` (text).

Files (protocol 1.2): `file_read`, `file_write`, ... are the contract's calls; `upload(local,
session, remote)` and `download(session, remote, local)` copy files and whole folders, many
files at once and big ones in parts (client/copy.py).

Connecting: when the daemon's queue of connections waiting to be accepted is full (a burst of
clients, or a daemon that does not accept), the kernel refuses a connect at once (EAGAIN). Both
clients then try again, with short pauses, for up to CONNECT_WAIT_S (a blocking Client with a
shorter `timeout`: that long), and raise ConnectionLost saying so if the queue stays full.
"""

from toolsd.client.asynchronous import AsyncClient, StreamingCall
from toolsd.client.blocking import Client
from toolsd.client.copy import CopyStats
from toolsd.client.core import CONNECT_WAIT_S, ConnectionLost
from toolsd.wire.events import Event
from toolsd.wire.protocol import ToolsdError

__all__ = ["Client", "AsyncClient", "StreamingCall", "Event", "ToolsdError", "ConnectionLost",
           "CONNECT_WAIT_S", "CopyStats"]
