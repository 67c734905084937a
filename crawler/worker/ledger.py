"""This worker's downloads as the master must hear of them: synchronous and socket-free, the twin of
master/downloads.py on the other end of the wire.

A download asks the master's leave first (protocol.DownloadAsk, a ticket of this worker's own numbering), and
tells it when it ended (protocol.DownloadDone: its host's slot is free for the cluster). Downloads run as this
worker's own jobs, apart from the page that found them: the page's report names them pending, and each job's
outcome follows on its own (protocol.DownloadReport). The server feeds this ledger what happens, with the loop's
`now`, carries out what it returns (start a job, send by a time) and sends the frames `flush()` hands it; the
asyncio objects (the job tasks, the futures an ask waits on, the timer) stay the server's.

| the event                                      | what the ledger does                                        |
|------------------------------------------------|-------------------------------------------------------------|
| a download asks (connected)                    | a ticket; the ask goes out within `ask_delay` (the asks of  |
|                                                | a burst share a frame, and the grant frame back)            |
| a granted download ends (connected)            | its end goes out at once (this loop turn): a slot is freed  |
| either, with no master                         | nothing is sent: the session that granted it is gone        |
| a page reports an item pending                 | its job starts, unless one for (page, address) runs already |
| a job ends                                     | its outcome is settled; it goes out at once, or, while the  |
|                                                | page that named it pending is unreported, once that is sent |
| the master hands a download over (DownloadWork)| a job, unless one runs already or it ended lately (then its |
|                                                | outcome goes again, the download is not fetched twice)      |
| a job's file is fingerprinted after it ended   | the outcome with it takes the place of the one held or      |
| (`refined`)                                    | unsent, else goes again (after the page report carrying it) |
| the connection ends                            | asks and ends unsent are dropped (the asks are made again); |
|                                                | outcomes held for unsent reports, and those unsent, stay    |
|                                                | for the next session                                        |

Memory is bounded: at most `pending_max` jobs (about: a page's items start together; while that many are pending
the worker grants no credit, so it takes no new pages), outcomes settled are remembered up to `kept` (oldest first
forgotten), asks out are bounded by the server's ask slots, outcomes waiting to go by the jobs that made them.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

from crawler import items as it
from crawler import protocol as p
from crawler.worker.recording import is_live

# Download asks wait this long for others to share their frame. They come one at a time (a download's ask slot
# frees as its bytes arrive), and a frame each, with the master's grant frame back, cost more CPU than the rest of
# the exchange; a worker asks twice its downloads ahead, so the wait costs no download its start.
ASK_DELAY = 0.005
SETTLED_KEPT = 4096

Key = tuple[str, str]     # a download: (the page that reported it, the address as reported)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What is due to the master, in the order it is sent: ends first (a slot freed may be what an ask of the
    same flush waits for), then asks, then outcomes."""

    ends: tuple[p.DownloadEnd, ...] = ()
    asks: tuple[tuple[int, str], ...] = ()
    outcomes: tuple[tuple[str, it.AudioItem], ...] = ()


