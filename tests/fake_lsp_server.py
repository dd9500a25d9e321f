"""A language server of the tests, speaking the real protocol (base-protocol framing,
JSON-RPC 2.0) on stdin and stdout, standard library only (it runs inside the sandbox):

    python3 fake_lsp_server.py normal|silent|crash|flood|chatty

- normal: answers initialize; on didOpen or didChange asks the client for its configuration
  (a request it must answer, as real servers do) and then publishes one error per line that
  contains TYPE_ERROR, with the document's version;
- silent: reads everything and never writes (a server that hangs);
- crash: says why on stderr and exits 3 at once;
- flood: publishes 10,000 diagnostics for each file opened;
- chatty: prints a log line on stdout before its first message (a server that mixes its
  logs into the protocol).
"""

import json
import sys

MODE = sys.argv[1] if len(sys.argv) > 1 else "normal"
out = sys.stdout.buffer


def read():
    length = None
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            sys.exit(0)
        line = line.strip()
        if not line:
            break
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return json.loads(sys.stdin.buffer.read(length))


def send(message):
    body = json.dumps(message).encode()
    out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    out.flush()


def diagnostic(line, message):
    return {"range": {"start": {"line": line, "character": 0},
                      "end": {"line": line, "character": 10}},
            "severity": 1, "source": "fake-lsp", "message": message}


def publish(document):
    uri, version = document["uri"], document.get("version")
    text = document.get("text")
    if MODE == "flood":
        found = [diagnostic(i, f"flood {i}") for i in range(10_000)]
    else:
        found = [diagnostic(i, "Type error: TYPE_ERROR is not a str")
                 for i, line in enumerate(text.splitlines()) if "TYPE_ERROR" in line]
    send({"jsonrpc": "2.0", "method": "textDocument/publishDiagnostics",
          "params": {"uri": uri, "version": version, "diagnostics": found}})


def main():
    if MODE == "crash":
        sys.stderr.write("fake-lsp: cannot start: no project config\n")
        sys.exit(3)
    waiting = {}
    while True:
        message = read()
        if MODE == "silent":
            continue
        method = message.get("method")
        if method == "initialize":
            if MODE == "chatty":
                out.write(b"Starting the fake server\n")
            send({"jsonrpc": "2.0", "id": message["id"],
                  "result": {"capabilities": {"textDocumentSync": 1}}})
        elif method in ("textDocument/didOpen", "textDocument/didChange"):
            params = message["params"]
            document = dict(params["textDocument"])
            if method == "textDocument/didChange":
                document["text"] = params["contentChanges"][-1]["text"]
            ask = f"cfg{len(waiting) + 1}"
            waiting[ask] = document
            send({"jsonrpc": "2.0", "id": ask, "method": "workspace/configuration",
                  "params": {"items": [{"section": "fake"}]}})
        elif "id" in message and message.get("id") in waiting and "result" in message:
            publish(waiting.pop(message["id"]))
        elif method == "shutdown":
            send({"jsonrpc": "2.0", "id": message["id"], "result": None})
        elif method == "exit":
            return


main()
