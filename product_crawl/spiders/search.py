"""The search node: ``scrapy crawl search`` on each crawl machine (docs/node.md).

It starts no requests of its own: the subtask scheduler (scheduler_ext) leases subtasks from this node's crawl
queue in Redis and asks :meth:`SearchSpider.subtask_requests` for their result-page requests. Each result page
is parsed by the task's engine into items and the page's figures (engine-reported count, results offered, end of
results), which the subtask middleware reads from ``response.meta``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from scrapy import Request, Spider
from scrapy.http import Response, TextResponse

from product_crawl.engines import Engine, PageProblem, get_engine
from product_crawl.items import SearchResultItem
from scheduler_ext.config import config_for
from scheduler_ext.connection import check_credentials
from scheduler_ext.models import Subtask
from scheduler_ext.tracker import META_LAST, META_OFFERED, META_PAGE, META_REPORTED, META_TOTAL_PAGES

NODE_SETTINGS: dict[str, Any] = {
    # The subtask scheduler, middlewares and Redis stats; telnet, remote control, file/data/ftp/s3 handlers off.
    "ADDONS": {"scheduler_ext.addon.NodeAddon": 0, "product_crawl.guard.GuardAddon": 0},
    "ITEM_PIPELINES": {"product_crawl.pipelines.MongoPipeline": 300},
    # Recall is the retry mechanism: a failed page fails its subtask, which the control sends elsewhere.
    "RETRY_ENABLED": False,
    "REDIRECT_ENABLED": False,
    "COOKIES_ENABLED": False,
    "LOGSTATS_INTERVAL": 30.0,
}


class SearchSpider(Spider):
    name = "search"
    custom_settings = NODE_SETTINGS

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> SearchSpider:
        config_for(crawler)  # refuse a bad node id, type or other SCHEDEXT_ setting before the crawl starts
        check_credentials(crawler.settings)  # and a Redis that refuses our password, rather than retry forever
        return super().from_crawler(crawler, *args, **kwargs)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._engines: dict[str, Engine] = {}

    @property
    def node_id(self) -> str:
        return config_for(self.crawler).node_id

    def engine(self, subtask: Subtask) -> Engine:
        name = str(subtask.payload.get("engine") or "baidu")
        if name not in self._engines:
            self._engines[name] = get_engine(name, self.settings)
        return self._engines[name]

    async def start(self) -> AsyncIterator[Any]:
        # Work comes from the subtask scheduler, not from start requests.
        return
        yield  # pragma: no cover  (makes this an async generator)

    def subtask_requests(self, subtask: Subtask) -> Iterator[Request]:
        """One request per result page of the subtask."""
        engine = self.engine(subtask)
        words = subtask.payload.get("keywords")
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
            raise ValueError(f"payload.keywords: expected a non-empty list of words, got {words!r}")
        headers = engine.request_headers() or None  # e.g. a Weibo session cookie
        for page in range(subtask.first_page, subtask.first_page + subtask.page_limit):
            yield Request(engine.page_url(words, subtask.site, page), callback=self.parse_results,
                          cb_kwargs={"subtask": subtask}, meta={META_PAGE: page}, dont_filter=True,
                          headers=headers)

    def is_blocked(self, response: Response, subtask: Subtask) -> bool:
        return self.engine(subtask).is_blocked(response)

    def parse_results(self, response: TextResponse, subtask: Subtask) -> Iterator[SearchResultItem]:
        engine = self.engine(subtask)
        page = response.meta[META_PAGE]
        result = engine.parse(response)
        if result.problem:
            # Not the end of the results: the page fails (the subtask middleware reports the reason) and the
            # control recalls the rest of the subtask.
            raise PageProblem(result.problem)
        if result.reported is not None:
            response.meta[META_REPORTED] = result.reported
            response.meta[META_OFFERED] = engine.offered(result.reported, page)
            response.meta[META_TOTAL_PAGES] = engine.pages_for(result.reported)
        else:
            response.meta[META_OFFERED] = len(result.results)
        response.meta[META_LAST] = not result.has_next
        now = time.time()
        payload = subtask.payload
        keywords = str(payload.get("keywords_joined") or "&".join(payload.get("keywords") or []))
        for r in result.results:
            yield SearchResultItem(
                product=str(payload.get("product") or subtask.group), keywords=keywords, site=subtask.site,
                engine=engine.name, title=r.title, url=r.url, snippet=r.snippet, date=r.date, rank=r.rank,
                page=page, task_id=subtask.task, subtask_id=subtask.id, node_id=self.node_id, crawled_at=now)
