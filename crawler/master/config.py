"""The master's one config object, loaded and checked from YAML."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crawler.archive.writer import ArchiveConfig
from crawler.bloom import GrowingBloomFilter
from crawler.config import (
    ConfigError,
    from_values,
    keys_of,
    load_yaml,
    non_negative,
    parse_keys,
    positive,
    probability,
    read_secret,
    regexes,
    setting,
)
from crawler.extras import missing_extra
from crawler.http.proxies import Proxy, parse_proxies
from crawler.http.targets import parse_network
from crawler.master.backend import dsn_problem
from crawler.politeness import PolitenessConfig
from crawler.resolvers import registry
from crawler.sites import SiteTable, check_welcome_fits, parse_sites
from crawler.web.urls import host_port

# Some sites' pages name their resource in the fragment (Kugou's songs); it must survive normalisation even before
# a worker with their resolver has joined. Site plugins are reached through the resolver registry only.
DEFAULT_KEEP_FRAGMENT = registry.default_keep_fragment()


KUGOU_SEARCH = "kugou-search"


def expand_seeds(seeds: Any) -> Any:
    """Seed entries that are not URLs, made into the URLs a worker task expands (registry.SEED_KINDS):
    ``kugou-search: WORDS`` (a mapping, or that text) becomes the first page of Kugou's keyword search, which the
    Kugou resolver turns into song URLs. The master itself makes no request to Kugou."""
    if not isinstance(seeds, list):
        return seeds
    out = []
    for i, entry in enumerate(seeds):
        kind = _seed_kind(entry)
        words: Any = None
        if kind is None:
            out.append(entry)
            continue
        if isinstance(entry, dict):
            if len(entry) != 1:
                raise ConfigError(f"seeds[{i}]", f"a {kind} entry takes no other keys")
            words = entry[kind]
        else:
            words = entry[len(kind) + 1:]
        if not isinstance(words, (str, int)) or not str(words).strip():
            raise ConfigError(f"seeds[{i}]", f"{kind} needs the words to search for")
        out.append(registry.seed_url(kind, str(words)))
    return out


def _seed_kind(entry: Any) -> str | None:
    for kind in registry.SEED_KINDS:
        if (isinstance(entry, dict) and kind in entry) or (isinstance(entry, str) and entry.startswith(kind + ":")):
            return kind
    return None


def _seeds_check(seeds: tuple[str, ...]) -> str | None:
    if not seeds:
        return "needs at least one URL"
    for s in seeds:
        if host_port(s) is None:
            return f"{s!r} is not an http(s) URL"
    return None


def _nodes_check(nodes: tuple[str, ...]) -> str | None:
    if not nodes:
        return "needs at least one node id"
    if len(set(nodes)) != len(nodes):
        return "node ids must be unique"
    return None


def _networks_check(networks: tuple[str, ...]) -> str | None:
    for n in networks:
        try:
            parse_network(n)
        except ValueError:
            return f"{n!r} is not an IP network (e.g. 10.0.0.0/8, 192.168.1.5, fd00::/8)"
    return None


def _seed_scope(seed: str) -> str:
    """The allowed_hosts entry a seed stands for: its host, with its port unless that is the default."""
    parts = urlsplit(seed)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    return host if port is None or port == {"http": 80, "https": 443}.get(parts.scheme) else f"{host}:{port}"


def _store_check(v: str) -> str | None:
    if v.startswith(("postgresql://", "postgres://")):
        return missing_extra("postgresql", "a postgresql:// store") or dsn_problem(v)
    return "must be a postgresql:// address (leave it out for the SQLite file in data_dir)"


def _key_check(v: str) -> str | None:
    return None if v in ("url", "host") else "must be 'url' or 'host'"


def _check_refresh(crawl: dict[str, Any]) -> None:
    base = crawl["refresh_interval"]
    for k in ("refresh_min", "refresh_max", "refresh_hub_interval"):
        if crawl[k] is not None and base is None:
            raise ConfigError(f"crawl.{k}", "needs crawl.refresh_interval")
    if base is None:
        return
    lo = crawl["refresh_min"] if crawl["refresh_min"] is not None else base / 4
    hi = crawl["refresh_max"] if crawl["refresh_max"] is not None else base * 4
    if lo > base:
        raise ConfigError("crawl.refresh_min", "must not be above crawl.refresh_interval")
    if hi < base:
        raise ConfigError("crawl.refresh_max", "must not be below crawl.refresh_interval")


@dataclass(frozen=True)
class Politeness(PolitenessConfig):
    """The politeness section: the page gate's and robots.txt's settings (PolitenessConfig, whose fields carry
    their keys and defaults) and the master's own, below."""

    robots_timeout: float = setting("float", 30.0, positive)   # a robots.txt fetch in all, redirects and body
    # Audio downloads, apart from pages: over all workers, per audio host (None: no limit, as for pages).
    audio_max_per_host: int | None = setting("int", None, positive)
    audio_min_delay: float = setting("float", 0.0, non_negative)


