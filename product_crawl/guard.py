"""Bounds on what a crawl node fetches and stores, set by its settings and never by what Redis or a page says.

A writable Redis or a planted result page must not turn nodes into a proxy into the machine's network (SSRF) or
fill MongoDB with garbage. The node's spider only builds result-page URLs from the engines' base URLs and follows
no link of a page; these components make that a rule rather than a habit:

:class:`EngineHostMiddleware` (downloader middleware)
    Sends a request only to the scheme and ``host:port`` of a configured engine (``PC_ENGINE_BASE_URLS``, with the
    defaults of :data:`product_crawl.engines.DEFAULT_BASE_URLS`). Anything else, including ``file:``, ``data:``,
    ``ftp:`` and ``s3:`` (whose handlers are off on nodes anyway), fails with :class:`RequestRefused` naming the
    URL; the subtask middleware turns that into a failed page, so the subtask fails with that reason. ``dont_filter``
    does not bypass it (it does Scrapy's own offsite middleware). Stat: ``pc/guard/offsite``.

The storage (:class:`product_crawl.pipelines.MongoPipeline`)
    Refuses an item with a text field longer than ``PC_ITEM_FIELD_MAXLEN`` characters (:class:`ItemRefused`, raised by
    :func:`check_fields`) before writing it; the item ends in ``item_error`` and its subtask fails with the field's
    name and length. Stat: ``pc/guard/item_refused``. The storage already looks at every field of every item; a
    pipeline of its own was one more coroutine stage per item.

:class:`PageSizeMiddleware` (downloader middleware, nearest the downloader)
    Pages larger than Scrapy's ``DOWNLOAD_MAXSIZE`` (product_crawl sets 2 MiB) are cancelled by Scrapy itself. When
    the server did not announce the size, Scrapy's exception has no message (it only logs one); this middleware
    gives it one, so the failed page and its subtask say why. Stat: ``pc/guard/page_too_large``.

:class:`GuardAddon` adds the two middlewares to a crawler (the search spider's ``ADDONS``), keeping any order a
project gave them.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request, signals
from scrapy.exceptions import DownloadCancelledError

from product_crawl.engines import engine_base_urls

logger = logging.getLogger(__name__)

DEFAULT_ITEM_FIELD_MAXLEN = 10_000


class RequestRefused(Exception):
    """Raised if a node is asked to fetch a URL outside the configured engines' hosts."""


class ItemRefused(Exception):
    """Raised if an item has a field over ``PC_ITEM_FIELD_MAXLEN`` characters."""


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


class EngineHostMiddleware:
    """Requests go to the engines' own scheme and host:port only (see the module docstring)."""

    def __init__(self, crawler: Any, base_urls: dict[str, str]) -> None:
        self.crawler = crawler
        self.allowed = {_origin(url) for url in base_urls.values() if url}

    @classmethod
    def from_crawler(cls, crawler: Any) -> EngineHostMiddleware:
        return cls(crawler, engine_base_urls(crawler.settings))

    def process_request(self, request: Request) -> None:
        if _origin(request.url) not in self.allowed:
            self.crawler.stats.inc_value("pc/guard/offsite")
            raise RequestRefused(f"{request.url[:200]} is not on an engine's host "
                                 f"({', '.join(sorted(f'{s}://{h}' for s, h in self.allowed))}; PC_ENGINE_BASE_URLS)")


class PageSizeMiddleware:
    """A failed page over ``DOWNLOAD_MAXSIZE`` says so (see the module docstring)."""

    def __init__(self, crawler: Any, maxsize: int) -> None:
        self.crawler = crawler
        self.maxsize = maxsize
        self.received: weakref.WeakKeyDictionary[Request, int] = weakref.WeakKeyDictionary()
        crawler.signals.connect(self._bytes_received, signal=signals.bytes_received)

    @classmethod
    def from_crawler(cls, crawler: Any) -> PageSizeMiddleware:
        return cls(crawler, crawler.settings.getint("DOWNLOAD_MAXSIZE"))

    def _bytes_received(self, data: bytes, request: Request, **kwargs: Any) -> None:
        self.received[request] = self.received.get(request, 0) + len(data)

    def process_exception(self, request: Request, exception: Exception) -> None:
        maxsize = int(request.meta.get("download_maxsize", self.maxsize) or 0)
        if isinstance(exception, DownloadCancelledError) and maxsize and self.received.get(request, 0) > maxsize:
            self.crawler.stats.inc_value("pc/guard/page_too_large")
            # The exception object travels on to the middlewares before this one, which record the failure.
            exception.args = (f"page larger than DOWNLOAD_MAXSIZE ({maxsize} bytes) refused: {request.url[:200]}",)


def check_fields(doc: dict[str, Any], maxlen: int) -> None:
    """Raise :class:`ItemRefused` naming the first text field of ``doc`` longer than ``maxlen`` characters."""
    for name, value in doc.items():
        if type(value) is str and len(value) > maxlen:
            raise ItemRefused(f"field {name!r} has {len(value)} characters, over PC_ITEM_FIELD_MAXLEN ({maxlen}); "
                              f"item from {doc.get('url')!r:.120} refused")


class GuardAddon:
    """Adds :class:`EngineHostMiddleware` (50) and :class:`PageSizeMiddleware` (990, after the subtask middleware's
    900, so it sees an exception first)."""

    def update_settings(self, settings: Any) -> None:
        settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", EngineHostMiddleware, 50)
        settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", PageSizeMiddleware, 990)
