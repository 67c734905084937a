"""Any audio file to mono float32 PCM at one low rate, in-process (PyAV: the FFmpeg libraries, no child process).

Bounded: at most ``max_seconds`` of audio are decoded (a longer file's fingerprint covers its start), and a file that
demuxes many packets without yielding audio (a hostile or broken stream) is refused, so a decode never runs away in
time or memory. Everything that goes wrong is one IdentifyError naming why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from crawler.identify.errors import IdentifyError
from crawler.identify.limits import MIN_SECONDS

RATE = 8000                 # Hz: the fingerprint looks at 150-3800 Hz; a low rate keeps the spectrogram cheap
MAX_SECONDS = 30 * 60       # a long file (a podcast, a live set) is fingerprinted on its first half hour
_MAX_IDLE_PACKETS = 20_000  # packets demuxed in a row with no decoded sample: a stream that is not audio


def decode(path: Path, rate: int = RATE, max_seconds: float = MAX_SECONDS) -> npt.NDArray[np.float32]:
    """The file's first audio stream, mixed to mono at ``rate`` Hz, at most ``max_seconds`` long."""
    limit = int(rate * max_seconds)
    try:
        container = av.open(str(path), mode="r", metadata_errors="ignore")
    except (av.FFmpegError, OSError, ValueError, UnicodeDecodeError) as exc:
        raise IdentifyError(f"not a readable audio file: {type(exc).__name__}: {exc}"[:300]) from None
    try:
        streams = [s for s in container.streams if s.type == "audio"]
        if not streams:
            raise IdentifyError("no audio stream in the file")
        stream = streams[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        chunks: list[npt.NDArray[np.float32]] = []
        total = 0
        idle = 0
        try:
            for packet in container.demux(stream):
                frames: list[Any] = list(packet.decode())
                if not frames:
                    idle += 1
                    if idle > _MAX_IDLE_PACKETS:
                        raise IdentifyError("the audio stream yields no samples")
                    continue
                idle = 0
                for frame in frames:
                    for out in resampler.resample(frame):
                        chunk = out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
                        chunks.append(chunk)
                        total += len(chunk)
                if total >= limit:
                    break
            else:
                for out in resampler.resample(None):
                    chunk = out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
                    chunks.append(chunk)
                    total += len(chunk)
        except IdentifyError:
            raise
        except (av.FFmpegError, OSError, ValueError, EOFError) as exc:
            # A stream broken part way: what decoded before the break is kept if it is long enough.
            if total < MIN_SECONDS * rate:
                raise IdentifyError(f"undecodable audio: {type(exc).__name__}: {exc}"[:300]) from None
    finally:
        container.close()
    if total < MIN_SECONDS * rate:
        raise IdentifyError(f"too little audio ({total / rate:.1f} s)")
    pcm = np.concatenate(chunks)[:limit]
    if not np.all(np.isfinite(pcm)):
        pcm = np.nan_to_num(pcm, nan=0.0, posinf=0.0, neginf=0.0)
    return pcm
