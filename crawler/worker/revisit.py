"""What a worker keeps for the next visit of a page: the page's change signal, and the audio it last listed.

**Change signal.** Whether a page changed is decided by the master from a 64-bit digest the worker sends with
each 2xx answer. A digest of the raw body would call a page changed on every visit when it carries a clock, a
visit counter or a per-request token; what matters to the crawl is what it takes from the page: its links, its
audio references and the audio items with their metadata. ``content_digest`` hashes that, as a sorted set (the
order of a page's blocks, or a link given twice, is no change either). Item addresses are taken by the
catalogue's key (the site's own id when the resolver knows it): per-client download tokens are no change.

**Audio of a page answered 304.** A page that answers 304 is not parsed, so its audio would only be looked at
again on its next full answer, however long the worker's ``revalidate_after``. ``PageAudio`` remembers, for the
pages this worker fetched in full, the audio each listed, so that a 304 still sends that audio through the
downloader (which asks its server again, conditionally, once ``revalidate_after`` has passed). The memory is of
one answer: it is used only for a conditional fetch with that answer's validators, so a 304 confirms exactly the
answer remembered. A page the worker has no such memory of (fetched in full by another node since, forgotten, or
before a restart) is fetched in full: its validators are dropped, so the visit both lists and revalidates its
audio. Only audio whose address is the page's
own link is replayed from memory (the generic resolver's, without a client identity): a site plugin's download
links expire and bind to the client that asked, so such a page is always fetched in full.

Memory is bounded: at most ``PAGES`` pages and ``ITEMS`` items (least recently visited forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import mmh3

from crawler.items import AudioItem

PAGES = 100_000       # pages whose audio is remembered
ITEMS = 200_000       # audio items remembered over all pages
PAGE_ITEMS = 256      # a page listing more is not remembered: it is fetched in full on each visit
REPLAYED_BY = "generic"

Validators = tuple[str | None, str | None]   # (ETag, Last-Modified) of a full answer, as a conditional fetch sends

# The item fields that are what a page says about its audio (not what a download found, nor its status).
_ITEM_FIELDS = ("title", "artist", "album", "duration", "description", "cover", "published", "lyrics")


def content_digest(links: Iterable[str], refs: Iterable[str], items: Iterable[AudioItem]) -> int:
    """A signed 64-bit digest of what the crawl extracted from a page, as a sorted set."""
    # The sorted set of "A ...", "L <link>" and "R <ref>" lines, made group by group: the groups sort in that
    # order by their first letter, and within a group the lines sort as what follows the shared prefix. So a
    # page's links are sorted and joined as they are, not each copied into a prefixed string first.
    groups = []
    if items:
        lines = set()
        for i in items:
            key = f"{i.resolver}:{i.source_id}" if i.source_id else i.url
            lines.add("A " + "\t".join([key, i.page, *("" if (v := getattr(i, f)) is None else str(v)
                                                       for f in _ITEM_FIELDS)]))
        groups.append("\n".join(sorted(lines)))
    for prefix, urls in (("L ", links), ("R ", refs)):
        unique = sorted(set(urls))
        if unique:
            groups.append(prefix + f"\n{prefix}".join(unique))
    text = "\n".join(groups)
    return int(mmh3.hash64(text.encode("utf-8", "surrogatepass"), signed=True)[0])


class PageAudio:
    """Page URL -> the audio its last full answer listed (possibly none), least recently visited first."""

    def __init__(self, pages: int = PAGES, items: int = ITEMS) -> None:
        self.pages = pages
        self.items = items
        self._by_page: OrderedDict[str, tuple[Validators, tuple[AudioItem, ...]]] = OrderedDict()
        self._count = 0

    def remember(self, page: str, validators: Validators, items: Sequence[AudioItem]) -> None:
        """A full answer of `page`, with these validators (ETag, Last-Modified), listed these items (its whole
        list: a failed resolver's partial one is not given here). A list that cannot be replayed is not kept:
        the page is then fetched in full next time."""
        self.forget(page)
        if (validators == (None, None) or len(items) > PAGE_ITEMS
                or any(i.resolver != REPLAYED_BY or i.identity is not None for i in items)):
            return
        self._by_page[page] = (validators, tuple(items))
        self._count += len(items)
        while len(self._by_page) > self.pages or self._count > self.items:
            _, (_, dropped) = self._by_page.popitem(last=False)
            self._count -= len(dropped)

    def known(self, page: str, validators: Validators | None) -> tuple[AudioItem, ...] | None:
        """The audio the page listed on the full answer these validators are of, when this worker fetched that
        answer; None when it does not know."""
        found = self._by_page.get(page)
        if found is None or validators is None or found[0] != tuple(validators):
            return None
        self._by_page.move_to_end(page)
        return found[1]

    def forget(self, page: str) -> None:
        dropped = self._by_page.pop(page, None)
        if dropped is not None:
            self._count -= len(dropped[1])

    def __len__(self) -> int:
        return len(self._by_page)
