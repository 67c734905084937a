"""The optional parts of the install: which extra brings which module, and the one line that says it is missing.

The base install leaves out what most crawls never use (the browser resolver's playwright, PostgreSQL's psycopg);
a config that asks for one is refused at start with the extra to install, never with an ImportError on first use.
"""

from __future__ import annotations

import importlib.util

# extra -> the module it installs
EXTRAS = {"browser": "playwright", "postgresql": "psycopg"}


def missing_extra(extra: str, needed_for: str) -> str | None:
    """None when the extra's module can be imported; else one line naming the extra to install. Looks the module
    up without importing it, so the check costs nothing at start-up."""
    module = EXTRAS[extra]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a broken or blocked install: as good as missing
        found = False
    if found:
        return None
    return (f"{needed_for} needs the [{extra}] extra ({module} is not installed); "
            f"install it with: pip install 'audio-crawler[{extra}]'")
