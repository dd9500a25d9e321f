"""The sandbox policy -> bwrap argv (pure), and one run of that argv with real bwrap."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolsd.sandbox.bwrap.policy import (
    Folder,
    Limits,
    Policy,
    bwrap_argv,
    guarding_mounts,
    sandbox_env,
    validate_env,
)

WS = "/home/u/proj"
SCRATCH = "/var/lib/toolsd/scratch/s1"

# Arity of every bwrap option the module may emit; parsing with it turns the flat argv back
# into operations, so a value that looks like a flag can never be mistaken for one.
ARITY = {"--ro-bind": 2, "--bind": 2, "--dev": 1, "--proc": 1, "--tmpfs": 1, "--setenv": 2,
         "--chdir": 1, "--cap-drop": 1, "--clearenv": 0, "--unshare-user": 0,
         "--unshare-pid": 0, "--unshare-ipc": 0, "--unshare-uts": 0,
         "--unshare-cgroup-try": 0, "--unshare-net": 0, "--as-pid-1": 0,
         "--die-with-parent": 0, "--new-session": 0, "--dir": 1, "--symlink": 2,
         "--ro-bind-try": 2, "--remount-ro": 1, "--overlay-src": 1, "--tmp-overlay": 1}
MOUNTS = {"--ro-bind", "--bind", "--dev", "--proc", "--tmpfs", "--ro-bind-try", "--remount-ro",
          "--overlay-src", "--tmp-overlay"}


def ops(argv: list[str]) -> list[tuple[str, ...]]:
    assert argv[-1] == "--", "the prefix must end with -- so the launcher argv is never parsed"
    out, i = [], 1
    while argv[i] != "--":
        flag = argv[i]
        assert flag in ARITY, f"unexpected bwrap option {flag!r}"
        n = ARITY[flag]
        out.append((flag, *argv[i + 1:i + 1 + n]))
        i += 1 + n
    assert i == len(argv) - 1
    return out


def mounts(argv: list[str]) -> list[tuple[str, ...]]:
    return [op for op in ops(argv) if op[0] in MOUNTS]


def policy(**kw) -> Policy:
    kw.setdefault("workspace", WS)
    kw.setdefault("scratch", SCRATCH)
    return Policy(**kw)


# ------------------------------------------------------------------ argv shape and order


def test_mounts_in_order_root_scratch_dev_proc_workspace_protected_then_hiding():
    p = policy(protected=(f"{WS}/.git/hooks", f"{WS}/.git/config"),
               hidden_dirs=("/home/u/.ssh", f"{WS}/.aws"),
               hidden_files=("/home/u/.netrc",), pinned=(f"{WS}/.git",))
    assert mounts(bwrap_argv(p)) == [
        ("--ro-bind", "/", "/"),
        ("--bind", SCRATCH, "/tmp"),
        ("--dev", "/dev"),
        ("--proc", "/proc"),
        ("--ro-bind", "/proc/sys", "/proc/sys"),
        ("--bind", WS, WS),
        ("--bind", f"{WS}/.git", f"{WS}/.git"),
        ("--ro-bind", f"{WS}/.git/hooks", f"{WS}/.git/hooks"),
        ("--ro-bind", f"{WS}/.git/config", f"{WS}/.git/config"),
        ("--tmpfs", "/home/u/.ssh"),
        ("--tmpfs", f"{WS}/.aws"),
        ("--ro-bind", "/dev/null", "/home/u/.netrc"),
    ]


def test_scratch_is_bound_before_a_workspace_under_tmp():
    ws = "/tmp/pytest-1/ws"
    m = mounts(bwrap_argv(policy(workspace=ws)))
    assert m.index(("--bind", SCRATCH, "/tmp")) < m.index(("--bind", ws, ws))


def test_argv_starts_with_the_given_bwrap_as_is_without_looking_it_up():
    # A name that exists nowhere: resolving it (plumbum's local[...]) would raise.
    argv = bwrap_argv(policy(), bwrap="bwrap-not-installed-anywhere")
    assert argv[0] == "bwrap-not-installed-anywhere"
    assert bwrap_argv(policy(), bwrap="/usr/bin/bwrap")[0] == "/usr/bin/bwrap"


def test_namespaces_session_and_caps_flags_present_and_no_seccomp():
    o = ops(bwrap_argv(policy()))
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup-try", "--as-pid-1", "--die-with-parent", "--new-session"):
        assert (flag,) in o
    assert ("--cap-drop", "ALL") in o
    assert ("--chdir", WS) in o
    assert not any("seccomp" in a for a in bwrap_argv(policy()))


def test_readonly_workspace_is_ro_bound_and_protected_paths_become_redundant():
    p = policy(writable=False, protected=(f"{WS}/.git/hooks",))
    m = mounts(bwrap_argv(p))
    assert ("--ro-bind", WS, WS) in m
    assert ("--bind", WS, WS) not in m
    assert not any(op[1] == f"{WS}/.git/hooks" for op in m)


def test_writable_workspace_is_bound_read_write():
    m = mounts(bwrap_argv(policy()))
    assert ("--bind", WS, WS) in m and ("--ro-bind", WS, WS) not in m


def test_network_none_unshares_net_and_host_does_not():
    assert ("--unshare-net",) in ops(bwrap_argv(policy(network="none")))
    assert ("--unshare-net",) not in ops(bwrap_argv(policy(network="host")))
    with pytest.raises(ValueError, match="network"):
        policy(network="bridge")


def test_env_is_cleared_then_set_exactly():
    env = {"PATH": "/usr/bin", "WEIRD": "a b\nc=d", "EMPTY": ""}
    o = ops(bwrap_argv(policy(env=env)))
    clear = o.index(("--clearenv",))
    sets = [(i, op) for i, op in enumerate(o) if op[0] == "--setenv"]
    assert all(i > clear for i, _ in sets)
    assert [op[1:] for _, op in sets] == list(env.items())


def test_paths_with_spaces_and_newlines_stay_single_arguments():
    ws = "/home/u/my proj\nline two"
    hidden = "/home/u/my proj\nline two/.ssh dir"
    m = mounts(bwrap_argv(policy(workspace=ws, scratch="/s/with space", hidden_dirs=(hidden,))))
    assert ("--bind", ws, ws) in m
    assert ("--bind", "/s/with space", "/tmp") in m
    assert ("--tmpfs", hidden) in m


@given(name=st.text(st.characters(blacklist_characters="\0/"), min_size=1).filter(
    lambda s: s not in (".", "..")))
def test_any_folder_name_round_trips_through_the_argv(name):
    ws = f"/home/u/{name}"
    o = ops(bwrap_argv(policy(workspace=ws, env={"K": name})))
    assert ("--bind", ws, ws) in o and ("--chdir", ws) in o and ("--setenv", "K", name) in o


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("ws", ["/", "//", "/proc", "/proc/1/root", "/dev", "/dev/shm/x"])
def test_workspace_that_would_expose_the_host_is_refused(ws):
    with pytest.raises(ValueError, match="workspace"):
        policy(workspace=ws)


@pytest.mark.parametrize("field,value,says", [
    ("workspace", "relative/ws", "workspace must be an absolute path"),
    ("scratch", "scratch", "scratch must be an absolute path"),
    ("scratch", "/", "scratch folder cannot be /"),
    ("hidden_dirs", ("/",), "/ cannot be hidden"),
    ("hidden_dirs", ("rel",), "hidden_dirs entry must be an absolute path"),
    ("hidden_files", ("/a\0b",), "NUL"),
    ("hidden_dirs", "/home/u/.ssh", "hidden_dirs must be a list of paths"),
    ("protected", ("/etc/passwd",), "not inside the workspace"),
    ("extra_ro_binds", ("opt",), "extra_ro_binds entry must be an absolute path"),
])
def test_bad_paths_are_refused_saying_what_is_wrong(field, value, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        policy(**{field: value})


def test_hidden_path_equal_to_the_workspace_is_refused():
    with pytest.raises(ValueError, match="hidden"):
        policy(hidden_dirs=(WS + "/",))


def test_extra_bind_inside_a_hidden_dir_is_refused():
    with pytest.raises(ValueError, match="hidden folder /opt/secret"):
        policy(hidden_dirs=("/opt/secret",), extra_ro_binds=("/opt/secret/driver",))


# ------------------------------------------------------------------ overlaps and duplicates


def test_hidden_dir_containing_the_workspace_is_mounted_first_and_workspace_on_top():
    ws = "/home/u/.docker/proj"
    p = policy(workspace=ws, hidden_dirs=("/home/u/.docker", f"{ws}/.ssh", "/home/u/.docker/x"),
               hidden_files=(f"{ws}/.netrc", "/home/u/.docker/config.json"))
    m = mounts(bwrap_argv(p))
    assert m.index(("--tmpfs", "/home/u/.docker")) < m.index(("--bind", ws, ws))
    # Inside the re-bound workspace a hidden path needs its own mount, after the workspace;
    # elsewhere in the hidden dir the outer tmpfs covers it already.
    assert m.index(("--bind", ws, ws)) < m.index(("--tmpfs", f"{ws}/.ssh"))
    assert ("--ro-bind", "/dev/null", f"{ws}/.netrc") in m
    assert not any(op[-1] in ("/home/u/.docker/x", "/home/u/.docker/config.json") for op in m)


def test_nested_hidden_dirs_outermost_first():
    ws = "/srv/a/b/c/ws"
    m = mounts(bwrap_argv(policy(workspace=ws, hidden_dirs=("/srv/a/b", "/srv/a"))))
    tmpfs = [op[1] for op in m if op[0] == "--tmpfs"]
    assert tmpfs == ["/srv/a"]  # /srv/a/b is under the /srv/a tmpfs already


def test_duplicates_and_covered_entries_are_dropped():
    p = policy(hidden_dirs=("/home/u/.ssh", "/home/u/.ssh/", "/home/u//.ssh", "/home/u/.ssh/keys"),
               hidden_files=("/home/u/.netrc", "/home/u/.netrc", "/home/u/.ssh/id_rsa"),
               protected=(f"{WS}/.git/hooks", f"{WS}/.git/hooks/"),
               extra_ro_binds=("/opt/d", "/opt/d", f"{WS}/vendored"))
    m = mounts(bwrap_argv(p))
    assert m.count(("--tmpfs", "/home/u/.ssh")) == 1
    assert not any(op[-1].startswith("/home/u/.ssh/") for op in m)
    assert m.count(("--ro-bind", "/dev/null", "/home/u/.netrc")) == 1
    assert m.count(("--ro-bind", f"{WS}/.git/hooks", f"{WS}/.git/hooks")) == 1
    assert m.count(("--ro-bind", "/opt/d", "/opt/d")) == 1
    # inside the workspace an extra bind adds nothing the workspace bind does not show
    assert not any(op[-1] == f"{WS}/vendored" for op in m)


def test_hidden_paths_under_host_tmp_are_skipped_unless_the_workspace_shows_them():
    # The sandbox's /tmp is the scratch, so the host's /tmp/toolsd-0 is out of sight anyway.
    ws = "/tmp/pytest-1/ws"
    p = policy(workspace=ws, hidden_dirs=("/tmp/toolsd-0", f"{ws}/.ssh"),
               hidden_files=("/tmp/x/.netrc", f"{ws}/.netrc"))
    m = mounts(bwrap_argv(p))
    assert not any(op[-1].startswith(("/tmp/toolsd-0", "/tmp/x")) for op in m)
    assert ("--tmpfs", f"{ws}/.ssh") in m
    assert ("--ro-bind", "/dev/null", f"{ws}/.netrc") in m


def test_extra_ro_binds_come_before_the_workspace_and_hiding_inside_them_applies():
    p = policy(extra_ro_binds=("/tmp/venv",), hidden_dirs=("/tmp/venv/secrets",))
    m = mounts(bwrap_argv(p))
    assert m.index(("--bind", SCRATCH, "/tmp")) < m.index(("--ro-bind", "/tmp/venv", "/tmp/venv"))
    assert m.index(("--ro-bind", "/tmp/venv", "/tmp/venv")) < m.index(("--bind", WS, WS))
    assert m[-1] == ("--tmpfs", "/tmp/venv/secrets")


# ------------------------------------------------------------------ folders shown entry by entry

HOME_SCRATCH = "/var/lib/toolsd/scratch/s1-home"


def test_the_session_home_is_its_scratch_with_entries_bound_back_before_the_workspace():
    home = Folder(path="/home/u", writable=True, dirs=("/home/u/.config",),
                  binds=("/home/u/.bashrc", "/home/u/.config/pip", "/home/u/proj"),
                  symlinks=(("dotfiles/vimrc", "/home/u/.vimrc"),))
    o = ops(bwrap_argv(policy(folders=(home,), home=HOME_SCRATCH)))
    start = o.index(("--bind", HOME_SCRATCH, "/home/u"))
    assert o[start:start + 6] == [
        ("--bind", HOME_SCRATCH, "/home/u"),
        ("--dir", "/home/u/.config"),
        ("--symlink", "dotfiles/vimrc", "/home/u/.vimrc"),
        ("--ro-bind-try", "/home/u/.bashrc", "/home/u/.bashrc"),
        ("--ro-bind-try", "/home/u/.config/pip", "/home/u/.config/pip"),
        ("--ro-bind-try", "/home/u/proj", "/home/u/proj"),
    ]
    assert o[start + 6] == ("--bind", WS, WS)  # the workspace (~/proj) on top, writable
    assert ("--remount-ro", "/home/u") not in o  # the session's own: writable


def test_folders_of_the_session_home_can_be_overlays_and_nothing_else_can():
    home = Folder(path="/home/u", writable=True, binds=("/home/u/.bashrc", "/home/u/src"),
                  overlays=("/home/u/src",))
    o = ops(bwrap_argv(policy(folders=(home,), home=HOME_SCRATCH)))
    start = o.index(("--bind", HOME_SCRATCH, "/home/u"))
    assert o[start + 1:start + 4] == [
        ("--ro-bind-try", "/home/u/.bashrc", "/home/u/.bashrc"),
        ("--overlay-src", "/home/u/src"), ("--tmp-overlay", "/home/u/src")]
    with pytest.raises(ValueError, match="only the session's home"):
        policy(folders=(Folder(path="/root", binds=("/root/src",), overlays=("/root/src",)),))
    with pytest.raises(ValueError, match="overlays must be bound entries"):
        policy(folders=(Folder(path="/home/u", writable=True, overlays=("/home/u/x",)),),
               home=HOME_SCRATCH)


def test_other_homes_are_a_tmpfs_filled_then_read_only():
    root = Folder(path="/root", binds=("/root/.profile",))
    o = ops(bwrap_argv(policy(folders=(root,))))
    start = o.index(("--tmpfs", "/root"))
    assert o[start:start + 3] == [("--tmpfs", "/root"),
                                  ("--ro-bind-try", "/root/.profile", "/root/.profile"),
                                  ("--remount-ro", "/root")]


def test_a_workspace_in_a_read_only_folder_gets_its_mount_point_made_before_remount():
    ws = "/root/.docker/proj"  # under a hidden entry of /root: nothing bound there
    root = Folder(path="/root", dirs=("/root/.config",), binds=("/root/.profile",))
    o = ops(bwrap_argv(policy(workspace=ws, folders=(root,))))
    made = [op[1] for op in o[:o.index(("--remount-ro", "/root"))] if op[0] == "--dir"]
    assert made == ["/root/.config", "/root/.docker", ws]
    assert o.index(("--remount-ro", "/root")) < o.index(("--bind", ws, ws))
    # Under a bound entry the host's folder is the mount point: nothing to make.
    o = ops(bwrap_argv(policy(workspace="/root/src/proj",
                              folders=(Folder(path="/root", binds=("/root/src",)),))))
    assert not any(op[0] == "--dir" for op in o)


def test_folders_outermost_first_and_one_in_a_hidden_entry_of_another_is_dropped():
    outer = Folder(path="/home", binds=("/home/bob",))
    inner = Folder(path="/home/bob", binds=("/home/bob/.profile",))
    hidden = Folder(path="/home/eve", binds=("/home/eve/.profile",))  # not bound in /home
    o = ops(bwrap_argv(policy(folders=(inner, hidden, outer))))
    assert o.index(("--tmpfs", "/home")) < o.index(("--remount-ro", "/home")) < o.index(
        ("--tmpfs", "/home/bob"))
    assert not any(op[-1].startswith("/home/eve") for op in o)


def test_a_folder_in_a_hidden_dir_is_dropped_and_hidden_paths_it_does_not_show_too():
    root = Folder(path="/root", binds=("/root/.pyenv",))
    p = policy(folders=(root, Folder(path="/srv/secret/x")), hidden_dirs=(
        "/srv/secret", "/root/.aws", "/root/.pyenv/keys", f"{WS}/.aws"))
    m = mounts(bwrap_argv(p))
    assert not any(op[-1].startswith("/srv/secret/") for op in m)
    assert ("--tmpfs", "/root/.aws") not in m  # not shown by /root: there is nothing to hide
    assert ("--tmpfs", "/root/.pyenv/keys") in m  # inside a bound entry: hidden on top
    assert ("--tmpfs", f"{WS}/.aws") in m


def test_guarding_mounts_include_the_folders_but_not_their_entries():
    home = Folder(path="/home/u", writable=True, binds=("/home/u/.bashrc",))
    p = policy(folders=(home, Folder(path="/root", binds=("/root/.profile",))),
               home=HOME_SCRATCH)
    assert {"/home/u", "/root", WS} <= set(guarding_mounts(p))
    assert "/home/u/.bashrc" not in guarding_mounts(p)  # its loss uncovers only the scratch


@pytest.mark.parametrize("kw,says", [
    (dict(folders=(Folder(path="/home/u", writable=True),)), "needs Policy.home"),
    (dict(folders=(Folder(path="/a", writable=True), Folder(path="/b", writable=True)),
          home=HOME_SCRATCH), "only one folder"),
    (dict(folders=(Folder(path=f"{WS}/sub"),)), "inside the workspace"),
    (dict(folders=(Folder(path="/"),)), "/ cannot be shown"),
    (dict(folders=(Folder(path="/proc/x"),)), "/proc"),
    (dict(folders=(Folder(path="/root", binds=("/etc/passwd",)),)), "not inside it"),
    (dict(folders=(Folder(path="/root"), Folder(path="/root/"))), "listed twice"),
    (dict(folders=(Folder(path="/opt"),), extra_ro_binds=("/opt/toolsd",)), "lists"),
])
def test_folders_that_cannot_be_shown_are_refused(kw, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        policy(**kw)


# ------------------------------------------------------------------ env, limits, credentials


def test_sandbox_env_has_fixed_values_and_session_env_on_top():
    env = sandbox_env(home="/home/u", path="/usr/bin:/bin", lang="C.UTF-8",
                      extra={"TERM": "xterm", "FOO": "bar"})
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "LANG": "C.UTF-8",
                   "TERM": "xterm", "NO_COLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat",
                   "PYTHONUNBUFFERED": "1", "TMPDIR": "/tmp", "FOO": "bar",
                   "NPM_CONFIG_UPDATE_NOTIFIER": "false"}
    own = sandbox_env(home="/h", path="/bin", lang="C", extra={}, own_home=True)
    assert own["GIT_CONFIG_GLOBAL"] == "/h/.gitconfig.toolsd"
    assert own["NPM_CONFIG_PREFIX"] == "/h/.npm/global" and own["PATH"] == "/h/.npm/global/bin:/bin"
    with pytest.raises(ValueError, match="'A=B'"):
        sandbox_env(home="/h", path="/bin", lang="C", extra={"A=B": "x"})


@pytest.mark.parametrize("env,bad", [
    ({"A=B": "x"}, "'A=B'"), ({"": "x"}, "''"), ({"A\0": "x"}, "A"), ({1: "x"}, "1"),
    ({"K": 5}, "'K'"), ({"K": "a\0b"}, "'K'"), ({"K": None}, "'K'"),
])
def test_validate_env_names_the_bad_key(env, bad):
    with pytest.raises(ValueError) as info:
        validate_env(env)
    assert bad in str(info.value)


def test_validate_env_refuses_non_maps_and_copies_good_ones():
    for bad in (["A=B"], "A=B", None):
        with pytest.raises(ValueError, match="map"):
            validate_env(bad)
    src = {"A": "1", "B": "x y"}
    out = validate_env(src)
    assert out == src and out is not src
    with pytest.raises(ValueError, match="'A=B'"):
        policy(env={"A=B": "x"})


def test_limits_as_rlimits():
    assert Limits(memory_mb=100, pids=7, cpu_s=9, file_mb=2, nofile=64).rlimits() == {
        "RLIMIT_AS": (100 * 2**20, 100 * 2**20),
        "RLIMIT_NPROC": (7, 7),
        "RLIMIT_CPU": (9, 9),
        "RLIMIT_FSIZE": (2 * 2**20, 2 * 2**20),
        "RLIMIT_NOFILE": (64, 64),
        "RLIMIT_CORE": (0, 0),
    }
    assert Limits().rlimits()["RLIMIT_AS"] == (4096 * 2**20,) * 2
    # A session whose memory a cgroup limits has no address-space limit, the rest unchanged.
    without = Limits(memory_mb=100).rlimits(address_space=False)
    assert "RLIMIT_AS" not in without
    assert without == {k: v for k, v in Limits(memory_mb=100).rlimits().items()
                       if k != "RLIMIT_AS"}


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10", None])
def test_limits_refuse_non_positive_or_non_integers(bad):
    with pytest.raises(ValueError, match="pids"):
        Limits(pids=bad)


# ------------------------------------------------------------------ the argv, run for real


def _run_inside(p: Policy, script: str) -> dict[str, str]:
    argv = bwrap_argv(p, bwrap=shutil.which("bwrap")) + ["bash", "-c", script]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL,
                          env={**os.environ, "TOOLSD_TEST_LEAK": "from-the-host"})
    assert proc.returncode == 0, f"bwrap failed: {proc.stderr}"
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


# probe NAME CODE: prints NAME=ok, or NAME=<the error's last part, e.g. Read-only file system>
PROBE = r"""probe() { local err; if err=$(eval "$2" 2>&1 >/dev/null); then echo "$1=ok";
  else echo "$1=${err##*: }"; fi; }
