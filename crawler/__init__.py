"""A distributed crawler that finds and collects audio."""

import sys
from functools import cache

# httpx's package imports its command-line client's module (httpx._main), which imports rich and pygments when
# they are installed (they are: another dependency brings them), about 45 ms of every daemon's start-up for a
# command line nothing here runs. Marked as absent, httpx takes the fallback it has for a missing CLI extra.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


@cache
def version() -> str:
    """The installed package's version, looked up when first asked: importing importlib.metadata costs every
    daemon's start-up about 35 ms, and only --version and the archives' warcinfo records say the version."""
    from importlib import metadata

    try:
        return metadata.version("audio-crawler")
    except metadata.PackageNotFoundError:   # run from a checkout that was never installed
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":   # crawler.__version__, as it always was, made when asked (see version)
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
