"""MongoPipeline against a real MongoDB-protocol server (nx-27017), in this process's reactor."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pymongo
import pytest_twisted
from twisted.internet import defer

from product_crawl.items import SearchResultItem
from product_crawl.pipelines import MongoPipeline


def item(i: int) -> SearchResultItem:
    return SearchResultItem(product="光明高钙牛奶", keywords="光明&高钙&牛奶", site="good.example", engine="baidu",
                            title=f"title {i}", url=f"http://good.example/{i}.html", snippet="...", date=None,
                            rank=i + 1, page=i // 10, task_id="t1", subtask_id="s1", node_id="node1",
                            crawled_at=time.time())


async def process_all(pipeline: MongoPipeline, items: list[Any]) -> None:
    """Every item through ``process_item`` at once, as Scrapy's scraper sends a page's items."""
    await defer.Deferred.fromFuture(asyncio.gather(*(pipeline.process_item(i) for i in items)))


@pytest_twisted.ensureDeferred
async def test_items_that_arrive_during_a_write_are_written_as_soon_as_it_is_answered(mongo_uri: str,
                                                                                      mongo_db: str) -> None:
    # A full batch goes at once; the 3 items behind it must not wait for the batch delay (30 s here): the group
    # commit writes them when the first write is answered. They wait on a subtask's critical path.
    pipeline = MongoPipeline(mongo_uri, mongo_db, "items", batch_size=10, batch_delay=30.0)
    await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.open_spider()))
    sizes: list[int] = []
    write = pipeline._write

    def recording(batch: list[Any]) -> int:  # the real write, with the size of each bulk write noted
        sizes.append(len(batch))
        return write(batch)

    pipeline._write = recording  # type: ignore[method-assign]
    started = time.monotonic()
    try:
        await process_all(pipeline, [item(i) for i in range(13)])
    finally:
        await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.close_spider()))
    assert sizes == [10, 3]
    assert time.monotonic() - started < 10  # not the 30 s batch delay
    stored = pymongo.MongoClient(mongo_uri)[mongo_db]["items"]
    assert stored.count_documents({}) == 13


@pytest_twisted.ensureDeferred
async def test_a_lone_item_is_written_after_the_batch_delay(mongo_uri: str, mongo_db: str) -> None:
    pipeline = MongoPipeline(mongo_uri, mongo_db, "items", batch_size=100, batch_delay=0.02)
    await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.open_spider()))
    try:
        await process_all(pipeline, [item(0)])
        await process_all(pipeline, [item(0), item(1)])  # the same result again: updated, never stored twice
    finally:
        await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.close_spider()))
    stored = pymongo.MongoClient(mongo_uri)[mongo_db]["items"]
    assert stored.count_documents({}) == 2
