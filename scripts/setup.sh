# Shared by scripts/run and scripts/test: make .venv, install the package, install bubblewrap.
# Quick when already done: each step checks before it acts.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing bubblewrap with apt-get" >&2
        apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
    else
        echo "setup: bubblewrap is missing; install it (sudo apt-get install bubblewrap)." \
             "Until then sessions run unsandboxed (sandbox: none)." >&2
    fi
fi

py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    "$py" -m venv .venv
fi
stamp=.venv/.toolsd-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup: installing toolsd, the MCP SDK, Ray and the test tools into .venv" >&2
    .venv/bin/pip install -q --disable-pip-version-check -e ".[test,mcp,cluster]"
    touch "$stamp"
fi

# The REPL driver's parts are imported inside the sandbox, where nothing can write their
# bytecode: compile them here (quick when up to date) with the python3 sessions run.
if command -v python3 >/dev/null 2>&1; then
    python3 -m compileall -q driver >/dev/null 2>&1 || true
fi
