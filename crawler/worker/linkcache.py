"""A bounded memory of links this worker already reported, so the site's navigation is not sent on every page."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class LinkCache:
    """Each link with the smallest depth it was reported at: a link seen again at a smaller depth (a shorter
    path to it) is reported again, so the master can lower its depth; seen again as deep or deeper, it is not."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._seen: OrderedDict[str, int] = OrderedDict()

    def fresh(self, links: Iterable[str], depth: int = 0) -> list[str]:
        """The links not reported recently at `depth` or less (and remembers them at depth); order kept,
        duplicates dropped."""
        seen = self._seen
        out = []
        for u in links:
            known = seen.get(u)
            if known is not None:
                seen.move_to_end(u)
                if known <= depth:
                    continue
            seen[u] = depth
            out.append(u)
        while len(seen) > self.size:
            seen.popitem(last=False)
        return out

    def forget(self) -> None:
        """After a reconnect the master may have lost what we told it: report everything again."""
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._seen)
