"""The references' triplets in an inverted index (hash -> postings), matched by one consistent time scale and offset.

Postings live in segments, each a CSR table: the postings sorted by hash and one offset per hash cell, so a query's
hashes are looked up as one numpy batch (no scan of the references). Added works collect in a pending buffer that
becomes a segment before the next match; segments are merged when they grow many, dropping removed works. A posting
costs 8 bytes (work number, anchor frame, anchor log frequency, span).

A match is verified, not counted: for a candidate work the pairs of (query triplet, reference triplet) that share a
hash vote in a Hough space of (time scale, offset); the best cell's pairs, refined by a least-squares fit and checked
for one frequency shift, are the score. Unrelated audio shares hashes with a work by chance, but not along one line.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from crawler.identify.errors import IdentifyError
from crawler.identify.fingerprint import Fingerprint, decode_fingerprint

HASH_BITS = 22
_CELLS = 1 << HASH_BITS

# Quantisation of each triplet feature: (cell width, tolerance in cells). A query feature within the tolerance of
# its cell's edge also looks up the neighbouring cell.
_R_CELLS = 10            # the time ratio in [0, 1]: 10 cells
_R_TOL = 0.4             # 0.04 of the ratio (a frame's jitter on a short span)
_D_STEP = 100 / 12       # the log-frequency differences (1/100 octave units): one semitone a cell
_D_TOL = 0.36            # 0.03 octave
_F_STEP = 25.0           # the anchor's log frequency (1/50 octave units): half an octave a cell
_F_TOL = 0.17            # 0.085 octave: the pitch moved by 5% plus measurement
_DT_LOG = float(np.log(1.3))   # the span in frames: cells of a factor 1.3
_DT_TOL = 0.3            # a factor 1.08: 5% faster or slower plus a frame of jitter

SCALES = np.arange(0.94, 1.0601, 0.002)   # time scales the Hough search tries (reference time per query time)
_OFFSET_BIN = 5          # frames per offset cell in the Hough search (0.16 s)
_LF_TOL = 4              # 1/50 octave: pairs off the copy's frequency shift by more are not inliers
CANDIDATES = 10          # works verified per query (those sharing the most hashes)
MIN_SCORE = 10           # consistent triplet pairs a match needs (unrelated audio scores 3 or less; a 20 s excerpt 16+)
MAX_POSTINGS = 5000      # a hash with more postings than this (a stop word) is skipped in a query


def _features(recs: npt.NDArray[np.void]) -> list[npt.NDArray[np.float64]]:
    r = recs["r"].astype(np.float64) / 255.0 * _R_CELLS
    d12 = recs["d12"].astype(np.float64) / _D_STEP + 16.0
    d13 = recs["d13"].astype(np.float64) / _D_STEP + 16.0
    f1 = recs["lf1"].astype(np.float64) / _F_STEP
    dt = np.log(np.maximum(recs["dt"].astype(np.float64), 1.0)) / _DT_LOG
    return [r, d12, d13, f1, dt]


_BITS = (4, 5, 5, 4, 4)
_TOLS = (_R_TOL, _D_TOL, _D_TOL, _F_TOL, _DT_TOL)


def _pack(cells: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    h = np.zeros(len(cells[0]), np.int64)
    for c, bits in zip(cells, _BITS, strict=True):
        h = (h << bits) | np.clip(c, 0, (1 << bits) - 1)
    return h


def reference_hashes(recs: npt.NDArray[np.void]) -> npt.NDArray[np.int64]:
    """Each triplet's one hash cell (the reference side)."""
    return _pack([np.floor(x).astype(np.int64) for x in _features(recs)])


