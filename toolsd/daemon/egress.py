"""A session's network as the daemon runs it (PROTOCOL.md 1.2, "Egress by domain").

`"host"`: the host's network, nothing to run. `"none"` and a `{allow, deny, ports}` map: the
sandbox's own network namespace, loopback only, in which the launcher makes the proxy's
listeners and hands them to the daemon; `SessionNetwork.start` serves them in the session's
nursery (sandbox/egress/proxy.py), for `"none"` refusing every connection and DNS query with
"network is off for this session", so that a failed `pip install` says why.

Resource handling: the Session owns its SessionNetwork; the proxy is a task of the
session's nursery and closes its sockets when the session ends.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import time

import trio

from toolsd.sandbox.egress import proxy_env
from toolsd.sandbox.errors import LauncherError
from toolsd.sandbox.egress.connlog import ConnectionLog
from toolsd.sandbox.egress.dial import Upstreams
from toolsd.sandbox.egress.gate import Gate
from toolsd.sandbox.egress.proxy import Budget, EgressProxy, ProxyLimits
from toolsd.sandbox.egress.resolver import HostResolver, TestResolver
from toolsd.sandbox.egress.rules import OFF, BadRule, Rule, parse_rule
from toolsd.wire.egress import NetworkEntry, NetworkRule, SessionNetworkResult
from toolsd.wire.protocol import BAD_PARAMS, SANDBOX_UNAVAILABLE, UNSET, ToolsdError

log = logging.getLogger("toolsd.egress")
# A result's call is taken to have begun this much before its duration says.
SLACK_S = 0.0


class EgressHost:
    """What every session's proxy shares: the resolver, the daemon's upstream proxy, the
    resolv.conf file bound into sandboxes. One per Supervisor."""

    def __init__(self, state_dir: str, test_resolver: str | None = None,
                 env: dict[str, str] | None = None):
        self.resolver = TestResolver(test_resolver) if test_resolver else HostResolver()
        if test_resolver:
            log.warning("egress: names resolved by the test resolver %s only", test_resolver)
        try:
            self.upstreams = Upstreams.from_env(os.environ if env is None else env)
        except ValueError as e:
            log.warning("egress: %s; allowed connections are made directly", e)
            self.upstreams = Upstreams()
        if self.upstreams.tunnel or self.upstreams.http:
            log.info("egress: allowed connections go through the upstream proxy %s",
                     self.upstreams.tunnel or self.upstreams.http)
        # A quarter of the daemon's descriptors for all sessions' proxied connections (two
        # each): the rest stays for clients, sandboxes and pipes.
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.budget = Budget(max(256, soft // 8))
        self.resolv_conf = os.path.join(state_dir, "resolv.conf")
        tmp = self.resolv_conf + ".tmp"
        with open(tmp, "w") as f:
            f.write(proxy_env.RESOLV_CONF)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.resolv_conf)


@dataclasses.dataclass
class SessionNetwork:
    name: str  # as session.list shows it: "none", "host" or "filtered"
    rule: Rule | None  # None: the host's network, or no sandbox to enforce any
    policy_network: str  # the sandbox's: "host", or "none" (its own namespace)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    resolv_conf: str = ""
    log: ConnectionLog = dataclasses.field(default_factory=ConnectionLog)
    proxy: EgressProxy | None = None
    _looked: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def listen(self) -> str | None:
        """The launcher's `listen=` argument, when it must make the proxy's sockets."""
        return proxy_env.launcher_argument() if self.proxy is not None else None

    def policy_fields(self) -> dict:
        return {"resolv_conf": self.resolv_conf, "listens": self.proxy is not None}

    async def start(self, nursery: trio.Nursery, listeners: dict) -> None:
        """Serve the listeners the launcher made (a task of the session's `nursery`)."""
        if self.proxy is not None:
            try:
                named = {name: listeners.pop(f"{kind}:{port}")
                         for name, kind, port in proxy_env.LISTENERS}
            except KeyError as e:
                raise LauncherError(f"the sandbox launcher made no listener {e} for the "
                                    f"session's egress proxy") from None
            await nursery.start(self.proxy.serve, named)

    def report(self, result):
        """`result` with network_denied, if it is a shell.run or repl.exec result: the
        refusals during its call (by its duration)."""
        if self.proxy is not None and hasattr(result, "network_denied") and hasattr(
                result, "duration_s"):
            since = time.time() - result.duration_s - SLACK_S
            result.network_denied = self.log.denied_since(since) or UNSET
        return result

    def report_output(self, result, proc, *, moves_mark: bool) -> None:
        """A process.output `result` of `proc` with network_denied: the session's refusals
        since the previous read of the process's output that moved its shared mark (as
        `since: null` does), or since it started."""
        if self.proxy is None:
            return
        now = time.time()
        since = self._looked.get(proc.id, proc.started_at)
        if moves_mark:
            self._looked[proc.id] = now
            if len(self._looked) > 10_000:
                self._looked.clear()
        result.network_denied = self.log.denied_since(since) or UNSET

    def listing(self, since: int) -> SessionNetworkResult:
        entries, next_, dropped = self.log.read(since)
        return SessionNetworkResult(
            entries=[NetworkEntry(at=e.at, host=e.host, port=e.port, verdict=e.verdict,
                                  why=e.why, sent=e.sent, received=e.received)
                     for e in entries], next=next_, dropped=dropped, network=self.name)


def session_network(network: str | NetworkRule, host: EgressHost, sandboxed: bool
                    ) -> SessionNetwork:
    """A session's network from session.open's `network`; ToolsdError if it cannot be."""
    if network == "host":
        return SessionNetwork("host", None, "host")
    if isinstance(network, str):
        rule = OFF
    else:
        try:
            rule = parse_rule(network.allow, network.deny, network.ports)
        except BadRule as e:
            raise ToolsdError(BAD_PARAMS, f"session.open: {e}") from None
        if not sandboxed:
            raise ToolsdError(SANDBOX_UNAVAILABLE, "a filtered network needs the sandbox, and "
                              "this daemon has none (toolsd doctor says why); install "
                              "bubblewrap, or open the session with network \"host\"")
    name = "none" if rule.off else "filtered"
    if not sandboxed:
        return SessionNetwork(name, None, "none")
    gate = Gate(rule, host.resolver.for_session(), host.upstreams)
    env = proxy_env.proxy_env()
    if rule.off:
        env["PIP_RETRIES"] = "0"  # pip would retry for seconds a network that is off
    net = SessionNetwork(name, rule, "none", env, host.resolv_conf)
    timeout = getattr(host.resolver, "head_timeout_s", None)  # tests only
    limits = ProxyLimits(head_timeout_s=timeout) if timeout else ProxyLimits()
    net.proxy = EgressProxy(gate, net.log, limits, host.budget)
    return net
