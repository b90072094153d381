"""MongoPipeline against a real MongoDB-protocol server (nx-27017), in this process's reactor."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymongo
import pytest
import pytest_twisted
from scrapy.utils.test import get_crawler
from twisted.internet import defer, reactor

from product_crawl import services
from product_crawl.items import SearchResultItem
from product_crawl.pipelines import MongoPipeline
from scheduler_ext.exceptions import ConfigurationError


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


@pytest_twisted.ensureDeferred
async def test_a_result_stored_before_keeps_its_first_crawl_and_records_the_last(mongo_uri: str,
                                                                                 mongo_db: str) -> None:
    # One batch holds a new result, one stored before, and the same new result twice: the insert refuses the
    # duplicates and the update refreshes them; nothing is stored twice and nothing new is lost.
    pipeline = MongoPipeline(mongo_uri, mongo_db, "items", batch_size=100, batch_delay=0.02)
    await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.open_spider()))
    first, again, fresh = item(0), item(0), item(1)
    again.node_id, again.subtask_id, again.crawled_at = "node2", "s2", first.crawled_at + 60
    try:
        await process_all(pipeline, [first])
        await process_all(pipeline, [again, fresh, item(1)])
    finally:
        await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.close_spider()))
    stored = {d["url"]: d for d in pymongo.MongoClient(mongo_uri)[mongo_db]["items"].find()}
    assert len(stored) == 2
    kept = stored[first.url]
    assert (kept["node_id"], kept["subtask_id"], kept["crawled_at"]) == ("node1", "s1", first.crawled_at)
    assert (kept["last_node_id"], kept["last_subtask_id"]) == ("node2", "s2")
    assert abs(kept["last_crawled_at"] - again.crawled_at) < 1e-3  # nx-27017's update keeps 15 digits
    assert stored[fresh.url]["last_node_id"] == "node1" and stored[fresh.url]["title"] == "title 1"


@dataclass
class Outer:
    product: str
    url: str
    inner: Inner


@dataclass
class Inner:
    words: list[str]


@pytest_twisted.ensureDeferred
async def test_an_item_holding_an_item_is_stored_as_a_document(mongo_uri: str, mongo_db: str) -> None:
    pipeline = MongoPipeline(mongo_uri, mongo_db, "items", batch_size=100, batch_delay=0.02)
    await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.open_spider()))
    try:
        await process_all(pipeline, [Outer("p", "http://good.example/x", Inner(["a", "b"]))])
    finally:
        await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.close_spider()))
    doc = pymongo.MongoClient(mongo_uri)[mongo_db]["items"].find_one({"url": "http://good.example/x"})
    assert doc is not None and doc["inner"] == {"words": ["a", "b"]}


@pytest_twisted.ensureDeferred
async def test_a_urls_items_are_found_by_the_id_range_without_an_index_on_fingerprint(mongo_uri: str,
                                                                                       mongo_db: str) -> None:
    from product_crawl.pipelines import fingerprint_range

    pipeline = MongoPipeline(mongo_uri, mongo_db, "items", batch_size=100, batch_delay=0.02)
    await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.open_spider()))
    other = dataclasses.replace(item(1), product="蒙牛纯牛奶")  # the same result for another product
    try:
        await process_all(pipeline, [item(i) for i in range(5)] + [other])
    finally:
        await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.close_spider()))
    stored = pymongo.MongoClient(mongo_uri)[mongo_db]["items"]
    keys = [tuple(k for k, _ in spec["key"]) for spec in stored.index_information().values()]
    assert ("product", "site") in keys and ("crawled_at",) in keys and ("fingerprint",) not in keys
    found = stored.find(fingerprint_range("http://good.example/1.html"))
    assert sorted(d["product"] for d in found) == ["光明高钙牛奶", "蒙牛纯牛奶"]
    assert [d["rank"] for d in stored.find(fingerprint_range("http://good.example/3.html"))] == [4]


@pytest_twisted.ensureDeferred
async def test_a_node_started_while_mongodb_is_down_stores_its_items_once_it_is_up(tmp_path: Path) -> None:
    # MongoDB not up yet when the node opens (a cluster started out of order, MongoDB restarting): the open must not
    # fail the node; the first batch waits for MongoDB (PC_MONGO_OUTAGE), is stored once it answers, and makes the
    # indexes then. Before, the open raised ServerSelectionTimeoutError and the node's crawl ended at its start.
    port = services.free_port()
    uri = f"mongodb://127.0.0.1:{port}"
    pipeline = MongoPipeline(uri, "late", "items", timeout=0.5, outage=60.0)
    await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.open_spider()))
    reactor.callLater(2.0, lambda: started.append(services.start_mongo_server(port, tmp_path / "mongodb")))
    started: list[Any] = []
    try:
        await process_all(pipeline, [item(i) for i in range(3)])
        await defer.Deferred.fromFuture(asyncio.ensure_future(pipeline.close_spider()))
        stored = pymongo.MongoClient(uri)["late"]["items"]
        assert stored.count_documents({}) == 3
        assert {("product", "site"), ("crawled_at",)} <= {tuple(ix["key"]) for ix in stored.list_indexes()}
    finally:
        for proc in started:
            services.stop_pid(proc.pid)


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("PC_MONGO_BATCH_SIZE", "0", "PC_MONGO_BATCH_SIZE: expected an integer >= 1, got '0'"),
    ("PC_MONGO_BATCH_SIZE", "many", "PC_MONGO_BATCH_SIZE: expected an integer >= 1, got 'many'"),
    ("PC_MONGO_BATCH_DELAY", "-0.1", "PC_MONGO_BATCH_DELAY: expected a number >= 0 and <= 604800, got '-0.1'"),
    ("PC_MONGO_TIMEOUT", "nan", "PC_MONGO_TIMEOUT: expected a number > 0 and <= 604800, got 'nan'"),
    ("PC_MONGO_TIMEOUT", "0", "PC_MONGO_TIMEOUT: expected a number > 0 and <= 604800, got '0'"),
    ("PC_MONGO_OUTAGE", "inf", "PC_MONGO_OUTAGE: expected a number >= 0 and <= 604800, got 'inf'"),
    ("PC_ITEM_FIELD_MAXLEN", "-5", "PC_ITEM_FIELD_MAXLEN: expected an integer >= 1, got '-5'"),
])
def test_a_bad_storage_setting_is_refused_naming_it(name: str, value: str, expected: str) -> None:
    # Before: int('many') / int(nan * 1000) tracebacks at start, or a node that never retried (-1) or refused
    # every item (-5).
    with pytest.raises(ConfigurationError) as err:
        MongoPipeline.from_crawler(get_crawler(settings_dict={name: value}))
    assert str(err.value) == expected


def test_storage_settings_left_unset_take_their_defaults() -> None:
    pipeline = MongoPipeline.from_crawler(get_crawler(settings_dict={"PC_MONGO_BATCH_SIZE": "7"}))
    assert (pipeline.batch_size, pipeline.timeout, pipeline.outage) == (7, 10.0, 60.0)


def test_a_malformed_mongo_uri_stops_the_node_naming_it() -> None:
    # Before: pymongo took "notaurl" for a host name, and the node waited for it (PC_MONGO_OUTAGE) batch after batch
    for uri in ("notaurl", "mongodb://h:99999"):
        with pytest.raises(ConfigurationError, match=f"^MONGO_URI: expected mongodb://.*, got '{uri}'"):
            MongoPipeline.from_crawler(get_crawler(settings_dict={"MONGO_URI": uri}))
