"""The control process: ``scrapy crawl control`` (docs/control.md).

It crawls nothing itself. It hosts scheduler_ext's control loop, which splits injected products into tasks,
modifies, recalls and allocates subtasks on a timer. Run one or more: one leads, the others stand by.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from scrapy import Spider
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import threads

from product_crawl.tasks import prepare
from scheduler_ext.connection import check_credentials
from scheduler_ext.strategies import check_strategy_settings


class ControlSpider(Spider):
    name = "control"
    custom_settings = {"ADDONS": {"scheduler_ext.addon.ControlAddon": 0}, "LOGSTATS_INTERVAL": 0}

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> ControlSpider:
        # Refuse bad strategy settings before the crawl starts, so the process exits non-zero naming the setting.
        check_strategy_settings(crawler.settings)
        check_credentials(crawler.settings)
        return super().from_crawler(crawler, *args, **kwargs)

    async def start(self) -> AsyncIterator[Any]:
        if self.settings.get("SCHEDEXT_SPLITTER") == "product_crawl.tasks.splitter":
            # jieba's dictionary and the project's settings now, in a thread, not at the first product injected.
            await maybe_deferred_to_future(threads.deferToThread(prepare))
        return
        yield  # pragma: no cover  (makes this an async generator)