def query_hashes(recs: npt.NDArray[np.void]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The hash cells a query triplet may meet its reference in: (hashes, the triplet each belongs to)."""
    base: list[npt.NDArray[np.int64]] = []
    alt: list[npt.NDArray[np.int64]] = []
    has: list[npt.NDArray[np.bool_]] = []
    for x, tol in zip(_features(recs), _TOLS, strict=True):
        b = np.floor(x)
        frac = x - b
        low, high = frac < tol, frac > 1 - tol
        base.append(b.astype(np.int64))
        alt.append((b + np.where(low, -1, 1)).astype(np.int64))
        has.append(low | high)
    n = len(recs)
    hashes: list[npt.NDArray[np.int64]] = []
    owners: list[npt.NDArray[np.int64]] = []
    for combo in range(1 << len(base)):
        sel = np.ones(n, np.bool_)
        cells = []
        for k in range(len(base)):
            if combo >> k & 1:
                sel &= has[k]
                cells.append(alt[k])
            else:
                cells.append(base[k])
        idx = np.nonzero(sel)[0]
        if len(idx):
            hashes.append(_pack([c[idx] for c in cells]))
            owners.append(idx)
    return np.concatenate(hashes), np.concatenate(owners)


@dataclass(frozen=True, slots=True)
class Match:
    work: str        # the reference's work id
    score: float     # how sure: higher is surer; only matches over the index's threshold are returned
    offset: float    # seconds into the work where the copy starts
    # Where in the query the work was heard: the span of its consistent pairs (a recording of a station holds
    # several works, each at its own place). Seconds from the query's start, and how long.
    at: float = 0.0
    length: float = 0.0


@dataclass(frozen=True, slots=True)
class _Segment:
    offsets: npt.NDArray[np.uint32]     # _CELLS + 1: postings of hash h are [offsets[h], offsets[h + 1])
    work: npt.NDArray[np.int32]
    t1: npt.NDArray[np.uint16]
    lf1: npt.NDArray[np.uint8]
    dt: npt.NDArray[np.uint8]

    @property
    def nbytes(self) -> int:
        return int(self.offsets.nbytes + self.work.nbytes + self.t1.nbytes + self.lf1.nbytes + self.dt.nbytes)


def _build(parts: list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.int32], npt.NDArray[np.uint16],
                             npt.NDArray[np.uint8], npt.NDArray[np.uint8]]]) -> _Segment:
    hashes = np.concatenate([p[0] for p in parts])
    order = np.argsort(hashes, kind="stable")
    counts = np.bincount(hashes, minlength=_CELLS)
    offsets = np.zeros(_CELLS + 1, np.uint32)
    np.cumsum(counts, out=offsets[1:])
    return _Segment(offsets=offsets,
                    work=np.concatenate([p[1] for p in parts])[order],
                    t1=np.concatenate([p[2] for p in parts])[order],
                    lf1=np.concatenate([p[3] for p in parts])[order],
                    dt=np.concatenate([p[4] for p in parts])[order])


def _merge(a: _Segment, b: _Segment) -> _Segment:
    """Two segments as one, without sorting: within each hash cell a's postings come first, then b's."""
    pos_a = np.arange(len(a.work)) + np.repeat(b.offsets[:-1].astype(np.int64), np.diff(a.offsets).astype(np.int64))
    pos_b = np.arange(len(b.work)) + np.repeat(a.offsets[1:].astype(np.int64), np.diff(b.offsets).astype(np.int64))
    n = len(a.work) + len(b.work)

    def both(x: npt.NDArray[Any], y: npt.NDArray[Any]) -> npt.NDArray[Any]:
        out = np.empty(n, x.dtype)
        out[pos_a] = x
        out[pos_b] = y
        return out

    return _Segment(offsets=a.offsets + b.offsets, work=both(a.work, b.work), t1=both(a.t1, b.t1),
                    lf1=both(a.lf1, b.lf1), dt=both(a.dt, b.dt))


class ReferenceIndex:
    """The references' fingerprints, indexed for matching (not a scan). Safe to share between threads: a lock
    serialises changes and matches (a match may first turn the pending works into a segment)."""

    def __init__(self, min_score: int = MIN_SCORE) -> None:
        self._lock = threading.RLock()
        self._min_score = min_score
        self._ids: dict[str, int] = {}          # live works -> their number
        self._names: list[str] = []             # number -> work id (removed numbers stay, marked dead)
        self._alive = np.zeros(0, np.bool_)
        self._hop: float | None = None
        self._segments: list[_Segment] = []
        self._pending: list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.int32], npt.NDArray[np.uint16],
                                  npt.NDArray[np.uint8], npt.NDArray[np.uint8]]] = []
        self._pending_count = 0

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def nbytes(self) -> int:
        """Memory held by the postings (the benchmark's figure)."""
        return sum(s.nbytes for s in self._segments) + self._pending_count * 12

    def add(self, work: str, fingerprint: bytes) -> None:
        """Index a reference; a work added again replaces its earlier fingerprint."""
        self.add_fingerprint(work, decode_fingerprint(fingerprint))

    def add_fingerprint(self, work: str, fp: Fingerprint) -> None:
        with self._lock:
            self._add(work, fp)

    def _add(self, work: str, fp: Fingerprint) -> None:
        self._check_hop(fp.hop)
        if work in self._ids:
            self.remove(work)
        number = len(self._names)
        self._names.append(work)
        self._ids[work] = number
        if number >= len(self._alive):
            grown = np.zeros(max(16, 2 * len(self._alive)), np.bool_)
            grown[:len(self._alive)] = self._alive
            self._alive = grown
        self._alive[number] = True
        recs = fp.triplets
        self._pending.append((reference_hashes(recs).astype(np.uint32), np.full(len(recs), number, np.int32),
                              recs["t1"].astype(np.uint16), recs["lf1"].astype(np.uint8),
                              recs["dt"].astype(np.uint8)))
        self._pending_count += len(recs)
        if self._pending_count > 4_000_000:
            self._flush()

    def remove(self, work: str) -> None:
        with self._lock:
            number = self._ids.pop(work, None)
            if number is not None:
                self._alive[number] = False

    def _check_hop(self, hop: float) -> None:
        if self._hop is None:
            self._hop = hop
        elif abs(self._hop - hop) > 1e-9:
            raise IdentifyError("the fingerprint's frame hop differs from the index's")

    def _flush(self) -> None:
        if self._pending:
            self._segments.append(_build(self._pending))
            self._pending = []
            self._pending_count = 0
        # Tiered merging (a binary counter): a segment is merged with the one before it while that one is not
        # more than twice its size, so a posting is rewritten O(log n) times and the segments stay few.
        while len(self._segments) > 1 and len(self._segments[-2].work) <= 2 * len(self._segments[-1].work):
            last = self._segments.pop()
            self._segments[-1] = _merge(self._compact(self._segments[-1]), self._compact(last))

    def _compact(self, seg: _Segment) -> _Segment:
        """The segment without the postings of removed works (still in hash order)."""
        keep = self._alive[seg.work]
        if keep.all():
            return seg
        hashes = np.repeat(np.arange(_CELLS, dtype=np.uint32), np.diff(seg.offsets).astype(np.int64))
        offsets = np.zeros(_CELLS + 1, np.uint32)
        np.cumsum(np.bincount(hashes[keep], minlength=_CELLS), out=offsets[1:])
        return _Segment(offsets=offsets, work=seg.work[keep], t1=seg.t1[keep], lf1=seg.lf1[keep], dt=seg.dt[keep])

    def match(self, fingerprint: bytes) -> list[Match]:
        """The works the fingerprint's audio is a copy of, best first."""
        return self.match_fingerprint(decode_fingerprint(fingerprint))

    def match_fingerprint(self, fp: Fingerprint) -> list[Match]:
        with self._lock:
            return self._match(fp)

    def _match(self, fp: Fingerprint) -> list[Match]:
        self._flush()
        q = fp.triplets
        if len(q) == 0 or not self._segments:
            return []
        if self._hop is not None and abs(self._hop - fp.hop) > 1e-9:
            raise IdentifyError("the fingerprint's frame hop differs from the index's")
        qh, qi = query_hashes(q)
        works, owners, t1s, lf1s, dts = [], [], [], [], []
        for seg in self._segments:
            start = seg.offsets[qh].astype(np.int64)
            count = seg.offsets[qh + 1].astype(np.int64) - start
            count[count > MAX_POSTINGS] = 0
            total = int(count.sum())
            if total == 0:
                continue
            first = np.cumsum(count) - count
            pos = np.repeat(start - first, count) + np.arange(total)
            works.append(seg.work[pos])
            owners.append(np.repeat(qi, count))
            t1s.append(seg.t1[pos])
            lf1s.append(seg.lf1[pos])
            dts.append(seg.dt[pos])
        if not works:
            return []
        work = np.concatenate(works)
        alive = self._alive[work]
        work = work[alive]
        owner = np.concatenate(owners)[alive]
        tr = np.concatenate(t1s)[alive].astype(np.float64)
        lfr = np.concatenate(lf1s)[alive].astype(np.float64)
        dtr = np.concatenate(dts)[alive].astype(np.float64)
        if len(work) == 0:
            return []
        numbers, hits = np.unique(work, return_counts=True)
        best = np.argsort(-hits, kind="stable")[:CANDIDATES]
        found: list[Match] = []
        tq_all = q["t1"].astype(np.float64)
        lfq_all = q["lf1"].astype(np.float64)
        dtq_all = q["dt"].astype(np.float64)
        hop = fp.hop
        for number, nhits in zip(numbers[best], hits[best], strict=True):
            if nhits < self._min_score:
                break
            sel = work == number
            own = owner[sel]
            verdict = _verify(tq_all[own], tr[sel], lfq_all[own], lfr[sel], dtq_all[own], dtr[sel])
            if verdict is not None and verdict[0] >= self._min_score:
                score, offset, first, last = verdict
                found.append(Match(work=self._names[int(number)], score=float(score), offset=round(offset * hop, 3),
                                   at=round(first * hop, 3), length=round((last - first) * hop, 3)))
        found.sort(key=lambda m: -m.score)
        return found


def _verify(tq: npt.NDArray[np.float64], tr: npt.NDArray[np.float64], lfq: npt.NDArray[np.float64],
            lfr: npt.NDArray[np.float64], dtq: npt.NDArray[np.float64],
            dtr: npt.NDArray[np.float64]) -> tuple[int, float, float, float] | None:
    """(consistent pairs, offset in frames, first and last query frame the pairs cover) of the best time line
    tr = scale * tq + offset, or None. The covered span runs from the first pair's anchor to the end of the last
    pair's triplet (its anchor plus its span): where in the query the work is heard."""
    # Each pair's own span ratio is a coarse scale: far from the searched range, it cannot be a copy.
    ratio = dtr / np.maximum(dtq, 1.0)
    keep = (ratio > 0.85) & (ratio < 1.18)
    tq, tr, lfq, lfr, dtq = tq[keep], tr[keep], lfq[keep], lfr[keep], dtq[keep]
    if len(tq) == 0:
        return None
    offsets = tr[None, :] - SCALES[:, None] * tq[None, :]
    cells = np.floor(offsets / _OFFSET_BIN).astype(np.int64)
    base = int(cells.min())
    width = int(cells.max()) - base + 2
    keys = (np.arange(len(SCALES))[:, None] * width + (cells - base)).ravel()
    uniq, votes = np.unique(keys, return_counts=True)
    top = int(uniq[int(np.argmax(votes))])
    s_idx, cell = divmod(top, width)
    scale = float(SCALES[s_idx])
    center = (cell + base + 0.5) * _OFFSET_BIN
    resid = tr - scale * tq - center
    inl = np.abs(resid) <= 1.5 * _OFFSET_BIN
    if inl.sum() < 3:
        return None
    shift = lfr[inl] - lfq[inl]
    med = float(np.median(shift))
    inl[inl] = np.abs(shift - med) <= _LF_TOL
    if inl.sum() < 3:
        return None
    # Least-squares line through the inliers (the scale and offset, finer than the grid).
    x, y = tq[inl], tr[inl]
    if float(np.ptp(x)) > 20:
        slope, icept = np.polyfit(x, y, 1)
        if not 0.92 < slope < 1.08:
            slope, icept = scale, float(np.median(y - scale * x))
    else:
        slope, icept = scale, float(np.median(y - scale * x))
    res = np.abs(y - (slope * x + icept))
    good = res <= 3.0
    pairs = np.unique(np.stack([x[good], y[good]]), axis=1).shape[1]
    heard = x[good]
    if len(heard) < 2:
        return int(pairs), float(icept), 0.0, 0.0
    first, last = float(heard.min()), float((heard + dtq[inl][good]).max())
    # The pairs are a sparse sample of the span (about one a second): its ends lie about one gap beyond the
    # first and the last pair, so each end is widened by the mean gap (the span's estimate without bias).
    gap = (last - first) / len(np.unique(heard))
    return int(pairs), float(icept), max(0.0, first - gap), last + gap
