"""The package's layers: the web layer and the HTTP package sit below the resolvers, and all below the daemons;
the master reaches the worker's code through nothing and site plugins through the resolver registry only."""

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
    ("web", ("crawler.worker", "crawler.master", "crawler.resolvers", "crawler.http")),
    ("http", ("crawler.worker", "crawler.master", "crawler.resolvers")),
    ("resolvers", ("crawler.worker", "crawler.master")),
    ("master", ("crawler.worker",)),
])
def test_a_layer_imports_nothing_from_the_layers_above(package: str, forbidden: tuple[str, ...]) -> None:
    files = sorted((ROOT / package).glob("*.py"))
    assert files
    wrong = {f"{f.name}: {name}" for f in files for name in imported(f)
             if name.startswith(forbidden)}
    assert not wrong, sorted(wrong)


# What the master may import from the resolvers: the registry (which loads plugins by name) and the package itself.
_REGISTRY = {"crawler.resolvers", "crawler.resolvers.registry"}


def test_the_master_reaches_site_plugins_through_the_registry_only() -> None:
    files = sorted((ROOT / "master").glob("*.py"))
    assert files
    wrong = {f"{f.name}: {name}" for f in files for name in imported(f)
             if name.startswith("crawler.resolvers") and name not in _REGISTRY}
    assert not wrong, sorted(wrong)
