"""Serve a generated demo site on loopback: the command line of testkit/siteserver.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run as a script: the repo's own packages
from testkit.siteserver import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