"""


@pytest.mark.skipif(shutil.which("bwrap") is None,
                    reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
def test_the_argv_sandboxes_a_real_bash(tmp_path):
    tag = uuid.uuid4().hex[:12]
    ws = tmp_path / "work space\nsecond line"  # under /tmp: also checks scratch-then-workspace
    home = ws / "home"  # a session opened on a home folder: credentials inside the workspace
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("SECRET KEY")
    (home / ".netrc").write_text("machine x password SECRET")
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (ws / ".git" / "config").write_text("[core]\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sleeper = f"98765.{int(tag, 16) % 10**6}"
    base = dict(workspace=str(ws), scratch=str(scratch),
                hidden_dirs=(str(home / ".ssh"),), hidden_files=(str(home / ".netrc"),),
                protected=(str(ws / ".git" / "hooks"), str(ws / ".git" / "config")),
                env=sandbox_env(home=str(home), path="/usr/bin:/bin", lang="C.UTF-8",
                                extra={"SESSION_VAR": "mine"}))

    out = _run_inside(Policy(**base), PROBE + f"""
probe ws_write 'echo made > made-inside'
probe etc_write 'echo x > /etc/toolsd-probe-{tag}'
probe opt_write 'mkdir /opt/toolsd-probe-{tag}'
probe hooks_write 'echo evil > .git/hooks/pre-commit'
probe config_write 'echo evil >> .git/config'
probe git_write 'echo ref > .git/HEAD'
probe tmp_write 'echo t > /tmp/in-scratch'
probe host_pid 'kill -0 {os.getpid()}'
echo "ssh=$(ls -A home/.ssh | tr '\\n' ,)"
echo "netrc=$(cat home/.netrc)"
echo "leak=${{TOOLSD_TEST_LEAK-unset}} session=$SESSION_VAR term=$TERM"
echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ,)"
setsid sleep {sleeper} >/dev/null 2>&1 &
""")
    assert out["ws_write"] == "ok" and (ws / "made-inside").read_text() == "made\n"
    assert out["etc_write"] == "Read-only file system"
    assert out["opt_write"] == "Read-only file system"
    assert not os.path.exists(f"/etc/toolsd-probe-{tag}")
    assert not os.path.exists(f"/opt/toolsd-probe-{tag}")
    assert out["hooks_write"] == out["config_write"] == "Read-only file system"
    assert (ws / ".git" / "hooks" / "pre-commit").read_text() == "#!/bin/sh\n"
    assert out["git_write"] == "ok"  # only hooks and config are protected
    assert out["tmp_write"] == "ok" and (scratch / "in-scratch").read_text() == "t\n"
    assert out["host_pid"].endswith("No such process")  # bash says "(PID) - No such process"
    assert out["ssh"] == "" and out["netrc"] == ""
    assert (home / ".ssh" / "id_rsa").read_text() == "SECRET KEY"  # hidden, not touched
    assert out["leak"] == "unset session=mine term=dumb"
    assert out["ifaces"] == "lo,"
    # Ending the sandbox's pid namespace took the setsid'd child along.
    left = [p for p in psutil.process_iter(["cmdline"]) if sleeper in (p.info["cmdline"] or [])]
    assert left == []

    out = _run_inside(Policy(**{**base, "writable": False}), PROBE + """