class DownloadLedger:
    def __init__(self, pending_max: int, ask_delay: float = ASK_DELAY, kept: int = SETTLED_KEPT,
                 fingerprint_of: Callable[[str], bytes | None] | None = None) -> None:
        """fingerprint_of: a stored file's fingerprint by its sha256, if still known (the fingerprint pool's
        cache): outcomes remembered are kept without theirs, which may be as large as a frame."""
        self.pending_max = pending_max
        self._fingerprint_of = fingerprint_of or (lambda sha256: None)
        self.ask_delay = ask_delay
        self.kept = kept
        self.connected = False                                 # a session with the master is up
        self._tickets = itertools.count(1)
        self._asks: list[tuple[int, str]] = []                 # not sent yet
        self._ends: list[p.DownloadEnd] = []                   # not sent yet
        self._outcomes: list[tuple[str, it.AudioItem]] = []    # ended, not sent yet (kept across a reconnect)
        self._send_at: float | None = None                     # the flush the server has been asked for
        self._pending: set[Key] = set()                        # jobs running
        # Recent outcomes, for a download the master hands back after a reconnect: sent again, not fetched.
        # Without their fingerprints (see _remember).
        self._settled: OrderedDict[Key, it.AudioItem] = OrderedDict()
        # An outcome goes to the master only after the page that reported its item pending (else it would find
        # nothing pending): the downloads whose page's report is not sent yet, and the outcomes held for them.
        self._unreported: set[Key] = set()
        self._held: dict[Key, it.AudioItem] = {}

    @property
    def full(self) -> bool:
        """As many downloads pending as the worker may hold: it grants the master no credit meanwhile."""
        return len(self._pending) >= self.pending_max

    def pending(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ the session
    def connect(self, now: float) -> float | None:
        """A session is up. Returns when to flush: the outcomes that ended while the master was away go now."""
        self.connected = True
        self._asks, self._ends = [], []
        self._send_at = None
        return self._due(now) if self._outcomes else None

    def disconnect(self) -> None:
        """The session is gone. Reports it did not send are lost with it (their pages are fetched again): the
        outcomes held for them go to the next session, where the master takes those it still waits for."""
        self.connected = False
        self._send_at = None
        self.reported(list(self._unreported), 0.0)

    # ------------------------------------------------------------------ the master's leave
    def ask(self, url: str, now: float) -> tuple[int, float | None]:
        """A download wants the master's leave: its ticket, and when to flush (None: a flush is arranged)."""
        ticket = next(self._tickets)
        self._asks.append((ticket, url))
        return ticket, self._due(now + self.ask_delay)

    def end(self, ticket: int | None, done: it.AudioItem | None, now: float) -> float | None:
        """A granted download ended (done None: it stopped without an outcome). Without a ticket, or when the
        session that granted it is gone (and with it the master's count of this download), nothing is sent."""
        if ticket is None or not self.connected:
            return None
        # A live recording is one window of a stream: no other node's visit may take it for its own.
        if done is not None and done.status == it.OK and done.sha256 and not is_live(done):
            self._ends.append(p.DownloadEnd(ticket, done.sha256, done.size, done.path))
        else:
            self._ends.append(p.DownloadEnd(ticket))
        return self._due(now)

    # ------------------------------------------------------------------ jobs
    def start(self, item: it.AudioItem) -> tuple[it.AudioItem, bool]:
        """A page reports item: the item as its report lists it (pending), and whether a job must start (not
        when one for the same download runs already)."""
        key = (item.page, item.url)
        self._unreported.add(key)
        fresh = key not in self._pending
        self._pending.add(key)
        return item.replace(status=it.PENDING, fingerprint=None), fresh

    def take(self, item: it.AudioItem, now: float) -> tuple[bool, float | None]:
        """Download-only work from the master: another node's pending download, or one of this node's own sent
        again after it rejoined. Whether a job must start (not for one running, nor one that ended lately:
        its outcome goes again), and when to flush."""
        key = (item.page, item.url)
        if key in self._pending:
            return False, None
        done = self._settled.get(key)
        if done is not None:
            return False, self._queue(key[1], self._recalled(done), now)
        self._pending.add(key)
        return True, None

    def ended(self, key: Key, done: it.AudioItem, now: float) -> tuple[it.AudioItem, float | None]:
        """A job ended: its outcome as the master will take it (only ok or failed, within the wire's limits),
        and when to flush."""
        self._pending.discard(key)
        if done.status not in (it.OK, it.FAILED):
            done = done.replace(status=it.FAILED, reason=done.reason or f"download ended {done.status}")
        done = outcome_within_limits(key[1], done)
        self._remember(key, done)
        while len(self._settled) > self.kept:
            self._settled.popitem(last=False)
        if key in self._unreported:
            self._held[key] = done
            return done, None
        return done, self._queue(key[1], done, now)

    def refined(self, key: Key, done: it.AudioItem, now: float) -> float | None:
        """A download's outcome made more complete after it ended (its file's fingerprint, made late): it takes
        the place of the one held for an unsent report or waiting to go, else it goes to the master again (as
        any outcome: the master takes it as a repeat). Returns when to flush."""
        done = outcome_within_limits(key[1], done)
        if key in self._settled:
            self._remember(key, done)
        if key in self._held or key in self._unreported:
            self._held[key] = done
            return None
        for i, (url, queued) in enumerate(self._outcomes):
            if url == key[1] and queued.page == key[0]:
                self._outcomes[i] = (url, done)
                return None
        return self._queue(key[1], done, now)

    def dropped(self, key: Key) -> None:
        """A job stopped without an outcome (the worker stops)."""
        self._pending.discard(key)

    def reported(self, keys: Collection[Key], now: float) -> float | None:
        """The reports naming these downloads pending were sent: their outcomes may follow."""
        at = None
        for key in keys:
            self._unreported.discard(key)
            done = self._held.pop(key, None)
            if done is not None:
                due = self._queue(key[1], done, now)
                at = due if due is not None else at
        return at

    def outcomes_of(self, keys: Collection[Key]) -> dict[Key, it.AudioItem]:
        """The outcomes of these downloads that ended, for their page's report to carry in place of its pending
        items: taken, so they are not sent apart as well. They stay unreported until that report is sent
        (`reported`): a later refinement of one (its fingerprint) is held until then."""
        ended: dict[Key, it.AudioItem] = {}
        for key in keys:
            done = self._held.pop(key, None)
            if done is not None:
                pass
            elif key not in self._pending:
                # Ended, and its outcome taken by another report naming the same download (a page leased
                # again while its first visit waited): the latest outcome of the key is the same.
                done = self._settled.get(key)
                done = done and self._recalled(done)
            if done is not None:
                ended[key] = done
        return ended

    # ------------------------------------------------------------------ out
    def flush(self) -> Outgoing:
        """What is due to the master now (nothing without a session); the server sends it."""
        self._send_at = None
        if not self.connected:
            return Outgoing()
        out = Outgoing(tuple(self._ends), tuple(self._asks), tuple(self._outcomes))
        self._asks, self._ends, self._outcomes = [], [], []
        return out

    def unsent(self, outcomes: tuple[tuple[str, it.AudioItem], ...]) -> None:
        """Outcomes a flush could not send: they go first next time (the next session, most likely)."""
        self._outcomes[:0] = outcomes

    # ------------------------------------------------------------------ inside
    def _remember(self, key: Key, done: it.AudioItem) -> None:
        self._settled[key] = done.replace(fingerprint=None) if done.fingerprint else done
        self._settled.move_to_end(key)

    def _recalled(self, done: it.AudioItem) -> it.AudioItem:
        fp = self._fingerprint_of(done.sha256) if done.sha256 and done.status == it.OK else None
        return done.replace(fingerprint=fp) if fp else done

    def _queue(self, url: str, done: it.AudioItem, now: float) -> float | None:
        self._outcomes.append((url, done))
        return self._due(now)

    def _due(self, at: float) -> float | None:
        """A flush is wanted by `at`: returns it when the server must arrange one (none is, or a later one)."""
        if not self.connected or (self._send_at is not None and self._send_at <= at):
            return None
        self._send_at = at
        return at


def outcome_within_limits(url: str, done: it.AudioItem) -> it.AudioItem:
    """The outcome as the master will take it: what a file's tags add past the wire's limits is dropped (the
    item as its page reported it passed them already), so a hostile file cannot cost the connection."""
    try:
        p.check_result(p.Result(0, url, p.DONE, audio=(done,)))
        return done
    except p.ProtocolError:
        pass
    trimmed = done.replace(file_tags={}, lyrics=None, description=None, meta_source={})
    try:
        p.check_result(p.Result(0, url, p.DONE, audio=(trimmed,)))
        return trimmed
    except p.ProtocolError as e:
        return it.AudioItem(url=done.url, page=done.page, status=it.FAILED, resolver=done.resolver,
                            reason=f"outcome out of the wire's limits: {str(e)[:200]}")
