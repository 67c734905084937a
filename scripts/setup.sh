#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with its test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import crawler, pytest, warcio, prometheus_client, playwright" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test]'
    touch .venv/.installed
fi
# The status page test drives the system's headless Chromium (Debian's package; no browser download).
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
    else
        echo "setup: chromium is missing; as root: apt-get update && apt-get install -y chromium" >&2
    fi
fi
