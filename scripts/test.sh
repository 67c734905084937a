#!/usr/bin/env bash
# The test suite: unit tests and end-to-end tests with real daemons on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# On every core (pytest-xdist), a test module at a time per process, its tests in order as in a plain run; the tests
# that cannot have a neighbour run alone, and modules are handed out in the order tests/parallel.py gives them (those
# with tests that run alone first, then the long-running; xdist would otherwise order them by their number of
# tests). `bash scripts/test.sh -n 0` runs all in one process.
exec .venv/bin/python -m pytest -n auto --dist loadfile --no-loadscope-reorder "$@"
