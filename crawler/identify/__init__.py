"""Acoustic identification: fingerprints of audio files and the index of the rights holder's reference works.

The interface the daemons build on (issue: identify the works). The worker runs ``fingerprint_file`` on every audio
file it stores, off its event loop in a bounded pool; the fingerprint travels with the item to the master, which
keeps it and matches it against a ``ReferenceIndex`` of the references.

The parts: ``decode`` (any audio file to mono PCM, bounded), ``fingerprint`` (triplets of spectral peaks whose hash
survives re-encoding and speed changes; pure numpy) and ``index`` (the inverted index and the verification of a
match by one consistent time scale and offset).

The parts are imported when first used, not with the package: numpy and av take about a quarter of a worker's
start-up, and a process that only needs MAX_FINGERPRINT_BYTES (crawler.items, so every daemon) or runs the
fingerprints in a pool of its own processes (the worker) never needs them itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from crawler.identify.errors import IdentifyError
from crawler.identify.limits import MAX_FINGERPRINT_BYTES, MIN_SECONDS

if TYPE_CHECKING:
    from crawler.identify.fingerprint import encode, fingerprint_pcm
    from crawler.identify.index import Match, ReferenceIndex

__all__ = ["MAX_FINGERPRINT_BYTES", "MIN_SECONDS", "IdentifyError", "Match", "ReferenceIndex", "fingerprint_file"]

# The names the parts define, by the module that defines them (imported on first use: module __getattr__).
# (decode is not among them: the package's attribute of that name is its submodule, once imported.)
_LAZY = {"encode": "crawler.identify.fingerprint",
         "fingerprint_pcm": "crawler.identify.fingerprint", "Match": "crawler.identify.index",
         "ReferenceIndex": "crawler.identify.index"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def fingerprint_file(path: Path) -> bytes:
    """The fingerprint of an audio file: CPU-bound and synchronous (callers run it off their event loop)."""
    from crawler.identify.decode import decode
    from crawler.identify.fingerprint import encode, fingerprint_pcm
    return encode(fingerprint_pcm(decode(path)), MAX_FINGERPRINT_BYTES)
