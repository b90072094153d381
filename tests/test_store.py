"""Tests of scheduler_ext.store: every Lua script (take, heartbeat, finish, release, commit, lead) against a
real Redis, with a key prefix of each test's own."""

from __future__ import annotations

import json
import pickle
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis as redis_lib

from scheduler_ext.keys import Keys
from scheduler_ext.models import Report, Subtask
from scheduler_ext.store import Guard, Store, Write


@pytest.fixture
def store(redis: redis_lib.Redis, prefix: str) -> Store:
    return Store(redis, Keys(prefix))


def sub(
    sid: str = "s1",
    *,
    time_limit: float = 60.0,
    priority: float = 0.0,
    site: str = "a.com",
    group: str = "milk",
) -> Subtask:
    return Subtask(
        id=sid,
        task="t1",
        site=site,
        first_page=0,
        page_limit=5,
        time_limit=time_limit,
        group=group,
        priority=priority,
    )


def queue(store: Store, node: str, *subtasks: Subtask) -> None:
    """What the control does when it allocates: LPUSH to the crawl queue, note the time in `queued`."""
    for s in subtasks:
        store.redis.lpush(store.keys.crawl(node), s.to_json())
        store.redis.zadd(store.keys.queued, {s.id: store.now()})


def snapshot(store: Store, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    r = store.redis
    out: dict[str, Any] = {}
    for key in sorted(r.scan_iter(match=f"{store.keys.prefix}:*")):
        if key in skip:
            continue
        kind = r.type(key)
        if kind == "string":
            out[key] = r.get(key)
        elif kind == "list":
            out[key] = r.lrange(key, 0, -1)
        elif kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        elif kind == "stream":
            out[key] = r.xrange(key)
    return out


# --- take ---------------------------------------------------------------------------------------------------


def test_take_moves_the_entry_into_a_lease(store: Store) -> None:
    k, s = store.keys, sub(time_limit=60.0)
    queue(store, "n1", s)
    before = store.now()
    taken = store.take("n1", lease_ttl=30.0, grace=10.0)
    assert taken is not None
    raw, token, started = taken
    assert raw == s.to_json() and Subtask.from_json(raw) == s
    assert token.startswith("n1:")
    assert before <= started <= store.now()
    assert store.redis.zscore(k.leases, "s1") == pytest.approx(started + 30.0, abs=1e-3)
    lease = json.loads(store.redis.hget(k.lease_info, "s1"))
    assert lease["token"] == token and lease["node"] == "n1"
    assert lease["started"] == pytest.approx(started, abs=1e-3)
    assert store.redis.hget(k.subtasks, "s1") == raw
    assert store.redis.llen(k.crawl("n1")) == 0
    assert store.redis.zscore(k.queued, "s1") is None


def test_take_caps_the_lease_at_time_limit_plus_grace(store: Store) -> None:
    queue(store, "n1", sub(time_limit=5.0))
    taken = store.take("n1", lease_ttl=30.0, grace=2.0)
    assert taken is not None
    assert store.redis.zscore(store.keys.leases, "s1") == pytest.approx(taken[2] + 7.0, abs=1e-3)


def test_take_is_fifo_and_tokens_differ(store: Store) -> None:
    queue(store, "n1", sub("s1"), sub("s2"))
    first, second = store.take("n1", 30.0, 10.0), store.take("n1", 30.0, 10.0)
    assert first is not None and second is not None
    assert [Subtask.from_json(first[0]).id, Subtask.from_json(second[0]).id] == ["s1", "s2"]
    assert first[1] != second[1]


def test_take_on_an_empty_queue(store: Store) -> None:
    assert store.take("n1", 30.0, 10.0) is None
    queue(store, "n2", sub())
    assert store.take("n1", 30.0, 10.0) is None  # another node's queue is not ours
    assert store.redis.zcard(store.keys.leases) == 0


def test_wait_for_entry_returns_when_an_entry_arrives_and_leaves_the_list_as_it_was(store: Store) -> None:
    key = store.keys.crawl("n1")
    assert store.wait_for_entry(key, 0.05) is False  # empty: waits out the timeout
    queue(store, "n1", sub("s1"), sub("s2"))
    before = store.redis.lrange(key, 0, -1)
    assert store.wait_for_entry(key, 0.05) is True
    assert store.redis.lrange(key, 0, -1) == before  # the rotation onto itself takes nothing, in the same order
    assert store.take("n1", 30.0, 10.0) is not None and Subtask.from_json(store.take("n1", 30.0, 10.0)[0]).id == "s2"

    # A waiter blocked on the empty queue (as the node waits, in a worker thread) returns once the control pushes.
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(store.wait_for_entry, key, 30.0)
        queue(store, "n1", sub("s3"))
        assert waiting.result(timeout=10) is True
    assert [Subtask.from_json(e).id for e in store.redis.lrange(key, 0, -1)] == ["s3"]


def test_take_moves_malformed_entries_to_failed_and_takes_the_next_valid(store: Store) -> None:
    k = store.keys
    missing_id = json.dumps({"v": 1, "task": "t1", "site": "a.com", "time_limit": 30})
    wrong_version = json.dumps({**json.loads(sub("s9").to_json()), "v": 2})
    for bad in (pickle.dumps({"a": 1}), "not json at all", missing_id, wrong_version):
        store.redis.lpush(k.crawl("n1"), bad)
    store.redis.zadd(k.queued, {"s9": 1.0})
    queue(store, "n1", sub("s1"))
    taken = store.take("n1", 30.0, 10.0)
    assert taken is not None and Subtask.from_json(taken[0]).id == "s1"
    failures = [json.loads(raw) for raw in reversed(store.redis.lrange(k.failed, 0, -1))]
    assert len(failures) == 4
    for f in failures:
        assert f["malformed"] is True and f["node"] == "n1" and f["outcome"] == "failed"
        assert f["reason"].startswith(f"malformed subtask in {k.crawl('n1')}: ")
    assert "not a JSON object" in failures[0]["reason"] and "not a JSON object" in failures[1]["reason"]
    assert "id" in failures[2]["reason"]
    assert failures[3]["id"] == "s9"
    assert store.redis.zscore(k.queued, "s9") is None
    assert failures[1]["raw"] == "not json at all"
    assert store.redis.hget(k.counters, "malformed_subtasks") == "4"
    assert store.redis.llen(k.crawl("n1")) == 0


def test_take_skips_at_most_max_skip_entries(store: Store) -> None:
    k = store.keys
    store.redis.lpush(k.crawl("n1"), "bad1", "bad2")
    queue(store, "n1", sub("s1"))
    assert store.take("n1", 30.0, 10.0, max_skip=2) is None
    assert store.redis.llen(k.failed) == 2
    taken = store.take("n1", 30.0, 10.0, max_skip=2)
    assert taken is not None and Subtask.from_json(taken[0]).id == "s1"


# --- finish -------------------------------------------------------------------------------------------------


def _run(
    store: Store,
    sid: str,
    *,
    offered: int,
    collected: int,
    pages: int,
    seconds: float,
    ok: bool,
    node: str = "n1",
    alpha: float = 0.3,
    node_seconds: float | None = None,
) -> str:
    queue(store, node, sub(sid))
    taken = store.take(node, 30.0, 10.0)
    assert taken is not None
    report = Report(
        subtask=Subtask.from_json(taken[0]),
        node=node,
        outcome="done" if ok else "failed",
        offered=offered,
        collected=collected,
        pages=pages,
    )
    assert store.finish(
        sid,
        taken[1],
        report.to_json(),
        node=node,
        site="a.com",
        group="milk",
        offered=offered,
        collected=collected,
        pages=pages,
        seconds=seconds,
        ok=ok,
        alpha=alpha,
        runs_maxlen=1000,
        fail_cost=0.75,
        node_seconds=node_seconds,
    )
    return report.to_json()


def test_finish_charges_the_sums_the_node_time_and_the_seconds_when_it_is_not_a_time(store: Store) -> None:
    k = store.keys
    _run(store, "s1", offered=10, collected=8, pages=2, seconds=4.0, ok=False, node_seconds=0.3)
    _run(store, "s2", offered=10, collected=8, pages=2, seconds=4.0, ok=False, node="n2")
    _run(store, "s3", offered=10, collected=8, pages=2, seconds=4.0, ok=False, node="n3", node_seconds=float("nan"))
    sums = {n: json.loads(store.redis.hget(k.est_site("a.com"), n)) for n in ("n1", "n2", "n3")}
    # node time, no recall: a recall holds no page slot; an older node (none) and a value that is not a time (NaN,
    # never sent): the seconds and the recall
    assert [sums[n]["sec"] for n in ("n1", "n2", "n3")] == pytest.approx([0.3, 4.75, 4.75])


def test_finish_records_the_run_and_the_report(store: Store) -> None:
    k = store.keys
    report = _run(store, "s1", offered=10, collected=8, pages=2, seconds=4.0, ok=True)
    assert store.redis.zscore(k.leases, "s1") is None
    assert not store.redis.hexists(k.lease_info, "s1")
    assert not store.redis.hexists(k.subtasks, "s1")
    assert store.redis.lrange(k.sleeping, 0, -1) == [report]
    assert store.redis.llen(k.failed) == 0
    runs = store.redis.xrange(k.runs)
    assert [fields for _, fields in runs] == [{"report": report}]
    for key in (k.agg_site_node("a.com", "n1"), k.agg_group_site_node("milk", "a.com", "n1")):
        h = store.redis.hgetall(key)
        assert (h["runs"], h["offered"], h["collected"], h["pages"]) == ("1", "10", "8", "2")
        assert float(h["seconds"]) == pytest.approx(4.0)
        assert float(h["last_run"]) == pytest.approx(store.now(), abs=5)
        assert "failures" not in h
    site_est = json.loads(store.redis.hget(k.est_site("a.com"), "n1"))
    assert site_est["c"] == pytest.approx(0.8)  # the first value is the observation itself
    assert site_est["spp"] == pytest.approx(2.0) and site_est["runs"] == 1
    assert site_est["last"] == pytest.approx(store.now(), abs=5)
    group_est = json.loads(store.redis.hget(k.est_group_site("milk", "a.com"), "n1"))
    assert group_est["spp"] == pytest.approx(2.0) and group_est["runs"] == 1 and "c" not in group_est
    assert store.redis.smembers(k.agg_index) == {"a.com|n1"}
    assert store.redis.smembers(k.agg_triples) == {"milk|a.com|n1"}
    assert store.redis.hgetall(k.progress) == {"milk|collected": "8", "milk|pages": "2"}


def test_finish_moves_estimates_by_alpha(store: Store) -> None:
    k = store.keys
    _run(store, "s1", offered=10, collected=8, pages=2, seconds=4.0, ok=True)
    _run(store, "s2", offered=10, collected=2, pages=2, seconds=8.0, ok=True)
    h = store.redis.hgetall(k.agg_site_node("a.com", "n1"))
    est = json.loads(store.redis.hget(k.est_site("a.com"), "n1"))
    assert est["c"] == pytest.approx(0.8 + 0.3 * (0.2 - 0.8))
    assert est["spp"] == pytest.approx(2.0 + 0.3 * (4.0 - 2.0))
    assert (h["runs"], h["offered"], h["collected"], h["pages"]) == ("2", "20", "10", "4")
    # A failure: completion moves toward what it collected, seconds per page is not touched.
    failed = _run(store, "s3", offered=0, collected=0, pages=1, seconds=3.0, ok=False)
    h = store.redis.hgetall(k.agg_site_node("a.com", "n1"))
    est = json.loads(store.redis.hget(k.est_site("a.com"), "n1"))
    assert est["c"] == pytest.approx(0.62 + 0.3 * (0.0 - 0.62))
    assert est["spp"] == pytest.approx(2.6)
    assert h["failures"] == "1" and h["runs"] == "3" and est["runs"] == 3
    assert store.redis.lrange(k.failed, 0, -1) == [failed]
    assert store.redis.llen(k.sleeping) == 2
    assert store.redis.xlen(k.runs) == 3


def test_finish_with_a_stale_token_changes_nothing(store: Store) -> None:
    k = store.keys
    queue(store, "n1", sub("s1"))
    taken = store.take("n1", 30.0, 10.0)
    assert taken is not None
    before = snapshot(store)
    report = Report(subtask=sub("s1"), node="n1", outcome="done", offered=10, collected=10, pages=1).to_json()
    assert (
        store.finish(
            "s1",
            taken[1] + "x",
            report,
            node="n1",
            site="a.com",
            group="milk",
            offered=10,
            collected=10,
            pages=1,
            seconds=1.0,
            ok=True,
            alpha=0.3,
            runs_maxlen=1000,
        )
        is False
    )
    assert (
        store.finish(
            "nope",
            taken[1],
            report,
            node="n1",
            site="a.com",
            group="milk",
            offered=10,
            collected=10,
            pages=1,
            seconds=1.0,
            ok=True,
            alpha=0.3,
            runs_maxlen=1000,
        )
        is False
    )
    assert snapshot(store, skip=(k.node_counters("n1"),)) == before
    assert store.redis.hgetall(k.node_counters("n1")) == {"stale_finish": "2"}


# --- heartbeat ----------------------------------------------------------------------------------------------


def test_heartbeat_registers_the_node(store: Store) -> None:
    k = store.keys
    info = {
        "type": [0, 1],
        "host": "h1",
        "pid": 42,
        "address": "127.0.0.2",
        "capacity": 1,
        "prefetch": 1,
        "subtasks": ["s7"],
    }
    assert store.heartbeat("n1", info, 30.0, []) == []
    stored = json.loads(store.redis.hget(k.nodes, "n1"))
    assert stored == info  # stored as sent; the time it was last seen lives in node_seen (Redis time)
    assert store.redis.zscore(k.node_seen, "n1") == pytest.approx(store.now(), abs=5)


def test_heartbeat_keeps_an_empty_list_a_list(store: Store) -> None:
    # An idle node reports "subtasks": []; status shows it as a list (Lua's cjson turns {} and [] alike
    # into {}).
    store.heartbeat("n1", {"type": [0], "subtasks": []}, 30.0, [])
    assert json.loads(store.redis.hget(store.keys.nodes, "n1"))["subtasks"] == []


def test_heartbeat_renews_held_leases_and_reports_lost_ones(store: Store) -> None:
    k = store.keys
    queue(store, "n1", sub("s1"), sub("s2"))
    t1, t2 = store.take("n1", 30.0, 10.0), store.take("n1", 30.0, 10.0)
    assert t1 is not None and t2 is not None
    store.redis.zadd(k.leases, {"s1": 1.0, "s2": 2.0})
    lost = store.heartbeat("n1", {"type": [0]}, 40.0, [("s1", t1[1]), ("s2", "n9:1"), ("gone", "n1:99")])
    assert sorted(lost) == ["gone", "s2"]
    assert store.redis.zscore(k.leases, "s1") == pytest.approx(store.now() + 40.0, abs=5)
    assert store.redis.zscore(k.leases, "s2") == 2.0  # not ours: untouched
    assert store.redis.zscore(k.leases, "gone") is None  # never created


def test_heartbeat_renewal_is_capped_by_the_hard_deadline(store: Store) -> None:
    k = store.keys
    queue(store, "n1", sub(time_limit=5.0))
    taken = store.take("n1", 30.0, 1.0)
    assert taken is not None
    store.redis.zadd(k.leases, {"s1": 1.0})
    assert store.heartbeat("n1", {}, 30.0, [("s1", taken[1])]) == []
    assert store.redis.zscore(k.leases, "s1") == pytest.approx(taken[2] + 6.0, abs=1e-3)


# --- release ------------------------------------------------------------------------------------------------


def test_release_returns_leases_and_the_crawl_queue_to_waiting(store: Store) -> None:
    k = store.keys
    queue(store, "n1", sub("s1", priority=3), sub("s2", priority=5), sub("s3", priority=7))
    taken = store.take("n1", 30.0, 10.0)
    assert taken is not None
    assert store.release("n1", [("s1", taken[1], 3.0)]) == 3
    assert store.redis.zrange(k.waiting, 0, -1, withscores=True) == [("s1", 3.0), ("s2", 5.0), ("s3", 7.0)]
    assert store.redis.zcard(k.leases) == 0 and store.redis.hlen(k.lease_info) == 0
    assert store.redis.llen(k.crawl("n1")) == 0
    assert store.redis.zcard(k.queued) == 0
    assert {sid: Subtask.from_json(raw).id for sid, raw in store.redis.hgetall(k.subtasks).items()} == {
        "s1": "s1",
        "s2": "s2",
        "s3": "s3",
    }


def test_release_ignores_a_lease_it_no_longer_holds(store: Store) -> None:
    k = store.keys
    queue(store, "n1", sub("s1", priority=3))
    taken = store.take("n1", 30.0, 10.0)
    assert taken is not None
    assert store.release("n1", [("s1", "n1:stale", 3.0)]) == 0
    assert store.redis.zcard(k.waiting) == 0
    assert json.loads(store.redis.hget(k.lease_info, "s1"))["token"] == taken[1]
    assert store.redis.zscore(k.leases, "s1") is not None


def test_release_leaves_unreadable_entries_and_returns_the_rest(store: Store) -> None:
    k = store.keys
    store.redis.lpush(k.crawl("n1"), pickle.dumps({"a": 1}))  # the oldest entry: at the tail
    queue(store, "n1", sub("s1", priority=1), sub("s2", priority=2))
    assert store.release("n1", []) == 2
    assert store.redis.zrange(k.waiting, 0, -1) == ["s1", "s2"]
    assert store.redis.llen(k.crawl("n1")) == 1  # left for the control to dead-letter


# --- commit -------------------------------------------------------------------------------------------------


def test_commit_tail_is_pops_the_tail_only_if_equal(store: Store) -> None:
    r, lst, h = store.redis, store.keys.sleeping, store.keys.counters
    r.rpush(lst, "a", "b")
    assert store.commit([["tail_is", lst, "a"]], [["hset", h, "f", "1"]]) is False
    assert r.lrange(lst, 0, -1) == ["a", "b"] and not r.exists(h)
    assert store.commit([["tail_is", lst, "b"]], [["hset", h, "f", "1"]]) is True
    assert r.lrange(lst, 0, -1) == ["a"] and r.hget(h, "f") == "1"
    assert store.commit([["tail_is", store.keys.failed, "a"]], []) is False  # empty list


def test_commit_same_tail_guard_applies_once(store: Store) -> None:
    r, lst, h = store.redis, store.keys.sleeping, store.keys.counters
    r.rpush(lst, "x", "report")
    guards: list[list[Any]] = [["tail_is", lst, "report"]]
    writes: list[list[Any]] = [["hincrby", h, "reports", 1], ["lpush", store.keys.virtual, "v"]]
    assert store.commit(guards, writes) is True
    assert store.commit(guards, writes) is False
    assert r.hget(h, "reports") == "1" and r.lrange(store.keys.virtual, 0, -1) == ["v"]
    assert r.lrange(lst, 0, -1) == ["x"]


def test_commit_lease_is(store: Store) -> None:
    k = store.keys
    queue(store, "n1", sub("s1"))
    taken = store.take("n1", 30.0, 10.0)
    assert taken is not None
    guard = ["lease_is", k.lease_info, k.leases, "s1", taken[1]]
    assert (
        store.commit([["lease_is", k.lease_info, k.leases, "s1", "n1:other"]], [["zadd", k.waiting, 1, "s1"]])
        is False
    )
    assert store.redis.hexists(k.lease_info, "s1") and store.redis.zscore(k.leases, "s1") is not None
    assert not store.redis.exists(k.waiting)
    assert store.commit([guard], [["zadd", k.waiting, 1, "s1"]]) is True
    assert not store.redis.hexists(k.lease_info, "s1") and store.redis.zscore(k.leases, "s1") is None
    assert store.redis.zscore(k.waiting, "s1") == 1.0
    assert store.commit([guard], [["hincrby", k.counters, "recalled", 1]]) is False  # recalled once only
    assert not store.redis.exists(k.counters)


def test_commit_zrem(store: Store) -> None:
    r, z = store.redis, store.keys.waiting
    r.zadd(z, {"s1": 1, "s2": 2})
    assert store.commit([["zrem", z, "s3"]], [["sadd", store.keys.agg_index, "x"]]) is False
    assert not r.exists(store.keys.agg_index)
    assert store.commit([["zrem", z, "s1"]], [["sadd", store.keys.agg_index, "x"]]) is True
    assert r.zrange(z, 0, -1) == ["s2"] and r.smembers(store.keys.agg_index) == {"x"}


def test_commit_lrem_removes_one_occurrence(store: Store) -> None:
    r, lst = store.redis, store.keys.crawl("n1")
    r.rpush(lst, "a", "v", "b", "v")
    assert store.commit([["lrem", lst, "zz"]], [["hset", store.keys.counters, "f", "1"]]) is False
    assert r.lrange(lst, 0, -1) == ["a", "v", "b", "v"] and not r.exists(store.keys.counters)
    assert store.commit([["lrem", lst, "v"]], [["hset", store.keys.counters, "f", "1"]]) is True
    assert r.lrange(lst, 0, -1) == ["a", "b", "v"]


def test_commit_zscore_le(store: Store) -> None:
    r, z, c = store.redis, store.keys.node_seen, store.keys.counters
    r.zadd(z, {"n1": 100})
    assert store.commit([["zscore_le", z, "n1", 99.5]], [["hincrby", c, "n", 1]]) is False
    assert store.commit([["zscore_le", z, "n9", 1000]], [["hincrby", c, "n", 1]]) is False  # no such member
    assert not r.exists(c)
    assert store.commit([["zscore_le", z, "n1", 100]], [["hincrby", c, "n", 1]]) is True
    assert r.zscore(z, "n1") == 100.0  # a comparison only: nothing removed
    assert r.hget(c, "n") == "1"


def test_commit_hdel(store: Store) -> None:
    r, h = store.redis, store.keys.dead
    r.hset(h, "e1", "{}")
    assert store.commit([["hdel", h, "e2"]], [["lpush", store.keys.virtual, "v"]]) is False
    assert not r.exists(store.keys.virtual)
    assert store.commit([["hdel", h, "e1"]], [["lpush", store.keys.virtual, "v"]]) is True
    assert not r.hexists(h, "e1") and r.lrange(store.keys.virtual, 0, -1) == ["v"]


def _all_guards_state(store: Store) -> list[list[Any]]:
    k, r = store.keys, store.redis
    queue(store, "n1", sub("s1"))
    taken = store.take("n1", 30.0, 10.0)
    assert taken is not None
    r.rpush(k.sleeping, "r1")
    r.zadd(k.waiting, {"w1": 1})
    r.rpush(k.crawl("n2"), "c1")
    r.zadd(k.node_seen, {"n2": 50})
    r.hset(k.dead, "d1", "{}")
    return [
        ["tail_is", k.sleeping, "r1"],
        ["lease_is", k.lease_info, k.leases, "s1", taken[1]],
        ["zrem", k.waiting, "w1"],
        ["lrem", k.crawl("n2"), "c1"],
        ["zscore_le", k.node_seen, "n2", 60],
        ["hdel", k.dead, "d1"],
    ]


def _all_writes(k: Keys) -> list[list[Any]]:
    return [
        ["hset", k.tasks, "t1", "{}"],
        ["hdel", k.subtasks, "s1"],
        ["zadd", k.waiting, 4, "w2"],
        ["zrem", k.queued, "q1"],
        ["lpush", k.failed, "f1"],
        ["hincrby", k.counters, "c", 2],
        ["del", k.seq],
        ["sadd", k.agg_index, "p1"],
    ]


@pytest.mark.parametrize("failing", range(6))
def test_commit_writes_nothing_if_any_guard_fails(store: Store, failing: int) -> None:
    guards = _all_guards_state(store)
    store.redis.zadd(store.keys.queued, {"q1": 1})
    before = snapshot(store)
    broken = [list(g) for g in guards]
    broken[failing][-1] = 0 if broken[failing][0] == "zscore_le" else "no-such-value"
    assert store.commit(broken, _all_writes(store.keys)) is False
    assert snapshot(store) == before


def test_commit_applies_everything_when_all_guards_hold(store: Store) -> None:
    k, r = store.keys, store.redis
    guards = _all_guards_state(store)
    r.zadd(k.queued, {"q1": 1})
    assert r.exists(k.seq)
    assert store.commit(guards, _all_writes(k)) is True
    assert r.llen(k.sleeping) == 0
    assert not r.hexists(k.lease_info, "s1") and r.zscore(k.leases, "s1") is None
    assert r.zscore(k.waiting, "w1") is None and r.llen(k.crawl("n2")) == 0
    assert r.zscore(k.node_seen, "n2") == 50.0 and not r.hexists(k.dead, "d1")
    assert r.hget(k.tasks, "t1") == "{}" and not r.hexists(k.subtasks, "s1")
    assert r.zscore(k.waiting, "w2") == 4.0 and r.zscore(k.queued, "q1") is None
    assert r.lrange(k.failed, 0, -1) == ["f1"] and r.hget(k.counters, "c") == "2"
    assert not r.exists(k.seq) and r.smembers(k.agg_index) == {"p1"}


def test_a_queued_entry_is_recalled_from_its_list_or_once_lost_never_once_taken(store: Store) -> None:
    """``lrem_or_lost``: the entry is in its crawl queue (taken out), or gone from it while its id is still queued
    since before the cutoff (lost by hand). A take removes the queued id in the same step, so a taken entry, or one
    queued after the cutoff, holds neither."""
    k, r = store.keys, store.redis
    guard = Guard.lrem_or_lost(k.crawl("n1"), "e1", k.queued, "s1", 10.0)
    r.lpush(k.crawl("n1"), "e1")
    r.zadd(k.queued, {"s1": 20.0})  # in the list: holds whatever the queued time
    assert store.commit([guard], [Write.zrem(k.queued, "s1")]) is True and r.llen(k.crawl("n1")) == 0
    assert store.commit([guard], []) is False  # gone from the list, and no longer queued (as after a take)
    r.zadd(k.queued, {"s1": 20.0})
    assert store.commit([guard], []) is False  # gone, but queued after the cutoff
    r.zadd(k.queued, {"s1": 5.0})
    assert store.commit([guard], [Write.zrem(k.queued, "s1")]) is True and r.zcard(k.queued) == 0  # lost


def test_commit_without_guards_applies(store: Store) -> None:
    assert store.commit([], [["hincrby", store.keys.counters, "c", 1]]) is True
    assert store.redis.hget(store.keys.counters, "c") == "1"


def test_commit_in_a_pipeline(store: Store) -> None:
    r, lst = store.redis, store.keys.sleeping
    r.rpush(lst, "a")
    with r.pipeline(transaction=False) as pipe:
        assert (
            store.commit([["tail_is", lst, "a"]], [["hset", store.keys.counters, "f", "1"]], pipe=pipe)
            is None
        )
        assert (
            store.commit([["tail_is", lst, "a"]], [["hset", store.keys.counters, "g", "1"]], pipe=pipe)
            is None
        )
        assert pipe.execute() == [[1], [0]]  # one code per decision of each call
    assert r.hgetall(store.keys.counters) == {"f": "1"}


def test_commit_refuses_an_unknown_guard(store: Store) -> None:
    store.redis.rpush(store.keys.sleeping, "a")
    with pytest.raises(redis_lib.ResponseError, match="unknown guard"):
        store.commit([["tail_is", store.keys.sleeping, "a"], ["bogus", store.keys.dead, "x"]], [])
    assert store.redis.lrange(store.keys.sleeping, 0, -1) == ["a"]


def test_commit_with_an_unknown_write_is_not_half_applied(store: Store) -> None:
    # A decision is applied whole or not at all: an unknown write must not leave the guard popped and the
    # writes before it done.
    r, k = store.redis, store.keys
    r.rpush(k.sleeping, "a")
    before = snapshot(store)
    with pytest.raises(redis_lib.ResponseError, match="unknown guard or write"):
        store.commit([["tail_is", k.sleeping, "a"]], [["hincrby", k.counters, "c", 1], ["bogus", k.dead]])
    assert snapshot(store) == before


# --- lead ---------------------------------------------------------------------------------------------------


def test_lead_one_control_at_a_time(store: Store) -> None:
    r, key = store.redis, store.keys.leader
    assert store.lead("c1", 0.2) is True
    assert r.get(key) == "c1" and 0 < r.pttl(key) <= 200
    assert store.lead("c2", 0.2) is False
    assert r.get(key) == "c1"
    r.pexpire(key, 10)
    assert store.lead("c1", 5.0) is True  # the leader renews its lease
    assert 200 < r.pttl(key) <= 5000
    assert store.lead("c2", 5.0) is False
    r.delete(key)  # the lease lapsed
    assert store.lead("c2", 5.0) is True and r.get(key) == "c2"
    assert store.lead("c1", 5.0) is False


def test_lead_expires(store: Store) -> None:
    assert store.lead("c1", 0.2) is True
    deadline = store.now() + 5
    while store.redis.exists(store.keys.leader):  # Redis expires it within ~0.2 s; no sleep needed to poll
        assert store.now() < deadline
    assert store.lead("c2", 0.2) is True


def test_now_is_redis_time(store: Store) -> None:
    sec, usec = store.redis.time()
    assert store.now() == pytest.approx(sec + usec / 1e6, abs=1.0)


def test_resign_gives_up_only_our_own_leader_lease(store: Store) -> None:
    assert store.lead("c1", 30)
    store.resign("c2")  # not the holder: nothing changes
    assert store.redis.get(store.keys.leader) == "c1" and not store.lead("c2", 30)
    store.resign("c1")
    assert store.redis.get(store.keys.leader) is None and store.lead("c2", 30)


def test_purge_deletes_this_prefix_only(store: Store) -> None:
    other = Store(store.redis, Keys(store.keys.prefix + "x"))
    store.redis.lpush(store.keys.virtual, "a")
    store.redis.zadd(store.keys.waiting, {"1": 1})
    other.redis.lpush(other.keys.virtual, "b")
    try:
        assert store.purge() == 2
        assert not store.redis.exists(store.keys.virtual, store.keys.waiting)
        assert other.redis.lrange(other.keys.virtual, 0, -1) == ["b"]
    finally:
        other.purge()


@pytest.mark.parametrize("glob", ["*", "?", "[xy]"])
def test_purge_of_a_prefix_with_glob_characters_deletes_that_prefix_only(store: Store, glob: str) -> None:
    """``SCAN MATCH <prefix>:*`` read the prefix's ``*``, ``?`` and ``[...]`` as a glob: purging ``{t..*}``
    deleted ``{t..x}``'s keys, another deployment's."""
    base = store.keys.prefix[:-1]  # "{t<hex>"
    mine, other = Store(store.redis, Keys(f"{base}{glob}}}")), Store(store.redis, Keys(f"{base}x}}"))
    mine.redis.lpush(mine.keys.virtual, "a")
    other.redis.lpush(other.keys.virtual, "b")
    try:
        assert mine.purge() == 1 and not mine.redis.exists(mine.keys.virtual)
        assert other.redis.lrange(other.keys.virtual, 0, -1) == ["b"]
    finally:
        other.purge()


# --- the scripts as files --------------------------------------------------------------------------------------


def test_every_script_is_a_file_with_a_header_naming_its_keys_and_args() -> None:
    import re

    from scheduler_ext.store import SCRIPTS, load_script

    for name in SCRIPTS:
        source = load_script(name)
        assert "--@include" not in source, name  # includes are expanded at load time
        for ref in set(re.findall(r"(KEYS|ARGV)\[(\d+)\]", source.split("]]", 1)[1])):
            assert f"{ref[0]}[{ref[1]}]" in source.split("]]", 1)[0], (name, ref)  # documented in the header


def test_resign_frees_only_our_own_lease(store: Store) -> None:
    assert store.lead("a", 10)
    assert not store.resign("b")
    assert store.redis.get(store.keys.leader) == "a"
    assert store.resign("a")
    assert store.redis.get(store.keys.leader) is None
    assert store.lead("b", 10)
