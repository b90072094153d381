"""Scrapy's downloader with its per-slot concurrency kept under the asyncio reactor.

Scrapy (2.14 to 2.19 at least) starts the queued requests of a download slot in a loop that stops when
``slot.free_transfer_slots()`` reaches 0, but it counts a request as transferring only once the task that downloads
it has started. Under the asyncio reactor that task starts on the next turn of the loop, so one pass starts every
request the slot holds: ``CONCURRENT_REQUESTS_PER_DOMAIN`` (and ``_PER_IP``, ``DOWNLOAD_SLOTS``' ``concurrency``)
are exceeded whenever several requests reach a slot at once, and only ``CONCURRENT_REQUESTS`` still holds. A node
that fires 16 requests at an engine it was told to ask 2 at a time gets blocked.

It also stamps the moment a request takes its place (``request.meta[META_SLOT_TAKEN]``), from which the subtask
middleware measures how long each page held a slot: a run's node time (``Report.node_seconds``).

:class:`Downloader` counts a request as transferring the moment the loop takes it from the queue. Scrapy's own
bookkeeping is otherwise unchanged: its download step adds the request again (a set) and removes it when the
response or error arrives. ``NodeAddon`` sets it as ``DOWNLOADER``; the project's settings do too, for every spider.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any

from scrapy import Request
from scrapy.core.downloader import Downloader as ScrapyDownloader
from scrapy.core.downloader import Slot

from .tracker import META_SLOT_TAKEN


class Downloader(ScrapyDownloader):
    def _wait_for_download(self, slot: Slot, request: Request, queue_dfd: Any) -> Coroutine[Any, Any, None]:
        # Called (not awaited) inside Scrapy's start loop: the place is taken before the loop asks for free ones.
        slot.transferring.add(request)
        request.meta[META_SLOT_TAKEN] = time.monotonic()
        return super()._wait_for_download(slot, request, queue_dfd)
