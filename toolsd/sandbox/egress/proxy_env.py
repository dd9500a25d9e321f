"""What the sandbox's programs read to find the proxies, and where the proxies listen. Pure."""

from __future__ import annotations

HOST = "127.0.0.1"
HTTP_PORT, SOCKS_PORT, DNS_PORT = 3128, 1080, 53
# The listeners the launcher makes in the session's network namespace, by name, in the order
# of its argument (driver/launcher.py, listen_inside).
LISTENERS = (("http", "tcp", HTTP_PORT), ("socks", "tcp", SOCKS_PORT),
             ("dns_tcp", "tcp", DNS_PORT), ("dns_udp", "udp", DNS_PORT))
NO_PROXY = "localhost,127.0.0.1,::1"
RESOLV_CONF = f"nameserver {HOST}\noptions attempts:1 timeout:2\n"


def launcher_argument() -> str:
    """The launcher's `listen=` argument: tcp:3128,tcp:1080,tcp:53,udp:53."""
    return "listen=" + ",".join(f"{kind}:{port}" for _name, kind, port in LISTENERS)


def proxy_env() -> dict[str, str]:
    """The variables that curl, wget, pip, requests, httpx, urllib, git, npm, yarn and node
    read (both cases where a program reads only one of them)."""
    http = f"http://{HOST}:{HTTP_PORT}"
    socks = f"socks5h://{HOST}:{SOCKS_PORT}"
    env = {}
    for name, value in (("http_proxy", http), ("https_proxy", http), ("all_proxy", socks),
                        ("no_proxy", NO_PROXY)):
        env[name] = env[name.upper()] = value
    env.update({
        # npm and yarn read their own settings (npm also reads https_proxy, yarn 1 not).
        "npm_config_proxy": http,
        "npm_config_https_proxy": http,
        "npm_config_noproxy": NO_PROXY,
        "YARN_HTTP_PROXY": http,
        "YARN_HTTPS_PROXY": http,
        # node's own fetch (undici) and http modules read the variables above with this
        # (node 22.21 / 24.5 on); older nodes ignore it.
        "NODE_USE_ENV_PROXY": "1",
        # git reads http_proxy for http and https remotes already.
    })
    return env
