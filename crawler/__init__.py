"""A distributed crawler that finds and collects audio."""

from importlib import metadata

try:
    __version__ = metadata.version("audio-crawler")
except metadata.PackageNotFoundError:   # run from a checkout that was never installed
    __version__ = "0+unknown"
