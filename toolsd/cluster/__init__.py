"""Sessions placed across a Ray cluster, one toolsd per node (docs/cluster.md).

`pip install toolsd[cluster]` brings Ray. Ray places and watches; it never carries a tool
call: a session's handle names its node's daemon (`tls://IP:PORT`, fingerprint, a token of
the session's own tenant) and the caller talks to it directly.

    Cluster.up()        a NodeAgent actor per node with `toolsd_slot` resources (agent.py),
                        each running and restarting that node's `toolsd serve --listen tls://`
    open_session()      a Lease actor holding one `toolsd_slot` (lease.py), placed by Ray; its
                        node's agent opens the session with a token made for the lease
    SessionHandle       plain data (handle.py); `.connect()` a Client, `.close()` the lease
"""

from toolsd.cluster.api import Cluster
from toolsd.cluster.handle import SessionHandle

__all__ = ["Cluster", "SessionHandle"]
