"""Tests side by side (tests/parallel.py): a test that runs alone has no neighbour, the others do run in parallel,
and every test the ALONE table names still exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel import ALONE

ROOT = Path(__file__).resolve().parent.parent

# Each sample test writes when it started and ended (its "spell") into $SPELLS/<name>.
SPELL = '''
import os, time
from pathlib import Path
import pytest

def _spell(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    Path(os.environ["SPELLS"], name).write_text(f"{start} {time.monotonic()}")
'''

SUITE = SPELL + '''
@pytest.mark.alone
def test_alone():
    _spell("alone", 0.6)

@pytest.mark.parametrize("n", range(8))
def test_beside(n):
    _spell(f"beside-{n}", 0.3)
'''


def _spells(tmp_path: Path, modules: dict[str, str], *args: str) -> dict[str, tuple[float, ...]]:
    """Run these sample modules in a pytest of their own on two xdist processes with tests/parallel.py as its
    plugin; each test's (start, end) by its spell's name."""
    pytest.importorskip("xdist")
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in modules.items():
        (suite / name).write_text(text)
    (suite / "pytest.ini").write_text("[pytest]\nmarkers = alone: runs alone\n")
    spells = tmp_path / "spells"
    spells.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}   # this run's own workers
    env.update(SPELLS=str(spells), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", *args, "-p", "tests.parallel", "-p",
                           "no:cacheprovider", "--basetemp", str(tmp_path / "tmp"), *modules],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return {f.name: tuple(map(float, f.read_text().split())) for f in spells.iterdir()}


def test_a_test_marked_alone_has_no_neighbour_and_the_rest_run_side_by_side(tmp_path: Path) -> None:
    span = _spells(tmp_path, {"test_suite.py": SUITE})
    assert len(span) == 9, sorted(span)
    a0, a1 = span.pop("alone")
    assert all(end <= a0 or start >= a1 for start, end in span.values()), (a0, a1, span)
    beside = sorted(span.values())
    assert any(b[0] < a[1] for a, b in zip(beside, beside[1:])), "no two tests ran side by side"


ALONE_TWICE = SPELL + '''
@pytest.mark.alone
def test_alone_first():
    _spell("alone-1", 0.4)

@pytest.mark.alone
def test_alone_then():
    _spell("alone-2", 0.4)
'''

BESIDE = SPELL + '''
@pytest.mark.parametrize("n", range(12))
def test_beside(n):
    _spell(f"beside-{n}", 0.1)
'''


def test_tests_that_run_alone_one_after_another_keep_the_machine_in_between(tmp_path: Path) -> None:
    """Two tests that run alone, one after the other in a process: the other process's tests wait for both, none
    slips in between (each would hold up the second with a core idle)."""
    span = _spells(tmp_path, {"test_a_alone.py": ALONE_TWICE, "test_b_beside.py": BESIDE}, "--dist", "loadfile")
    assert len(span) == 14, sorted(span)
    a0, a1 = span.pop("alone-1")[0], span.pop("alone-2")[1]
    assert all(end <= a0 or start >= a1 for start, end in span.values()), (a0, a1, span)


@pytest.mark.parametrize("key", sorted(ALONE))
def test_every_test_listed_to_run_alone_exists(key: str) -> None:
    path, _, name = key.partition("::")
    source = (ROOT / path).read_text()
    assert not name or re.search(rf"^(async )?def {re.escape(name)}\(", source, re.M), key


class _Item:
    """What the ordering hook reads of a collected test."""

    def __init__(self, nodeid: str, alone: bool = False) -> None:
        self.nodeid, self.path, self._alone = nodeid, Path(nodeid.split("::")[0]), alone

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "alone" and self._alone else None


def test_modules_with_tests_that_run_alone_go_first_then_the_long_running_each_in_its_order() -> None:
    from tests.parallel import pytest_collection_modifyitems

    items = [_Item("tests/test_a.py::t1"), _Item("tests/test_e2e_b.py::t1"),
             _Item("tests/test_c.py::t1"), _Item("tests/test_c.py::t2", alone=True), _Item("tests/test_c.py::t3"),
             _Item("tests/test_e2e_d.py::t1", alone=True), _Item("tests/test_e2e_d.py::t2", alone=True),
             _Item("tests/test_e2e_b.py::t2")]
    pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/test_e2e_d.py::t1", "tests/test_e2e_d.py::t2",                             # all alone
        "tests/test_c.py::t1", "tests/test_c.py::t2", "tests/test_c.py::t3",             # some alone
        "tests/test_e2e_b.py::t1", "tests/test_e2e_b.py::t2",                             # long-running
        "tests/test_a.py::t1"]
