"""Cluster-wide politeness: the polite script against a real Redis, and two real nodes against the simulated web."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import redis as redis_lib

from product_crawl.cluster import LocalCluster, NodeSpec
from scheduler_ext.keys import Keys
from scheduler_ext.models import Report, Subtask
from scheduler_ext.store import load_script


def polite(redis: redis_lib.Redis, keys: Keys, node: str, *, limit: int = 0, inflight: int = 0, want: int = 0,
           rate: float = 0.0, burst: float = 1.0, tokens: int = 0, key: str = "site.example") -> list[int]:
    script = redis.register_script(load_script("polite"))
    return [int(x) for x in script(keys=[keys.polite_slots(key), keys.polite_seen(key), keys.polite_bucket(key)],
                                   args=[node, limit, inflight, want, 10, rate, burst, tokens])]


def test_slots_never_exceed_the_limit_and_a_newcomer_gets_its_fair_share(redis: redis_lib.Redis, prefix: str
                                                                         ) -> None:
    keys = Keys(prefix)
    assert polite(redis, keys, "a", limit=4, want=10) == [4, 0]  # alone: the whole limit
    assert polite(redis, keys, "b", limit=4, want=10) == [0, 0]  # all held: nothing, but b now counts
    # a still has 4 in flight: its record stays true (4), though its fair share is now 2.
    assert polite(redis, keys, "a", limit=4, inflight=4, want=10) == [4, 0]
    assert polite(redis, keys, "b", limit=4, want=10) == [0, 0]
    assert polite(redis, keys, "a", limit=4, inflight=1, want=10) == [2, 0]  # down to its share as requests end
    assert polite(redis, keys, "b", limit=4, want=10) == [2, 0]
    assert redis.hget(keys.polite_slots("site.example"), "|sum") == "4"
    assert polite(redis, keys, "a", limit=4) == [0, 0]  # nothing wanted, nothing in flight: given back
    assert redis.hget(keys.polite_slots("site.example"), "|sum") == "2"
    assert not redis.hexists(keys.polite_slots("site.example"), "a")


def test_a_node_that_held_no_slot_and_died_does_not_stop_the_sites_politeness(redis: redis_lib.Redis,
                                                                              prefix: str) -> None:
    # b asked while a held the whole limit: it holds 0 slots. b dies (never syncs again); once its holding lapses,
    # giving back its 0 slots once took -0 from the sum, which Redis refuses as an integer: every node's sync for
    # the site failed until the keys expired.
    keys = Keys(prefix)
    assert polite(redis, keys, "a", limit=4, want=10) == [4, 0]
    assert polite(redis, keys, "b", limit=4, want=10) == [0, 0]
    assert redis.hget(keys.polite_slots("site.example"), "b") == "0"
    redis.zadd(keys.polite_seen("site.example"), {"b": 1})  # b's holding lapsed long ago
    assert polite(redis, keys, "a", limit=4, inflight=4, want=10) == [4, 0]  # alone again: the whole limit
    assert not redis.hexists(keys.polite_slots("site.example"), "b")
    assert redis.hget(keys.polite_slots("site.example"), "|sum") == "4"


def test_tokens_come_from_one_bucket_refilled_at_the_rate(redis: redis_lib.Redis, prefix: str) -> None:
    keys = Keys(prefix)
    assert polite(redis, keys, "a", rate=0.01, burst=3, tokens=10) == [0, 3]  # a full bucket: the burst
    assert polite(redis, keys, "b", rate=0.01, burst=3, tokens=10) == [0, 0]  # empty; 0.01/s refills nothing yet


def _profile(tmp_path: Path) -> Path:
    path = tmp_path / "polite.json"
    path.write_text(json.dumps({"name": "polite", "corpus": {"min": 200, "max": 300},
                                "default": {"share": 1.0, "latency": {"mean": 0.15, "spread": 0.0},
                                            "error_rate": 0.0, "block_rate": 0.0}}))
    return path


def _subtask(sid: str, site: str, first_page: int) -> str:
    return Subtask(id=sid, task="t" + sid, group="光明高钙牛奶", site=site, first_page=first_page, page_limit=4,
                   time_limit=60, payload={"engine": "baidu", "keywords": ["光明", "高钙", "牛奶"],
                                           "product": "光明高钙牛奶"}).to_json()


def test_two_nodes_together_never_exceed_the_site_limit(cluster: LocalCluster, tmp_path: Path) -> None:
    url = cluster.start_simweb(_profile(tmp_path))
    keys = cluster.store.keys
    for node in ("node1", "node2"):
        for i in range(3):
            cluster.redis.lpush(keys.crawl(node), _subtask(f"{node}-a{i}", "a.example", 4 * i))
            cluster.redis.lpush(keys.crawl(node), _subtask(f"{node}-b{i}", "b.example", 4 * i))
    limits: dict[str, Any] = {"SCHEDEXT_SITE_CONCURRENCY": 2, "SCHEDEXT_IDLE_CLOSE": 1}
    one = cluster.start_node(NodeSpec("node1", "127.0.0.2"), **limits)
    two = cluster.start_node(NodeSpec("node2", "127.0.0.3"), **limits)
    assert one.wait(120) == 0 and two.wait(120) == 0
    reports = [Report.from_json(r) for r in cluster.redis.lrange(keys.sleeping, 0, -1)]
    assert len(reports) == 12 and all(r.outcome == "done" and r.pages == 4 for r in reports)
    counters = json.loads(urllib.request.urlopen(f"{url}/_counters", timeout=5).read())
    # 48 pages of 0.15 s each from two nodes of 8 pages in flight each: without the limit, far more than 2 at once.
    assert counters["peak_in_flight"] == {"a.example": 2, "b.example": 2}
    assert sum(c["requests"] for c in counters["by_address"].values()) == 48


def test_a_node_keeps_scrapys_per_domain_concurrency(cluster: LocalCluster, tmp_path: Path) -> None:
    # Scrapy's own downloader starts every request waiting in a slot at once under the asyncio reactor
    # (scheduler_ext/downloader.py): this node had 4 of its 24 pages in flight at a limit of 2.
    url = cluster.start_simweb(_profile(tmp_path))
    keys = cluster.store.keys
    for i in range(6):
        cluster.redis.lpush(keys.crawl("node1"), _subtask(f"a{i}", "a.example", 4 * i))
    node = cluster.start_node(NodeSpec("node1", "127.0.0.2"), CONCURRENT_REQUESTS_PER_DOMAIN=2,
                              SCHEDEXT_IDLE_CLOSE=1)
    assert node.wait(120) == 0
    counters = json.loads(urllib.request.urlopen(f"{url}/_counters", timeout=5).read())
    assert sum(c["requests"] for c in counters["by_address"].values()) == 24
    assert counters["peak_in_flight"] == {"a.example": 2}
