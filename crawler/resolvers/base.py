"""The resolver interface: what the worker hands a resolver and what it gets back.

A resolver turns a fetched page (or, for some sites, just a URL) into audio items that carry the real
address and the client identity a download must reuse. Resolvers never raise on what a site sends them:
bad input becomes a failed item or nothing, so one odd page cannot take a worker down.
"""

from __future__ import annotations

import dataclasses
import time
import types
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from crawler.archive import NO_ARCHIVE, Archive
from crawler.config import unknown_key
from crawler.http.getter import Getter
from crawler.http.targets import TargetPolicy
from crawler.items import AudioItem, LinkMeta
from crawler.web.page import FetchedPage


class ResolverConfigError(ValueError):
    """A resolver's config section is wrong; the message names the key and the problem."""


class ResolverUnavailable(Exception):
    """A part of this node the resolver needs (a browser, say) failed: the task goes back to be retried, and the
    page is not blamed."""


@dataclass(frozen=True)
class ResolveContext:
    """What a resolver may use while resolving: the worker's HTTP stack and its defaults."""

    # API calls through http.client (httpx's API over the worker's stack: its timeouts, body cap, target policy).
    http: Getter
    user_agent: str
    clock: Callable[[], float] = time.time
    # A page fetch within the worker's limits (size, time, concurrency), for a page other than the one being
    # resolved: the page that linked an extensionless audio URL, say. None: no such fetches.
    fetch_page: Callable[[str], Awaitable[FetchedPage | None]] | None = None
    # The addresses the worker's client may reach (its crawl's, learned from the master): the browser's
    # connections obey the same. None: the public internet only.
    targets: TargetPolicy | None = None
    # Where the resolver's exchanges are recorded (crawler/archive/): API calls through ``http.client`` are
    # recorded by the stack; what a resolver sees otherwise (a browser's traffic, its rendered page) it records.
    archive: Archive = NO_ARCHIVE
    # The user agent a site's policy gives a URL (crawler/worker/siterules.py), None where it names none. API
    # calls through ``http.client`` get the sites' headers from the client itself; this is for what does not go
    # through it (a browser's context).
    site_user_agent: Callable[[str], str | None] | None = None

    def user_agent_for(self, url: str) -> str:
        """The user agent for a request to url with no identity of its own: its site's, else the worker's."""
        if self.site_user_agent is not None and (ua := self.site_user_agent(url)):
            return ua
        return self.user_agent


@dataclass
class Resolution:
    items: list[AudioItem] = field(default_factory=list)
    links: list[str] = field(default_factory=list)   # extra absolute links to crawl (playlists, ...)
    lastmod: dict[str, float] = field(default_factory=dict)   # link -> when its page last changed (sitemaps)
    # link -> what this page says about it, for links that may lead to audio without saying so (a playlist, a
    # stream named like a page): the names go with the link, so its audio needs no second look at this page.
    link_meta: dict[str, LinkMeta] = field(default_factory=dict)


class Resolver:
    """Base class of all resolvers. Subclasses set ``name`` and override what they need.

    A subclass reads its own config section with ``parse_section`` into a frozen dataclass, which rejects
    unknown keys. ``keep_fragment`` lists regexes, searched in a normalised URL without its fragment, of
    URLs whose fragment names the resource, so the URL normaliser keeps it.
    """

    name: ClassVar[str]
    keep_fragment: tuple[str, ...] = ()

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def claims(self, url: str) -> bool:
        raise NotImplementedError

    def needs_page(self, url: str) -> bool:
        return True

    def runs_after(self, url: str, page: FetchedPage | None, found: Resolution | None) -> bool:
        """Whether to resolve this page too, after the resolver that claimed it found ``found``.

        For resolvers too slow for every page (a real browser): they add to what the static ones found.
        """
        return False

    async def aclose(self) -> None:
        """Release what the resolver started (processes, connections) when the worker stops."""

    async def resolve(self, url: str, page: FetchedPage | None, ctx: ResolveContext) -> Resolution:
        raise NotImplementedError

    async def reresolve(self, item: AudioItem, ctx: ResolveContext) -> AudioItem | None:
        return None

    def audio_link(self, url: str) -> bool:
        return False

    # What a master asks of a site plugin, through the registry (registry.py), before any worker has joined.
    @classmethod
    def seed_url(cls, kind: str, words: str) -> str:
        """The URL a seed entry ``kind: words`` stands for (``kind`` one of registry.SEED_KINDS naming this
        resolver): the master makes it into a task, the resolver expands the page."""
        raise NotImplementedError

    @classmethod
    def default_keep_fragment(cls) -> tuple[str, ...]:
        """``keep_fragment`` under this resolver's default config: rules a master applies from the start."""
        return ()

    @classmethod
    def scope_hosts(cls, seed_hosts: Sequence[str]) -> tuple[str, ...]:
        """Hosts a crawl seeded on these hosts reaches through this site, beyond the seeds' own."""
        return ()


C = TypeVar("C")


def parse_section(schema: type[C], name: str, section: Mapping[str, Any] | None) -> C:
    """Build the frozen config dataclass ``schema`` from a resolver's YAML section.

    Unknown keys and wrongly typed values raise ResolverConfigError naming ``<resolver>.<key>``; lists
    become tuples so the result stays hashable and immutable. Range and format checks belong in the
    schema's ``__post_init__``, which may raise ResolverConfigError itself.
    """
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ResolverConfigError(f"{name}: section must be a mapping, got {type(section).__name__}")
    hints = typing.get_type_hints(schema)
    fields = {f.name for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in section.items():
        if key not in fields:
            raise ResolverConfigError(f"{name}.{key}: {unknown_key(key, fields)}")
        kwargs[key] = _coerce(f"{name}.{key}", hints[key], value)
    return schema(**kwargs)


def _coerce(where: str, hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(where, option, value)
            except ResolverConfigError as exc:
                errors.append(str(exc))
        raise ResolverConfigError(errors[0] if errors else f"{where}: must not be null")
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ResolverConfigError(f"{where}: must be a list")
        inner = typing.get_args(hint)[0]
        return tuple(_coerce(f"{where}[{i}]", inner, v) for i, v in enumerate(value))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResolverConfigError(f"{where}: must be a number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ResolverConfigError(f"{where}: must be an integer")
        return value
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise ResolverConfigError(f"{where}: must be a {hint.__name__}")
        return value
    return value
