"""The whole loop as real processes: nodes, controls, the simulated web, Redis and MongoDB.

Short intervals come from settings (tests/conftest.py FAST_SETTINGS: recall threshold 4 s, tick 0.3 s, heartbeat
0.5 s, leader lease 2 s); nothing here sleeps for a production interval.
"""

from __future__ import annotations

import json
import time

from conftest import FAST_PROFILE, FAST_SETTINGS

from product_crawl.cluster import LocalCluster, NodeSpec
from product_crawl.simweb.corpus import corpus_size
from product_crawl.tasks import keywords_for

NODES = [NodeSpec("node1", "127.0.0.2"), NodeSpec("node2", "127.0.0.3"), NodeSpec("node3", "127.0.0.4")]
THRESHOLD, TICK = FAST_SETTINGS["SCHEDEXT_RECALL_THRESHOLD"], FAST_SETTINGS["SCHEDEXT_TICK_INTERVAL"]


def all_done(cluster: LocalCluster) -> bool:
    products = cluster.status()["products"]
    return bool(products) and all(p["tasks"] and p["done"] == p["tasks"] for p in products.values())


def assert_no_duplicates(cluster: LocalCluster) -> None:
    coll = cluster.mongo[cluster.mongo_db]["items"]
    keys = {(d["fingerprint"], d["product"]) for d in coll.find({}, {"fingerprint": 1, "product": 1})}
    assert len(keys) == coll.count_documents({})


