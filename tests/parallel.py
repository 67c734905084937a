"""Tests side by side (pytest-xdist: scripts/test.sh runs the suite with `-n auto`), and the few that must run alone.

Most tests share nothing but the machine: each has its own tmp_path, its daemons and sites listen on ports the
kernel gives (port 0), and each xdist worker process starts its own throwaway PostgreSQL cluster (tests/conftest.py).
A few cannot have a neighbour: they hold machine-wide names (network namespaces), or they measure wall-clock
behaviour (request spacing and rates, event-loop lag, deadlines with little slack) that another test's daemons on
the same cores would distort. Those run alone: while one runs, no other test does, and it starts once the tests
already running end. They are listed in ALONE below (a module or a test, with the reason), or marked
`@pytest.mark.alone`.

Hypothesis's per-example deadline (200 ms by default) is off for the whole suite: it times each example in wall-clock
time, which a neighbour's load stretches, and the property tests check results, not speed.

The exclusion is a readers-writer lock across the worker processes: flock(2) on a file in the run's shared
temporary directory, taken shared by every test and exclusively by a test that runs alone, with a turnstile in
front so that such a test goes ahead of the tests that arrive after it. The lock is taken around the whole test
protocol, outside pytest-timeout's timer: waiting for a neighbour does not count against a test's timeout. Without
xdist nothing is locked.

A process keeps the machine from one test that runs alone to the next when that one runs alone too (a module of
them, or the next module's first test): released in between, every such test would first wait for whatever test
the other process took up in the gap, that test running with the other core idle, once per test.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# a module, or a test (with all its parameters) -> why it cannot have a neighbour
ALONE = {
    "tests/test_e2e_failures.py": "network namespaces of fixed names (acn-*); request spacing, heartbeat deadlines",
    "tests/test_e2e_politeness.py": "achieved request rates, spacing and backoff waits against the allowed ones",
    "tests/test_e2e_sites.py": "a site's request spacing and concurrency against its own politeness",
    "tests/test_master_commit_thread.py": "the master's worst event-loop lag, bounded in wall-clock time",
    "tests/test_e2e_downloads.py::test_more_workers_finish_a_politeness_bound_crawl_sooner_when_downloads_dominate":
        "compares the wall-clock time of two crawls",
    "tests/test_e2e_observe.py::test_progress_lines_appear_on_schedule_in_a_slow_crawl":
        "progress lines once a second, give or take 0.3 s",
    "tests/test_e2e_peer_attacks.py::test_many_idle_unauthenticated_connections":
        "refused connections told apart from held ones by when they close (0.5 s of slack)",
    "tests/test_e2e_limits.py::test_max_duration_counts_from_the_first_start_over_a_restart":
        "a 2 s crawl, three daemons' starts included, must end within 8 s",
}


def runs_alone(item: pytest.Item) -> bool:
    if item.get_closest_marker("alone") is not None:
        return True
    return any(item.nodeid == key or item.nodeid.startswith((key + "::", key + "[")) for key in ALONE)


_files: dict[Path, int] = {}


def _fd(path: Path) -> int:
    if path not in _files:
        _files[path] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    return _files[path]


@contextlib.contextmanager
def _flock(path: Path, how: int) -> Iterator[None]:
    fd = _fd(path)
    fcntl.flock(fd, how)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine_share(shared_dir: Path, alone: bool) -> Iterator[None]:
    """Hold the machine for one test: shared with the other workers' tests, or (alone) to itself."""
    turnstile, room = shared_dir / "alone.turnstile", shared_dir / "alone.lock"
    if alone:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(room, fcntl.LOCK_EX):
            yield
    else:
        with _flock(turnstile, fcntl.LOCK_EX):
            pass                                  # wait behind a test that is waiting to run alone
        with _flock(room, fcntl.LOCK_SH):
            yield


# The machine this process holds to itself from one test that runs alone to the next (machine_share's exclusive
# hold, still open), or None.
_kept: contextlib.ExitStack | None = None


def _release() -> None:
    global _kept
    if _kept is not None:
        kept, _kept = _kept, None
        kept.close()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    global _kept
    basetemp = item.config.option.basetemp
    if os.environ.get("PYTEST_XDIST_WORKER") is None or not basetemp:
        yield
        return
    # xdist gives each worker <the run's basetemp>/<worker id>: the parent is the run's, shared by its workers.
    shared_dir = Path(basetemp).resolve().parent
    if not runs_alone(item):
        _release()
        with machine_share(shared_dir, False):
            yield
        return
    if _kept is None:
        stack = contextlib.ExitStack()
        stack.enter_context(machine_share(shared_dir, True))
        _kept = stack
    try:
        yield
    finally:
        if nextitem is None or not runs_alone(nextitem):
            _release()


# Modules that start real daemons, browsers or mypy take from seconds to minutes each; the rest take well under a
# second a test. xdist hands modules out in collection order (--dist loadfile --no-loadscope-reorder, as
# scripts/test.sh runs it), so these go first: the long ones then overlap each other and the short ones fill the
# gaps at the end, instead of one long module starting last and running alone while the other processes idle.
# Ahead of them all, the modules with tests that run alone (those of nothing else first): at the start the other
# processes are on such modules too, so a test that runs alone mostly waits for another that does, with no core
# idle behind it; later, each would first wait out the neighbour's test in progress, a core idle meanwhile.
LONG_RUNNING = ("test_e2e_", "test_browser", "test_types", "test_install")


def _long_running(item: pytest.Item) -> bool:
    return item.path.name.startswith(LONG_RUNNING)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    alone: dict[Path, list[bool]] = {}
    for item in items:
        alone.setdefault(item.path, []).append(runs_alone(item))

    def rank(item: pytest.Item) -> int:
        mine = alone[item.path]
        if all(mine):
            return 0
        if any(mine):
            return 1
        return 2 if _long_running(item) else 3

    items.sort(key=rank)   # stable: each module's tests keep their order
