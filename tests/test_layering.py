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


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _crawler_imports(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The crawler modules `path` imports anywhere in it (a lazy import inside a function counts too).

    `from crawler.x import y` names the module `crawler.x.y` when that is a module, else `crawler.x`; relative
    imports are resolved against the importing module's package."""
    here = _module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            candidates = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module
                          for a in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != here:
                found.add(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan), each as a closed path:
    the shortest one through the component's first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # the shortest path back to `start` inside the component, breadth first
        paths = {start: [start]}
        queue = [start]
        cycle: list[str] = []
        while queue and not cycle:
            node = queue.pop(0)
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    cycle = paths[node] + [start]
                    break
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
        cycles.append(cycle)
    return cycles


def test_no_import_cycle_among_the_crawler_modules() -> None:
    files = {_module_name(f): f for f in sorted(ROOT.rglob("*.py"))}
    assert "crawler.master.server" in files and "crawler.worker.downloader" in files
    graph = {name: _crawler_imports(path, set(files)) for name, path in files.items()}
    cycles = _cycles(graph)
    for cycle in cycles:
        print("import cycle:", " -> ".join(cycle))
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_the_cycle_finder_finds_a_cycle_a_lazy_import_closes(tmp_path: Path) -> None:
    """The check above would pass on a tree it cannot read: its parts, on a made-up package."""
    pkg = tmp_path / "crawler" / "worker"
    pkg.mkdir(parents=True)
    (tmp_path / "crawler" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from crawler.worker.b import helper\n")
    (pkg / "b.py").write_text("def helper():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("import crawler.worker.a\n")
    root = tmp_path / "crawler"
    files = {_module_name(f, root): f for f in sorted(root.rglob("*.py"))}
    graph = {name: _crawler_imports(path, set(files), root) for name, path in files.items()}
    assert graph["crawler.worker.b"] == {"crawler.worker.a"}
    assert _cycles(graph) == [["crawler.worker.a", "crawler.worker.b", "crawler.worker.a"]]


def test_the_tests_and_the_harness_import_nothing_from_scripts() -> None:
    # The harness (testkit/) sits below both the suite and the entry points in scripts/ (the demo, the benchmarks,
    # the sites' command lines): scripts import it, never the other way, and no test reaches into scripts/. Neither
    # the harness nor the entry points reach into the suite.
    repo = ROOT.parent
    harness = sorted((repo / "testkit").rglob("*.py"))
    assert harness
    wrong = {f"{f.relative_to(repo)}: {name}" for f in sorted((repo / "tests").rglob("*.py")) + harness
             for name in imported(f) if name == "scripts" or name.startswith("scripts.")}
    wrong |= {f"{f.relative_to(repo)}: {name}" for f in harness + sorted((repo / "scripts").glob("*.py"))
              for name in imported(f) if name == "tests" or name.startswith("tests.")}
    assert not wrong, sorted(wrong)


# What the master may import from the resolvers: the registry (which loads plugins by name) and the package itself.
_REGISTRY = {"crawler.resolvers", "crawler.resolvers.registry"}


def test_the_master_reaches_site_plugins_through_the_registry_only() -> None:
    files = sorted((ROOT / "master").glob("*.py"))
    assert files
    wrong = {f"{f.name}: {name}" for f in files for name in imported(f)
             if name.startswith("crawler.resolvers") and name not in _REGISTRY}
    assert not wrong, sorted(wrong)
