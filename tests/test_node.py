"""The crawl node (scrapy crawl search) as real processes against the simulated web, Redis and MongoDB."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from conftest import FAST_PROFILE

from product_crawl.cluster import LocalCluster, NodeSpec
from product_crawl.simweb.corpus import corpus_size
from scheduler_ext.models import Report, Subtask

WORDS = ["光明", "高钙", "牛奶"]


def subtask(sid: str, site: str = "good.example", first_page: int = 0, pages: int = 3, time_limit: float = 30,
            **kw: Any) -> Subtask:
    return Subtask(id=sid, task="t" + sid, group="光明高钙牛奶", site=site, first_page=first_page, page_limit=pages,
                   time_limit=time_limit, payload={"engine": "baidu", "keywords": WORDS,
                                                   "keywords_joined": "光明&高钙&牛奶",
                                                   "product": "光明高钙牛奶"}, **kw)


def push(cluster: LocalCluster, node: str, *entries: str | bytes) -> None:
    for entry in entries:
        cluster.redis.lpush(cluster.store.keys.crawl(node), entry)


def reports(cluster: LocalCluster, which: str) -> list[dict[str, Any]]:
    return [json.loads(r) for r in cluster.redis.lrange(getattr(cluster.store.keys, which), 0, -1)]


def test_subtask_pushed_by_hand_is_crawled_stored_and_reported(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    push(cluster, "node1", subtask("s1", pages=3).to_json())
    proc = cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_IDLE_CLOSE=1)
    assert proc.wait(60) == 0

    [raw] = cluster.redis.lrange(cluster.store.keys.sleeping, 0, -1)
    report = Report.from_json(raw)
    total = corpus_size(WORDS, "good.example", 0, 40, 60)
    assert report.outcome == "done" and report.node == "node1" and report.reported == total
    assert report.offered == 30 and report.collected == 30 and report.pages == 3 and report.next_page == 3
    assert report.resume_page == 0  # every page of the slice was crawled
    assert report.ended >= report.started > 0
    # Node time: each of the 3 pages held one of the node's 8 slots for part of the run
    assert report.node_seconds is not None and 0 < report.node_seconds <= 3 * report.seconds / 8
    items = list(cluster.mongo[cluster.mongo_db]["items"].find({}, {"_id": 0}))
    assert len(items) == 30
    assert {i["subtask_id"] for i in items} == {"s1"} and {i["node_id"] for i in items} == {"node1"}
    assert sorted(i["rank"] for i in items) == list(range(1, 31))
    indexed = {tuple(k for k, _ in spec["key"]) for spec in
               cluster.mongo[cluster.mongo_db]["items"].index_information().values()}
    assert {("product", "site"), ("crawled_at",)} <= indexed  # the dashboard sorts by crawled_at
    first = min(items, key=lambda i: i["rank"])
    assert first["product"] == "光明高钙牛奶" and first["keywords"] == "光明&高钙&牛奶"
    assert first["site"] == "good.example"
    assert first["title"] and first["url"].startswith("http") and first["engine"] == "baidu" and first["page"] == 0
    runs = cluster.redis.xrange(cluster.store.keys.runs)
    assert len(runs) == 1 and json.loads(runs[0][1]["report"])["subtask"]["id"] == "s1"
    agg = cluster.redis.hgetall(cluster.store.keys.agg_site_node("good.example", "node1"))
    assert agg["runs"] == "1" and agg["collected"] == "30"
    assert json.loads(cluster.redis.hget(cluster.store.keys.est_site("good.example"), "node1"))["c"] == 1.0
    assert not cluster.redis.zcard(cluster.store.keys.leases)
    node_stats = cluster.redis.hgetall(cluster.store.keys.stats("node", "node1"))
    assert node_stats["item_scraped_count"] == "30"


def test_partial_service_is_measured_as_completion(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    push(cluster, "node2", subtask("h1", site="half.example", pages=4).to_json())
    assert cluster.start_node(NodeSpec("node2", "127.0.0.3"), SCHEDEXT_IDLE_CLOSE=1).wait(60) == 0
    report = Report.from_json(cluster.redis.lindex(cluster.store.keys.sleeping, 0))
    assert report.offered == 40 and 8 <= report.collected <= 32  # about half of the 40 results served
    assert cluster.items() == report.collected


def test_pickle_in_crawl_queue_goes_to_failed_and_node_keeps_crawling(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    push(cluster, "node1", pickle.dumps({"id": "evil", "cmd": "rm -rf /"}), b"not json at all",
         subtask("ok1", pages=2).to_json())
    assert cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_IDLE_CLOSE=1).wait(60) == 0
    failed = reports(cluster, "failed")
    assert len(failed) == 2 and all(f["malformed"] and "malformed subtask" in f["reason"] for f in failed)
    assert [Report.from_json(r).subtask.id for r in cluster.redis.lrange(cluster.store.keys.sleeping, 0, -1)] == ["ok1"]
    assert cluster.items() == 20


def test_block_page_fails_the_subtask_with_a_reason(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    push(cluster, "node1", subtask("b1", site="blocked.example", pages=2).to_json())
    assert cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_IDLE_CLOSE=1).wait(60) == 0
    [failure] = reports(cluster, "failed")
    assert failure["outcome"] == "failed" and failure["reason"].startswith("blocked")
    assert failure["subtask"]["id"] == "b1" and cluster.items() == 0


def test_time_limit_ends_subtask_as_timeout_with_what_it_got(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    # 0.8 s a page, one page at a time, 2 s allowed: a couple of pages, then the rest is dropped.
    push(cluster, "node1", subtask("t1", site="slow.example", pages=8, time_limit=2.0).to_json())
    node = cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_IDLE_CLOSE=1, CONCURRENT_REQUESTS=1)
    assert node.wait(60) == 0
    report = Report.from_json(cluster.redis.lindex(cluster.store.keys.sleeping, 0))
    assert report.outcome == "timeout" and 1 <= report.pages < 8
    assert report.next_page == report.pages  # pages are taken in order, so the next subtask resumes after them
    assert cluster.items() == report.collected == 10 * report.pages


def test_kill_9_mid_subtask_leaves_lease_and_recrawl_stores_no_duplicates(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    st = subtask("k1", site="slow.example", pages=5)
    push(cluster, "node1", st.to_json())
    cluster.start_node(NodeSpec("node1", "127.0.0.2"), CONCURRENT_REQUESTS=1)
    assert cluster.wait_for(lambda: cluster.items() >= 10, 60)
    cluster.kill("node1")
    keys = cluster.store.keys
    # Not lost: still leased (recoverable by the control), never reported.
    assert cluster.redis.zscore(keys.leases, "k1") is not None
    assert json.loads(cluster.redis.hget(keys.lease_info, "k1"))["node"] == "node1"
    assert not cluster.redis.llen(keys.sleeping) and not cluster.redis.llen(keys.failed)
    total = min(50, corpus_size(WORDS, "slow.example", 0, 40, 60))  # 5 pages of the query's results
    before = cluster.items()
    assert 10 <= before < total
    # Crawl it again on another node (what a recall does): every result stored once.
    push(cluster, "node3", st.to_json())
    assert cluster.start_node(NodeSpec("node3", "127.0.0.4"), SCHEDEXT_IDLE_CLOSE=1).wait(90) == 0
    assert cluster.items() == total
    coll = cluster.mongo[cluster.mongo_db]["items"]
    assert len(coll.distinct("fingerprint")) == total
    # The first node's lease was replaced by the second's take; its late finish would be refused by the token.
    assert Report.from_json(cluster.redis.lindex(keys.sleeping, 0)).node == "node3"


def test_sigterm_returns_unfinished_and_queued_subtasks_to_waiting(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    first, second = subtask("w1", site="slow.example", pages=5, priority=1.0), subtask("w2", priority=2.0)
    push(cluster, "node1", first.to_json(), second.to_json())
    cluster.start_node(NodeSpec("node1", "127.0.0.2"), CONCURRENT_REQUESTS=1)
    keys = cluster.store.keys
    assert cluster.wait_for(lambda: cluster.redis.zscore(keys.leases, "w1") is not None, 60)
    assert cluster.stop_process("node1") == 0
    # Both are back in waiting at once, with their priorities: nothing waits for a recall.
    assert cluster.redis.zrange(keys.waiting, 0, -1, withscores=True) == [("w1", 1.0), ("w2", 2.0)]
    assert not cluster.redis.zcard(keys.leases) and not cluster.redis.llen(keys.crawl("node1"))
    assert Subtask.from_json(cluster.redis.hget(keys.subtasks, "w2")).id == "w2"
    assert not cluster.redis.hexists(keys.nodes, "node1")  # deregistered


def test_http_error_fails_the_subtask_with_the_status(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    push(cluster, "node4", subtask("e1", site="error.example", pages=2).to_json())
    assert cluster.start_node(NodeSpec("node4", "127.0.0.5"), SCHEDEXT_IDLE_CLOSE=1).wait(60) == 0
    [failure] = reports(cluster, "failed")
    assert failure["reason"].startswith("HTTP 503") and failure["subtask"]["id"] == "e1"


def test_mongodb_write_error_fails_the_subtask_and_drops_nothing_silently(cluster: LocalCluster, tmp_path: Any
                                                                          ) -> None:
    from product_crawl import services

    port = services.free_port()
    mongo = services.start_mongo_server(port, tmp_path / "private-mongo")
    cluster.start_simweb(FAST_PROFILE)
    push(cluster, "node1", subtask("m1", site="slow.example", pages=5).to_json())
    cluster.start_node(NodeSpec("node1", "127.0.0.2"), CONCURRENT_REQUESTS=1, PC_MONGO_TIMEOUT=1, PC_MONGO_OUTAGE=2,
                       MONGO_URI=f"mongodb://127.0.0.1:{port}")
    keys = cluster.store.keys
    assert cluster.wait_for(lambda: cluster.redis.zscore(keys.leases, "m1") is not None, 60)
    services.stop_pid(mongo.pid)  # MongoDB goes away while the subtask is being crawled
    assert cluster.wait_for(lambda: cluster.redis.llen(keys.failed) == 1, 60)
    [failure] = reports(cluster, "failed")
    assert failure["subtask"]["id"] == "m1" and "item pipeline error" in failure["reason"]
    assert not cluster.redis.llen(keys.sleeping)  # reported as failed, so the control recalls it


def test_a_finished_subtask_frees_its_slot_and_the_next_is_taken_at_once(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    push(cluster, "node1", *[subtask(f"n{i}", first_page=3 * i).to_json() for i in range(3)])
    # One subtask at a time and no refill timer to speak of: only the finish of one can start the next.
    node = cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_CONCURRENT_SUBTASKS=1,
                              SCHEDEXT_REFILL_INTERVAL=3600, SCHEDEXT_IDLE_CLOSE=1)
    assert node.wait(60) == 0
    done = sorted((Report.from_json(r) for r in cluster.redis.lrange(cluster.store.keys.sleeping, 0, -1)),
                  key=lambda r: r.started)
    assert [r.subtask.id for r in done] == ["n0", "n1", "n2"] and all(r.outcome == "done" for r in done)
    assert all(a.ended <= b.started for a, b in zip(done, done[1:], strict=False))  # one after the other
    assert cluster.items() == sum(r.collected for r in done) > 0


def test_an_idle_node_takes_work_as_soon_as_it_is_queued_without_its_refill_timer(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    # No refill timer to speak of: the node learns of each entry by waiting on its (empty) crawl queue. Without that
    # wait only Scrapy's engine heartbeat (every 5 s) would make it look again: 7.5 s for three entries on average.
    node = cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_REFILL_INTERVAL=3600, SCHEDEXT_IDLE_CLOSE=30)
    assert cluster.wait_for(lambda: cluster.redis.hexists(cluster.store.keys.nodes, "node1"), 60)
    delays = []
    for i in range(3):
        pushed = cluster.store.now()
        push(cluster, "node1", subtask(f"w{i}", first_page=2 * i, pages=2).to_json())
        assert cluster.wait_for(lambda n=i: cluster.redis.llen(cluster.store.keys.sleeping) > n, 30, interval=0.05)
        report = Report.from_json(cluster.redis.lindex(cluster.store.keys.sleeping, 0))
        assert report.subtask.id == f"w{i}" and report.outcome == "done"
        delays.append(report.started - pushed)
    assert sum(delays) < 4.5, delays  # each about the time of one take (0.1 s quiet); never Scrapy's 5 s heartbeat
    assert cluster.stop_process("node1") == 0 and node.poll() is not None
    assert cluster.items() > 0


def test_node_survives_a_redis_restart_and_sends_the_finish_it_could_not(cluster: LocalCluster, tmp_path: Any
                                                                         ) -> None:
    from product_crawl import services

    port = services.free_port()
    data = tmp_path / "private-redis"
    server = services.start_redis_server(port, data)
    url = f"redis://127.0.0.1:{port}/0"
    private = LocalCluster(redis_url=url, mongo_uri=cluster.mongo_uri, mongo_db=cluster.mongo_db,
                           prefix=cluster.prefix, log_dir=tmp_path / "logs", settings=dict(cluster.settings))
    try:
        private.start_simweb(FAST_PROFILE)
        keys = private.store.keys
        push(private, "node1", subtask("r1", site="slow.example", pages=3).to_json())
        private.start_node(NodeSpec("node1", "127.0.0.2"), CONCURRENT_REQUESTS=1, SCHEDEXT_BACKOFF_MAX=1,
                           SCHEDEXT_STATS_FLUSH_INTERVAL=0.5)
        assert private.wait_for(lambda: private.redis.zscore(keys.leases, "r1") is not None, 60)
        private.redis.close()
        services.stop_pid(server.pid)  # Redis goes away while r1 is crawled (its data is kept on disk)
        log = tmp_path / "logs" / "node1.log"
        assert private.wait_for(lambda: "finishing subtasks failed, Redis unreachable" in log.read_text(), 60)
        server = services.start_redis_server(port, data)  # and comes back
        # The finish is sent again with the same token and accepted: the report exists, the lease is gone.
        assert private.wait_for(lambda: private.redis.llen(keys.sleeping) == 1, 60)
        assert Report.from_json(private.redis.lindex(keys.sleeping, 0)).subtask.id == "r1"
        assert private.redis.zscore(keys.leases, "r1") is None
        # Every loop came back by itself: the node takes new work, heartbeats and flushes its stats.
        push(private, "node1", subtask("r2", pages=2).to_json())
        assert private.wait_for(lambda: private.redis.llen(keys.sleeping) == 2, 60)
        assert private.wait_for(
            lambda: private.redis.hget(keys.stats("node", "node1"), "schedext/subtasks/done") == "2", 30)
        assert private.alive("node1") and "Traceback" not in log.read_text()
    finally:
        private.stop()
        services.stop_pid(server.pid)


def test_every_blocked_page_of_a_run_is_reported_and_charged(cluster: LocalCluster, tmp_path: Any) -> None:
    # Slow block pages: the node starts all 4 pages (8 in flight allowed) long before the first answers, so the run
    # attempts 4 pages and every one is a block page, not only the first that failed the subtask.
    profile = json.loads(FAST_PROFILE.read_text(encoding="utf-8"))
    profile["nodes"]["127.0.0.2"]["sites"]["blocked.example"] = {"block_rate": 1.0, "latency": {"mean": 1.5,
                                                                                                 "spread": 0.0}}
    (tmp_path / "slow_blocks.json").write_text(json.dumps(profile), encoding="utf-8")
    cluster.start_simweb(tmp_path / "slow_blocks.json")
    push(cluster, "node1", subtask("b4", site="blocked.example", pages=4).to_json())
    assert cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_IDLE_CLOSE=1).wait(60) == 0
    report = Report.from_json(cluster.redis.lindex(cluster.store.keys.failed, 0))
    assert (report.attempted, report.blocked, report.failed, report.pages) == (4, 4, 0, 0)
    # Its node time: 4 pages held a slot for their 1.5 s each, of the node's 8 slots (not the run's 1.5 s, nor the
    # recall that a failed run costs its task).
    assert report.node_seconds is not None and 4 * 1.5 / 8 <= report.node_seconds < 4 * 2.0 / 8
    # The pair's sums (the finish script) charge all 4 pages attempted, none collected, and the node time.
    sums = json.loads(cluster.redis.hget(cluster.store.keys.est_site("blocked.example"), "node1"))
    assert (sums["pg"], sums["got"], sums["n"]) == (4, 0, 1)
    assert sums["sec"] == pytest.approx(report.node_seconds, abs=1e-5)


def test_idle_close_counts_from_the_last_finish_not_from_scrapys_first_idle_signal() -> None:
    # Scrapy sends spider_idle every 5 s; a node asked to close after 1 idle second, whose last finish was 2 s
    # ago, closes at the first signal instead of keeping the cluster's process open one more heartbeat.
    import time
    from types import SimpleNamespace

    import pytest
    from scrapy.exceptions import DontCloseSpider

    from scheduler_ext.scheduler import SubtaskScheduler

    def node(finished_ago: float, cluster_work: bool = False) -> SubtaskScheduler:
        s = SubtaskScheduler.__new__(SubtaskScheduler)
        s.idle_close, s.tracker, s._unsent, s._idle_since = 1.0, SimpleNamespace(active={}), {}, None
        s._worked_at = time.monotonic() - finished_ago
        s._cluster_has_work = lambda: cluster_work  # type: ignore[method-assign]
        return s

    node(2.0)._on_idle()  # closes: no DontCloseSpider
    for waiting in (node(0.0), node(2.0, cluster_work=True)):
        with pytest.raises(DontCloseSpider):
            waiting._on_idle()


def test_a_starved_node_asks_for_more_only_once_it_got_what_it_asked_for() -> None:
    # A busy node whose crawl queue runs dry doubles its prefetch (and tells the control at once), but only once it
    # has taken a whole prefetch since the prefetch last changed: a node the control gives less than it asks for
    # (late binding holds the work for a better node) has room already (docs/node.md, "Prefetch").
    import math
    from types import SimpleNamespace

    from scheduler_ext.scheduler import Pace, SubtaskScheduler

    told: list[int] = []
    s = SubtaskScheduler.__new__(SubtaskScheduler)
    s.pace = Pace(ready=8, max_leases=16, prefetch=None, prefetch_min=2, prefetch_max=64, tick=1.0)
    s.tracker = SimpleNamespace(active={"s1": object()})
    s.prefetch, s._fed, s._grown_at, s.refill_interval = 2, 1, -math.inf, 0.5
    s._heartbeat_soon = SimpleNamespace(schedule=lambda: told.append(s.prefetch))
    s._starved()
    assert (s.prefetch, told) == (2, [])  # given one of the two it asked for: it does not ask for more
    s._fed = 2
    s._starved()
    assert (s.prefetch, s._fed, told) == (4, 0, [4])  # fed all it asked for: doubled, and the control told
