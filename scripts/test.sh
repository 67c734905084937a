#!/usr/bin/env bash
# The test suite: unit tests and end-to-end tests with real daemons on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
