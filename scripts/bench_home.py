#!/usr/bin/env python3
"""What the guarded home and the host_exec watch cost.

- `home`: sessions of a daemon whose HOME is a realistic one (100 entries, ~/.config and
  ~/.local/share listed entry by entry for the secrets in them), next to the same figures
  with an empty HOME measured in the same run: session.open cold and from the warm spare,
  shell.run('true'), and the mounts a sandbox then has.
- `big-workspace`: a workspace of 50,000 files in 5,000 folders, next to an empty one in
  the same daemon: session.open and its first shell.run (which waits for the walk that
  finds the repositories and watches the folders), shell.run('true') (one poll of the
  watch), and a call that makes a folder (the watch has something to look at).

Run alone (`.venv/bin/python scripts/bench_home.py [home|big-workspace]`) or as sections of
scripts/bench.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench import ms, open_sessions, report, running_daemon, stats, timed  # noqa: E402

from toolsd.client import Client  # noqa: E402

CONFIG_APPS = 30
SHARE_APPS = 20


def realistic_home(path: str) -> None:
    """100 entries as a developer's home has them: 40 dotfiles (histories and credentials
    among them), 40 dot folders (toolchains, caches, secrets), 20 plain folders; ~/.config
    holding 30 applications' folders and ~/.local/share 20."""
    def touch(rel: str, text: str = "x\n") -> None:
        full = os.path.join(path, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)

    files = [".bashrc", ".profile", ".bash_logout", ".vimrc", ".gitconfig", ".tmux.conf",
             ".inputrc", ".wget-hsts", ".selected_editor", ".npmrc", ".bash_history",
             ".python_history", ".lesshst", ".viminfo", ".netrc", ".pypirc", ".zshrc",
             ".editorconfig", ".curlrc", ".Xresources"]
    files += [f".rc{i}" for i in range(40 - len(files))]
    for n in files:
        touch(n)
    folders = [".ssh/id_ed25519", ".aws/credentials", ".pyenv/versions/3.12/bin/python",
               ".rustup/toolchains/stable/bin/rustc", ".nvm/nvm.sh", ".cargo/bin/cargo",
               ".cargo/env", ".cargo/registry/index/x", ".cargo/credentials.toml",
               ".m2/repository/x", ".m2/settings.xml", ".gradle/caches/x",
               ".gradle/gradle.properties", ".terraform.d/plugins/x",
               ".terraform.d/credentials.tfrc.json", ".cache/pip/x", ".npm/_cacache/x",
               ".local/bin/tool", ".local/state/x", ".docker/config.json", ".kube/config",
               ".gnupg/pubring.kbx", ".ipython/profile_default/x", ".jupyter/x",
               ".vscode-server/bin/x", ".mozilla/firefox/x", ".claude/x", ".conda/x",
               ".dotnet/x", ".java/x", ".pki/x", ".sdkman/x", ".bun/bin/bun", ".deno/bin/deno",
               ".volta/bin/volta", ".ghcup/bin/ghc", ".opam/x", ".julia/x", ".R/x"]
    for n in folders:
        touch(n)
    for i in range(30):
        touch(f".config/app{i}/settings")
    touch(".config/gh/hosts.yml")
    touch(".config/git/config")
    for i in range(20):
        touch(f".local/share/app{i}/data")
    touch(".local/share/keyrings/login.keyring")
    for n in ("Desktop", "Documents", "Downloads", "Music", "Pictures", "Videos", "Public",
              "Templates", "snap", "go", "src", "bin", "projects", "work", "notes", "scripts",
              "dotfiles", "tmp", "backup"):
        touch(f"{n}/README")
    i = 0
    while len(os.listdir(path)) < 100:
        touch(f"project{i}/README.md")
        i += 1


def sandbox_mounts(c: Client, workspace: str) -> int:
    s = c.session_open(workspace)["session"]
    try:
        return int(c.shell_run(s, "wc -l < /proc/self/mountinfo")["output"])
    finally:
        c.session_close(s)


