"""The worker's one config object: an optional YAML file, with the command line's flags (or their environment
variables) taking precedence, and defaults that fit a systemd unit so `crawler-worker --master host:port` runs."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crawler.config import (
    ConfigError,
    Key,
    load_yaml,
    non_negative,
    one_of,
    parse_hostport,
    parse_keys,
    positive,
    read_secret,
)
from crawler.worker.pagestore import FORMATS

DEFAULT_USER_AGENT = "Mozilla/5.0 (compatible; audio-crawler/0.1)"
DEFAULT_DATA_DIR = Path("/var/lib/audio-crawler")     # systemd's StateDirectory=audio-crawler
DEFAULT_SECRET_FILE = Path("/etc/audio-crawler/secret")


def default_data_dir() -> Path:
    # systemd sets $STATE_DIRECTORY (colon-separated when a unit has several) from StateDirectory=.
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(state) if state else DEFAULT_DATA_DIR


SPEC = {
    "master": Key("str", None),
    "id": Key("str", None),
    "data_dir": Key("path", None),
    "secret_file": Key("path", None),
    "concurrency": Key("int", 64, positive),          # page fetches in flight
    "downloads": Key("int", 4, positive),             # audio downloads in flight, apart from page fetches
    # Downloads a worker holds, running or waiting for their turn: past it, it takes no new pages until some end.
    "pending_downloads": Key("int", 256, positive),
    "max_tasks": Key("int", None, positive),          # credit announced to the master
    "user_agent": Key("str", DEFAULT_USER_AGENT),
    "max_page_bytes": Key("int", 5 * 1024 * 1024, positive),
    "max_audio_bytes": Key("int", 2 * 1024 ** 3, positive),
    "connect_timeout": Key("float", 10.0, positive),
    "read_timeout": Key("float", 30.0, positive),
    "fetch_timeout": Key("float", 60.0, positive),       # a page fetch or API call in all, body included
    "download_timeout": Key("float", 120.0, positive),   # a download in all: this, plus its size at...
    "download_min_rate": Key("int", 32 * 1024, positive),  # ...this many bytes per second
    # A finished audio file is trusted this long before it is asked for again (conditionally: a 304 costs no
    # download); 0 asks on every visit of its page.
    "revalidate_after": Key("float", 86_400.0, non_negative),
    "max_page_depth": Key("int", 512, positive),         # element nesting a page may reach
    "max_page_tags": Key("int", 100_000, positive),      # tags a page may hold
    "max_redirects": Key("int", 5, positive),
    "dns_ttl": Key("float", 300.0, positive),
    "link_cache": Key("int", 200_000, positive),
    "max_links_per_page": Key("int", 5000, positive),
    "store_pages": Key("bool", True),
    "page_format": Key("str", "warc", one_of(*FORMATS)),   # see crawler/worker/pagestore.py
    "warc_file_bytes": Key("int", 1024 ** 3, positive),      # a new WARC file past this size
    "min_free_bytes": Key("int", 100 * 1024 ** 2, non_negative),   # less free in data_dir: take no work
    "download_audio": Key("bool", True),
    "reconnect_max_delay": Key("float", 30.0, positive),
    "resolvers": Key("map", None),                    # name -> its own section, in the order they are tried
    "metrics_listen": Key("hostport|off", None),      # host:port of this worker's /metrics; off by default
    "log_interval": Key("float", 30.0, positive),     # seconds between progress lines
}


@dataclass(frozen=True)
class WorkerConfig:
    master: tuple[str, int]
    id: str
    data_dir: Path
    secret: bytes
    concurrency: int
    downloads: int
    pending_downloads: int
    max_tasks: int
    user_agent: str
    max_page_bytes: int
    max_audio_bytes: int
    connect_timeout: float
    read_timeout: float
    fetch_timeout: float
    download_timeout: float
    download_min_rate: int
    revalidate_after: float
    max_page_depth: int
    max_page_tags: int
    max_redirects: int
    dns_ttl: float
    link_cache: int
    max_links_per_page: int
    store_pages: bool
    page_format: str
    warc_file_bytes: int
    min_free_bytes: int
    download_audio: bool
    reconnect_max_delay: float
    resolvers: dict[str, dict[str, Any]]
    metrics_listen: tuple[str, int] | None
    log_interval: float

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
        v = parse_keys(raw, SPEC, base)
        if v["master"] is None:
            raise ConfigError("master", "required: give --master host:port, set $CRAWLER_MASTER or set master "
                                        "in the config file")
        v["id"] = v["id"] or socket.gethostname()
        v["data_dir"] = v["data_dir"] or default_data_dir()
        v["secret_file"] = v["secret_file"] or DEFAULT_SECRET_FILE
        resolvers = v["resolvers"] or {"generic": {}}
        for name, section in resolvers.items():
            if section is not None and not isinstance(section, dict):
                raise ConfigError(f"resolvers.{name}", "expected a mapping (the resolver's own settings)")
        return cls(
            master=parse_hostport(v["master"], "master"), id=v["id"], data_dir=v["data_dir"],
            secret=read_secret(v["secret_file"]), concurrency=v["concurrency"], downloads=v["downloads"],
            pending_downloads=v["pending_downloads"],
            max_tasks=v["max_tasks"] or 2 * v["concurrency"] + 2 * v["downloads"], user_agent=v["user_agent"],
            max_page_bytes=v["max_page_bytes"], max_audio_bytes=v["max_audio_bytes"],
            connect_timeout=v["connect_timeout"], read_timeout=v["read_timeout"],
            fetch_timeout=v["fetch_timeout"], download_timeout=v["download_timeout"],
            download_min_rate=v["download_min_rate"], revalidate_after=v["revalidate_after"],
            max_page_depth=v["max_page_depth"],
            max_page_tags=v["max_page_tags"],
            max_redirects=v["max_redirects"], dns_ttl=v["dns_ttl"], link_cache=v["link_cache"],
            max_links_per_page=v["max_links_per_page"], store_pages=v["store_pages"],
            page_format=v["page_format"], warc_file_bytes=v["warc_file_bytes"], min_free_bytes=v["min_free_bytes"],
            download_audio=v["download_audio"], reconnect_max_delay=v["reconnect_max_delay"],
            resolvers={k: dict(s or {}) for k, s in resolvers.items()},
            metrics_listen=v["metrics_listen"], log_interval=v["log_interval"],
        )
