"""What a message costs on the wire: encode and decode time per message of realistic size, in microseconds.

Three messages:
  report   a Report of one page: ~50 links, two audio items with their metadata, client identity and extras,
           validators and a few sitemap dates (what every fetched page sends the master)
  assign   an Assign of one Task with validators (what the master sends for every page)
  assign64 an Assign of 64 tasks (a full credit's worth), per task

"decode" is the master's (or worker's) whole path for one frame: FrameDecoder.feed + next_message, which checks
every field. The API it uses is the same in every protocol version since 8, so the same script times another
checkout: PYTHONPATH=/path/to/other/checkout .venv/bin/python scripts/bench_protocol.py

    .venv/bin/python scripts/bench_protocol.py [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))     # after PYTHONPATH, so another checkout given there is the one timed

from crawler import protocol as p
from crawler.items import AudioItem, RequestIdentity


def _page_result(lease: int) -> p.Result:
    base = "https://music.example.com"
    links = tuple(f"{base}/artist/{i:03d}/album/some-album-title-{i}?page={i % 7}" for i in range(50))
    ident = RequestIdentity(user_agent="Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/120.0 Safari/537.36",
                            headers=(("Referer", f"{base}/song/{lease}.html"),), cookies=(("kg_mid", "0123456789abcdef"),))
    audio = tuple(AudioItem(url=f"https://cdn.example.com/audio/{lease}-{k}.mp3", page=f"{base}/song/{lease}.html",
                            title=f"Song title number {k}", artist="Some Artist", album="Some Album", duration=215.5,
                            bitrate=320, description="A song found on a page, with a short description.",
                            cover=f"https://cdn.example.com/cover/{lease}.jpg", resolver="generic", identity=ident,
                            source_id=f"{lease:032x}", content_type="audio/mpeg", status="pending",
                            meta_source={"title": "jsonld", "artist": "class"}, extra={"via": "jsonld", "rank": k})
                  for k in range(2))
    return p.Result(lease, f"{base}/song/{lease}.html", p.DONE, 200, f"{base}/song/{lease}.html",
                    "text/html; charset=utf-8", 48_213, None, links, audio, 3,
                    lastmod=tuple((links[i], 1_700_000_000.0 + i) for i in range(3)),
                    validators=('"5f1a-62c1e0"', "Wed, 02 Dec 2026 10:00:00 GMT", -(1 << 40)))


def _task(lease: int) -> p.Task:
    return p.Task(lease, f"https://music.example.com/artist/{lease:03d}/album/some-album-title", 3,
                  "https://music.example.com/artist/", None, ('"5f1a-62c1e0"', "Wed, 02 Dec 2026 10:00:00 GMT"))


def _time(fn: Callable[[], object], seconds: float) -> float:
    """Seconds per call: the best of five rounds of about `seconds` / 5 each."""
    n = 1
    while True:                           # calls per round, so that a round takes long enough to time
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 > seconds / 50:
            break
        n *= 2
    n = max(1, int(n * (seconds / 5) / max(time.perf_counter() - t0, 1e-9)))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def _decode(frame: bytes) -> p.Message | None:
    d = p.FrameDecoder()
    d.feed(frame)
    return d.next_message()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=0.5, help="time spent on each figure")
    args = ap.parse_args()
    cases = [("report", p.Report((_page_result(7),)), 1),
             ("assign", p.Assign((_task(7),)), 1),
             ("assign64", p.Assign(tuple(_task(i) for i in range(64))), 64)]
    print(f"protocol version {p.PROTOCOL_VERSION} ({Path(p.__file__).resolve().parent.parent})")
    print(f"{'message':10} {'bytes':>7} {'encode µs':>10} {'decode µs':>10}   (per {'message or task'})")
    for name, msg, per in cases:
        frame = p.encode(msg)
        assert _decode(frame) == msg, name
        enc = _time(lambda m=msg: p.encode(m), args.seconds) / per
        dec = _time(lambda f=frame: _decode(f), args.seconds) / per
        print(f"{name:10} {len(frame) // per:7d} {enc * 1e6:10.2f} {dec * 1e6:10.2f}")


if __name__ == "__main__":
    main()
