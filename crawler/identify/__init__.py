"""Acoustic identification: fingerprints of audio files and the index of the rights holder's reference works.

The interface the daemons build on (issue: identify the works). The worker runs ``fingerprint_file`` on every audio
file it stores, off its event loop in a bounded pool; the fingerprint travels with the item to the master, which
keeps it and matches it against a ``ReferenceIndex`` of the references.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# A fingerprint on the wire and in the store is at most this many bytes (a file's fingerprint is cut there).
MAX_FINGERPRINT_BYTES = 1 << 20


class IdentifyError(Exception):
    """The file cannot be fingerprinted (not audio, undecodable, empty): one line naming why."""


@dataclass(frozen=True, slots=True)
class Match:
    work: str        # the reference's work id
    score: float     # how sure: higher is surer; only matches over the index's threshold are returned
    offset: float    # seconds into the work where the copy starts


def fingerprint_file(path: Path) -> bytes:
    """The fingerprint of an audio file: CPU-bound and synchronous (callers run it off their event loop)."""
    raise IdentifyError("fingerprinting is not built yet")


class ReferenceIndex:
    """The references' fingerprints, indexed for matching (not a scan)."""

    def add(self, work: str, fingerprint: bytes) -> None:
        raise IdentifyError("fingerprinting is not built yet")

    def remove(self, work: str) -> None:
        raise IdentifyError("fingerprinting is not built yet")

    def match(self, fingerprint: bytes) -> list[Match]:
        """The works the fingerprint's audio is a copy of, best first."""
        return []

    def __len__(self) -> int:
        return 0
