"""The Scrapy side of the throughput comparison (scripts/bench_crawl.py): a plain spider doing our crawler's job.

    python scripts/bench_scrapy_spider.py URL --concurrency 128 --items items.jsonl [--stats stats.json]

It follows every in-site link (a, area, iframe, frame, link rel=next/prev) from URL and notes every audio
reference (links, <audio>/<source>/<embed>/<object>, data-* attributes and quoted URLs inside inline scripts,
responses whose Content-Type is audio, and the entries of .m3u/.pls playlists, which it fetches as our workers do)
as an item. With --files-store it also downloads every item's audio with Scrapy's own FilesPipeline (the item's
``file_urls``), the peer a Scrapy user would choose, storing each file once under its URL's hash as Scrapy does;
without it the audio is not downloaded. It obeys robots.txt like
our master does in the benchmark. Everything else is Scrapy's defaults, apart from the concurrency: all requests
go to one host, so the per-domain limit is raised to the total, which is what our crawl gets too.

At exit it writes Scrapy's own counters (responses, elapsed time, ...) as JSON to --stats. Scrapy is a benchmark
extra (`pip install -e '.[bench]'`), never a runtime dependency.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import scrapy
from scrapy.crawler import CrawlerProcess

from crawler.web import media

# The same extensions the generic resolver treats as audio or playlists.
FOUND_EXTENSIONS = sorted(media.AUDIO_EXTENSIONS | media.PLAYLIST_EXTENSIONS)
_AUDIO_PATH = re.compile(r"\.(?:" + "|".join(FOUND_EXTENSIONS) + r")$", re.IGNORECASE)
_PLAYLIST_PATH = re.compile(r"\.(?:m3u|m3u8|pls)$", re.IGNORECASE)
_PLS_ENTRY = re.compile(r"^\s*File\d+\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)
# Quoted relative or absolute URLs ending in an audio extension, inside scripts and JSON blocks.
_QUOTED_AUDIO = re.compile(r"""["']([^"'\s<>]+?\.(?:""" + "|".join(FOUND_EXTENSIONS) + r"""))(?:\?[^"'\s<>]*)?["']""",
                           re.IGNORECASE)
_FOLLOW = ("a:not([rel~=nofollow])::attr(href), area::attr(href), iframe::attr(src), frame::attr(src), "
           "link[rel~=next]::attr(href), link[rel~=prev]::attr(href)")
_AUDIO_ATTRS = ("audio::attr(src), source::attr(src), embed::attr(src), object::attr(data), "
                "*::attr(data-audio), *::attr(data-src), *::attr(data-url), *::attr(data-file)")


def is_audio_url(url: str) -> bool:
    return bool(_AUDIO_PATH.search(urlsplit(url).path))


def is_playlist_url(url: str) -> bool:
    return bool(_PLAYLIST_PATH.search(urlsplit(url).path))


def playlist_entries(text: str) -> list[str]:
    if "[playlist]" in text[:256].lower():
        return _PLS_ENTRY.findall(text)
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


class AudioSpider(scrapy.Spider):
    name = "audio"

    def __init__(self, start: str, download: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start]
        self.allowed_domains = [urlsplit(start).hostname]
        self.pages = 0
        self.download = download    # --files-store: the FilesPipeline fetches each item's file_urls

    def item(self, found: dict) -> dict:
        if self.download:
            found["file_urls"] = [found["url"]]
        return found

    def parse(self, response):
        ctype = response.headers.get(b"Content-Type", b"").decode("latin-1").lower()
        if ctype.startswith("audio/"):
            yield self.item({"url": response.url, "page": response.request.headers.get(b"Referer", b"").decode(),
                             "how": "content-type"})
            return
        if not isinstance(response, scrapy.http.TextResponse):
            return
        self.pages += 1
        found = set(response.css(_AUDIO_ATTRS).getall())
        for script in response.css("script::text").getall():
            found.update(_QUOTED_AUDIO.findall(script))
        for href in response.css(_FOLLOW).getall():
            url = response.urljoin(href)
            if is_audio_url(url):
                found.add(href)
            elif url.startswith(("http://", "https://")):
                yield scrapy.Request(url, callback=self.parse)
        for ref in found:
            url = response.urljoin(ref)
            if is_playlist_url(url):
                yield scrapy.Request(url, callback=self.parse_playlist, cb_kwargs={"page": response.url})
            elif is_audio_url(url):
                yield self.item({"url": url, "page": response.url, "how": "reference"})

    def parse_playlist(self, response, page: str):
        for entry in playlist_entries(response.text if isinstance(response, scrapy.http.TextResponse)
                                      else response.body.decode("utf-8", "replace")):
            url = response.urljoin(entry)
            if is_audio_url(url) and not is_playlist_url(url):
                yield self.item({"url": url, "page": page, "how": "playlist"})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--concurrency", type=int, default=128, help="requests in flight (all to the one host)")
    ap.add_argument("--items", type=Path, required=True, help="where the audio references go (JSON lines)")
    ap.add_argument("--stats", type=Path, help="where Scrapy's counters go (JSON)")
    ap.add_argument("--files-store", type=Path, help="download the audio with FilesPipeline into this folder")
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(argv)
    files = {"ITEM_PIPELINES": {"scrapy.pipelines.files.FilesPipeline": 1}, "FILES_STORE": str(a.files_store),
             "MEDIA_ALLOW_REDIRECTS": True} if a.files_store else {}
    process = CrawlerProcess(settings={
        **files,
        "CONCURRENT_REQUESTS": a.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": a.concurrency,
        "ROBOTSTXT_OBEY": True,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": a.log_level,
        "FEEDS": {str(a.items): {"format": "jsonlines", "overwrite": True}},
    })
    crawler = process.create_crawler(AudioSpider)
    process.crawl(crawler, start=a.url, download=a.files_store is not None)
    process.start()
    stats = dict(crawler.stats.get_stats())
    stats["pages_parsed"] = crawler.spider.pages
    if a.stats:
        a.stats.write_text(json.dumps(stats, default=str, indent=1, sort_keys=True))
    return 0 if stats.get("finish_reason") == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
