"""Synthesised audio for the identification tests and benchmark: "works" of music, decoys, and the copies an
unlicensed upload makes of a work (re-encoded, resampled, quieter, mono, band-limited, noisy, cut, an excerpt,
faster or slower), each made by ffmpeg's command line as an uploader would.

A work is seeded numpy: a melody and chords of harmonic notes with attack-decay envelopes over a random key and
tempo, with percussion bursts. Different seeds give different works built the same way (the hardest decoys).
"""

from __future__ import annotations

import subprocess
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

RATE = 22050


def work(seed: int, seconds: float, rate: int = RATE) -> npt.NDArray[np.float32]:
    """A piece of synthesised music in [-1, 1]."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    out = np.zeros(n, np.float64)
    scale = np.array([0, 2, 4, 5, 7, 9, 11])
    root = 110.0 * 2 ** (int(rng.integers(0, 12)) / 12)
    beat = float(rng.uniform(0.2, 0.35))
    harmonics = rng.uniform(0.3, 0.7, 6) ** np.arange(1, 7)
    t = 0.0
    while t < seconds:
        dur = beat * float(rng.choice([0.5, 1, 1, 2, 2, 4]))
        a = int(t * rate)
        voices = int(rng.integers(1, 4))
        for _ in range(voices):
            step = int(scale[int(rng.integers(0, len(scale)))]) + 12 * int(rng.integers(0, 3))
            f = root * 2 ** (step / 12)
            m = min(n - a, int(dur * rate * 1.4))
            if m <= 0:
                continue
            tt = np.arange(m) / rate
            env = np.exp(-tt * rng.uniform(1.5, 5.0)) * np.minimum(1.0, tt / 0.01)
            sig = np.zeros(m)
            for h, amp in enumerate(harmonics):
                if f * (h + 1) < rate / 2:
                    sig += amp * np.sin(2 * np.pi * f * (h + 1) * tt + rng.uniform(0, 6.28))
            out[a:a + m] += 0.25 * env * sig
        if rng.random() < 0.35:
            m = min(n - a, int(0.06 * rate))
            out[a:a + m] += 0.4 * rng.standard_normal(m) * np.exp(-np.arange(m) / rate * 60)
        t += dur
    out /= max(1e-9, float(np.abs(out).max())) * 1.12
    return out.astype(np.float32)


def speech(seed: int, seconds: float, rate: int = RATE) -> npt.NDArray[np.float32]:
    """Speech-like audio: a gliding glottal pulse train through moving formants, in syllables and pauses."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    tt = np.arange(n) / rate
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.3 * tt + rng.uniform(0, 6)) + 15 * rng.standard_normal()
    phase = np.cumsum(pitch / rate)
    pulses = (np.diff(np.floor(phase), prepend=0.0) > 0).astype(np.float64)
    out = np.zeros(n)
    for centre in (500.0, 1500.0, 2500.0):
        formant = centre * (1 + 0.3 * np.sin(2 * np.pi * rng.uniform(2, 5) * tt + rng.uniform(0, 6)))
        # A crude resonator: pulses times a decaying sinusoid at the (moving) formant frequency.
        kernel_t = np.arange(int(0.01 * rate)) / rate
        ring = np.convolve(pulses, np.exp(-kernel_t * 400), mode="same")
        out += ring * np.sin(2 * np.pi * np.cumsum(formant) / rate) / centre * 500
    syllables = (np.sin(2 * np.pi * rng.uniform(3, 5) * tt) > -0.2) & (np.sin(2 * np.pi * 0.4 * tt) > -0.6)
    out *= syllables
    out += 0.01 * rng.standard_normal(n)
    out /= max(1e-9, float(np.abs(out).max())) * 1.12
    return out.astype(np.float32)


def noise(seed: int, seconds: float, rate: int = RATE) -> npt.NDArray[np.float32]:
    return (0.2 * np.random.default_rng(seed).standard_normal(int(seconds * rate))).astype(np.float32)


def write_wav(path: Path, pcm: npt.NDArray[np.float32], rate: int = RATE, channels: int = 2) -> Path:
    samples = (np.clip(pcm, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.repeat(samples[:, None], channels, axis=1).tobytes())
    return path


@dataclass(frozen=True, slots=True)
class Transform:
    name: str
    before: tuple[str, ...]     # ffmpeg options before -i (the seek)
    after: tuple[str, ...]      # options after it (codec, filters)
    suffix: str
    offset: float               # seconds into the work where the copy starts
    noisy: bool = False         # white noise mixed in at 15 dB SNR


def _tempo(name: str, start: float, factor: float, pitch: bool) -> Transform:
    flt = f"asetrate={RATE}*{factor},aresample={RATE}" if pitch else f"atempo={factor}"
    return Transform(name, ("-ss", str(start)), ("-af", flt), ".wav", start)


TRANSFORMS = (
    Transform("mp3", (), ("-c:a", "libmp3lame", "-b:a", "64k"), ".mp3", 0.0),
    Transform("aac", (), ("-c:a", "aac", "-b:a", "48k"), ".m4a", 0.0),
    Transform("vorbis", (), ("-c:a", "libvorbis", "-q:a", "0"), ".ogg", 0.0),
    Transform("opus", (), ("-c:a", "libopus", "-b:a", "24k"), ".opus", 0.0),
    Transform("hls-ts", (), ("-c:a", "aac", "-b:a", "64k", "-f", "mpegts"), ".ts", 0.0),   # a joined HLS file
    Transform("flac-11k", (), ("-ar", "11025", "-c:a", "flac"), ".flac", 0.0),
    Transform("resample-44k", (), ("-ar", "44100"), ".wav", 0.0),
    Transform("quiet", (), ("-af", "volume=0.05"), ".wav", 0.0),
    Transform("loud", (), ("-af", "volume=4"), ".wav", 0.0),
    Transform("mono", (), ("-ac", "1", "-c:a", "libmp3lame", "-b:a", "96k"), ".mp3", 0.0),
    Transform("lowpass", (), ("-af", "lowpass=f=2000"), ".wav", 0.0),
    Transform("noise-15db", (), (), ".wav", 0.0, noisy=True),
    Transform("cut-start", ("-ss", "7.3"), (), ".wav", 7.3),
    Transform("excerpt-20s", ("-ss", "31", "-t", "20"), ("-c:a", "libmp3lame", "-b:a", "128k"), ".mp3", 31.0),
    _tempo("tempo-0.95", 5.0, 0.95, pitch=False),
    _tempo("tempo-1.05", 5.0, 1.05, pitch=False),
    _tempo("tempo-pitch-0.95", 5.0, 0.95, pitch=True),
    _tempo("tempo-pitch-1.05", 5.0, 1.05, pitch=True),
)


def make_copy(source: Path, transform: Transform, dest: Path, seed: int = 0) -> Path:
    """The copy of ``source`` (a WAV at RATE) that ``transform`` describes, made by ffmpeg, at ``dest``."""
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-y", *transform.before, "-i", str(source)]
    if transform.noisy:
        with wave.open(str(source), "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64) / 32767
        rms = float(np.sqrt(np.mean(pcm ** 2)))
        level = rms / 10 ** (15 / 20)     # 15 dB below the signal
        hiss = dest.with_name(dest.stem + ".noise.wav")
        write_wav(hiss, (level * np.random.default_rng(seed).standard_normal(len(pcm) // 2)).astype(np.float32))
        cmd += ["-i", str(hiss), "-filter_complex", "[0:a][1:a]amix=inputs=2:duration=first:normalize=0"]
    cmd += [*transform.after, str(dest)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return dest
