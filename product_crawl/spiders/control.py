"""The control process: ``scrapy crawl control`` (docs/control.md).

It crawls nothing itself. It hosts scheduler_ext's control loop, which splits injected products into tasks,
modifies, recalls and allocates subtasks on a timer. Run one or more: one leads, the others stand by.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from scrapy import Spider


class ControlSpider(Spider):
    name = "control"
    custom_settings = {
        "SCHEDEXT_CONTROL_ENABLED": True,
        "EXTENSIONS": {"scheduler_ext.control.ControlExtension": 500},
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        "LOGSTATS_INTERVAL": 0,
    }

    async def start(self) -> AsyncIterator[Any]:
        return
        yield  # pragma: no cover  (makes this an async generator)
