"""The master's one config object, loaded and checked from YAML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from crawler.config import (
    ConfigError,
    Key,
    load_yaml,
    non_negative,
    parse_section,
    positive,
    probability,
    read_secret,
)

# Kugou song pages name the song in the fragment (see resolvers/kugou.py); it must survive normalisation.
DEFAULT_KEEP_FRAGMENT = (r"^https?://(www\.)?kugou\.com/song/",)


def _seeds_check(seeds: tuple[str, ...]) -> str | None:
    if not seeds:
        return "needs at least one URL"
    for s in seeds:
        parts = urlsplit(s)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return f"{s!r} is not an http(s) URL"
    return None


def _nodes_check(nodes: tuple[str, ...]) -> str | None:
    if not nodes:
        return "needs at least one node id"
    if len(set(nodes)) != len(nodes):
        return "node ids must be unique"
    return None


def _key_check(v: str) -> str | None:
    return None if v in ("url", "host") else "must be 'url' or 'host'"


SPEC = {
    "listen": Key("hostport"),
    "data_dir": Key("path"),
    "secret_file": Key("path"),
    "nodes": Key("list[str]", check=_nodes_check),
    "seeds": Key("list[str]", check=_seeds_check),
    "exit_when_done": Key("bool", False),
    "crawl": Key("section", section={
        "max_depth": Key("int", 5, non_negative),
        "max_pages": Key("int", None, positive),
        "max_url_length": Key("int", 256, positive),
        "max_query_params": Key("int", 10, non_negative),
        "max_separator_ratio": Key("float", 0.3, probability),
        "allowed_hosts": Key("list[str]", ()),       # empty: the seeds' hosts
        "allow_patterns": Key("list[str]", ()),
        "deny_patterns": Key("list[str]", ()),
        "sort_query": Key("bool", False),
        "drop_params": Key("list[str]", ("utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content")),
        "keep_fragment": Key("list[str]", DEFAULT_KEEP_FRAGMENT),
        "refresh_interval": Key("float", None, positive),
        "max_attempts": Key("int", 3, positive),
    }),
    "scheduling": Key("section", section={
        "key": Key("str", "url", _key_check),
        "batch_size": Key("int", 64, positive),
        "lease_timeout": Key("float", 300.0, positive),
        "heartbeat_interval": Key("float", 5.0, positive),
        "heartbeat_timeout": Key("float", 20.0, positive),
    }),
    "politeness": Key("section", section={
        "max_per_host": Key("int", None, positive),
        "min_delay": Key("float", 0.0, non_negative),
        "obey_robots": Key("bool", True),
        "crawl_delay_cap": Key("float", 10.0, non_negative),
        "user_agent": Key("str", "audio-crawler/0.1"),
        "adaptive": Key("bool", False),
        "max_delay": Key("float", 60.0, non_negative),
        "target_concurrency": Key("float", 1.0, positive),
        "backoff_base": Key("float", 1.0, non_negative),
        "backoff_max": Key("float", 300.0, non_negative),
        "retry_after_cap": Key("float", 3600.0, non_negative),
    }),
    "dedup": Key("section", section={
        "expected_urls": Key("int", 10_000_000, positive),
        "fp_rate": Key("float", 1e-6, probability),
        "whitelist": Key("list[str]", ()),
        "snapshot_interval": Key("float", 60.0, positive),
    }),
    "max_frame": Key("int", 16 * 1024 * 1024, positive),
}


@dataclass(frozen=True)
class CrawlLimits:
    max_depth: int
    max_pages: int | None
    max_url_length: int
    max_query_params: int
    max_separator_ratio: float
    allowed_hosts: tuple[str, ...]
    allow_patterns: tuple[str, ...]
    deny_patterns: tuple[str, ...]
    sort_query: bool
    drop_params: tuple[str, ...]
    keep_fragment: tuple[str, ...]
    refresh_interval: float | None
    max_attempts: int


@dataclass(frozen=True)
class Scheduling:
    key: str
    batch_size: int
    lease_timeout: float
    heartbeat_interval: float
    heartbeat_timeout: float


@dataclass(frozen=True)
class Politeness:
    max_per_host: int | None
    min_delay: float
    obey_robots: bool
    crawl_delay_cap: float
    user_agent: str
    adaptive: bool
    max_delay: float
    target_concurrency: float
    backoff_base: float
    backoff_max: float
    retry_after_cap: float


@dataclass(frozen=True)
class DedupSettings:
    expected_urls: int
    fp_rate: float
    whitelist: tuple[str, ...]
    snapshot_interval: float


@dataclass(frozen=True)
class MasterConfig:
    listen: tuple[str, int]
    data_dir: Path
    secret: bytes
    nodes: tuple[str, ...]
    seeds: tuple[str, ...]
    exit_when_done: bool
    crawl: CrawlLimits
    scheduling: Scheduling
    politeness: Politeness
    dedup: DedupSettings
    max_frame: int

    @classmethod
    def from_mapping(cls, raw: dict, base: Path) -> MasterConfig:
        v = parse_section(raw, SPEC, base)
        crawl = v["crawl"]
        if not crawl["allowed_hosts"]:
            crawl["allowed_hosts"] = tuple(dict.fromkeys(urlsplit(s).hostname or "" for s in v["seeds"]))
        sched = Scheduling(**v["scheduling"])
        if sched.heartbeat_timeout <= sched.heartbeat_interval:
            raise ConfigError("scheduling.heartbeat_timeout", "must be longer than scheduling.heartbeat_interval")
        pol = Politeness(**v["politeness"])
        if pol.max_delay < pol.min_delay:
            raise ConfigError("politeness.max_delay", "must not be below politeness.min_delay")
        if pol.backoff_max < pol.backoff_base:
            raise ConfigError("politeness.backoff_max", "must not be below politeness.backoff_base")
        return cls(
            listen=v["listen"], data_dir=v["data_dir"], secret=read_secret(v["secret_file"]),
            nodes=v["nodes"], seeds=v["seeds"], exit_when_done=v["exit_when_done"],
            crawl=CrawlLimits(**crawl), scheduling=sched, politeness=pol,
            dedup=DedupSettings(**v["dedup"]), max_frame=v["max_frame"],
        )

    @classmethod
    def load(cls, path: Path) -> MasterConfig:
        return cls.from_mapping(load_yaml(path), path.resolve().parent)
