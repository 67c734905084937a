"""The install: `pip install audio-crawler` is lean (no browser, no PostgreSQL driver), each of those is an extra, and
a config that needs a missing extra is refused in one line that names it."""

from __future__ import annotations

import importlib.metadata
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import crawler
from crawler.extras import EXTRAS
from testkit.cluster import write_secret

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def _base_and_extras(requires: list[str]) -> tuple[set[str], dict[str, set[str]]]:
    base: set[str] = set()
    extras: dict[str, set[str]] = {}
    for r in requires:
        found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", r)
        if found:
            extras.setdefault(found.group(1), set()).add(r.split(";")[0].strip())
        else:
            base.add(_name(r))
    return base, extras


def test_the_base_install_has_neither_the_browser_nor_postgresql():
    # What pip resolves for `pip install audio-crawler`: the Requires-Dist lines without an extra marker.
    base, extras = _base_and_extras(importlib.metadata.requires("audio-crawler") or [])
    assert "httpx" in base and "msgspec" in base
    assert not base & {"playwright", "psycopg", "psycopg-binary", "greenlet"}, base
    assert {_name(r) for r in extras["browser"]} == {"playwright"}
    assert {_name(r) for r in extras["postgresql"]} == {"psycopg"}
    # The suite (and so setup.sh, the demo) needs both.
    assert "audio-crawler[browser,postgresql]" in extras["test"]


def test_pyproject_says_the_same_as_the_installed_metadata():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not {_name(r) for r in project["dependencies"]} & {"playwright", "psycopg"}
    optional = project["optional-dependencies"]
    for extra, module in EXTRAS.items():
        assert [_name(r) for r in optional[extra]] == [module]
    probe = next(line for line in (ROOT / "scripts" / "setup.sh").read_text().splitlines() if "import crawler" in line)
    assert "playwright" in probe and "psycopg" in probe, "setup.sh must reinstall when a test extra is missing"


BLOCK = "import sys; sys.modules['playwright'] = sys.modules['psycopg'] = None; "


def test_every_module_imports_without_the_extras():
    # playwright and psycopg are imported where they are used, never at module level.
    names = [m.name for m in pkgutil.walk_packages(crawler.__path__, "crawler.") if not m.name.endswith("__main__")]
    code = BLOCK + "import importlib\nfor n in sys.argv[1:]: importlib.import_module(n)\nprint('ok')"
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def _without_extras(daemon: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    code = BLOCK + f"from crawler.{daemon}.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, check=False)


def test_a_postgresql_store_without_its_extra_is_one_line_naming_the_extra(tmp_path):
    cfg = tmp_path / "master.yaml"
    cfg.write_text(f"listen: 127.0.0.1:0\ndata_dir: state\nsecret_file: {write_secret(tmp_path / 'secret')}\n"
                   "nodes: [w1]\nseeds: ['http://127.0.0.1:9/']\nstore: postgresql://crawl@127.0.0.1/crawl\n")
    for args in (["--config", str(cfg)], ["status", "--config", str(cfg)]):
        r = _without_extras("master", *args, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        [line] = r.stderr.strip().splitlines()
        assert line.startswith("crawler-master: config error: store:"), line
        assert "[postgresql] extra" in line and "pip install 'audio-crawler[postgresql]'" in line, line
    assert not (tmp_path / "state").exists()


def test_the_browser_resolver_without_its_extra_is_one_line_naming_the_extra(tmp_path):
    cfg = tmp_path / "worker.yaml"
    cfg.write_text("resolvers:\n  browser: {}\n")
    r = _without_extras("worker", "--master", "127.0.0.1:9", "--id", "w1", "--data-dir", str(tmp_path / "d"),
                        "--secret-file", str(write_secret(tmp_path / "secret")), "--config", str(cfg),
                        cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("crawler-worker: config error:") and "browser resolver" in line, line
    assert "[browser] extra" in line and "pip install 'audio-crawler[browser]'" in line, line
    assert not (tmp_path / "d").exists(), "a refused worker leaves no data dir"