probe ws_write 'echo made > made-while-readonly'
probe tmp_write 'echo t > /tmp/still-writable'
""")
    assert out == {"ws_write": "Read-only file system", "tmp_write": "ok"}
    assert not (ws / "made-while-readonly").exists()

    # A workspace inside a hidden dir: the workspace is usable, its siblings stay hidden.
    # The extra bind brings this part of the host's /tmp back into view to test it.
    shelf = tmp_path / "shelf"
    (shelf / ".docker" / "proj").mkdir(parents=True)
    (shelf / ".docker" / "config.json").write_text("SECRET")
    (shelf / "notes.txt").write_text("visible")
    proj = shelf / ".docker" / "proj"
    out = _run_inside(Policy(workspace=str(proj), scratch=str(scratch),
                             hidden_dirs=(str(shelf / ".docker"),),
                             extra_ro_binds=(str(shelf),)), PROBE + """
probe ws_write 'echo made > made-in-proj'
probe shelf_write 'echo x >> ../../notes.txt'
echo "siblings=$(ls -A .. | tr '\\n' ,)"
echo "notes=$(cat ../../notes.txt)"
""")
    assert out == {"ws_write": "ok", "shelf_write": "Read-only file system",
                   "siblings": "proj,", "notes": "visible"}
    assert (proj / "made-in-proj").read_text() == "made\n"
    assert (shelf / ".docker" / "config.json").read_text() == "SECRET"
