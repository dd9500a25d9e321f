"""NodeAgent: the actor that runs, supervises and speaks for one node's toolsd.

Pinned to its node (NodeAffinitySchedulingStrategy, soft=False), it starts `toolsd serve
--listen tls://NODE_IP:PORT` as its child (daemon_process.py) and restarts it whenever it
exits. It opens each lease's session over TLS with a token made for that lease (so the
session belongs to the lease's tenant and no other lease can reach it), writes the lease's
record (lease_record.py), and ends the session when the lease ends: closed, or its placement
group gone (its owner's job or actor ended, or it was removed: the manager's look at Ray's
placement group table, check()).

A daemon that dies loses its sessions (a daemon's sessions never survive it): the agent
records them as lost with the reason, which their handles report, releases their leases
(their slots are free again), and starts the daemon again on the same state folder, so no
id it hands out is an old one.

Resource handling: the agent owns the daemon process (which gets SIGTERM if the agent's
process dies); the leases it holds are in `self.leases` (their placement groups are Ray's).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time

import ray

from toolsd.client import AsyncClient, ToolsdError
from toolsd.cluster import lease as leases
from toolsd.cluster import lease_record, names
from toolsd.cluster.lease_record import LeaseState
from toolsd.cluster.daemon_process import NodeFiles, die_with_parent, serve_argv

log = logging.getLogger("toolsd.cluster")

LOST_KEPT = 1000  # lost sessions remembered for status()


@ray.remote(num_cpus=0, max_concurrency=10000)
class NodeAgent:
    def __init__(self, node_id: str, root: str, port: int = 0, serve_args: list[str] = ()):
        self.node_id = node_id
        self.host = ray.util.get_node_ip_address()
        self.files = NodeFiles(os.path.join(root, names.node_folder(node_id)))
        self.port = port
        self.serve_args = list(serve_args)
        self.url: str | None = None
        self.fingerprint: str | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.leases: dict[str, dict] = {}  # lease -> {tenant, token, session, job, pg}
        self.lost: list[dict] = []
        self.restarts = 0
        self.stopping = False
        self._ready = asyncio.Event()

    async def start(self) -> dict:
        """Start the daemon (once) and return where it answers."""
        if self.proc is None:
            await self._start_daemon()
            asyncio.get_running_loop().create_task(self._supervise())
        await self._ready.wait()
        return {"url": self.url, "fingerprint": self.fingerprint}

    async def _start_daemon(self) -> None:
        self.files.write_tokens({})
        self.proc = await asyncio.create_subprocess_exec(
            *serve_argv(self.files, self.host, self.port, self.serve_args),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent, start_new_session=True)
        # Ready when it says where it listens (after remote.json is written).
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"toolsd on node {self.node_id} exited at start (code "
                                   f"{await self.proc.wait()}); see its log in "
                                   f"{self.files.folder}")
            if b"listening on tls://" in line:
                break
        info = self.files.remote_info()
        self.url, self.fingerprint = info["urls"][0], info["fingerprint"]
        self.port = int(self.url.rsplit(":", 1)[1])  # the same port after a restart
        asyncio.get_running_loop().create_task(self._drain(self.proc))
        self._ready.set()

    @staticmethod
    async def _drain(proc) -> None:
        while await proc.stdout.read(65536):
            pass

    async def _supervise(self) -> None:
        while True:
            code = await self.proc.wait()
            if self.stopping:
                return
            self._ready.clear()
            self.restarts += 1
            reason = (f"the toolsd daemon on Ray node {self.node_id} died (exit code {code}) "
                      f"and was restarted; its sessions were lost")
            log.warning("%s", reason)
            for name in list(self.leases):
                await self._end(name, reason, LeaseState.LOST)
            try:
                await self._start_daemon()
            except RuntimeError:
                # Its port may be taken by now: any free one (handles hold the URL of a
                # session, and those sessions are gone).
                self.port = 0
                await self._start_daemon()

    async def open_lease(self, lease: str, pg: str, job: str, params: dict) -> dict:
        """Open a session for `lease` (placement group `pg`, hex, holding a slot here)."""
        await self._ready.wait()
        tenant, token = names.lease_tenant(lease), secrets.token_urlsafe(32)
        self.leases[lease] = {"tenant": tenant, "token": token, "session": None, "job": job,
                              "pg": pg, "opened": time.time()}
        self._write_tokens()
        try:
            client = await AsyncClient.connect(self.url, token=token,
                                               fingerprint=self.fingerprint)
            try:
                result = await client.session_open(**params)
            finally:
                await client.aclose()
        except BaseException:
            self.leases.pop(lease, None)
            self._write_tokens()
            raise
        self.leases[lease]["session"] = result["session"]
        lease_record.write(self.node_id, lease, LeaseState.OPEN, pg=pg, job=job,
                           session=result["session"])
        return {"url": self.url, "fingerprint": self.fingerprint, "token": token,
                "session": result["session"], "node": self.node_id,
                "workspace": result.get("workspace"), "result": result}

    async def close_lease(self, lease: str) -> bool:
        """Close the lease's session and end the lease; False: not one of this node's."""
        if lease not in self.leases:
            return False
        await self._end(lease, "the session was closed", None)
        return True

    async def check(self, placed: list[str], dead_jobs: list[str]) -> int:
        """End the leases whose placement group is no longer placed here (`placed`: the
        leases Ray's table showed on this node a moment ago; one opened since is looked up
        again) or whose job is gone; how many."""
        placed, dead_jobs = set(placed), set(dead_jobs)
        gone = []
        for name, entry in list(self.leases.items()):
            if entry["job"] in dead_jobs:
                gone.append((name, "the Ray job that opened it ended"))
            elif (name not in placed and entry["session"] is not None
                  and leases.node_of(entry["pg"]) != self.node_id):
                gone.append((name, "its placement group was removed (the job or actor that "
                                   "opened it ended, or it was removed)"))
        for name, reason in gone:
            await self._end(name, reason, LeaseState.ENDED)
        return len(gone)

    async def _end(self, lease: str, reason: str, state: LeaseState | None) -> None:
        """End a lease: closed (state None: its record goes), ENDED or LOST (the record
        keeps the reason). Its session is closed unless the daemon died with it."""
        entry = self.leases.pop(lease, None)
        if entry is None:
            return
        self._write_tokens()
        if state is LeaseState.LOST:
            if entry["session"] is not None:
                self.lost.append({"session": entry["session"], "lease": lease,
                                  "reason": reason})
                del self.lost[:-LOST_KEPT]
        elif entry["session"] is not None:
            await self._close_session(entry["session"])
        if state is None:
            lease_record.drop(self.node_id, lease)
        else:
            lease_record.write(self.node_id, lease, state, pg=entry["pg"], job=entry["job"],
                               session=entry["session"], reason=reason)
        leases.release(entry["pg"])

    async def _close_session(self, session: str) -> None:
        try:
            client = await AsyncClient.connect(f"unix://{self.files.socket}")
            try:
                await client.session_close(session)
            finally:
                await client.aclose()
        except ToolsdError as e:
            if e.code not in ("not_found", "session_closed", "connection_lost"):
                log.warning("closing %s: %s", session, e)

    def _write_tokens(self) -> None:
        self.files.write_tokens({e["tenant"]: e["token"] for e in self.leases.values()})

    async def status(self) -> dict:
        return {"node": self.node_id, "url": self.url, "fingerprint": self.fingerprint,
                "pid": self.proc.pid if self.proc else None, "restarts": self.restarts,
                "sessions": sorted(e["session"] for e in self.leases.values()
                                   if e["session"]),
                "used": len(self.leases), "lost": list(self.lost)}

    async def stop(self) -> None:
        """End every lease, then the daemon (SIGTERM: it closes its sessions first)."""
        self.stopping = True
        for name in list(self.leases):
            await self._end(name, "the cluster was taken down", LeaseState.ENDED)
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()
