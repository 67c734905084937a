"""Landmark fingerprints that survive speed changes: triplets of spectral peaks (pure numpy, no I/O).

The scheme is Panako's: a copy played faster or slower scales every time by one factor (and, when the pitch moves
with the tempo, every frequency by the same factor), so a hash built from the *ratio* of two time differences and
from *differences of log frequencies* between three peaks is the same in the copy as in the work. Re-encoding,
resampling, volume, band-limiting and noise move few of the strongest peaks.

A fingerprint keeps, per triplet, the peak features at a fine resolution (not the hash): the index quantises them
into its hash, and a query also tries the neighbouring cell of any feature that lies near a cell edge, so a feature
moved a little by a transform still meets its reference. Per triplet it keeps the anchor's time and log frequency
too: the index verifies a match by one consistent time scale and offset over many triplets.

Bytes: ``b"AFP"``, a version byte, the frame hop in microseconds (uint32), the triplet count (uint32), then the
triplets as packed little-endian records (``TRIPLET``: 7 bytes each).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from crawler.identify.errors import IdentifyError

VERSION = 1
MAGIC = b"AFP"
_HEADER = struct.Struct("<3sBII")

RATE = 8000
N_FFT = 1024                 # 128 ms windows: 7.8 Hz bins, interpolated to a fraction of that
HOP = 256                    # 32 ms frames
F_LOW = 150.0                # Hz: log frequencies are octaves above this
F_HIGH = 3800.0
PEAK_DF = 10                 # a peak is the largest value within +-PEAK_DF bins ...
PEAK_DT = 6                  # ... and +-PEAK_DT frames
PEAKS_PER_SECOND = 9         # the strongest peaks kept per second
MIN_DT = 2                   # frames between the anchor and its second peak, at least
MAX_DT = 45                  # frames between the anchor and its third peak, at most (1.4 s)
MAX_DLF = 1.25               # octaves between the anchor and the other two peaks, at most
FAN_OUT = 3                  # the first FAN_OUT peaks after an anchor; every pair of them makes a triplet
_BLOCK = 2048                # frames per spectrogram block: bounds the memory of a long file

# One triplet: the anchor's frame and log frequency (1/50 octave), the triplet's span in frames, the ratio of the
# time differences (x255) and the two log-frequency differences (1/100 octave).
TRIPLET = np.dtype([("t1", "<u2"), ("lf1", "u1"), ("dt", "u1"), ("r", "u1"), ("d12", "i1"), ("d13", "i1")])


@dataclass(frozen=True, slots=True)
class Fingerprint:
    hop: float                          # seconds per frame
    triplets: npt.NDArray[np.void]      # TRIPLET records, in anchor-time order


def spectral_peaks(pcm: npt.NDArray[np.float32], rate: int = RATE) -> tuple[npt.NDArray[np.int64],
                                                                           npt.NDArray[np.float64]]:
    """The strongest spectral peaks: (frame, log2(frequency / F_LOW)) sorted by frame then frequency."""
    if rate != RATE:
        raise ValueError(f"the fingerprint reads {RATE} Hz audio")
    n_frames = 1 + (len(pcm) - N_FFT) // HOP if len(pcm) >= N_FFT else 0
    if n_frames < 2 * PEAK_DT + 2:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    window = np.hanning(N_FFT).astype(np.float32)
    lo = int(np.floor(F_LOW * N_FFT / rate))
    hi = int(np.ceil(F_HIGH * N_FFT / rate)) + 1
    frames = np.lib.stride_tricks.sliding_window_view(pcm, N_FFT)[::HOP][:n_frames]
    times: list[npt.NDArray[np.int64]] = []
    freqs: list[npt.NDArray[np.float64]] = []
    for start in range(0, n_frames, _BLOCK):
        a = max(0, start - PEAK_DT)
        b = min(n_frames, start + _BLOCK + PEAK_DT)
        spec = np.abs(np.fft.rfft(frames[a:b] * window, axis=1))[:, lo - 1:hi + 1].astype(np.float32)
        logs = np.log(spec + 1e-6)
        t, f = _block_peaks(logs, start - a, min(_BLOCK, n_frames - start))
        if len(t) == 0:
            continue
        # Parabolic interpolation of the peak's bin on the log magnitude.
        left, mid, right = logs[t, f - 1], logs[t, f], logs[t, f + 1]
        den = left - 2 * mid + right
        frac = np.where(den < 0, 0.5 * (left - right) / np.where(den < 0, den, -1.0), 0.0)
        hz = (f + (lo - 1) + np.clip(frac, -0.5, 0.5)) * rate / N_FFT
        times.append((t + a).astype(np.int64))
        freqs.append(np.log2(hz / F_LOW).astype(np.float64))
    if not times:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    tt = np.concatenate(times)
    ff = np.concatenate(freqs)
    order = np.lexsort((ff, tt))
    return tt[order], ff[order]


def _sliding_max(x: npt.NDArray[np.float32], radius: int, axis: int) -> npt.NDArray[np.float32]:
    out = x.copy()
    n = x.shape[axis]
    for k in range(1, radius + 1):
        if k >= n:
            break
        if axis == 0:
            np.maximum(out[k:], x[:-k], out=out[k:])
            np.maximum(out[:-k], x[k:], out=out[:-k])
        else:
            np.maximum(out[:, k:], x[:, :-k], out=out[:, k:])
            np.maximum(out[:, :-k], x[:, k:], out=out[:, :-k])
    return out


def _block_peaks(logs: npt.NDArray[np.float32], first: int, count: int) -> tuple[npt.NDArray[np.int64],
                                                                                npt.NDArray[np.int64]]:
    """Local maxima of one block's log spectrogram (rows first..first+count), the strongest per second kept."""
    inner = logs[:, 1:-1]
    local = _sliding_max(_sliding_max(inner, PEAK_DF, 1), PEAK_DT, 0)
    # Salience: how far the peak stands above its frame's typical level (so volume and spectral tilt cancel).
    floor = np.median(inner, axis=1, keepdims=True)
    salience = inner - floor
    loudest = float(inner.max()) if inner.size else 0.0
    is_peak = (inner == local) & (salience > 2.0) & (inner > loudest - 9.0)
    is_peak[:first] = False
    is_peak[first + count:] = False
    t, f = np.nonzero(is_peak)
    if len(t) == 0:
        return t.astype(np.int64), f.astype(np.int64)
    sal = salience[t, f]
    # At most PEAKS_PER_SECOND per second: rank within each second by salience.
    second = (t * HOP) // RATE
    order = np.lexsort((-sal, second))
    t, f, second = t[order], f[order], second[order]
    starts = np.searchsorted(second, second, side="left")
    keep = (np.arange(len(t)) - starts) < PEAKS_PER_SECOND
    return t[keep].astype(np.int64), (f[keep] + 1).astype(np.int64)


