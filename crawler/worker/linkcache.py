"""A bounded memory of links this worker already reported, so the site's navigation is not sent on every page."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class LinkCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._seen: OrderedDict[str, None] = OrderedDict()

    def fresh(self, links: Iterable[str]) -> list[str]:
        """The links not reported recently (and remembers them); order kept, duplicates dropped."""
        seen = self._seen
        out = []
        for u in links:
            if u in seen:
                seen.move_to_end(u)
                continue
            seen[u] = None
            out.append(u)
        while len(seen) > self.size:
            seen.popitem(last=False)
        return out

    def forget(self) -> None:
        """After a reconnect the master may have lost what we told it: report everything again."""
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._seen)
