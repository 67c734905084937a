"""Fixtures shared by the store tests and the end-to-end tests: a throwaway PostgreSQL cluster for the session,
and a fresh database in it per test, so every store test and durability test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

# The hooks: long-running modules first; who may run beside whom.
from tests.parallel import pytest_collection_modifyitems, pytest_runtest_protocol  # noqa: F401
from testkit import cluster as daemons
from testkit.pgcluster import PgCluster

_names = itertools.count(1)


@pytest.fixture(autouse=True)
def _root_log_level() -> Iterator[None]:
    """A CLI run in-process sets the root logger's level (a command quiets it to ERROR); put it back, or every later
    test's caplog would miss the warnings it looks for, depending on which tests ran before it."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test() -> Iterator[None]:
    """A test that fails before it stops its master and workers leaves them running: they are killed here."""
    yield
    daemons.kill_leftovers()


@pytest.fixture(scope="session")
def pg() -> Iterator[PgCluster]:
    cluster = PgCluster.start()
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def pg_dsn(pg: PgCluster) -> str:
    """An empty database of its own for this test."""
    return pg.create_database(f"t{next(_names)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request, tmp_path: Path) -> Path | str:
    """Where a master store lives: an SQLite file, or an empty PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "m.db"
    return request.getfixturevalue("pg_dsn")


@pytest.fixture(params=["sqlite", "postgresql"])
def master_store(request) -> dict:
    """master_config overrides that put the master's store on SQLite (none) or in a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return {}
    return {"store": request.getfixturevalue("pg_dsn")}


@pytest.fixture
def fake_clock():
    """A monotonic clock that moves only when the test says (tests/fakes/clock.py): deadlines without sleeping."""
    from tests.fakes.clock import FakeClock
    return FakeClock()


@pytest.fixture
def until():
    """Poll for a condition nothing signals, with a deadline (tests/fakes/clock.py): ``await until(pred, 5, what)``."""
    from tests.fakes.clock import until
    return until
