"""The scrapy-redis node (scrapy crawl redis_search) of the experiment's scrapy_redis configuration, as a real
process against the simulated web, Redis and MongoDB."""

from __future__ import annotations

import json

from conftest import FAST_PROFILE

from product_crawl.cluster import LocalCluster, NodeSpec
from product_crawl.engines.baidu import BaiduEngine
from product_crawl.experiment.runner import scrapy_redis_keys
from product_crawl.simweb.corpus import corpus_size
from product_crawl.spiders.redis_search import dumps, loads

WORDS = ["光明", "高钙", "牛奶"]


def test_a_scrapy_redis_node_follows_a_query_to_its_last_page_and_stores_every_result(cluster: LocalCluster) -> None:
    url = cluster.start_simweb(FAST_PROFILE)
    keys = scrapy_redis_keys(cluster.prefix)
    first = BaiduEngine(url).page_url(WORDS, "good.example", 0)
    cluster.redis.rpush(keys["REDIS_START_URLS_KEY"],
                        json.dumps({"url": first, "meta": {"product": "光明高钙牛奶", "page": 0, "follow": True}}))
    node = cluster.start_node(NodeSpec("node1", "127.0.0.2"), "redis_search", DOWNLOAD_BIND_ADDRESS="127.0.0.2",
                              MAX_IDLE_TIME_BEFORE_CLOSE=2, **keys)
    assert node.wait(90) == 0
    total = corpus_size(WORDS, "good.example", 0, 40, 60)
    items = list(cluster.mongo[cluster.mongo_db]["items"].find({}, {"_id": 0}))
    assert len(items) == total  # every page of the query, one after another through scrapy-redis's queue
    assert {i["product"] for i in items} == {"光明高钙牛奶"} and {i["site"] for i in items} == {"good.example"}
    assert {i["node_id"] for i in items} == {"node1"}
    assert cluster.redis.scard(keys["SCHEDULER_DUPEFILTER_KEY"]) == -(-total // 10) - 1  # followed pages


def test_queue_serializer_is_json_and_keeps_bytes() -> None:
    request = {"url": "http://x/", "headers": {b"Accept": [b"text/html"]}, "body": b"\x00\xff", "meta": {"page": 2}}
    text = dumps(request)
    assert json.loads(text)["meta"] == {"page": 2}
    assert loads(text) == request
