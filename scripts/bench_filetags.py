"""Time per file of reading an in-memory MP3's tags: mutagen alone against the fast path (crawler/worker/mp3tags.py).

    python scripts/bench_filetags.py [--files 500] [--size 4096] [--rounds 5]

The files are the demo site's MP3s (scripts/sitegen.py: an ID3v2.3 tag, then 128 kbit/s MPEG-1 Layer III frames)
with names from its vocabularies. Prints the best of --rounds runs in µs per file for each path, CPU time of this
process, and checks that both paths gave the same answers.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run as a script: the repo's own packages

from crawler.worker.filetags import read_file_tags
from crawler.worker.mp3tags import read_mp3
from scripts import sitegen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--size", type=int, default=4096, help="typical bytes per file (the demo site's default)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(1)
    files = [sitegen._mp3(rng, rng.randint(args.size // 2, args.size * 3 // 2), sitegen._title(rng, i),
                          rng.choice(sitegen._LAST), rng.choice(sitegen._BANDS)) for i in range(args.files)]
    accepted = sum(read_mp3(data) is not None for data in files)
    same = all(read_file_tags(d, ".mp3") == read_file_tags(d, ".mp3", fast=False) for d in files)
    for label, fast in (("mutagen", False), ("fast path", True)):
        best = min(_run(files, fast) for _ in range(args.rounds))
        print(f"{label:>10}: {best / len(files) * 1e6:7.1f} µs per file (CPU, best of {args.rounds})")
    print(f"fast path accepted {accepted}/{len(files)} files; same answers: {same}")


def _run(files: list[bytes], fast: bool) -> float:
    start = time.process_time()
    for data in files:
        read_file_tags(data, ".mp3", fast=fast)
    return time.process_time() - start


if __name__ == "__main__":
    main()