def paired_opens(workspace: str, homes: dict[str, str], rounds: int, pause_s: float,
                 *extra: str) -> dict[str, float]:
    """Median session.open of a daemon per home, the daemons taking turns (one open each per
    round), so that both see the same load on a shared machine."""
    with contextlib.ExitStack() as stack:
        clients = {}
        for name, home in homes.items():
            sock, _root, _proc = stack.enter_context(running_daemon(*extra, env={"HOME": home}))
            clients[name] = stack.enter_context(Client(sock))
        times: dict[str, list[float]] = {name: [] for name in homes}
        for _ in range(rounds):
            for name, c in clients.items():
                time.sleep(pause_s)
                t = time.perf_counter()
                s = c.session_open(workspace)["session"]
                times[name].append(time.perf_counter() - t)
                c.shell_run(s, "true")
                c.session_close(s)
        return {name: statistics.median(ts) for name, ts in times.items()}


def bench_home() -> None:
    base = tempfile.mkdtemp(prefix="toolsd-bench-home-", dir="/var/tmp")
    try:
        empty, full, ws = (os.path.join(base, n) for n in ("empty", "full", "ws"))
        for folder in (empty, ws):
            os.makedirs(folder)
        realistic_home(full)
        homes = {"empty": empty, "full": full}
        cold = paired_opens(ws, homes, 15, 0.3, "--no-warm-spare")
        warm = paired_opens(ws, homes, 10, 1.0)
        mounts, runs = {}, {}
        for name, home in homes.items():
            with running_daemon("--no-warm-spare", env={"HOME": home}) as (sock, _root, _proc):
                with Client(sock) as c:
                    mounts[name] = sandbox_mounts(c, ws)
                    s = c.session_open(ws)["session"]
                    runs[name] = stats(timed(lambda: c.shell_run(s, "true"), 200))[0]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for name, figures in (("session.open, cold", cold), ("session.open taking the spare", warm),
                          ("shell.run('true'), median", runs)):
        report(f"{name}, 100-entry home", ms(figures["full"]),
               anchor=f"empty home {ms(figures['empty'])}", ratio=figures["full"] / figures["empty"])
    report("mounts in a session's sandbox, 100-entry home", f"{mounts['full']:8d}",
           anchor=f"empty home {mounts['empty']}")


def big_workspace(path: str, files: int = 50_000, per_folder: int = 10) -> None:
    for i in range(files // per_folder):
        folder = os.path.join(path, f"d{i // 100}", f"e{i % 100}")
        os.makedirs(folder)
        for j in range(per_folder):
            with open(os.path.join(folder, f"f{j}.txt"), "w") as f:
                f.write("x\n")


def bench_big_workspace() -> None:
    n = 200
    base = tempfile.mkdtemp(prefix="toolsd-bench-ws-", dir="/var/tmp")
    try:
        big, small = os.path.join(base, "big"), os.path.join(base, "small")
        os.makedirs(small)
        big_workspace(big)
        with running_daemon("--no-warm-spare") as (sock, _root, _proc):
            with Client(sock) as c:
                opens, firsts = {}, {}
                for name, ws in (("small", small), ("big", big)):
                    opens[name], firsts[name], _ = open_sessions(c, ws, pause_s=0, n=5)
                runs, makes = {}, {}
                for name, ws in (("small", small), ("big", big)):
                    s = c.session_open(ws)["session"]
                    runs[name] = stats(timed(lambda: c.shell_run(s, "true"), n))[0]
                    counter = iter(range(10**9))
                    makes[name] = stats(timed(
                        lambda: c.shell_run(s, f"mkdir new{next(counter)}"), n // 2))[0]
                    c.session_close(s)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report("session.open, cold, 50,000-file workspace", ms(opens["big"]),
           anchor=f"empty workspace {ms(opens['small'])}", ratio=opens["big"] / opens["small"])
    # The first command waits for the workspace's repositories to be found (the walk).
    report("session.open + first shell.run, 50,000-file workspace", ms(firsts["big"]),
           anchor=f"empty workspace {ms(firsts['small'])}",
           ratio=firsts["big"] / firsts["small"])
    report("shell.run('true'), 50,000-file workspace", ms(runs["big"]),
           anchor=f"empty workspace {ms(runs['small'])}", ratio=runs["big"] / runs["small"])
    report("shell.run('mkdir newN'), 50,000-file workspace", ms(makes["big"]),
           anchor=f"empty workspace {ms(makes['small'])}", ratio=makes["big"] / makes["small"])


if __name__ == "__main__":
    for section in sys.argv[1:] or ["home", "big-workspace"]:
        {"home": bench_home, "big-workspace": bench_big_workspace}[section]()
