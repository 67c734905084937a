"""The worker's one config object: an optional YAML file, with the command line's flags (or their environment
variables) taking precedence, and defaults that fit a systemd unit so `crawler-worker --master host:port` runs."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crawler.archive.writer import ArchiveConfig
from crawler.config import (
    ConfigError,
    from_values,
    keys_of,
    load_yaml,
    non_negative,
    one_of,
    parse_hostport,
    parse_keys,
    positive,
    read_secret,
    setting,
)
from crawler.http.proxies import Proxy, parse_proxies
from crawler.worker.fingerprints import IdentifyConfig
from crawler.worker.pagestore import FORMATS
from crawler.worker.transfer import DownloadConfig

DEFAULT_USER_AGENT = "Mozilla/5.0 (compatible; audio-crawler/0.1)"
DEFAULT_DATA_DIR = Path("/var/lib/audio-crawler")     # systemd's StateDirectory=audio-crawler
DEFAULT_SECRET_FILE = Path("/etc/audio-crawler/secret")


def default_data_dir() -> Path:
    # systemd sets $STATE_DIRECTORY (colon-separated when a unit has several) from StateDirectory=.
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(state) if state else DEFAULT_DATA_DIR


def _master_address(v: str | None, key: str) -> tuple[str, int]:
    if v is None:
        raise ConfigError(key, "required: give --master host:port, set $CRAWLER_MASTER or set master "
                               "in the config file")
    return parse_hostport(v, key)


def _or_host_name(v: str | None, key: str) -> str:
    return v or socket.gethostname()


def _or_default_data_dir(v: Path | None, key: str) -> Path:
    return v or default_data_dir()


def _read_secret_file(v: Path | None, key: str) -> bytes:
    return read_secret(v or DEFAULT_SECRET_FILE, key)


def _resolver_sections(v: dict[str, Any] | None, key: str) -> dict[str, dict[str, Any]]:
    resolvers = v or {"generic": {}}
    for name, section in resolvers.items():
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"{key}.{name}", "expected a mapping (the resolver's own settings)")
    return {k: dict(s or {}) for k, s in resolvers.items()}


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """The worker's config: each field made by setting() is a YAML key (SPEC, below, is derived from these), and
    the command line's flags override the same names (see build)."""

    master: tuple[str, int] = setting("str", None, convert=_master_address)   # host:port, required in the end
    id: str = setting("str", None, convert=_or_host_name)                   # absent: the host name
    data_dir: Path = setting("path", None, convert=_or_default_data_dir)    # absent: see default_data_dir
    # The shared secret, read from secret_file (absent: DEFAULT_SECRET_FILE) at load and refused there if others
    # can read it or guess it.
    secret: bytes = setting("path", None, yaml="secret_file", convert=_read_secret_file)
    concurrency: int = setting("int", 64, positive)          # page fetches in flight
    # Audio downloads in flight, apart from page fetches ...
    downloads: int = setting("int", 32, positive)
    # ... and at most this many of them to one host (the host a download's address names), so one host never
    # takes them all; the master's politeness paces each host over the whole cluster on top of this.
    downloads_per_host: int = setting("int", 4, positive)
    # Downloads a worker holds, running or waiting for their turn: past it, it takes no new pages until some end.
    pending_downloads: int = setting("int", 256, positive)
    # Seconds a page's report waits for the downloads the page started, so that it carries their outcomes
    # (0: it never waits; downloads still running then report apart, as they end).
    report_wait: float = setting("float", 2.0, non_negative)
    # Credit announced to the master; absent, two tasks for each page fetch and each download in flight.
    max_tasks: int = setting("int", None, positive)
    user_agent: str = setting("str", DEFAULT_USER_AGENT)
    max_page_bytes: int = setting("int", 5 * 1024 * 1024, positive)
    max_audio_bytes: int = setting("int", 2 * 1024 ** 3, positive)
    connect_timeout: float = setting("float", 10.0, positive)
    read_timeout: float = setting("float", 30.0, positive)
    fetch_timeout: float = setting("float", 60.0, positive)       # a page fetch or API call in all, body included
    download_timeout: float = setting("float", 120.0, positive)   # a download in all: this, plus its size at...
    download_min_rate: int = setting("int", 32 * 1024, positive)  # ...this many bytes per second
    # A finished audio file is trusted this long before it is asked for again (conditionally: a 304 costs no
    # download); 0 asks on every visit of its page.
    revalidate_after: float = setting("float", 86_400.0, non_negative)
    # Seconds of a live stream (a live HLS playlist, a dynamic DASH presentation, an internet radio station)
    # recorded per visit of its page (crawler/worker/recording.py); each visit records a new window.
    live_record_seconds: float = setting("float", 60.0, positive)
    max_page_depth: int = setting("int", 512, positive)         # element nesting a page may reach
    max_page_tags: int = setting("int", 100_000, positive)      # tags a page may hold
    max_redirects: int = setting("int", 5, positive)
    dns_ttl: float = setting("float", 300.0, positive)
    link_cache: int = setting("int", 200_000, positive)
    max_links_per_page: int = setting("int", 5000, positive)
    store_pages: bool = setting("bool", True)
    page_format: str = setting("str", "warc", one_of(*FORMATS))   # see crawler/worker/pagestore.py
    min_free_bytes: int = setting("int", 100 * 1024 ** 2, non_negative)   # less free in data_dir: take no work
    download_audio: bool = setting("bool", True)
    reconnect_max_delay: float = setting("float", 30.0, positive)
    # The most bytes one answer to the master's evidence request may hold (records and stored files together).
    evidence_max_bytes: int = setting("int", 8 * 1024 ** 3, positive)
    # name -> its own section, in the order they are tried (absent: the generic resolver alone)
    resolvers: dict[str, dict[str, Any]] = setting("map", None, convert=_resolver_sections)
    # host:port of this worker's /metrics; off by default
    metrics_listen: tuple[str, int] | None = setting("hostport|off", None)
    log_interval: float = setting("float", 30.0, positive)     # seconds between progress lines
    # This node's own proxies (crawler/http/proxies.py), over the crawl's and every site's; absent: those the
    # master sends; an empty list: this node goes direct.
    proxies: tuple[Proxy, ...] | None = setting("custom", None, parser=parse_proxies)
    # The fingerprint pool (crawler/worker/fingerprints.py): every stored audio file is fingerprinted.
    identify: IdentifyConfig = field(default_factory=IdentifyConfig, kw_only=True)
    # Every exchange this node makes, as WARC records in data_dir/archive (crawler/archive/).
    archive: ArchiveConfig = field(default_factory=ArchiveConfig, kw_only=True)

    def download_config(self) -> DownloadConfig:
        """The downloader's settings (crawler/worker/transfer.py) from this config's keys."""
        return DownloadConfig(max_size=self.max_audio_bytes, timeout=self.read_timeout,
                              max_downloads=self.downloads, max_per_host=self.downloads_per_host,
                              deadline_base=self.download_timeout, min_rate=self.download_min_rate,
                              revalidate_after=self.revalidate_after,
                              live_record_seconds=self.live_record_seconds)

    @classmethod
    def build(cls, yaml_path: Path | None, overrides: dict[str, Any]) -> WorkerConfig:
        """overrides: the command line's values (None: not given). Paths among them are taken from the current
        directory, paths in the file from the file's folder."""
        raw = load_yaml(yaml_path) if yaml_path else {}
        base = yaml_path.resolve().parent if yaml_path else Path.cwd()
        given = {k: v for k, v in overrides.items() if v is not None}
        for k in ("data_dir", "secret_file"):
            if k in given:
                given[k] = str(Path(given[k]).expanduser().absolute())
        raw.update(given)
        if "warc_file_bytes" in raw:    # the key before the archive section had one: the same setting
            old = raw.pop("warc_file_bytes")
            section = raw.get("archive")
            if section is None:
                raw["archive"] = {"file_bytes": old}
            elif isinstance(section, dict):
                raw["archive"] = {"file_bytes": old, **section}
        v = parse_keys(raw, SPEC, base)
        if v["max_tasks"] is None:
            v["max_tasks"] = 2 * v["concurrency"] + 2 * v["downloads"]
        return from_values(cls, v)


SPEC = keys_of(WorkerConfig)   # the YAML keys, derived from the fields above