@dataclass(frozen=True)
class CrawlLimits:
    max_depth: int = setting("int", 5, non_negative)
    max_pages: int | None = setting("int", None, positive)
    # The crawl's byte and time limits (crawler/master/limits.py): bytes fetched (pages and audio, as the workers
    # report them) and seconds since the crawl first started, both over restarts.
    max_bytes: int | None = setting("int", None, positive)
    max_duration: float | None = setting("float", None, positive)
    max_url_length: int = setting("int", 256, positive)
    max_query_params: int = setting("int", 10, non_negative)
    max_separator_ratio: float = setting("float", 0.3, probability)
    allowed_hosts: tuple[str, ...] = setting("list[str]", ())    # empty: the seeds' hosts and ports
    # Networks outside the public internet (loopback, private, link-local ...) the crawl may fetch from;
    # a seed given by IP address always may reach its own host:port (a seed given by name: only public addresses
    # unless listed here). See crawler/http/targets.py.
    allowed_networks: tuple[str, ...] = setting("list[str]", (), _networks_check)
    allow_patterns: tuple[str, ...] = setting("list[str]", (), regexes)
    deny_patterns: tuple[str, ...] = setting("list[str]", (), regexes)
    sort_query: bool = setting("bool", False)
    drop_params: tuple[str, ...] = setting(
        "list[str]", ("utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content"))
    keep_fragment: tuple[str, ...] = setting("list[str]", DEFAULT_KEEP_FRAGMENT, regexes)
    # Fragment rules a worker's resolvers may bring that the crawl takes in (keys URLs with, keeps in the store,
    # tells every worker): the operator's approval, compared as text. Others a worker brings are ignored.
    approved_fragment_rules: tuple[str, ...] = setting("list[str]", (), regexes)
    refresh_interval: float | None = setting("float", None, positive)
    # Each page's revisit interval adapts within these (default: a quarter and four times refresh_interval);
    # pages that yielded audio are revisited every refresh_hub_interval when set. See master/revisit.py.
    refresh_min: float | None = setting("float", None, positive)
    refresh_max: float | None = setting("float", None, positive)
    refresh_hub_interval: float | None = setting("float", None, positive)
    max_attempts: int = setting("int", 3, positive)


@dataclass(frozen=True)
class Scheduling:
    key: str = setting("str", "url", _key_check)
    batch_size: int = setting("int", 64, positive)
    lease_timeout: float = setting("float", 300.0, positive)
    heartbeat_interval: float = setting("float", 5.0, positive)
    heartbeat_timeout: float = setting("float", 20.0, positive)
    # A worker that cannot store (disk full, read-only) this long has its pending downloads handed to the live
    # nodes: waiting longer keeps their partial files usable, but the crawl cannot end while they wait.
    fault_timeout: float = setting("float", 120.0, positive)


def _bits_per_url_check(v: float) -> str | None:
    return None if 1 <= v <= 256 else "must be between 1 and 256"


def _hashes_check(v: int) -> str | None:
    return None if 1 <= v <= 64 else "must be between 1 and 64"


