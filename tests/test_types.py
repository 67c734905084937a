"""The package type-checks under mypy --strict (pyproject's [tool.mypy]): a wrong annotation fails the suite."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_package_checks_under_mypy_strict(tmp_path: Path) -> None:
    # A fresh cache each run: a stale one in the checkout must not hide an error.
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")], check=False,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout
