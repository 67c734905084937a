"""The one error of the identification package (its own module so that decode, fingerprint and index share it)."""

from __future__ import annotations


class IdentifyError(Exception):
    """The file cannot be fingerprinted (not audio, undecodable, empty): one line naming why."""
