"""The identification package's two limits, in a module of their own: crawler.items (every daemon) and the
worker's fingerprint pool read them without importing the parts that bring numpy and av."""

from __future__ import annotations

# A fingerprint on the wire and in the store is at most this many bytes (a file's fingerprint is cut there).
MAX_FINGERPRINT_BYTES = 1 << 20
# Audio shorter than this is no audio worth matching: decode refuses it, and the worker does not send a file it
# knows to be shorter to its fingerprint pool.
MIN_SECONDS = 2.0
