"""When to visit a fetched page again, and whether it changed since the last visit: pure, time passed in.

Each page keeps its own revisit interval. It starts at ``crawl.refresh_interval``; a visit that finds the page
changed divides it by ``FACTOR``, a visit that finds it unchanged multiplies it by ``FACTOR``, within
``crawl.refresh_min`` and ``crawl.refresh_max``. Pages that change often are then visited often and static
pages rarely, which is how a fixed number of visits keeps the most pages fresh (Cho and Garcia-Molina,
"Effective page refresh policies for web crawlers", TODS 2003) and how Heritrix's adaptive revisit frontier
waits (its WaitEvaluator: unchanged and changed factors of 1.5). A page that yielded audio on its last visit
(an audio hub, where new audio appears) is visited every ``crawl.refresh_hub_interval`` when that is set.

Changed means: answered 304 -> not changed; a 2xx body -> its digest differs from the last one; otherwise the
HTTP status differs from the last one (a page that went 404, or came back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

FACTOR = 1.5
GONE_STATUSES = frozenset({404, 410})


@dataclass(frozen=True, slots=True)
class RevisitPolicy:
    base: float                 # crawl.refresh_interval
    min: float                  # crawl.refresh_min
    max: float                  # crawl.refresh_max
    hub: float | None = None    # crawl.refresh_hub_interval

    def interval(self, previous: float | None, changed: bool, hub: bool) -> float:
        """The wait until the next visit, after a visit that found the page changed or not."""
        if hub and self.hub is not None:
            return self.hub
        if previous is None:
            return min(max(self.base, self.min), self.max)
        wait = previous / FACTOR if changed else previous * FACTOR
        return min(max(wait, self.min), self.max)


class RefreshSettings(Protocol):
    @property
    def refresh_interval(self) -> float | None: ...
    @property
    def refresh_min(self) -> float | None: ...
    @property
    def refresh_max(self) -> float | None: ...
    @property
    def refresh_hub_interval(self) -> float | None: ...


def revisit_policy(c: RefreshSettings) -> RevisitPolicy | None:
    """The policy of a crawl's config (None: refresh is off). Unset bounds are a quarter and four times the
    base interval."""
    if c.refresh_interval is None:
        return None
    base = c.refresh_interval
    return RevisitPolicy(base, c.refresh_min if c.refresh_min is not None else base / 4,
                         c.refresh_max if c.refresh_max is not None else base * 4, c.refresh_hub_interval)


def changed(status: int | None, digest: int | None, last_status: int | None, last_digest: int | None) -> bool:
    """Whether a revisit found the page different from its last visit (see the module's docstring)."""
    if status == 304:
        return False
    if status is not None and 200 <= status < 300 and digest is not None and last_digest is not None:
        return digest != last_digest
    return status != last_status


def gone(status: int | None) -> bool:
    """The page no longer holds what it held: not found, gone, or moved away (a redirect is not followed, its
    target is a page of its own)."""
    return status is not None and (status in GONE_STATUSES or 300 <= status < 400 and status != 304)
