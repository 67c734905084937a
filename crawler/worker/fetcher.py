"""Fetching one page with the bounds a hostile site cannot push past.

Pages take the lean HTTP/1.1 path downloads take (http1.py, reached through the Getter's ``get``): a keep-alive
pool and llhttp's parser, nothing built per request beyond the request's bytes and the answer's headers.
Resolvers' API calls keep the httpx client over the aiohttp transport (the Getter's ``client``): they want
its redirects, query building and JSON. Both share the transport's resolver, so a host's DNS answer is
cached for `dns_ttl` seconds and every connection is checked by the same target policy (crawler/http/).

Bounds: a body cap counted on the *decoded* bytes, a stack of encodings refused (crawler/http/bodies.py), connect
and read timeouts, a total deadline for the whole exchange, an answer's head at most http1.MAX_HEAD bytes, a
redirect limit for API calls, and the addresses a request may reach (crawler/http/targets.py, checked after DNS on
every connection).

Page fetches do not follow redirects: the worker reports the Location as a link, so the master's dedup sees it
and a page that two addresses lead to is fetched once (as Scrapy and Heritrix do). API calls and downloads follow
redirects up to the limit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import httpx

from crawler.http.bodies import BodyError
from crawler.http.getter import Getter
from crawler.http.http1 import header_list, parse_url
from crawler.http.targets import TargetRefused
from crawler.web.media import is_audio_type, media_type
from crawler.worker import icy
from crawler.worker.siterules import SiteRules
from crawler.web.page import FetchedPage

SNIFF_BYTES = 64 * 1024
# The bytes a page's connection may hold for its reader before reading pauses.
_READ_SIZE = 256 * 1024
# Bodies we read whole (up to the page cap): documents and playlists. Anything else is sniffed from its start.
_DOCUMENT = re.compile(r"^(text/|application/(xhtml\+xml|xml|json|ld\+json|javascript|x-mpegurl|"
                       r"vnd\.apple\.mpegurl|pls\+xml|rss\+xml|atom\+xml)|audio/(x-)?mpegurl|audio/x-scpls|$)")


class FetchError(Exception):
    """A page that could not be fetched; ``reason`` names the kind of a permanent refusal, for counting."""

    def __init__(self, message: str, transient: bool, reason: str | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.reason = reason


def is_document(mt: str) -> bool:
    return bool(_DOCUMENT.match(mt))


class PageFetcher:
    """Page GETs on the lean path of the Getter it is handed (the worker's: http1.py's keep-alive pool and llhttp
    parser, the transport's DNS cache and target policy), the one downloads take.

    A page fetch needs none of a client's per-request machinery (URL and header merging, the auth flow, the
    redirect loop, cookies, event hooks), nor httpx's request and response objects, nor aiohttp's session: those
    cost more CPU than writing the request and parsing the answer. Redirects are reported, not followed; a site's
    session cookies are the Getter's to add (crawler/worker/sessions.py). The headers are the Getter's client's
    (User-Agent, Accept, Accept-Encoding), built once, with a site's own user agent and headers set over them
    (siterules.py); the timeouts the Getter's, its total deadline over the whole exchange.
    """

    def __init__(self, http: Getter) -> None:
        self._http = http
        self._headers = header_list(http.client.headers)
        self._sent = _encoded(self._headers)     # the same, as the archive records them
        self._timeouts = http.timeouts
        # The sites' own headers (siterules.py), from the master's Welcome; empty until then.
        self.sites = SiteRules()

    async def fetch(self, url: str, *, max_bytes: int, referrer: str | None = None,
                    validators: tuple[str | None, str | None] | None = None) -> tuple[FetchedPage, bool]:
        """GET url; returns the page and whether its body was cut at the cap. Raises FetchError.

        validators: (ETag, Last-Modified) of the page's last full answer, sent as If-None-Match and
        If-Modified-Since (RFC 9110, 13.1): an unchanged page is then answered 304 with no body."""
        request_url = url.split("#", 1)[0]
        headers = self._headers
        if referrer or validators:
            headers = headers.copy()
            if referrer:
                headers.append(("Referer", referrer))
            if validators:
                etag, last_modified = validators
                if etag:
                    headers.append(("If-None-Match", etag))
                if last_modified:
                    headers.append(("If-Modified-Since", last_modified))
        try:
            target = parse_url(request_url)
            site = self.sites.of(target.host, target.port) if self.sites else None
            if site is not None:
                headers = site.over(headers)
            started = time.time()
            # A page is cut at its cap, not refused: one byte past it tells the fetch it was cut.
            r = await self._http.get(target, headers, timeout=self._timeouts, max_body=max_bytes + 1,
                                     read_size=_READ_SIZE, cut=True)
            try:
                fields = header_fields(r.raw_headers)
                mt = media_type(fields.get("content-type"))
                # An internet radio station (icy.py) never ends its body: its head says it is audio, and the
                # body is left unread (the connection closed) for the download to record.
                stream = icy.is_stream(r.extensions, fields)
                if stream and not is_audio_type(mt):
                    mt = "audio/mpeg"       # what a SHOUTcast station sends when it names no type
                document = is_document(mt) and not stream
                limit = max_bytes if document else 0 if stream else SNIFF_BYTES
                chunks: list[bytes] = []
                size = 0
                truncated = False
                if not stream:
                    async for chunk in r.stream:
                        chunks.append(chunk)
                        size += len(chunk)
                        if size >= limit:
                            truncated = document and size > limit
                            break
            finally:
                # Back to the pool when the body was read to the end; closed when it was not (a capped page).
                await r.aclose()
            body = b"".join(chunks)[:limit]
            # What was sent: the lean path's request is Host and these headers, in this order.
            host = (b"Host", (target.host_port_subcomponent or "").encode("latin-1", "replace"))
            if site is not None:
                sent = (host, *_encoded(headers))
            else:
                sent = (host, *self._sent,
                        *(_encoded(headers[len(self._headers):]) if headers is not self._headers else ()))
            page = FetchedPage(url=url, final_url=request_url, status=r.status_code, content_type=mt,
                               headers=fields, body=body, referrer=referrer, raw_headers=r.raw_headers,
                               sent=sent, started=started, cut=truncated or (not document and size >= limit))
            return page, truncated
        except httpx.UnsupportedProtocol as e:
            raise FetchError(f"unsupported URL: {e}", transient=False) from None
        except BodyError as e:
            raise FetchError(str(e), transient=False, reason="body refused") from None
        except TargetRefused as e:
            raise FetchError(str(e), transient=False, reason="address refused") from None
        except httpx.DecodingError as e:
            raise FetchError(f"undecodable body: {e}", transient=False) from None
        except httpx.InvalidURL as e:
            raise FetchError(f"invalid URL: {e}", transient=False) from None
        except httpx.LocalProtocolError as e:
            raise FetchError(f"cannot send the request: {e}", transient=False) from None
        except (httpx.TransportError, OSError) as e:
            raise FetchError(f"{type(e).__name__}: {e}".rstrip(": "), transient=True) from None


def _encoded(headers: Sequence[tuple[str, str]]) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((k.encode("latin-1", "replace"), v.encode("latin-1", "replace")) for k, v in headers)


def header_fields(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """An answer's headers by lower-case name, the values of a repeated name joined with ", " (RFC 9110, 5.3),
    decoded as httpx decodes them: ASCII, else UTF-8 if every header is, else Latin-1."""
    try:
        pairs = [(k.decode("ascii").lower(), v.decode("ascii")) for k, v in raw]
    except UnicodeDecodeError:
        try:
            pairs = [(k.decode().lower(), v.decode()) for k, v in raw]
        except UnicodeDecodeError:
            pairs = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw]
    fields: dict[str, str] = {}
    for name, value in pairs:
        known = fields.get(name)
        fields[name] = value if known is None else f"{known}, {value}"
    return fields