def _check_dedup(d: dict[str, Any]) -> None:
    """The paper's sizing takes both keys, and must hold dedup.expected_urls within its share of dedup.fp_rate (the
    first layer's half), or the filter would grow before the crawl reached the size it was configured for."""
    bits, k = d["bits_per_url"], d["hashes"]
    if (bits is None) != (k is None):
        raise ConfigError("dedup.hashes" if k is None else "dedup.bits_per_url",
                          "dedup.bits_per_url and dedup.hashes go together")
    if bits is None:
        return
    holds = GrowingBloomFilter.first_capacity(d["expected_urls"], d["fp_rate"], bits, k)
    if holds < d["expected_urls"]:
        raise ConfigError("dedup.bits_per_url", f"{bits:g} bits and {k} hashes per URL hold only {holds} URLs within "
                                                f"half of dedup.fp_rate {d['fp_rate']:g}, under dedup.expected_urls "
                                                f"{d['expected_urls']}: raise dedup.fp_rate or dedup.bits_per_url")


@dataclass(frozen=True)
class DedupSettings:
    expected_urls: int = setting("int", 10_000_000, positive)
    fp_rate: float = setting("float", 1e-6, probability)
    # The first layer's geometry the paper's way (16 bits, 8 hashes per URL); absent, derived from the two above.
    bits_per_url: float | None = setting("float", None, _bits_per_url_check)
    hashes: int | None = setting("int", None, _hashes_check)
    whitelist: tuple[str, ...] = setting("list[str]", (), regexes)
    snapshot_interval: float = setting("float", 60.0, positive)


def _host_names_check(names: tuple[str, ...]) -> str | None:
    for name in names:
        if not name or any(c in name for c in "/:@[] \t") or name != name.strip("."):
            return f"{name!r} is not a host name (give the name alone: no scheme, port or path)"
    return None


def _read_token(path: Path | None, key: str) -> str | None:
    return None if path is None else read_secret(path, key).decode("utf-8", "replace")


@dataclass(frozen=True)
class WebSettings:
    # Where /, /api/status and /metrics are served; off: nowhere. Port 0 (the default): one the system picks,
    # so masters side by side never collide; the address taken is logged and written to <data_dir>/web.addr.
    listen: tuple[str, int] | None = setting("hostport|off", ("127.0.0.1", 0))
    # When token_file is set, every request needs the token it holds.
    token: str | None = setting("path", None, yaml="token_file", convert=_read_token)
    # Host names requests may give besides loopback's and the listen address (a name the machine is reached by).
    allowed_hosts: tuple[str, ...] = setting("list[str]", (), _host_names_check)


def _webhook_check(url: str | None) -> str | None:
    if url is None:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL"
    return None


def _read_alert_secret(path: Path | None, key: str) -> bytes | None:
    return None if path is None else read_secret(path, key)


@dataclass(frozen=True)
class AlertSettings:
    # Each new (audio URL, work) match is POSTed here as a JSON object (the matches export's row), signed with the
    # secret: X-Crawler-Signature: sha256=<hex HMAC-SHA256 of the body>. Off when absent.
    webhook: str | None = setting("str", None, _webhook_check)
    secret: bytes | None = setting("path", None, yaml="secret_file", convert=_read_alert_secret)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, kw_only=True)