def triplets(t: npt.NDArray[np.int64], lf: npt.NDArray[np.float64]) -> npt.NDArray[np.void]:
    """Every anchor's triplets: the anchor with each pair of the first FAN_OUT peaks in its zone."""
    n = len(t)
    if n < 3:
        return np.zeros(0, TRIPLET)
    look = 40
    idx = np.arange(n)[:, None] + np.arange(1, look + 1)[None, :]
    valid = idx < n
    idx = np.minimum(idx, n - 1)
    dt = t[idx] - t[:, None]
    dlf = np.abs(lf[idx] - lf[:, None])
    ok = valid & (dt >= MIN_DT) & (dt <= MAX_DT) & (dlf <= MAX_DLF)
    rank = np.cumsum(ok, axis=1)
    ok &= rank <= FAN_OUT
    rows, cols = np.nonzero(ok)
    # The chosen peaks per anchor, FAN_OUT slots (-1 where an anchor has fewer).
    chosen = np.full((n, FAN_OUT), -1, np.int64)
    chosen[rows, rank[rows, cols] - 1] = idx[rows, cols]
    out: list[npt.NDArray[np.void]] = []
    for a in range(FAN_OUT):
        for b in range(a + 1, FAN_OUT):
            i = np.nonzero((chosen[:, a] >= 0) & (chosen[:, b] >= 0))[0]
            j, k = chosen[i, a], chosen[i, b]
            good = (t[k] > t[j]) & (t[j] > t[i])
            i, j, k = i[good], j[good], k[good]
            rec = np.zeros(len(i), TRIPLET)
            span = t[k] - t[i]
            rec["t1"] = t[i]
            rec["lf1"] = np.clip(np.round(lf[i] * 50), 0, 255)
            rec["dt"] = span
            rec["r"] = np.clip(np.round((t[j] - t[i]) / span * 255), 0, 255)
            rec["d12"] = np.clip(np.round((lf[j] - lf[i]) * 100), -127, 127)
            rec["d13"] = np.clip(np.round((lf[k] - lf[i]) * 100), -127, 127)
            out.append(rec)
    recs = np.concatenate(out)
    return recs[np.argsort(recs["t1"], kind="stable")]


def fingerprint_pcm(pcm: npt.NDArray[np.float32], rate: int = RATE) -> Fingerprint:
    if len(pcm) > 65535 * HOP:
        pcm = pcm[:65535 * HOP]   # frame numbers are 16-bit (35 minutes); decode stops at 30
    t, lf = spectral_peaks(pcm, rate)
    return Fingerprint(hop=HOP / rate, triplets=triplets(t, lf))


def encode(fp: Fingerprint, max_bytes: int) -> bytes:
    """The versioned bytes, cut to at most max_bytes (a long file keeps its first triplets)."""
    room = max(0, (max_bytes - _HEADER.size) // TRIPLET.itemsize)
    recs = fp.triplets[:room]
    return _HEADER.pack(MAGIC, VERSION, round(fp.hop * 1e6), len(recs)) + recs.tobytes()


def decode_fingerprint(data: bytes) -> Fingerprint:
    if len(data) < _HEADER.size:
        raise IdentifyError("fingerprint too short")
    magic, version, hop_us, count = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise IdentifyError("not a fingerprint")
    if version != VERSION:
        raise IdentifyError(f"fingerprint version {version} (this build reads {VERSION})")
    if len(data) != _HEADER.size + count * TRIPLET.itemsize or hop_us == 0:
        raise IdentifyError("fingerprint length does not match its header")
    recs = np.frombuffer(data, TRIPLET, count, _HEADER.size)
    return Fingerprint(hop=hop_us / 1e6, triplets=recs)
