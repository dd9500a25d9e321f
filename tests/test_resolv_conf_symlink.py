"""A host whose /etc/resolv.conf is a symlink into /run (systemd-resolved's
`../run/systemd/resolve/stub-resolv.conf`, the default on Ubuntu): sessions hide /run, so a
bind onto the symlink would lead into the hidden, empty /run, and every session with its own
network (`"none"`, the default, and filtered ones) failed to start. The daemon runs here in a
mount namespace of its own whose /etc is a copy with that symlink."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import RunningDaemon, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.isdir("/run/systemd") or not shutil.which("unshare"),
    reason="needs root, unshare and a /run/systemd folder to mount over (in a mount "
           "namespace of the test's own)")]

SETUP = ('mount --bind "$0" /etc && mount -t tmpfs toolsd-test /run/systemd && '
         'mkdir -p /run/systemd/resolve && '
         'cp "$0/resolv.conf.host" /run/systemd/resolve/stub-resolv.conf && exec "$@"')


@pytest.fixture
def resolved_host(daemon_root):
    etc = os.path.join(daemon_root, "etc")
    subprocess.run(["cp", "-a", "/etc", etc], check=True)
    if os.path.lexists(os.path.join(etc, "resolv.conf")):
        os.rename(os.path.join(etc, "resolv.conf"), os.path.join(etc, "resolv.conf.host"))
    else:
        open(os.path.join(etc, "resolv.conf.host"), "w").close()
    os.symlink("../run/systemd/resolve/stub-resolv.conf", os.path.join(etc, "resolv.conf"))
    d = RunningDaemon(daemon_root, prefix=("unshare", "-m", "--propagation", "private",
                                           "sh", "-c", SETUP, etc)).start()
    yield d
    assert d.stop() == 0, d.read_log()


@pytest.mark.parametrize("network", ["none", {"allow": ["allowed.test"]}, "host"])
def test_sessions_start_and_read_their_resolv_conf_where_it_is_a_symlink(
        resolved_host, network):
    with open("/etc/resolv.conf") as f:  # the host's, which the symlink leads to
        hosts = f.read()
    with resolved_host.client() as c:
        s = c.session_open(resolved_host.workspace, network=network)["session"]
        try:
            out = c.shell_run(s, "cat /etc/resolv.conf")["output"]
            if network == "host":  # the host's resolver, as the host reads it
                assert out == hosts, out
            else:  # the proxy's stub
                assert out.startswith("nameserver 127.0.0.1\n"), out
            # /run is still the hidden, empty one (less the path to the bound file).
            listing = c.shell_run(s, "find /run")["output"].split()
            assert listing == ["/run", "/run/systemd", "/run/systemd/resolve",
                               "/run/systemd/resolve/stub-resolv.conf"], listing
        finally:
            c.session_close(s)
