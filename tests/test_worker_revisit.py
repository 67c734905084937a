"""What a worker keeps for a page's next visit: the change signal of what the crawl took from it, and the audio it
listed, replayed when the page answers 304 (crawler/worker/revisit.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crawler.items import AudioItem, RequestIdentity
from crawler.worker.revisit import PAGE_ITEMS, PageAudio, content_digest

PAGE = "http://s/song.html"


def song(n, **kw):
    return AudioItem(url=f"http://cdn/{n}.mp3", page=PAGE, title=f"Song {n}", **kw)


def test_the_digest_is_of_what_the_crawl_takes_not_of_the_bytes():
    base = content_digest(["http://s/a", "http://s/b"], ["http://s/l.m3u"], [song(1)])
    # The same set, in another order, a link given twice, a download's outcome: no change.
    assert content_digest(["http://s/b", "http://s/a", "http://s/a"], ["http://s/l.m3u"],
                          [song(1, status="pending", sha256="f" * 64, size=9)]) == base
    # A per-client token in the address of an item the site identifies by its own id: no change.
    assert (content_digest([], [], [song(1, source_id="42", resolver="kugou").replace(url="http://cdn/1?t=9")])
            == content_digest([], [], [song(1, source_id="42", resolver="kugou").replace(url="http://cdn/1?t=8")]))
    # A link, a reference, an item or its metadata that differs: a change.
    others = [content_digest(["http://s/a"], ["http://s/l.m3u"], [song(1)]),
              content_digest(["http://s/a", "http://s/b"], [], [song(1)]),
              content_digest(["http://s/a", "http://s/b"], ["http://s/l.m3u"], [song(2)]),
              content_digest(["http://s/a", "http://s/b"], ["http://s/l.m3u"], [song(1).replace(title="Other")])]
    assert len({base, *others}) == 5
    assert all(-(1 << 63) <= d < (1 << 63) for d in others)
    # A link and a reference of the same address are not the same thing.
    assert content_digest(["http://s/x"], [], []) != content_digest([], ["http://s/x"], [])


V1 = ('"e1"', None)


def test_the_audio_of_a_page_is_remembered_for_the_answer_it_came_with():
    mem = PageAudio()
    mem.remember(PAGE, V1, [song(1), song(2)])
    assert mem.known(PAGE, V1) == (song(1), song(2))
    # Validators of another answer (another node fetched the page in full since): this memory is not of it.
    assert mem.known(PAGE, ('"e2"', None)) is None and mem.known(PAGE, None) is None
    # A page without validators is never fetched conditionally: nothing to keep.
    mem.remember("http://s/plain", (None, None), [song(3)])
    assert mem.known("http://s/plain", (None, None)) is None and len(mem) == 1


def test_the_audio_of_a_page_is_remembered_within_bounds():
    mem = PageAudio(pages=3, items=4)
    assert mem.known(PAGE, V1) is None
    mem.remember(PAGE, V1, [song(1), song(2)])
    mem.remember("http://s/empty", V1, [])
    assert mem.known(PAGE, V1) == (song(1), song(2)) and mem.known("http://s/empty", V1) == ()
    mem.remember("http://s/c", V1, [song(3)])
    mem.remember("http://s/d", V1, [song(4)])            # four pages: the least recently visited one goes
    assert mem.known(PAGE, V1) is None and len(mem) == 3
    mem.remember("http://s/c", V1, [song(3), song(7)])
    mem.remember("http://s/e", V1, [song(5), song(6)])   # five items: pages go, oldest first, until four are left
    assert [mem.known(u, V1) is not None for u in ("http://s/empty", "http://s/d", "http://s/c", "http://s/e")] == [
        False, False, True, True]
    # A list that cannot be replayed (a site plugin's links expire, or bind to a client) is not kept: its page is
    # fetched in full on its next visit.
    mem.remember("http://s/e", V1, [song(5, resolver="kugou")])
    assert mem.known("http://s/e", V1) is None
    mem.remember("http://s/e", V1, [song(5, identity=RequestIdentity(user_agent="x"))])
    assert mem.known("http://s/e", V1) is None
    big = PageAudio()
    big.remember(PAGE, V1, [song(i) for i in range(PAGE_ITEMS + 1)])
    assert big.known(PAGE, V1) is None
    big.remember(PAGE, V1, [song(1)])
    big.forget(PAGE)
    assert big.known(PAGE, V1) is None and len(big) == 0


def _reference_digest(links, refs, items) -> int:
    """content_digest as first written: one set of prefixed lines, sorted whole."""
    import mmh3

    from crawler.worker.revisit import _ITEM_FIELDS
    lines = {f"L {u}" for u in links}
    lines.update(f"R {u}" for u in refs)
    for i in items:
        key = f"{i.resolver}:{i.source_id}" if i.source_id else i.url
        lines.add("A " + "\t".join([key, i.page, *("" if (v := getattr(i, f)) is None else str(v)
                                                   for f in _ITEM_FIELDS)]))
    return int(mmh3.hash64("\n".join(sorted(lines)).encode("utf-8", "surrogatepass"), signed=True)[0])


_URLS = st.lists(st.sampled_from(["http://s/a", "http://s/b", "http://s/a\n", "", "A x", "L y", "http://s/é",
                                  "http://s/\udcff", "\x00", "http://s/a b"]) | st.text(max_size=8), max_size=6)


@settings(max_examples=1500, deadline=None)
@given(_URLS, _URLS, st.lists(st.builds(AudioItem, url=st.sampled_from(["http://cdn/1.mp3", "http://cdn/2.mp3"]),
                                        page=st.just(PAGE), title=st.none() | st.text(max_size=4),
                                        duration=st.none() | st.floats(1, 9),
                                        source_id=st.none() | st.sampled_from(["1", "2"])), max_size=3))
def test_the_digest_is_the_first_definitions(links, refs, items):
    assert content_digest(links, refs, items) == _reference_digest(links, refs, items)
