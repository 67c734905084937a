"""The package's layers: the web layer sits below the resolvers, and both below the daemons."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "crawler"


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("package, forbidden", [
    ("web", ("crawler.worker", "crawler.master", "crawler.resolvers")),
    ("resolvers", ("crawler.worker", "crawler.master")),
])
def test_a_layer_imports_nothing_from_the_layers_above(package: str, forbidden: tuple[str, ...]) -> None:
    files = sorted((ROOT / package).glob("*.py"))
    assert files
    wrong = {f"{f.name}: {name}" for f in files for name in imported(f)
             if name.startswith(forbidden)}
    assert not wrong, sorted(wrong)


def test_the_tests_and_the_harness_import_nothing_from_scripts() -> None:
    # The harness (testkit/) sits below both the suite and the entry points in scripts/ (the demo, the benchmarks,
    # the sites' command lines): scripts import it, never the other way, and no test reaches into scripts/. The
    # harness does not reach into the suite either.
    repo = ROOT.parent
    harness = sorted((repo / "testkit").rglob("*.py"))
    assert harness
    wrong = {f"{f.relative_to(repo)}: {name}" for f in sorted((repo / "tests").rglob("*.py")) + harness
             for name in imported(f) if name == "scripts" or name.startswith("scripts.")}
    wrong |= {f"{f.relative_to(repo)}: {name}" for f in harness for name in imported(f)
              if name == "tests" or name.startswith("tests.")}
    assert not wrong, sorted(wrong)