class MasterConfig:
    """The master's config: each field made by setting() is a YAML key, each field typed with a dataclass a
    section of them (SPEC, below, is derived from these)."""

    listen: tuple[str, int] = setting("hostport")
    data_dir: Path = setting("path")
    # Where the URL table, frontier and catalogue live: absent, an SQLite file in data_dir; a postgresql://
    # address puts them in that PostgreSQL database (a crawl bigger than one disk, or a standby to fail over to).
    store: str | None = setting("str", None, _store_check)
    # The shared secret, read from secret_file at load and refused there if others can read it or guess it.
    secret: bytes = setting("path", yaml="secret_file", convert=read_secret)
    nodes: tuple[str, ...] = setting("list[str]", check=_nodes_check)
    seeds: tuple[str, ...] = setting("list[str]", check=_seeds_check)
    exit_when_done: bool = setting("bool", False)
    crawl: CrawlLimits
    scheduling: Scheduling
    politeness: Politeness
    dedup: DedupSettings
    max_frame: int = setting("int", 16 * 1024 * 1024, positive)
    log_interval: float = setting("float", 30.0, positive)     # seconds between progress lines
    web: WebSettings
    alerts: AlertSettings
    # The master's own exchanges (robots.txt fetches) as WARC records in data_dir/archive (crawler/archive/).
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    # Where requests leave from (crawler/http/proxies.py): the whole crawl's, sent to every worker and used for
    # the master's own robots.txt fetches; a site's entry or a worker's own config overrides it.
    proxies: tuple[Proxy, ...] = setting("custom", (), parser=parse_proxies)
    # Per-site policy (crawler/sites.py), keyed by host, host:port or *.domain.
    sites: SiteTable = setting("custom", SiteTable(), parser=parse_sites)

    @property
    def store_location(self) -> Path | str:
        """The master store: the postgresql:// address, or the SQLite file in the data dir."""
        return self.store if self.store else self.data_dir / "master.db"

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], base: Path) -> MasterConfig:
        if isinstance(raw, dict) and "seeds" in raw:
            raw = {**raw, "seeds": expand_seeds(raw["seeds"])}
        v = parse_keys(raw, SPEC, base)
        crawl = v["crawl"]
        if not crawl["allowed_hosts"]:
            hosts = [_seed_scope(s) for s in v["seeds"]]
            hosts.extend(registry.scope_hosts(hosts))   # a keyword search leads to Kugou's song pages
            crawl["allowed_hosts"] = tuple(dict.fromkeys(hosts))
        _check_refresh(crawl)
        _check_dedup(v["dedup"])
        sched = v["scheduling"]
        if sched["heartbeat_timeout"] <= sched["heartbeat_interval"]:
            raise ConfigError("scheduling.heartbeat_timeout", "must be longer than scheduling.heartbeat_interval")
        if sched["lease_timeout"] <= sched["heartbeat_interval"]:
            # A worker's heartbeat renews the leases it works on: one must come before a lease can expire.
            raise ConfigError("scheduling.lease_timeout", "must be longer than scheduling.heartbeat_interval")
        p = v["politeness"]
        if p["max_delay"] < p["min_delay"]:
            raise ConfigError("politeness.max_delay", "must not be below politeness.min_delay")
        if p["backoff_max"] < p["backoff_base"]:
            raise ConfigError("politeness.backoff_max", "must not be below politeness.backoff_base")
        # PolitenessConfig's own checks (an empty user_agent, say) come out as "politeness: ..." errors.
        cfg = from_values(cls, v)
        if (cfg.alerts.webhook is None) != (cfg.alerts.secret is None):
            raise ConfigError("alerts.secret_file" if cfg.alerts.secret is None else "alerts.webhook",
                              "alerts.webhook and alerts.secret_file go together")
        web = cfg.web
        if web.listen is not None and web.token is None and not _is_loopback(web.listen[0]):
            # The page shows the crawl's URLs and catalogue: never to the network without a token.
            raise ConfigError("web.listen", f"{web.listen[0]} is not a loopback address: set web.token_file "
                                            "to serve the status page and metrics beyond this machine")
        # A Welcome a worker cannot read would keep every worker out: the sites table must fit in it.
        check_welcome_fits("sites", cfg.sites, tuple(x.wire for x in cfg.proxies),
                           rules=tuple(cfg.crawl.keep_fragment), networks=tuple(cfg.crawl.allowed_networks),
                           drop_params=tuple(cfg.crawl.drop_params))
        return cfg

    @classmethod
    def load(cls, path: Path) -> MasterConfig:
        return cls.from_mapping(load_yaml(path), path.resolve().parent)


SPEC = keys_of(MasterConfig)   # the YAML keys, derived from the fields above
