"""Acoustic identification: fingerprints of audio files and the index of the rights holder's reference works.

The interface the daemons build on (issue: identify the works). The worker runs ``fingerprint_file`` on every audio
file it stores, off its event loop in a bounded pool; the fingerprint travels with the item to the master, which
keeps it and matches it against a ``ReferenceIndex`` of the references.

The parts: ``decode`` (any audio file to mono PCM, bounded), ``fingerprint`` (triplets of spectral peaks whose hash
survives re-encoding and speed changes; pure numpy) and ``index`` (the inverted index and the verification of a
match by one consistent time scale and offset).
"""

from __future__ import annotations

from pathlib import Path

from crawler.identify.decode import decode
from crawler.identify.errors import IdentifyError
from crawler.identify.fingerprint import encode, fingerprint_pcm
from crawler.identify.index import Match, ReferenceIndex

__all__ = ["MAX_FINGERPRINT_BYTES", "IdentifyError", "Match", "ReferenceIndex", "fingerprint_file"]

# A fingerprint on the wire and in the store is at most this many bytes (a file's fingerprint is cut there).
MAX_FINGERPRINT_BYTES = 1 << 20


def fingerprint_file(path: Path) -> bytes:
    """The fingerprint of an audio file: CPU-bound and synchronous (callers run it off their event loop)."""
    return encode(fingerprint_pcm(decode(path)), MAX_FINGERPRINT_BYTES)
