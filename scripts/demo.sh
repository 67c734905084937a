#!/usr/bin/env bash
# The demo: builds a local music site, serves it on loopback, crawls it with a master and two workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
