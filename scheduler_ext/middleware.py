"""The subtask middlewares: time limits, block pages, errors and completion accounting on a node.

:class:`SubtaskDownloaderMiddleware` (a downloader middleware) applies each subtask's time limit (download timeout
and a deadline after which pages not yet started are dropped: the subtask ends as timed out with what it got),
detects block pages through ``spider.is_blocked(response, subtask)``, HTTP errors and download failures, which end
the subtask as failed with a reason, and measures download time per site (stat ``site/<site>/download_seconds``)
and how long each page held a download slot (the subtask's node time, ``Report.node_seconds``: from the moment
the node's downloader gave the request its place, else from this middleware's ``process_request``, to its
response or error).

:class:`SubtaskSpiderMiddleware` (a spider middleware) counts what the spider makes of each page: the items it
yields (which must then leave the pipelines before the subtask can finish) and the page's own figures that the
spider leaves on ``response.meta`` (results offered, engine-reported count, end of results).

Both are no-ops for requests that do not belong to a subtask. Setting: ``SCHEDEXT_MIDDLEWARE_ENABLED``.
Stats: ``schedext/pages/timeout``, ``schedext/pages/blocked``, ``schedext/pages/http_error``,
``schedext/pages/download_error``, ``site/<site>/pages``, ``site/<site>/items``, ``site/<site>/blocked``,
``site/<site>/download_seconds``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response

from .defaults import setting
from .tracker import META_PAGE, META_SID, META_SLOT_TAKEN, Active, Tracker, tracker_for

logger = logging.getLogger(__name__)
_STARTED = "schedext_download_started"


class _Base:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Any) -> Any:
        if not setting(crawler.settings, "SCHEDEXT_MIDDLEWARE_ENABLED"):
            raise NotConfigured("SCHEDEXT_MIDDLEWARE_ENABLED is off")
        return cls(crawler)

    @property
    def tracker(self) -> Tracker | None:
        return tracker_for(self.crawler)

    def _active(self, request: Request) -> tuple[Tracker, Active] | None:
        """The tracker and the active subtask ``request`` belongs to, if it belongs to one."""
        tracker = self.tracker
        active = tracker.get(request.meta.get(META_SID)) if tracker else None
        return (tracker, active) if tracker and active else None


class SubtaskDownloaderMiddleware(_Base):
    def process_request(self, request: Request) -> None:
        if (found := self._active(request)) is None:
            return
        tracker, active = found
        sid, page = active.subtask.id, request.meta[META_PAGE]
        remaining = active.deadline_local - time.monotonic()
        if remaining <= 0 and not active.moot(page):
            active.timed_out = True
            self.stats.inc_value("schedext/pages/timeout")
        if active.moot(page):
            tracker.page_dropped(sid, page)
            raise IgnoreRequest(f"subtask {sid} ended; page {page} dropped")
        request.meta["download_timeout"] = max(0.5, min(float(request.meta.get("download_timeout") or remaining),
                                                        remaining))
        request.meta[_STARTED] = time.monotonic()

    @staticmethod
    def _held(tracker: Tracker, sid: str, request: Request) -> None:
        """The page's download ended: charge the subtask the time it held its download slot."""
        taken = request.meta.get(META_SLOT_TAKEN, request.meta.get(_STARTED))
        if taken is not None:
            tracker.page_held(sid, time.monotonic() - taken)

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if (found := self._active(request)) is None:
            return response
        tracker, active = found
        sid, site, page = active.subtask.id, active.subtask.site, request.meta[META_PAGE]
        if _STARTED in request.meta:
            self.stats.inc_value(f"site/{site}/download_seconds", time.monotonic() - request.meta[_STARTED])
        self._held(tracker, sid, request)
        if response.status >= 400:
            self.stats.inc_value("schedext/pages/http_error")
            tracker.page_failed(sid, page, f"HTTP {response.status} from {response.url}")
            raise IgnoreRequest(f"HTTP {response.status}")
        is_blocked = getattr(self.crawler.spider, "is_blocked", None)
        if is_blocked is not None and is_blocked(response, active.subtask):
            self.stats.inc_value("schedext/pages/blocked")
            self.stats.inc_value(f"site/{site}/blocked")
            tracker.page_failed(sid, page, f"blocked: a verification page at {response.url}", blocked=True)
            raise IgnoreRequest("block page")
        self.stats.inc_value(f"site/{site}/pages")
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if isinstance(exception, IgnoreRequest) or (found := self._active(request)) is None:
            return
        tracker, active = found
        sid = active.subtask.id
        self._held(tracker, sid, request)
        if time.monotonic() >= active.deadline_local - 0.05:
            # The subtask's time limit cut this download short: a timeout, not a failure of the site.
            active.timed_out = True
            self.stats.inc_value("schedext/pages/timeout")
            tracker.page_dropped(sid, request.meta[META_PAGE], attempted=True)
            return
        self.stats.inc_value("schedext/pages/download_error")
        name = type(exception).__name__
        tracker.page_failed(sid, request.meta[META_PAGE], f"download error {name}: {exception}")


class SubtaskSpiderMiddleware(_Base):
    def __init__(self, crawler: Any) -> None:
        super().__init__(crawler)
        for sig, error in ((signals.item_scraped, False), (signals.item_dropped, False),
                           (signals.item_error, True)):
            crawler.signals.connect(self._item_out_error if error else self._item_out, signal=sig)

    def _item_out(self, item: Any, response: Response | None = None, **kw: Any) -> None:
        tracker = self.tracker
        if tracker is not None and response is not None and META_SID in response.meta:
            tracker.item_out(response.meta[META_SID])

    def _item_out_error(self, item: Any, response: Response | None = None, failure: Any = None,
                        **kw: Any) -> None:
        tracker = self.tracker
        if tracker is not None and response is not None and META_SID in response.meta:
            reason = f"item pipeline error: {failure.getErrorMessage() if failure else 'unknown'}"
            tracker.item_out(response.meta[META_SID], error=reason)

    def _page_done(self, response: Response, items: int) -> None:
        tracker = self.tracker
        if tracker is not None:
            active = tracker.get(response.meta[META_SID])
            if active is not None:
                self.stats.inc_value(f"site/{active.subtask.site}/items", items)
            tracker.page_parsed(response.meta[META_SID], response.meta[META_PAGE], response.meta, items)

    def _count(self, response: Response, obj: Any) -> bool:
        if isinstance(obj, Request):
            return False
        tracker = self.tracker
        if tracker is not None:
            tracker.item_in(response.meta[META_SID])
        return True

    def process_spider_output(self, response: Response, result: Iterable[Any]) -> Iterable[Any]:
        if META_SID not in response.meta:
            yield from result
            return
        items = 0
        for obj in result:
            items += self._count(response, obj)
            yield obj
        self._page_done(response, items)

    async def process_spider_output_async(self, response: Response, result: AsyncIterator[Any]
                                          ) -> AsyncIterator[Any]:
        if META_SID not in response.meta:
            async for obj in result:
                yield obj
            return
        items = 0
        async for obj in result:
            items += self._count(response, obj)
            yield obj
        self._page_done(response, items)

    def process_spider_exception(self, response: Response, exception: Exception) -> None:
        tracker = self.tracker
        if tracker is not None and META_SID in response.meta:
            tracker.page_failed(response.meta[META_SID], response.meta[META_PAGE],
                                f"spider error {type(exception).__name__}: {exception}")
