"""The cheapest crawler: ``scrapy crawl plain_search -s PC_PLAIN_PAGES=FILE``, plain Scrapy with no scheduling.

Every result page listed in ``PC_PLAIN_PAGES`` (a JSON file: a list of ``{"url": ..., "meta": {"product": ...,
"page": ...}}``) is a start request, parsed by the same engines into the same items and stored by the same
``MongoPipeline`` as the search node's. No Redis, no subtasks, no allocation: what a crawl of those pages costs
this machine at the least. The experiment measures the machine with it (``product_crawl.experiment.machine``, the
best possible's costs), and the node benchmark runs it as its plain Scrapy side (docs/benchmarks.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured

from product_crawl.spiders.redis_search import ResultPages


class PlainSearchSpider(ResultPages, Spider):
    name = "plain_search"
    custom_settings = {"ITEM_PIPELINES": {"product_crawl.pipelines.MongoPipeline": 300}, "RETRY_ENABLED": False,
                       "REDIRECT_ENABLED": False, "COOKIES_ENABLED": False, "TELNETCONSOLE_ENABLED": False}

    entries: list[dict[str, Any]]

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> PlainSearchSpider:
        """Reads ``PC_PLAIN_PAGES`` before anything opens, so that a missing or bad list is the error reported."""
        spider = super().from_crawler(crawler, *args, **kwargs)
        path = crawler.settings.get("PC_PLAIN_PAGES")
        if not path:
            raise NotConfigured("PC_PLAIN_PAGES: expected the path of a JSON list of result pages, got nothing")
        try:
            entries = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise NotConfigured(f"PC_PLAIN_PAGES={path!r}: expected a JSON list of result pages ({exc})") from exc
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and isinstance(e.get("url"), str) and isinstance(e.get("meta"), dict)
                for e in entries):
            raise NotConfigured(f"PC_PLAIN_PAGES={path!r}: expected a JSON list of {{\"url\": str, \"meta\": "
                                f"{{...}}}} entries")
        spider.entries = entries
        return spider  # type: ignore[no-any-return]

    async def start(self) -> AsyncIterator[Any]:
        for entry in self.entries:
            yield Request(entry["url"], meta=entry["meta"], dont_filter=True)
