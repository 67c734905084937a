"""The frontier benchmark runs at any size (a short run's tenth has fewer batches than the control's interval)
and prints the figures the README quotes. It is a script, not a timed test: this only checks that it works."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_run_prints_every_figure(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_frontier.py"), "--count", "40000",
                          "--batch", "2000", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert sum(line.startswith("tenth ") for line in out.splitlines()) == 10 and "x the CPU per URL of a store under" in out
    for figure in ("against the control", "peak RSS", "bytes per URL", "projection to 1B"):
        assert figure in out, out
    assert list(tmp_path.iterdir()) == []          # the stores it made are gone