def test_node_kill_and_leader_kill_lose_nothing(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    products = [("光明高钙牛奶", None), ("特仑苏", "蒙牛")]
    sites = ["slow.example", "good.example"]
    for node in NODES:
        cluster.start_node(node, SCHEDEXT_ALLOCATION="scheduler_ext.strategies.allocation.SharedAllocation")
    for name in ("control-a", "control-b"):
        cluster.start_control(name)
    cluster.inject([{"name": n, **({"brand": b} if b else {}), "sites": sites} for n, b in products])
    keys = cluster.store.keys

    # Kill -9 a node while it holds a lease on a slow page.
    def leased_slow() -> tuple[str, str] | None:
        for sid, raw in cluster.redis.hgetall(keys.lease_info).items():
            st = cluster.redis.hget(keys.subtasks, sid)
            if st and json.loads(st)["site"] == "slow.example":
                return sid, json.loads(raw)["node"]
        return None

    assert cluster.wait_for(lambda: leased_slow() is not None, 60)
    found = leased_slow()
    assert found is not None
    sid, victim = found
    cluster.kill(victim)
    killed_at = time.monotonic()
    assert cluster.wait_for(lambda: cluster.redis.zscore(keys.leases, sid) is None
                            or json.loads(cluster.redis.hget(keys.lease_info, sid) or '{"node": ""}')["node"] != victim,
                            THRESHOLD + 15, interval=0.1)
    recalled_after = time.monotonic() - killed_at
    # Within the threshold plus one tick (and a little for a loaded 2-core machine).
    assert recalled_after <= THRESHOLD + TICK + 3, recalled_after
    assert int(cluster.redis.hget(keys.node_counters(victim), "recalled") or 0) >= 1

    # Kill -9 the leader; the standby takes over.
    leader = cluster.redis.get(keys.leader)
    assert leader in ("control-a", "control-b")
    cluster.kill(leader)
    standby = "control-b" if leader == "control-a" else "control-a"
    assert cluster.wait_for(lambda: cluster.redis.get(keys.leader) == standby, 15)

    # Everything is collected in the end: every page of every task, once.
    assert cluster.wait_for(lambda: all_done(cluster), 150, interval=1)
    expected = sum(corpus_size(keywords_for(n, b), s, 0, 40, 60) for n, b in products for s in sites)
    assert_no_duplicates(cluster)
    assert cluster.items() == expected
    runs = [json.loads(r[1]["report"]) for r in cluster.redis.xrange(keys.runs)]
    assert any(r["subtask"]["id"] == sid and r["node"] != victim for r in runs)  # finished elsewhere
    assert not cluster.redis.hlen(keys.dead)


def test_poison_subtask_dead_letters_after_exactly_max_recalls_with_two_controls(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    for node in NODES[:2]:
        cluster.start_node(node)
    for name in ("control-a", "control-b"):
        cluster.start_control(name, SCHEDEXT_RECALL_MAX=3)
    cluster.inject([{"name": "光明高钙牛奶", "sites": ["blocked.example"]}])
    keys = cluster.store.keys
    assert cluster.wait_for(lambda: cluster.redis.hlen(keys.dead) >= 1, 60)
    time.sleep(5 * TICK)  # a few more ticks of both controls: nothing may be recalled twice
    [entry] = [json.loads(v) for v in cluster.redis.hvals(keys.dead)]
    assert entry["kind"] == "subtask" and entry["attempts"] == 3 and entry["reason"].startswith("failed on")
    assert "blocked" in entry["reason"] and entry["last_node"] in ("node1", "node2")
    runs = [json.loads(r[1]["report"]) for r in cluster.redis.xrange(keys.runs)]
    assert [r["subtask"]["id"] for r in runs] == [entry["id"]] * 3
    assert sum(int(cluster.redis.hget(keys.node_counters(n.id), "recalled") or 0) for n in NODES[:2]) == 3
    assert not cluster.redis.zcard(keys.waiting) and not cluster.redis.zcard(keys.leases)
    assert cluster.redis.get(keys.leader) in ("control-a", "control-b")


def test_a_control_that_read_a_full_batch_ticks_again_at_once(cluster: LocalCluster) -> None:
    # Ticks every 30 s, no wake, one entry of each input a tick: three products wait. Without ticking again at
    # once after a full batch, the second would be split 30 s after the first and the third 60 s after.
    cluster.inject([{"name": n, "sites": ["good.example"]} for n in ("光明高钙牛奶", "蒙牛早餐奶", "特仑苏")])
    cluster.start_control(SCHEDEXT_TICK_INTERVAL=30, SCHEDEXT_TICK_WAKE=0, SCHEDEXT_TICK_BATCH=1)
    keys = cluster.store.keys
    assert cluster.wait_for(lambda: cluster.redis.hlen(keys.tasks) >= 1, 60, interval=0.05)
    first = time.monotonic()
    assert cluster.wait_for(lambda: cluster.redis.hlen(keys.tasks) == 3 and not cluster.redis.llen(keys.virtual),
                            15, interval=0.05)
    assert time.monotonic() - first < 15


def test_a_report_wakes_the_control_so_a_task_goes_on_long_before_the_next_tick(cluster: LocalCluster) -> None:
    # Ticks every 30 s, first subtasks of 2 pages: every task needs a second subtask, which only a tick can make.
    # Without waking, none would exist before the second tick, 30 s after the first; with it, the node's report
    # starts a tick SCHEDEXT_TICK_WAKE (0.1 s) after the last one ended.
    cluster.start_simweb(FAST_PROFILE)
    cluster.start_node(NODES[0])
    assert cluster.wait_for(lambda: cluster.redis.hexists(cluster.store.keys.nodes, "node1"), 60)
    cluster.inject([{"name": n, "sites": ["good.example"]} for n in ("光明高钙牛奶", "蒙牛早餐奶")])
    cluster.start_control(SCHEDEXT_TICK_INTERVAL=30, SCHEDEXT_PAGE_LIMIT=2)
    assert cluster.wait_for(lambda: cluster.redis.xlen(cluster.store.keys.runs) > 0, 60, interval=0.05)
    first = time.monotonic()
    assert cluster.wait_for(lambda: all_done(cluster), 20, interval=0.1), cluster.status()["products"]
    assert time.monotonic() - first < 20 and cluster.redis.xlen(cluster.store.keys.runs) >= 4
    assert_no_duplicates(cluster)
