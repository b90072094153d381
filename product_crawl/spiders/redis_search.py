"""The scrapy-redis node: ``scrapy crawl redis_search``, the tool users would pick instead of dynamic scheduling.

A plain scrapy-redis deployment of the same crawl: a ``RedisSpider`` that reads result-page URLs from
``REDIS_START_URLS_KEY`` (JSON entries ``{"url": ..., "meta": {"product": ..., "follow": true}}``), scrapy-redis's
scheduler, queue and ``RFPDupeFilter`` shared by every node through Redis, and the same engines, items and MongoDB
pipeline as the search node. With ``follow`` the spider queues, from a query's first page, every other page of the
query (their number follows from the reported count), so any node may fetch any page in parallel through the
shared queue. No scheduling model: no allocation, no modification, no recall.

The experiment runs it as the ``scrapy_redis`` configuration, the node benchmark as its (b) side
(docs/experiment.md, docs/benchmarks.md).

This module is also the scheduler's serializer (``SCHEDULER_SERIALIZER = "product_crawl.spiders.redis_search"``):
:func:`dumps` and :func:`loads` put a request in the queue as JSON (bytes kept as latin-1 text), never pickle, so a
writable Redis does not mean code execution on the nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from scrapy import Request
from scrapy.http import TextResponse
from scrapy_redis.spiders import RedisSpider

from product_crawl.engines import Engine, get_engine
from product_crawl.items import SearchResultItem
from product_crawl.simweb.corpus import parse_query

#: Settings of a scrapy-redis node (its scheduler, dupefilter, JSON serializer), plus our pipeline. Key names
#: are set per deployment with REDIS_START_URLS_KEY, SCHEDULER_QUEUE_KEY and SCHEDULER_DUPEFILTER_KEY.
REDIS_NODE_SETTINGS: dict[str, Any] = {
    "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
    "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
    "SCHEDULER_SERIALIZER": "product_crawl.spiders.redis_search",
    "SCHEDULER_PERSIST": True,  # a node that stops must not clear the queue the others work from
    "ITEM_PIPELINES": {"product_crawl.pipelines.MongoPipeline": 300},
    "RETRY_ENABLED": False,  # as the search node: a failed page is a lost page (scrapy-redis has no recall)
    "REDIRECT_ENABLED": False,
    "COOKIES_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False,
    "LOGSTATS_INTERVAL": 30.0,
}


class ResultPages:
    """Parsing of a result page without subtasks: the page's query (words, site) from its URL, the product from
    ``meta["product"]``, the same items as the search node's; with ``meta["follow"]`` on a query's first page, every
    other page of the query. Shared by this spider and the plain Scrapy spider
    (:mod:`product_crawl.spiders.plain_search`)."""

    settings: Any
    crawler: Any

    def engine(self, name: str) -> Engine:
        engines = self.__dict__.setdefault("_engines", {})
        if name not in engines:
            engines[name] = get_engine(name, self.settings)
        return engines[name]

    def parse(self, response: Any, **kwargs: Any) -> Iterator[Any]:
        """Items of one result page (block pages are counted, not parsed) and, with ``follow``, the query's other
        pages."""
        if not isinstance(response, TextResponse):
            return
        engine = self.engine(str(response.meta.get("engine") or "baidu"))
        if engine.is_blocked(response):
            self.crawler.stats.inc_value("redis_search/blocked")
            return
        args = parse_qs(urlsplit(response.url).query)
        words, site = parse_query((args.get("wd") or args.get("q") or [""])[0])
        result = engine.parse(response)
        page = int(response.meta.get("page") or 0)
        product = str(response.meta.get("product") or "&".join(words))
        now = time.time()
        for r in result.results:
            yield SearchResultItem(product=product, keywords="&".join(words), site=site, engine=engine.name,
                                   title=r.title, url=r.url, snippet=r.snippet, date=r.date, rank=r.rank, page=page,
                                   task_id="", subtask_id="", node_id=self.settings.get("SCHEDEXT_NODE_ID") or "",
                                   crawled_at=now)
        if response.meta.get("follow") and page == 0 and result.has_next:
            # The first page tells how many there are: queue all the others at once, so that every node can fetch
            # them in parallel (what a scrapy-redis user who wants speed writes).
            last = engine.pages_for(result.reported) if result.reported is not None else 2
            for p in range(1, max(2, last)):
                yield Request(engine.page_url(words, site, p), callback=self.parse,
                              meta={"product": product, "engine": engine.name, "page": p})


class RedisSearchSpider(ResultPages, RedisSpider):
    name = "redis_search"
    custom_settings = REDIS_NODE_SETTINGS

    def make_request_from_data(self, data: bytes | str) -> Request | list[Request]:
        """A GET of the entry's URL with its meta (scrapy-redis's own would send the extra keys as a form)."""
        try:
            entry = json.loads(data)
            url, meta = str(entry["url"]), dict(entry.get("meta") or {})
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # not our JSON: skip, as scrapy-redis does
            self.logger.warning("start URL entry is not {\"url\": ..., \"meta\": {...}} JSON (%s): %r", exc, data)
            return []
        return Request(url, callback=self.parse, meta=meta, dont_filter=True)


# --- the scheduler's JSON serializer (SCHEDULER_SERIALIZER) -------------------------------------------------------


def _encode(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {"__bytes__": obj.decode("latin-1")}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: _encode(v) for k, v in obj.items()}
        return {"__pairs__": [[_encode(k), _encode(v)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    return obj


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__bytes__"}:
            return obj["__bytes__"].encode("latin-1")
        if set(obj) == {"__pairs__"}:
            return {_decode(k): _decode(v) for k, v in obj["__pairs__"]}
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """A request dict (``Request.to_dict``) as JSON.

    >>> loads(dumps({"url": "http://x/", "headers": {b"Accept": [b"*/*"]}, "body": b"", "meta": {"page": 1}}))
    {'url': 'http://x/', 'headers': {b'Accept': [b'*/*']}, 'body': b'', 'meta': {'page': 1}}
    """
    return json.dumps(_encode(obj), ensure_ascii=False)


def loads(data: bytes | str) -> Any:
    return _decode(json.loads(data))
