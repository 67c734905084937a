"""Acoustic identification: fingerprint cost beside fpcalc's, matching at 100,000 references, recall and false matches.

    python scripts/bench_fingerprint.py [--works 20] [--seconds 120] [--decoys 1000] [--references 100000]
                                        [--ref-seconds 180] [--quick] [--keep DIR]

1. Fingerprint CPU per minute of audio: crawler.identify.fingerprint_file (decode + fingerprint, in this process) and
   Chromaprint's ``fpcalc -length 0`` (a child process: its CPU from the children's rusage) on the same files (the
   works as WAV and as MP3).
2. Recall per transform: every work copied by every transform of testkit/music.py (ffmpeg's command line: codecs,
   resampling, volume, mono, low-pass, noise at 15 dB SNR, cut, 20 s excerpt, tempo and tempo+pitch +-5%); a copy
   counts when its best match is its work at its offset (within 0.5 s). False matches: any match of a decoy
   (other synthesised music, speech-like audio, noise; 30 s each) and any match of a copy to another work.
3. The index at scale: the works plus --references synthetic references (random triplets at the density real
   fingerprints have, --ref-seconds long each): its postings' memory, the process's peak RSS, and the time per
   query (the copies and decoys above are the queries, against the full index).

--quick: 3 works of 60 s, 60 decoys, 2,000 references (a minute or two). Prints one table per part.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run as a script: the repo's own packages

from crawler.identify import MAX_FINGERPRINT_BYTES, ReferenceIndex, fingerprint_file
from crawler.identify.fingerprint import TRIPLET, Fingerprint, decode_fingerprint, encode, fingerprint_pcm
from testkit import music


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _duration(path: Path) -> float:
    out = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(path)],
                         check=True, capture_output=True, text=True).stdout
    return float(out.strip())


def _cpu_table(files: list[Path]) -> None:
    minutes = sum(_duration(f) for f in files) / 60
    start = time.process_time()
    for f in files:
        fingerprint_file(f)
    ours = (time.process_time() - start) / minutes
    print(f"\n## fingerprint CPU per minute of audio ({len(files)} files, {minutes:.1f} min)")
    print(f"{'method':<34}{'CPU s/min':>10}")
    print(f"{'crawler.identify (PyAV + numpy)':<34}{ours:>10.3f}")
    if shutil.which("fpcalc"):
        before = _children_cpu()
        for f in files:
            # This fpcalc exits 3 on reaching the end of some files ("Error decoding audio frame (End of file)")
            # after printing the whole fingerprint: the output, not the status, says whether it worked.
            done = subprocess.run(["fpcalc", "-length", "0", str(f)], check=False, capture_output=True, text=True)
            if "FINGERPRINT=" not in done.stdout:
                sys.exit(f"fpcalc failed on {f}: {done.stderr.strip()}")
        print(f"{'fpcalc -length 0 (Chromaprint)':<34}{(_children_cpu() - before) / minutes:>10.3f}")
    else:
        print("fpcalc: not installed (libchromaprint-tools)")


def _synthetic(rng: np.random.Generator, seconds: float, density: float, hop: float) -> Fingerprint:
    n = int(seconds * density)
    rec = np.zeros(n, TRIPLET)
    rec["t1"] = np.sort(rng.integers(0, int(seconds / hop), n))
    rec["lf1"] = rng.integers(0, 233, n)
    rec["dt"] = rng.integers(3, 46, n)
    rec["r"] = rng.integers(10, 245, n)
    rec["d12"] = rng.integers(-125, 126, n)
    rec["d13"] = rng.integers(-125, 126, n)
    return Fingerprint(hop=hop, triplets=rec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--works", type=int, default=20, help="reference works synthesised (each copied by every transform)")
    parser.add_argument("--seconds", type=float, default=120.0, help="length of each work")
    parser.add_argument("--decoys", type=int, default=1000)
    parser.add_argument("--references", type=int, default=100_000, help="synthetic references in the index")
    parser.add_argument("--ref-seconds", type=float, default=180.0, help="length of each synthetic reference")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", type=Path, help="write the files here (default: a temporary directory)")
    args = parser.parse_args()
    if args.quick:
        args.works, args.seconds, args.decoys, args.references = 3, 60.0, 60, 2000
    if shutil.which("ffmpeg") is None:
        sys.exit("bench_fingerprint: ffmpeg is needed (scripts/setup.sh installs it)")
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-fp-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        _run(args, root)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _run(args: argparse.Namespace, root: Path) -> None:
    works = {f"work{k:03d}": music.write_wav(root / f"work{k:03d}.wav", music.work(1000 + k, args.seconds))
             for k in range(args.works)}
    mp3s = [music.make_copy(p, music.TRANSFORMS[0], root / f"{name}.cpu.mp3") for name, p in works.items()]
    _cpu_table(list(works.values())[:10] + mp3s[:10])

    prints = {name: decode_fingerprint(fingerprint_file(p)) for name, p in works.items()}
    seconds = sum(_duration(p) for p in works.values())
    density = sum(len(fp.triplets) for fp in prints.values()) / seconds
    hop = next(iter(prints.values())).hop

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    index = ReferenceIndex()
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for k in range(args.references):
        index.add_fingerprint(f"synthetic{k}", _synthetic(rng, args.ref_seconds, density, hop))
    for name, fp in prints.items():
        index.add_fingerprint(name, fp)
    index.match_fingerprint(prints[next(iter(prints))])      # builds the last segment
    build = time.perf_counter() - start
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    # Copies: recall per transform.
    rows: dict[str, list[int]] = {}
    query_times: list[float] = []
    for t_num, transform in enumerate(music.TRANSFORMS):
        hit = wrong = 0
        for name, path in works.items():
            copy = music.make_copy(path, transform, root / f"{name}.{transform.name}{transform.suffix}", seed=t_num)
            fp = fingerprint_file(copy)
            copy.unlink()
            start = time.perf_counter()
            found = index.match(fp)
            query_times.append(time.perf_counter() - start)
            if found and found[0].work == name and abs(found[0].offset - transform.offset) <= 0.5:
                hit += 1
            wrong += sum(1 for m in found if m.work != name)
        rows[transform.name] = [hit, len(works), wrong]

    # Decoys: false matches.
    false = 0
    kinds = {"music": 0, "speech": 0, "noise": 0}
    for k in range(args.decoys):
        kind = "music" if k % 10 < 7 else ("speech" if k % 10 < 9 else "noise")
        make = {"music": music.work, "speech": music.speech, "noise": music.noise}[kind]
        fp = encode(fingerprint_pcm(make(50_000 + k, 30.0, rate=8000)), MAX_FINGERPRINT_BYTES)
        start = time.perf_counter()
        found = index.match(fp)
        query_times.append(time.perf_counter() - start)
        if found:
            false += 1
            kinds[kind] += 1

    print(f"\n## recall per transform ({len(works)} works of {args.seconds:.0f} s, index of {len(index):,} references)")
    print(f"{'transform':<20}{'matched':>9}{'copies':>8}{'recall':>8}{'wrong work':>12}")
    total_hit = total = total_wrong = 0
    for name, (hit, n, wrong) in rows.items():
        print(f"{name:<20}{hit:>9}{n:>8}{hit / n:>8.0%}{wrong:>12}")
        total_hit, total, total_wrong = total_hit + hit, total + n, total_wrong + wrong
    print(f"{'all':<20}{total_hit:>9}{total:>8}{total_hit / max(total, 1):>8.0%}{total_wrong:>12}")
    print(f"\n## decoys: {false} of {args.decoys} matched something "
          f"(music {kinds['music']}, speech {kinds['speech']}, noise {kinds['noise']})")

    q = np.array(query_times) * 1000
    print(f"\n## index of {len(index):,} references ({args.references:,} synthetic of {args.ref_seconds:.0f} s, "
          f"{density:.1f} triplets/s)")
    print(f"{'postings memory':<28}{index.nbytes / 2**20:>10.0f} MiB ({index.nbytes / max(len(index), 1):,.0f} "
          f"B/reference)")
    print(f"{'peak RSS growth (build)':<28}{(rss1 - rss0) / 1024:>10.0f} MiB")
    print(f"{'build time':<28}{build:>10.1f} s")
    print(f"{'match time per query':<28}{np.median(q):>10.1f} ms median, {np.percentile(q, 95):.1f} ms p95, "
          f"{q.max():.1f} ms max ({len(q)} queries)")


if __name__ == "__main__":
    main()
