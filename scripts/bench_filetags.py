"""Time per file of reading an in-memory audio file's tags: mutagen alone against the fast path, per format.

    python scripts/bench_filetags.py [--files 500] [--size 4096] [--rounds 5] [--formats .mp3,.flac,.ogg,.wav,.aac]

The files are the demo site's (scripts/sitegen.py: MP3 with an ID3v2.3 tag and 128 kbit/s MPEG-1 Layer III
frames; FLAC with STREAMINFO and a Vorbis comment; Ogg Vorbis pages; WAVE with a LIST INFO chunk; untagged ADTS
AAC-LC frames) with names from its vocabularies. Prints, per format, the best of --rounds runs in µs per file for
each path, CPU time of this process (crawler/worker/mp3tags.py and fasttags.py are the fast paths), and checks that
both gave the same answers.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run as a script: the repo's own packages

from crawler.worker.fasttags import read_aac, read_flac, read_ogg_vorbis, read_wave
from crawler.worker.filetags import read_file_tags
from crawler.worker.mp3tags import read_mp3
from testkit import sitegen

_FORMATS: dict[str, tuple[Callable[..., bytes], Callable[[bytes], dict[str, Any] | None]]] = {
    ".mp3": (sitegen._mp3, read_mp3), ".flac": (sitegen._flac, read_flac),
    ".ogg": (sitegen._ogg, read_ogg_vorbis), ".wav": (sitegen._wav, read_wave), ".aac": (sitegen._aac, read_aac),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--size", type=int, default=4096, help="typical bytes per file (the demo site's default)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--formats", default=",".join(_FORMATS), help="comma-separated extensions")
    args = parser.parse_args()
    for ext in args.formats.split(","):
        build, reader = _FORMATS[ext]
        rng = random.Random(1)
        files = [build(rng, rng.randint(args.size // 2, args.size * 3 // 2), sitegen._title(rng, i),
                       rng.choice(sitegen._LAST), rng.choice(sitegen._BANDS)) for i in range(args.files)]
        accepted = sum(reader(data) is not None for data in files)
        same = all(read_file_tags(d, ext) == read_file_tags(d, ext, fast=False) for d in files)
        for label, fast in (("mutagen", False), ("fast path", True)):
            best = min(_run(files, ext, fast) for _ in range(args.rounds))
            print(f"{ext:>5} {label:>10}: {best / len(files) * 1e6:7.1f} µs per file (CPU, best of {args.rounds})")
        print(f"{ext:>5} fast path accepted {accepted}/{len(files)} files; same answers: {same}")


def _run(files: list[bytes], ext: str, fast: bool) -> float:
    start = time.process_time()
    for data in files:
        read_file_tags(data, ext, fast=fast)
    return time.process_time() - start


if __name__ == "__main__":
    main()
