"""The launcher's side of port.forward: a socket connected to a port on the sandbox's own
loopback, made here, inside the sandbox's network namespace, and passed to the daemon with
SCM_RIGHTS. Standard library only; loaded by the launcher on its first `connect` request.

    daemon -> launcher:  {"op": "connect", "n": N, "port": PORT, "family": 4 | 6}
    launcher -> daemon:  {"op": "connected", "n": N} (fds: the socket), or
                         {"op": "connected", "n": N, "error": TEXT, "errno": E}

The connect is non-blocking, so the launcher never waits on it: on loopback it is refused at
once or under way, and the daemon waits for it to complete (and reads SO_ERROR) itself. The
socket passed back is the daemon's; ours is closed once sent.
"""

import _socket as socket
import errno
import os

ADDRESSES = {4: (socket.AF_INET, "127.0.0.1"), 6: (socket.AF_INET6, "::1")}


def answer(host, msg, send):
    """Answer one connect request `msg` on the channel `host`, with the launcher's `send`."""
    n = msg.get("n")
    port = msg.get("port")
    family, address = ADDRESSES.get(msg.get("family"), ADDRESSES[4])
    if not isinstance(port, int) or not 0 < port < 65536:
        send(host, {"op": "connected", "n": n, "error": "no such port", "errno": errno.EINVAL})
        return
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        send(host, {"op": "connected", "n": n, "error": e.strerror or str(e),
                    "errno": e.errno or 0})
        return
    try:
        sock.setblocking(False)
        err = sock.connect_ex((address, port))
        if err in (0, errno.EINPROGRESS):
            send(host, {"op": "connected", "n": n}, [sock.fileno()])
        else:
            send(host, {"op": "connected", "n": n, "error": os.strerror(err), "errno": err})
    finally:
        sock.close()
