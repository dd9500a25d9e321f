"""The Language Server Protocol as the diagnostics client speaks it: base-protocol framing
(`Content-Length` headers, JSON-RPC 2.0 bodies) and the few messages it sends and reads, built
and read with `lsprotocol`'s types (generated from the specification's model). Pure.

Bounded against a server that floods: a header block over MAX_HEADER_BYTES or a message over
MAX_MESSAGE_BYTES raises `Flood`; a body that is not JSON raises `Garbled`. Of one
publishDiagnostics, only the first `shown` diagnostics are read into types; the rest are
counted.

Everything sent is ASCII (JSON with escapes), so that a write the pipe takes in part can be
continued at any byte.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any

from lsprotocol import types as lsp
from lsprotocol.converters import get_converter

__all__ = ["Deframer", "Flood", "Garbled", "Published", "frame", "initialize", "initialized",
           "did_open", "did_change", "answer", "read_published", "file_uri", "LANGUAGE_IDS"]

MAX_HEADER_BYTES = 8192
MAX_MESSAGE_BYTES = 8 * 2**20

_converter = get_converter()

# File name ending -> the LSP languageId (the server's config key is agent/lsp/servers.py's).
LANGUAGE_IDS = {".py": "python", ".pyi": "python", ".ts": "typescript", ".mts": "typescript",
                ".cts": "typescript", ".tsx": "typescriptreact", ".js": "javascript",
                ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascriptreact"}


class Flood(Exception):
    """The server sent more than a message may hold."""


class Garbled(Exception):
    """The server sent something that is not the protocol."""


def frame(message: Any) -> str:
    """One message (an lsprotocol object or a dict) as the text written to the server."""
    body = message if isinstance(message, dict) else _converter.unstructure(message)
    data = json.dumps(body, ensure_ascii=True, separators=(",", ":"))
    return f"Content-Length: {len(data)}\r\n\r\n{data}"


class Deframer:
    """Messages out of the server's output as it comes (decoded JSON objects)."""

    def __init__(self, max_message: int = MAX_MESSAGE_BYTES):
        self._buffer = bytearray()
        self._max = max_message

    def feed(self, data: bytes) -> list[dict]:
        self._buffer += data
        out = []
        while True:
            end = self._buffer.find(b"\r\n\r\n", 0, MAX_HEADER_BYTES + 4)
            if end < 0:
                if len(self._buffer) > MAX_HEADER_BYTES:
                    raise Flood(f"a header block over {MAX_HEADER_BYTES} bytes")
                return out
            length = None
            for line in bytes(self._buffer[:end]).split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    try:
                        length = int(value.strip())
                    except ValueError:
                        raise Garbled(f"a Content-Length that is no number: {line!r}") from None
            if length is None or length < 0:
                raise Garbled(f"a header without Content-Length: "
                              f"{bytes(self._buffer[:min(end, 80)])!r}")
            if length > self._max:
                raise Flood(f"a message of {length:,} bytes, over the {self._max:,} a message "
                            f"may have")
            start = end + 4
            if len(self._buffer) < start + length:
                return out
            body = bytes(self._buffer[start:start + length])
            del self._buffer[:start + length]
            try:
                message = json.loads(body)
            except ValueError:
                raise Garbled(f"a body that is not JSON: {body[:80]!r}") from None
            if isinstance(message, dict):
                out.append(message)


def file_uri(path: str) -> str:
    return "file://" + urllib.parse.quote(os.path.abspath(path))


def initialize(request_id: int, root: str) -> lsp.InitializeRequest:
    uri = file_uri(root)
    capabilities = lsp.ClientCapabilities(
        text_document=lsp.TextDocumentClientCapabilities(
            synchronization=lsp.TextDocumentSyncClientCapabilities(did_save=False),
            publish_diagnostics=lsp.PublishDiagnosticsClientCapabilities(
                version_support=True)),
        workspace=lsp.WorkspaceClientCapabilities(configuration=True, workspace_folders=True))
    return lsp.InitializeRequest(id=request_id, params=lsp.InitializeParams(
        capabilities=capabilities, process_id=None, root_uri=uri,
        workspace_folders=[lsp.WorkspaceFolder(uri=uri, name=os.path.basename(root) or "/")],
        client_info=lsp.ClientInfo(name="toolsd-agent")))


def initialized() -> lsp.InitializedNotification:
    return lsp.InitializedNotification(params=lsp.InitializedParams())


def did_open(path: str, language_id: str, version: int, text: str):
    return lsp.DidOpenTextDocumentNotification(params=lsp.DidOpenTextDocumentParams(
        text_document=lsp.TextDocumentItem(uri=file_uri(path), language_id=language_id,
                                           version=version, text=text)))


def did_change(path: str, version: int, text: str):
    return lsp.DidChangeTextDocumentNotification(params=lsp.DidChangeTextDocumentParams(
        text_document=lsp.VersionedTextDocumentIdentifier(uri=file_uri(path), version=version),
        content_changes=[lsp.TextDocumentContentChangeWholeDocument(text=text)]))


def answer(message: dict) -> dict | None:
    """The reply to a request from the server (it waits for one): `workspace/configuration`
    gets no settings for each item asked, anything else a null result. None for what is not
    a request."""
    if "id" not in message or "method" not in message:
        return None
    result: Any = None
    if message["method"] == "workspace/configuration":
        items = (message.get("params") or {}).get("items") or []
        result = [None] * len(items) if isinstance(items, list) else []
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


class Published:
    """One publishDiagnostics: its uri, version, the first diagnostics as lsprotocol
    Diagnostics, and how many it held in all."""

    def __init__(self, uri: str, version: int | None, shown: list[lsp.Diagnostic], total: int):
        self.uri, self.version, self.shown, self.total = uri, version, shown, total


def read_published(message: dict, shown: int) -> Published | None:
    """A publishDiagnostics notification read (its first `shown` diagnostics into types), or
    None for any other message. Raises Garbled for one that does not follow the protocol."""
    if message.get("method") != "textDocument/publishDiagnostics":
        return None
    params = message.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("diagnostics"), list):
        raise Garbled("a publishDiagnostics without its diagnostics")
    everything = params["diagnostics"]
    head = {**message, "params": {**params, "diagnostics": everything[:shown]}}
    try:
        typed = _converter.structure(head, lsp.PublishDiagnosticsNotification)
    except Exception as e:  # cattrs raises its own groups of what did not fit
        raise Garbled(f"a publishDiagnostics that does not follow the protocol ({e})") from None
    return Published(typed.params.uri, typed.params.version, list(typed.params.diagnostics),
                     len(everything))
