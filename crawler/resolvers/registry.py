"""Which resolvers run, in which order: built-ins by name, third-party ones through an entry point."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from crawler.resolvers.base import Resolution, Resolver, ResolverConfigError
from crawler.web.page import FetchedPage

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "crawler.resolvers"
GENERIC = "generic"
# Dotted paths, imported on demand so a worker that does not enable a resolver never imports it.
BUILTINS = {
    "kugou": "crawler.resolvers.kugou:KugouResolver",
    "browser": "crawler.resolvers.browser:BrowserResolver",
    GENERIC: "crawler.resolvers.generic:GenericResolver",
}
# Seed entries that are not URLs (``kugou-search: WORDS`` among a master's seeds), by key: the built-in that makes
# them into URLs (Resolver.seed_url).
SEED_KINDS = {"kugou-search": "kugou"}
# Built-ins whose URL rules a master applies before any worker with them has joined: the fragments their pages
# keep (Resolver.default_keep_fragment), the hosts their seeds lead to (Resolver.scope_hosts).
MASTER_RULES = ("kugou",)


def entry_points(group: str) -> Sequence[EntryPoint]:
    """The installed plugins' entry points of a group. importlib.metadata is imported only when a resolver is not
    a built-in: it costs a daemon's start-up about 10 ms."""
    from importlib.metadata import entry_points as installed

    return tuple(installed(group=group))


def _load_class(name: str) -> type[Resolver]:
    if name in BUILTINS:
        module_name, _, attr = BUILTINS[name].partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
    else:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            known = sorted(set(BUILTINS) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})
            raise ResolverConfigError(f"{name}: unknown resolver (known: {', '.join(known)})")
        try:
            cls = found[0].load()
        except Exception as exc:  # a broken plugin must be reported as a config problem, with its cause
            raise ResolverConfigError(f"{name}: entry point {found[0].value} failed to load: {exc!r}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Resolver)):
        raise ResolverConfigError(f"{name}: {cls!r} is not a Resolver subclass")
    return cls


def seed_url(kind: str, words: str) -> str:
    """The URL the seed entry ``kind: words`` stands for; kind is one of SEED_KINDS."""
    return _load_class(SEED_KINDS[kind]).seed_url(kind, words)


def default_keep_fragment() -> tuple[str, ...]:
    """The fragment rules a master keeps URLs by from the start (crawl.keep_fragment's default)."""
    return tuple(rule for name in MASTER_RULES for rule in _load_class(name).default_keep_fragment())


def scope_hosts(seed_hosts: Sequence[str]) -> tuple[str, ...]:
    """Hosts a crawl seeded on these hosts reaches through the built-in sites, beyond the seeds' own."""
    return tuple(host for name in MASTER_RULES for host in _load_class(name).scope_hosts(seed_hosts))


def load_resolvers(sections: Mapping[str, Mapping[str, Any] | None]) -> list[Resolver]:
    """Instances in config order, each given only its own section; the generic resolver always last."""
    resolvers: list[Resolver] = []
    for name, section in sections.items():
        if name == GENERIC:
            continue
        resolvers.append(_load_class(name)(section or {}))
    resolvers.append(_load_class(GENERIC)(sections.get(GENERIC) or {}))
    log.info("resolvers: %s", ", ".join(r.name for r in resolvers))
    return resolvers


def pick(resolvers: Sequence[Resolver], url: str) -> Resolver:
    """The first resolver that claims ``url``; the generic one, last, claims every http(s) URL."""
    for resolver in resolvers:
        if resolver.claims(url):
            return resolver
    return resolvers[-1]


def followers(resolvers: Sequence[Resolver], picked: Resolver, url: str, page: FetchedPage | None,
              found: Resolution | None) -> list[Resolver]:
    """The resolvers that run after ``picked`` on this page, in config order (see Resolver.runs_after)."""
    return [r for r in resolvers if r is not picked and r.runs_after(url, page, found)]
