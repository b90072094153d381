"""The control loop in-process against a real Redis: each tick's decisions and their atomicity.

Nodes are played by the store's own node operations (take, finish, heartbeat), so every step is deterministic.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any

import pytest
import redis as redis_lib

from product_crawl.tasks import splitter
from scheduler_ext.control import ID_BLOCK, Control, decide, node_view
from scheduler_ext.keys import Keys
from scheduler_ext.models import Report, Subtask
from scheduler_ext.store import Guard, Store
from scheduler_ext.strategies.allocation import DynamicAllocation, SharedAllocation
from scheduler_ext.strategies.modification import DynamicModification, FixedModification
from scheduler_ext.strategies.recall import DynamicRecall, NoRecall

NODE_INFO = {"type": [0, 1], "prefetch": 1, "capacity": 1, "address": None}


def make_control(store: Store, name: str = "c1", *, recall: Any = None, allocation: Any = None,
                 modification: Any = None, lanes: int = 1, idle_lanes: int | None = None) -> Control:
    """A control of ``lanes`` lanes, and no more while nodes idle unless ``idle_lanes`` says so (the tests'
    heartbeats list no subtasks: every node looks idle)."""
    return Control(store, splitter=splitter, allocation=allocation or SharedAllocation(),
                   modification=modification or FixedModification(3, 20.0),
                   recall=recall or DynamicRecall(threshold=30, max_recalls=3), control_id=name, page_limit=3,
                   time_limit=20.0, leader_ttl=5, lanes=lanes, idle_lanes=lanes if idle_lanes is None else idle_lanes)


@pytest.fixture
def store(redis: redis_lib.Redis, prefix: str) -> Store:
    return Store(redis, Keys(prefix))


def inject(store: Store, *tasks: dict[str, Any] | str) -> None:
    for t in tasks:
        store.redis.lpush(store.keys.virtual, t if isinstance(t, str) else json.dumps(t, ensure_ascii=False))


def take(store: Store, node: str) -> tuple[Subtask, str, float]:
    got = store.take(node, lease_ttl=30, grace=5)
    assert got is not None, f"nothing in {node}'s crawl queue"
    raw, token, started = got
    return Subtask.from_json(raw), token, started


def finish(store: Store, node: str, st: Subtask, token: str, *, ok: bool = True, collected: int = 30,
           exhausted: bool = False, reason: str = "") -> bool:
    report = Report(subtask=st, node=node, outcome="done" if ok else "failed", reason=reason, reported=200,
                    offered=30 if ok else 0, collected=collected if ok else 0, pages=st.page_limit if ok else 0,
                    next_page=st.first_page + st.page_limit, exhausted=exhausted, total_pages=20,
                    started=store.now() - 3, ended=store.now())
    return store.finish(st.id, token, report.to_json(), node=node, site=st.site, group=st.group,
                        offered=report.offered, collected=report.collected, pages=report.pages,
                        seconds=report.seconds, ok=ok, alpha=0.3, runs_maxlen=1000)


def test_split_creates_tasks_and_first_subtasks_in_fifo_order(store: Store) -> None:
    inject(store, {"name": "光明高钙牛奶", "sites": ["a.com", "b.com"]},
           {"name": "特仑苏", "brand": "蒙牛", "sites": ["a.com"]})
    result = make_control(store).tick()
    assert result.leader and result.split == 2
    k = store.keys
    assert store.redis.llen(k.virtual) == 0 and store.redis.hlen(k.tasks) == 3
    waiting = [Subtask.from_json(store.redis.hget(k.subtasks, sid)) for sid in store.redis.zrange(k.waiting, 0, -1)]
    assert [(s.group, s.site) for s in waiting] == [
        ("光明高钙牛奶", "a.com"), ("光明高钙牛奶", "b.com"), ("特仑苏", "a.com")]
    assert all(s.first_page == 0 and s.page_limit == 3 and s.time_limit == 20.0 for s in waiting)
    assert waiting[2].payload["keywords"] == ["蒙牛", "特仑苏"]


def test_malformed_raw_virtual_task_goes_to_dead_letter_with_reason(store: Store) -> None:
    inject(store, '{"name": ""}', "\x80\x04not json", {"name": "ok", "sites": ["a.com"]})
    result = make_control(store).tick()
    assert result.split == 1 and result.dead == 2
    dead = [json.loads(v) for v in store.redis.hvals(store.keys.dead)]
    reasons = sorted(d["reason"] for d in dead)
    assert any("name" in r for r in reasons) and any("JSON" in r for r in reasons)
    assert all(d["kind"] == "virtual" and d["raw"] for d in dead)
    assert store.redis.llen(store.keys.virtual) == 0


def test_allocation_respects_prefetch_and_type(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com", "b.com", "c.com"]})
    store.heartbeat("n0", {**NODE_INFO, "type": [0]}, 30, [])
    store.heartbeat("n1", {**NODE_INFO, "type": [1]}, 30, [])
    result = make_control(store).tick()
    k = store.keys
    assert result.allocated == 1  # prefetch 1 on the only type-0 node
    assert store.redis.llen(k.crawl("n0")) == 1 and store.redis.llen(k.crawl("n1")) == 0
    assert store.redis.zcard(k.waiting) == 2 and store.redis.zcard(k.queued) == 1


def test_report_modifies_and_queues_the_next_subtask_until_the_task_is_done(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store, modification=DynamicModification(base_pages=3, recall_threshold=60))
    control.tick()
    st, token, _ = take(store, "n1")
    assert finish(store, "n1", st, token, collected=30)
    control.tick()
    k = store.keys
    [nxt_raw] = store.redis.lrange(k.crawl("n1"), 0, -1)
    nxt = Subtask.from_json(nxt_raw)
    assert nxt.first_page == 3 and nxt.task == st.task and nxt.prev_node == "n1"
    assert nxt.page_limit == 6  # full completion: twice the base page count
    assert store.redis.hget(k.node_counters("n1"), "modified") == "1"
    task = json.loads(store.redis.hget(k.tasks, st.task))
    # next_page: the first page no subtask was given (the new subtask's end); one subtask of the task is out
    assert task["next_page"] == 9 and task["open"] == 1 and task["collected"] == 30 and task["total_pages"] == 20
    st2, token2, _ = take(store, "n1")
    assert finish(store, "n1", st2, token2, exhausted=True)
    control.tick()
    assert json.loads(store.redis.hget(k.tasks, st.task))["done"] is True
    assert store.redis.zcard(k.waiting) == 0 and store.redis.llen(k.crawl("n1")) == 0
    assert store.redis.hget(k.progress, "p|done") == "1"


def test_failure_is_recalled_avoiding_the_node_then_dead_lettered_at_the_maximum(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    for n in ("n1", "n2"):
        store.heartbeat(n, NODE_INFO, 30, [])
    control = make_control(store, recall=DynamicRecall(threshold=30, max_recalls=3, backoff=0.0))
    k = store.keys
    control.tick()
    nodes_tried = []
    for attempt in range(3):
        node = next(n for n in ("n1", "n2") if store.redis.llen(k.crawl(n)))
        nodes_tried.append(node)
        st, token, _ = take(store, node)
        assert st.attempt == attempt
        assert finish(store, node, st, token, ok=False, reason="blocked")
        control.tick()
    assert nodes_tried[1] != nodes_tried[0]  # a recalled subtask avoids the node it failed on
    [entry] = [json.loads(v) for v in store.redis.hvals(k.dead)]
    assert entry["attempts"] == 3 and entry["last_node"] == nodes_tried[-1] and "blocked" in entry["reason"]
    assert entry["subtask"]["id"] == st.id
    recalled = sum(int(store.redis.hget(k.node_counters(n), "recalled") or 0) for n in ("n1", "n2"))
    assert recalled == 3 and store.redis.xlen(k.runs) == 3
    assert store.redis.zcard(k.waiting) == 0 and not store.redis.hexists(k.subtasks, st.id)


@pytest.mark.parametrize(("reset", "runs", "seen", "dead_at"), [
    # SCHEDEXT_RECALL_RESET (the default): only the runs that crawl nothing count
    (True, (0, 1, 0, 1, 0, 0), [(0, 0), (0, 1), (1, 1), (1, 2), (2, 1), (2, 2)], 2),
    # the paper's count (the experiment's paper configuration): every recall counts
    (False, (0, 1, 0), [(0, 0), (0, 1), (1, 2)], 1),
])
def test_a_failed_run_that_crawled_pages_starts_its_count_of_recalls_over(
        store: Store, reset: bool, runs: tuple[int, ...], seen: list[tuple[int, int]], dead_at: int) -> None:
    """Runs on nodes answered with captchas now and then crawl a page, then fail: the subtask moves on with each, so
    it is not stuck, and only the runs that crawl nothing count towards ``SCHEDEXT_RECALL_MAX`` (before, three such
    runs in a row dead-lettered it, and its task stopped, with pages crawled at each)."""
    inject(store, {"name": "p", "sites": ["a.com"]})
    for n in ("n1", "n2"):
        store.heartbeat(n, NODE_INFO, 30, [])
    control = make_control(store, recall=DynamicRecall(threshold=30, max_recalls=3, backoff=0.0, reset=reset))
    k = store.keys
    control.tick()
    taken = []
    for crawled in runs:  # pages each run crawls before its block page
        node = next(n for n in ("n1", "n2") if store.redis.llen(k.crawl(n)))
        st, token, started = take(store, node)
        taken.append((st.first_page, st.attempt))
        report = Report(subtask=st, node=node, outcome="failed", reason="blocked: a verification page", reported=200,
                        offered=10 * crawled, collected=10 * crawled, pages=crawled,
                        next_page=st.first_page + crawled, total_pages=20, started=started, ended=store.now())
        assert store.finish(st.id, token, report.to_json(), node=node, site=st.site, group=st.group,
                            offered=report.offered, collected=report.collected, pages=crawled, seconds=1.0, ok=False,
                            alpha=0.3, runs_maxlen=100)
        control.tick()
    assert taken == seen
    [entry] = [json.loads(v) for v in store.redis.hvals(k.dead)]  # the third counted run
    assert entry["attempts"] == 3 and entry["subtask"]["first_page"] == dead_at


def test_a_failed_run_that_claims_pages_but_moved_nothing_on_counts(store: Store) -> None:
    """A report of pages crawled whose next page is still the slice's first (a node's bug, or a lie) recalls the
    whole slice: no smaller than before, so it counts, and such a subtask cannot go round for ever."""
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store, recall=DynamicRecall(threshold=30, max_recalls=3, backoff=0.0))
    control.tick()
    attempts = []
    for _ in range(3):
        st, token, started = take(store, "n1")
        attempts.append(st.attempt)
        report = Report(subtask=st, node="n1", outcome="failed", reason="HTTP 503", reported=200, offered=10,
                        collected=10, pages=1, next_page=st.first_page, total_pages=20, started=started,
                        ended=store.now())
        assert store.finish(st.id, token, report.to_json(), node="n1", site=st.site, group=st.group, offered=10,
                            collected=10, pages=1, seconds=1.0, ok=False, alpha=0.3, runs_maxlen=100)
        control.tick()
    assert attempts == [0, 1, 2]
    [entry] = [json.loads(v) for v in store.redis.hvals(store.keys.dead)]
    assert entry["attempts"] == 3


def test_lapsed_lease_is_recalled_once_even_with_two_controls(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    c1, c2 = make_control(store, "c1"), make_control(store, "c2")
    c1.tick()
    st, token, _ = take(store, "n1")
    k = store.keys
    store.redis.zadd(k.leases, {st.id: 1.0})  # its deadline has passed (the node died)
    store.redis.zadd(k.node_seen, {"n1": 1.0})
    store.redis.delete(k.leader)  # both controls think they lead for this tick (the worst case)
    r1 = c1.tick()
    store.redis.delete(k.leader)
    r2 = c2.tick()
    assert r1.recalled + r2.recalled == 1
    assert store.redis.hget(k.node_counters("n1"), "recalled") == "1"
    assert store.redis.zcard(k.leases) == 0 and store.redis.zcard(k.waiting) == 1
    again = Subtask.from_json(store.redis.hget(k.subtasks, st.id))
    assert again.attempt == 1 and again.avoid == ["n1"]
    assert not finish(store, "n1", st, token)  # the dead node's late finish is refused by the token
    assert store.redis.hget(k.node_counters("n1"), "stale_finish") == "1"


def test_subtask_left_in_a_crawl_queue_past_the_threshold_is_recalled(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store)
    control.tick()
    k = store.keys
    [sid] = store.redis.zrange(k.queued, 0, -1)
    store.redis.zadd(k.queued, {sid: 1.0})  # queued long ago, never taken
    store.heartbeat("n2", NODE_INFO, 30, [])
    control.tick()
    assert store.redis.llen(k.crawl("n1")) == 0
    placed = Subtask.from_json(store.redis.hget(k.subtasks, sid))
    assert placed.attempt == 1 and placed.node == "n2" and store.redis.llen(k.crawl("n2")) == 1


def test_standby_takes_over_when_the_leader_lease_lapses(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    leader, standby = make_control(store, "c1"), make_control(store, "c2")
    assert leader.tick().leader and not standby.tick().leader
    assert store.redis.llen(store.keys.virtual) == 0  # only the leader split it
    store.redis.delete(store.keys.leader)  # the leader died: its lease lapsed
    inject(store, {"name": "q", "sites": ["a.com"]})
    assert standby.tick().split == 1 and store.redis.get(store.keys.leader) == "c2"
    assert not leader.tick().leader


def test_no_recall_baseline_abandons_failed_pages_and_keeps_lapsed_leases(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store, recall=NoRecall(threshold=30))
    control.tick()
    st, token, _ = take(store, "n1")
    finish(store, "n1", st, token, ok=False, reason="HTTP 503")
    control.tick()
    k = store.keys
    nxt = Subtask.from_json(store.redis.lindex(k.crawl("n1"), 0))
    assert nxt.first_page == 3 and nxt.attempt == 0  # pages 0-2 given up, the task goes on
    st2, _, _ = take(store, "n1")
    store.redis.zadd(k.leases, {st2.id: 1.0})
    control.tick()
    assert store.redis.zscore(k.leases, st2.id) == 1.0 and not store.redis.hlen(k.dead)


def test_dynamic_allocation_routes_by_measured_rate(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com", "b.com"]})
    for n in ("good", "bad"):
        store.heartbeat(n, NODE_INFO, 30, [])
    control = make_control(store, allocation=DynamicAllocation(rate_floor=0.6, patience=1000))
    k = store.keys
    # History: "good" collects everything on a.com, half on b.com; "bad" a tenth on a.com, nothing yet on b.com.
    for node, site, collected in (("good", "a.com", 30), ("good", "b.com", 15), ("bad", "a.com", 3)):
        for _ in range(2):
            st = Subtask(id=f"h-{node}-{site}-{_}", task="h", site=site, group="p", first_page=0, page_limit=3,
                         time_limit=20)
            store.redis.lpush(k.crawl(node), st.to_json())
            s, token, _ = take(store, node)
            finish(store, node, s, token, collected=collected)
    store.redis.delete(k.sleeping)
    control.tick()
    a = [Subtask.from_json(r) for r in store.redis.lrange(k.crawl("good"), 0, -1)]
    assert [s.site for s in a] == ["a.com"]
    # "bad" is not given a.com while "good" is better by far; it explores b.com instead.
    b = [Subtask.from_json(r) for r in store.redis.lrange(k.crawl("bad"), 0, -1)]
    assert [s.site for s in b] == ["b.com"]


def test_subtask_a_node_could_not_read_goes_to_dead_letter_at_once(store: Store) -> None:
    k = store.keys
    bad = '{"v": 1, "id": "x1", "time_limit": 5, "page_limit": "many"}'
    store.redis.lpush(k.crawl("n1"), bad)
    raw, token, started = store.take("n1", lease_ttl=30, grace=5)  # passes the script's checks, not validation
    stub = Subtask(id="x1", task="?", site="?", first_page=0, page_limit=1, time_limit=5.0,
                   payload={"malformed": raw})
    report = Report(subtask=stub, node="n1", outcome="failed", reason="malformed subtask: page_limit")
    assert store.finish("x1", token, report.to_json(), node="n1", site="?", group="", offered=0, collected=0,
                        pages=0, seconds=0.0, ok=False, alpha=0.3, runs_maxlen=100)
    make_control(store).tick()
    entry = json.loads(store.redis.hget(k.dead, "x1"))
    assert entry["subtask"]["payload"]["malformed"] == bad and entry["attempts"] == 1
    assert not store.redis.zcard(k.waiting)


def test_corrupt_task_record_does_not_stop_the_loop(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store)
    control.tick()
    st, token, _ = take(store, "n1")
    store.redis.hset(store.keys.tasks, st.task, "not json")
    finish(store, "n1", st, token)
    result = control.tick()
    assert result.reports == 1 and store.redis.llen(store.keys.sleeping) == 0
    assert store.redis.hget(store.keys.counters, "corrupt_tasks") == "1"


@pytest.mark.parametrize(("next_page", "resume_page", "requeued"), [
    (2, None, (2, 1)),  # pages 0-1 were stored already: the rest of the slice goes back
    (0, 1, (0, 1)),  # page 0 failed while pages 1-2, in flight with it, were stored: only page 0 goes back
])
def test_a_failed_subtask_is_recalled_for_the_pages_it_did_not_crawl_only(
        store: Store, next_page: int, resume_page: int | None, requeued: tuple[int, int]) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store)
    control.tick()
    st, token, _ = take(store, "n1")
    assert (st.first_page, st.page_limit) == (0, 3)
    report = Report(subtask=st, node="n1", outcome="failed", reason="HTTP 503", offered=20, collected=20, pages=2,
                    next_page=next_page, resume_page=resume_page, started=store.now() - 1, ended=store.now())
    assert Report.from_json(report.to_json()).resume_page == resume_page
    store.finish(st.id, token, report.to_json(), node="n1", site=st.site, group=st.group, offered=20,
                 collected=20, pages=2, seconds=1.0, ok=False, alpha=0.3, runs_maxlen=100)
    control.tick()
    again = Subtask.from_json(store.redis.hget(store.keys.subtasks, st.id))
    assert (again.first_page, again.page_limit, again.attempt) == (*requeued, 1)
    # The task's next slice starts after the failed one (no page crawled twice). Finishing the remainder does not
    # count as a modification: the fixed strategy chose the same limits again.
    st2, token2, _ = take(store, "n1")
    assert finish(store, "n1", st2, token2)
    control.tick()
    nxt = Subtask.from_json(store.redis.lindex(store.keys.crawl("n1"), 0))
    assert (nxt.first_page, nxt.page_limit) == (3, 3)
    assert store.redis.hget(store.keys.node_counters("n1"), "modified") is None


# --- decide, without Redis -----------------------------------------------------------------------------------------


class NoEstimates:
    def completion(self, site: str, node: str) -> None:
        return None

    def seconds_per_page(self, group: str, site: str, node: str) -> None:
        return None


def test_decide_is_a_function_of_the_snapshot_and_splits_then_allocates_in_one_tick() -> None:
    from scheduler_ext.control import CountingIds, Entry, Snapshot, Strategies, decide
    from scheduler_ext.strategies import NodeView

    keys = Keys("{sim}")
    raw = json.dumps({"name": "p", "sites": ["a.com", "b.com"]})
    snap = Snapshot(keys=keys, now=100.0, estimates=NoEstimates(), ids=CountingIds(),
                    virtual=[Entry(keys.virtual, raw, len(raw))],
                    nodes=[NodeView(id="n1", types=[0, 1], free=1)])
    strategies = Strategies(allocation=SharedAllocation(), modification=FixedModification(3, 20.0),
                            recall=DynamicRecall(), splitter=splitter)
    decisions = decide(snap, strategies, 100.0)
    assert [d.kind for d in decisions] == ["split", "allocate"]
    assert decisions[0].guards == [Guard.tail_is(keys.virtual, raw)]
    placed = [w for w in decisions[1].writes if w[0] == "lpush"]
    assert placed and placed[0][1] == keys.crawl("n1") and Subtask.from_json(placed[0][2]).site == "a.com"


def test_a_subtask_recalled_again_waits_its_backoff_before_it_is_placed_then_goes_to_the_first_free_node() -> None:
    """Failures in a burst (a site answering errors for a few seconds) must not spend a subtask's recalls within a
    second: from its second recall on, a recalled subtask waits out the recall strategy's retry delay in waiting."""
    from scheduler_ext.control import CountingIds, Snapshot, Strategies, decide
    from scheduler_ext.strategies import NodeView

    keys = Keys("{sim}")
    strategies = Strategies(allocation=SharedAllocation(), modification=FixedModification(3, 20.0),
                            recall=DynamicRecall(threshold=30, max_recalls=5, backoff=2.0), splitter=splitter)
    recalled = [Subtask(f"s{a}", f"t{a}", "a.com", 0, 3, 20.0, attempt=a, since=100.0) for a in range(5)]

    def placed(now: float) -> list[str]:
        snap = Snapshot(keys=keys, now=now, estimates=NoEstimates(), ids=CountingIds(),
                        waiting=[(st.id, st.to_json()) for st in recalled],
                        nodes=[NodeView(id="n1", types=[0, 1], free=5)])
        return [d.subject for d in decide(snap, strategies, now) if d.kind == "allocate"]

    assert placed(100.0) == ["s0", "s1"]  # never recalled, recalled once: at once
    assert placed(101.9) == ["s0", "s1"]
    assert placed(102.0) == ["s0", "s1", "s2"]  # recalled twice: 2 s
    assert placed(103.9) == ["s0", "s1", "s2"]
    assert placed(104.0) == ["s0", "s1", "s2", "s3"]  # three times: 4 s
    assert placed(108.0) == ["s0", "s1", "s2", "s3", "s4"]  # four times: 8 s


@pytest.mark.parametrize(("runs", "held"), [
    ([(True, 99.0)] * 3 + [(False, 99.5)] * 2, False),  # most of the site's recent runs finished: at once
    ([(True, 99.0)] * 2 + [(False, 99.5)] * 3, True),  # most failed (a passing trouble): it waits
    ([(True, 60.0)] * 5 + [(False, 99.5)] * 2, True),  # the finished runs are older than the recall age (30 s)
    ([], True),  # nothing tells: it waits
])
def test_a_retry_delay_holds_only_while_its_site_fails_most_of_its_runs(runs: list[tuple[bool, float]],
                                                                        held: bool) -> None:
    """The retry delay is for a site's passing trouble: on a site whose nodes finish most of their runs, a subtask
    that failed on some of them (errors or captchas now and then) runs again at once; a thousand nodes of which 996
    fail a tenth of their pages had the shared queue collect twice what the delays left (docs/strategies.md)."""
    from scheduler_ext.control import CountingIds, HealthySites, Snapshot, Strategies, backing_off, decide
    from scheduler_ext.sim.estimates import MemoryEstimates
    from scheduler_ext.strategies import NodeView

    estimates = MemoryEstimates()
    for i, (ok, t) in enumerate(runs):  # one run each on nodes of the site, ended at t
        estimates.finish(site="a.com", group="p", node=f"n{i}", offered=30, collected=10 if ok else 0,
                         pages=3 if ok else 0, seconds=1.0, ok=ok, now=t)
    recall = DynamicRecall(threshold=30, max_recalls=5, backoff=2.0)
    st = Subtask("s3", "t3", "a.com", 0, 3, 20.0, attempt=3, since=99.5)  # recalled three times: waits 4 s
    snap = Snapshot(keys=Keys("{sim}"), now=100.0, estimates=estimates, ids=CountingIds(),
                    waiting=[(st.id, st.to_json())], nodes=[NodeView(id="n9", types=[0, 1], free=1)])
    strategies = Strategies(allocation=SharedAllocation(), modification=FixedModification(3, 20.0), recall=recall,
                            splitter=splitter, recall_age=30.0)
    placed = [d.subject for d in decide(snap, strategies, 100.0) if d.kind == "allocate"]
    assert placed == ([] if held else ["s3"])
    assert backing_off(recall, st, 100.0, HealthySites(estimates, 100.0, 30.0)) is held
    assert backing_off(recall, st, 104.0, HealthySites(estimates, 104.0, 30.0)) is False  # its delay is over
    assert backing_off(recall, st, 100.0, HealthySites(NoEstimates(), 100.0, 30.0)) is True  # no sums: it waits


def test_subtasks_waiting_out_their_retry_delay_take_no_room_in_the_window() -> None:
    """An outage recalls many subtasks at once, first in priority order: the window is the first subtasks that
    may be placed, not the first waiting ones, so the work behind them goes on."""
    from scheduler_ext.control import CountingIds, Snapshot, Strategies, decide
    from scheduler_ext.strategies import NodeView

    keys = Keys("{sim}")
    held = [Subtask(f"h{i}", f"t{i}", "a.com", 0, 3, 20.0, attempt=2, since=100.0, priority=i) for i in range(3)]
    ready = Subtask("r", "t9", "a.com", 0, 3, 20.0, priority=9)
    snap = Snapshot(keys=keys, now=100.0, estimates=NoEstimates(), ids=CountingIds(),
                    waiting=[(x.id, x.to_json()) for x in (*held, ready)],
                    nodes=[NodeView(id="n1", types=[0, 1], free=1)])
    strategies = Strategies(allocation=SharedAllocation(), modification=FixedModification(3, 20.0),
                            recall=DynamicRecall(threshold=30, max_recalls=5, backoff=2.0), splitter=splitter,
                            window=lambda free: 1)
    assert [d.subject for d in decide(snap, strategies, 100.0) if d.kind == "allocate"] == ["r"]


def test_a_recall_strategy_whose_retry_delay_fails_holds_nothing_back() -> None:
    from scheduler_ext.control import CountingIds, Snapshot, Strategies, decide
    from scheduler_ext.strategies import NodeView

    class Broken(DynamicRecall):
        def retry_delay(self, subtask: Subtask) -> float:
            raise RuntimeError("a plug-in's bug")

    keys = Keys("{sim}")
    st = Subtask("s3", "t3", "a.com", 0, 3, 20.0, attempt=3, since=100.0)
    snap = Snapshot(keys=keys, now=100.0, estimates=NoEstimates(), ids=CountingIds(),
                    waiting=[(st.id, st.to_json())], nodes=[NodeView(id="n1", types=[0, 1], free=1)])
    strategies = Strategies(allocation=SharedAllocation(), modification=FixedModification(3, 20.0),
                            recall=Broken(), splitter=splitter)
    assert [d.subject for d in decide(snap, strategies, 100.0) if d.kind == "allocate"] == ["s3"]


def test_an_entry_that_fails_halfway_leaves_the_task_records_as_they_were() -> None:
    """What an entry's processing changed of its task before it raised is undone: the tick's later entries of the
    task start from the record as it was, not as the half-done call left it (here the id source fails as a
    failure's recall opens a lane beside the recalled subtask, after the task was counted as retrying and one more
    out; then a stale entry of the same task is recalled)."""
    from scheduler_ext.control import CountingIds, Entry, Snapshot, Strategies, decide
    from scheduler_ext.models import Task
    from scheduler_ext.strategies import NodeView

    class FailingOnce(CountingIds):
        armed = True

        def take(self, n: int) -> list[str]:
            if self.armed:
                self.armed = False
                raise RuntimeError("the id source is away")
            return super().take(n)

    keys = Keys("{t}")
    task = Task(id="t1", site="a.com", total_pages=20, next_page=6, open=2, page_limit=3, time_limit=20.0)
    st = Subtask("s1", "t1", "a.com", 0, 3, 20.0)
    failed = Report(subtask=st, node="n1", outcome="failed", reason="HTTP 503", reported=200, offered=0,
                    collected=0, pages=0, next_page=0, total_pages=20, started=90.0, ended=95.0).to_json()
    queued = Subtask("s2", "t1", "a.com", 3, 3, 20.0, node="n2").to_json()  # in n2's queue, never taken
    snap = Snapshot(keys=keys, now=100.0, estimates=NoEstimates(), ids=FailingOnce(),
                    failures=[Entry(keys.failed, failed, len(failed))], tasks={"t1": task.to_json()},
                    stale=[("s2", queued)], nodes=[NodeView(id="n1", types=[0], free=2)])
    strategies = Strategies(allocation=SharedAllocation(), modification=FixedModification(3, 20.0),
                            recall=DynamicRecall(threshold=30, max_recalls=3), splitter=splitter, lanes=2,
                            idle_lanes=2)
    decisions = decide(snap, strategies, 100.0)
    assert decisions[0].kind == "dead"  # the failure, dead-lettered
    [recall] = [d for d in decisions if d.subject == "s2" and d.kind == "recall"]
    [record] = [json.loads(w[3]) for w in recall.writes if w[0] == "hset" and w[1] == keys.tasks]
    assert (record["open"], record["retrying"]) == (2, 1)  # (3, 2) if the failed call's changes stayed


def test_estimates_are_kept_across_ticks_and_only_changed_fields_are_read_again(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]}, {"name": "q", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store, allocation=DynamicAllocation())
    control.tick()  # loads a.com's estimates (none yet) and explores n1 on it
    assert control.estimates.completion("a.com", "n1") is None
    reads = control.estimates.reads
    st, token, _ = take(store, "n1")
    assert finish(store, "n1", st, token, collected=15)  # 15 of 30 offered
    assert store.redis.scard(store.keys.est_dirty) == 2  # the site's field and the product's field
    control.tick()
    assert store.redis.scard(store.keys.est_dirty) == 0
    c = control.estimates.completion("a.com", "n1")
    assert c is not None and c.value == 0.5 and c.runs == 1
    assert control.estimates.reads - reads <= 3  # the changed fields (and the new product's pair), not every hash
    control.is_leader = False  # as after losing the lead: the next tick starts afresh
    control.tick()
    assert control.estimates.completion("a.com", "n1") == c


def test_snapshot_reads_what_a_tick_needs_in_one_call(store: Store) -> None:
    k, r, now = store.keys, store.redis, store.now()
    big = "x" * 100
    r.lpush(k.virtual, "old", big, "new")  # the tail is the oldest
    # a deadline past the lease horizon, a heartbeat past the node timeout ahead: times no script writes
    r.zadd(k.leases, {"lapsed": now - 1, "running": now + 60, "absurd": now + 1000})
    r.zadd(k.queued, {"stale": now - 120, "fresh": now})
    r.zadd(k.node_seen, {"silent": now - 100, "n1": now, "skewed": now + 20, "ghost": now + 100})
    r.hset(k.nodes, "n1", json.dumps(NODE_INFO))
    r.lpush(k.crawl("n1"), "a", "b")
    r.zadd(k.waiting, {"w1": 1, "w2": 2, "w3": 3})
    r.sadd(k.est_dirty, "s|n1|a.com", "g|n1|a.com|p")
    t = store.snapshot(batch=10, max_bytes=50, recall_age=60, node_timeout=30, window=2, nodes=["n1", "gone"],
                       lease_horizon=600)
    assert now <= t.now <= store.now()
    assert [raw for raw, _, _ in t.virtual] == ["old", big[:2000], "new"] and t.sleeping == t.failed == []
    assert t.virtual[1][1:] == (100, hashlib.sha1(big.encode()).hexdigest())  # over max_bytes: size and SHA-1
    assert (t.lapsed, t.stale) == (["lapsed", "absurd"], ["stale"])
    assert (t.silent, t.live) == (["silent", "ghost"], ["n1", "skewed"])
    assert t.entries == {"n1": (json.dumps(NODE_INFO), 2), "gone": (None, 0)}
    assert t.window == ["w1", "w2"]
    assert sorted(t.dirty) == ["g|n1|a.com|p", "s|n1|a.com"] and r.scard(k.est_dirty) == 0


def test_snapshot_says_when_an_input_may_have_more_than_it_read(store: Store) -> None:
    k, r = store.keys, store.redis
    read = functools.partial(store.snapshot, max_bytes=50, recall_age=60, node_timeout=30, window=0, nodes=[],
                             lease_horizon=600)
    r.lpush(k.sleeping, "a" * 10, "b" * 10, "c" * 10)
    assert read(batch=3).more and not read(batch=4).more  # as many entries as a tick reads: more may wait
    assert read(batch=10, budget=15).more  # stopped by the bytes a list may return
    assert not read(batch=10, budget=31).more
    r.delete(k.sleeping)
    r.lpush(k.failed, "x" * 100)  # over max_bytes: counted as the bytes returned of it (show_bytes)
    assert read(batch=10, show_bytes=20, budget=20).more and not read(batch=10, show_bytes=20, budget=21).more


def test_a_tick_that_read_a_full_batch_says_so_and_the_next_reads_the_rest(store: Store) -> None:
    inject(store, *({"name": f"p{i}", "sites": ["a.com"]} for i in range(3)))
    control = Control(store, splitter=splitter, allocation=SharedAllocation(), modification=FixedModification(3, 20.0),
                      recall=DynamicRecall(threshold=30, max_recalls=3), control_id="c1", batch=2)
    first = control.tick()
    assert (first.split, first.behind) == (2, True)
    second = control.tick()
    assert (second.split, second.behind) == (1, False)
    # A full batch none of which could be taken (every guard lost to another control, as if it always got there
    # first): the entries are still there, and ticking again at once would spin; the interval decides.
    inject(store, *({"name": f"q{i}", "sites": ["a.com"]} for i in range(3)))
    store.commit_many = lambda pairs: [False] * len(pairs)  # type: ignore[method-assign]
    refused = control.tick()
    assert refused.refused >= 2 and refused.split == 0 and not refused.behind


def test_a_node_that_joins_fills_its_slots_in_its_first_tick(store: Store) -> None:
    k, r = store.keys, store.redis
    for i in range(100):
        st = Subtask(id=f"w{i:03d}", task=f"t{i}", site="a.com", first_page=0, page_limit=3, time_limit=20.0,
                     priority=float(i))
        r.hset(k.subtasks, st.id, st.to_json())
        r.zadd(k.waiting, {st.id: st.priority})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store)
    assert control.tick().allocated == 1
    store.heartbeat("n2", {**NODE_INFO, "prefetch": 40}, 30, [])  # far more free slots than the last tick had
    assert control.tick().allocated == 40
    assert r.llen(k.crawl("n2")) == 40 and r.zcard(k.waiting) == 59


class _Sends:
    """An allocation that sends every subtask to n1 as ``make(subtask)`` says: capped, or forged."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def allocate(self, subtasks: Any, nodes: Any, estimates: Any, now: float) -> list[tuple[Subtask, str]]:
        return [(self.make(s), "n1") for s in subtasks][:1]


def test_an_exploration_capped_to_its_first_pages_is_queued_capped_and_its_task_goes_on_after_it(
        store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store, allocation=_Sends(lambda s: s.capped(1)))
    assert control.tick().allocated == 1
    st, token, _ = take(store, "n1")
    assert (st.first_page, st.page_limit) == (0, 1)  # the split made 3 pages; the strategy sent the first only
    assert finish(store, "n1", st, token)
    control.tick()
    nxt = Subtask.from_json(store.redis.lrange(store.keys.crawl("n1"), 0, -1)[0])
    assert nxt.task == st.task and nxt.first_page == 1  # from where the capped run ended: no page skipped


def test_the_pages_a_one_page_look_leaves_out_wait_at_once_so_its_task_does_not_wait_for_the_look(
        store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    k = store.keys
    sends = _Sends(lambda s: s.capped(1))
    control = make_control(store, allocation=sends)
    assert control.tick().allocated == 1
    st, _, _ = take(store, "n1")
    assert (st.first_page, st.page_limit, st.rest) == (0, 1, 0)
    # Before the look reports, its task's other pages wait already, a subtask of the same task
    [sid] = store.redis.zrange(k.waiting, 0, -1)
    rest = Subtask.from_json(store.redis.hget(k.subtasks, sid))
    assert (rest.task, rest.first_page, rest.page_limit, rest.node) == (st.task, 1, 2, None)
    assert _task_record(store)["open"] == 2  # both out: the task is not done until both report
    sends.make = lambda s: s
    assert control.tick().allocated == 1
    assert [(s.first_page, s.page_limit) for s, _ in _drain(store, "n1")] == [(1, 2)]


@pytest.mark.parametrize("forge", [
    lambda s: Subtask.from_json(s.to_json()).capped(s.page_limit + 1),  # a copy, not capped: not the object
    lambda s: dataclasses.replace(s, page_limit=1, first_page=s.first_page + 1),  # other pages
    lambda s: dataclasses.replace(s, page_limit=s.page_limit + 2),  # more pages than it has
    lambda s: (s.id, s.site),  # not a subtask at all
])
def test_an_assignment_that_is_not_the_subtask_or_its_first_pages_is_refused(store: Store, forge: Any) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    result = make_control(store, allocation=_Sends(forge)).tick()
    assert result.allocated == 0
    assert store.redis.llen(store.keys.crawl("n1")) == 0 and store.redis.zcard(store.keys.waiting) == 1


# --- lanes: several subtasks of one task out at once ---------------------------------------------------------------


def finish_at(store: Store, node: str, st: Subtask, token: str, stop: int, *, ok: bool = True,
              total: int = 20) -> bool:
    """Finish ``st`` having crawled its pages up to ``stop`` (a time limit cut the rest, or a failure there)."""
    stop = min(stop, total)
    pages = stop - st.first_page
    outcome = "failed" if not ok else "done" if stop >= st.first_page + st.page_limit else "timeout"
    report = Report(subtask=st, node=node, outcome=outcome, reason="" if ok else "HTTP 503", reported=10 * total,
                    offered=10 * pages, collected=10 * pages, pages=pages, next_page=stop,
                    exhausted=stop >= total, total_pages=total, started=store.now() - 1, ended=store.now())
    return store.finish(st.id, token, report.to_json(), node=node, site=st.site, group=st.group,
                        offered=report.offered, collected=report.collected, pages=pages, seconds=1.0, ok=ok,
                        alpha=0.3, runs_maxlen=1000)


def _drain(store: Store, node: str) -> list[tuple[Subtask, str]]:
    out = []
    while (got := store.take(node, lease_ttl=30, grace=5)) is not None:
        out.append((Subtask.from_json(got[0]), got[1]))
    return out


class _Caps:
    """An allocation that sends every subtask of the window to n1 (its avoid list ignored) as ``cap`` says."""

    def __init__(self, cap: Any) -> None:
        self.cap = cap

    def allocate(self, subtasks: Any, nodes: Any, estimates: Any, now: float) -> list[tuple[Subtask, str]]:
        return [(self.cap(s), "n1") for s in subtasks]


def _task_record(store: Store) -> dict[str, Any]:
    [raw] = store.redis.hvals(store.keys.tasks)
    return json.loads(raw)


def test_a_task_keeps_its_lanes_out_once_its_page_count_is_known(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", {**NODE_INFO, "prefetch": 8}, 30, [])
    control = make_control(store, lanes=2)
    control.tick()
    [(first, token)] = _drain(store, "n1")  # one subtask until the engine's count is seen
    assert (first.first_page, first.page_limit) == (0, 3)
    assert finish_at(store, "n1", first, token, 3)
    control.tick()
    out = _drain(store, "n1")
    assert sorted((st.first_page, st.page_limit) for st, _ in out) == [(3, 3), (6, 3)]
    task = _task_record(store)
    assert (task["next_page"], task["open"], task["done"]) == (9, 2, False)
    # The later slice reports first; the earlier one is cut by its time limit after one page: its two pages
    # left become a subtask of their own, and the later slice's report made the next slice.
    (a, ta), (b, tb) = sorted(out, key=lambda x: x[0].first_page)
    assert finish_at(store, "n1", b, tb, 9)
    assert finish_at(store, "n1", a, ta, 4)
    control.tick()
    assert sorted((st.first_page, st.page_limit) for st, _ in _drain(store, "n1")) == [(4, 2), (9, 3)]
    assert _task_record(store)["open"] == 2


@pytest.mark.parametrize(("case", "lanes"), [("dry", 2), ("site waiting", 1), ("node full", 1)])
def test_a_second_lane_opens_only_where_the_site_runs_dry_for_the_node_that_reported(
        store: Store, case: str, lanes: int) -> None:
    """Beyond one subtask a task at a time, a task opens a lane only when the node that reported its run could take
    more (a free slot in its crawl queue) and no subtask of its site is waiting: elsewhere more subtasks would
    only wait, or go to worse nodes."""
    others = {"dry": [], "site waiting": [{"name": "q", "sites": ["a.com"]}],
              "node full": [{"name": "r", "sites": ["b.com"]}]}[case]
    inject(store, {"name": "p", "sites": ["a.com"]}, *others)
    store.heartbeat("n1", {**NODE_INFO, "prefetch": 8 if case == "dry" else 1}, 30, [])
    control = make_control(store, lanes=2)
    control.tick()
    st, token, _ = take(store, "n1")
    assert st.group == "p" and st.first_page == 0
    if case == "node full":
        control.tick()  # r's first subtask (b.com) fills n1's one slot before p reports
    # "site waiting": q's first subtask (a.com) is still waiting when the report is read: n1's slot is free, but
    # allocation comes after the reports in a tick
    assert store.redis.llen(store.keys.crawl("n1")) == (1 if case == "node full" else 0)
    assert store.redis.zcard(store.keys.waiting) == (1 if case == "site waiting" else 0)
    assert finish_at(store, "n1", st, token, 3)
    control.tick()
    [task] = [t for t in map(json.loads, store.redis.hvals(store.keys.tasks)) if t["group"] == "p"]
    assert (task["next_page"], task["open"]) == (3 + 3 * lanes, lanes)


@pytest.mark.parametrize(("idle", "idle_lanes", "opened"), [
    (4, 8, [(3, 3), (6, 3), (9, 3), (12, 3)]),  # 4 idle nodes, 2 taken by the task's own 2 lanes: 2 lanes more
    (3, 8, [(3, 3), (6, 3), (9, 3)]),  # 3 idle: one more
    (2, 8, [(3, 3), (6, 3)]),  # as many idle nodes as the task's new slices: SCHEDEXT_TASK_LANES
    (4, 3, [(3, 3), (6, 3), (9, 3)]),  # SCHEDEXT_TASK_LANES_IDLE caps them
])
def test_a_task_whose_site_runs_dry_takes_a_lane_more_per_idle_node(
        store: Store, idle: int, idle_lanes: int, opened: list[tuple[int, int]]) -> None:
    """Where a task's site runs dry and nodes of the cluster hold nothing (their heartbeats list no subtask, their
    crawl queues are empty) beyond the subtasks waiting or made in the tick, the task opens lanes beyond
    SCHEDEXT_TASK_LANES, one per such idle node, up to SCHEDEXT_TASK_LANES_IDLE: capacity nobody uses crawls the
    tasks' pages in parallel."""
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", {**NODE_INFO, "prefetch": 8, "subtasks": ["busy"]}, 30, [])
    for i in range(2, 7):
        store.heartbeat(f"n{i}", {**NODE_INFO, "prefetch": 8, "subtasks": [] if i < 2 + idle else ["x"]}, 30, [])
    control = make_control(store, lanes=2, idle_lanes=idle_lanes, allocation=_Caps(cap=lambda s: s))
    control.tick()
    [(first, token)] = _drain(store, "n1")
    assert finish_at(store, "n1", first, token, 3)
    control.tick()
    assert sorted((st.first_page, st.page_limit) for st, _ in _drain(store, "n1")) == opened
    assert _task_record(store)["open"] == len(opened)


@pytest.mark.parametrize("seed", range(8))
def test_lanes_crawl_every_page_once_whatever_the_order_cuts_and_caps(store: Store, seed: int) -> None:
    """Slices finished in any order, cut short by time limits or failed pages, capped by the allocation: every
    page of the task is crawled exactly once and the task is done only when the last of its subtasks has reported."""
    import random

    rng = random.Random(seed)
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", {**NODE_INFO, "prefetch": 8}, 30, [])
    caps = _Caps(cap=lambda s: s.capped(rng.randint(1, s.page_limit)) if rng.random() < 0.4 else s)
    control = make_control(store, lanes=rng.choice([2, 3]), allocation=caps,
                           recall=DynamicRecall(threshold=30, max_recalls=100, backoff=0.0))
    crawled: list[int] = []
    reported = 0  # results of the runs that did not fail (a failed run's are stored, not counted on the task)
    for _ in range(200):
        control.tick()
        out = _drain(store, "n1")
        if not out:
            break
        assert not _task_record(store)["done"]
        rng.shuffle(out)
        for st, token in out:
            ok = rng.random() < 0.8  # else a page fails: the slice is recalled from there
            stop = rng.randint(st.first_page, st.first_page + st.page_limit - (0 if ok else 1))  # or a time limit
            assert finish_at(store, "n1", st, token, stop, ok=ok)
            crawled += range(st.first_page, min(stop, 20))
            reported += 10 * (min(stop, 20) - st.first_page) if ok else 0
    task = _task_record(store)
    assert sorted(crawled) == list(range(20))
    assert task["done"] is True and task["open"] == 0 and task["collected"] == reported
    assert store.redis.zcard(store.keys.waiting) == 0 and store.redis.hget(store.keys.progress, "p|done") == "1"


def test_a_dead_lettered_slice_closes_its_lane_and_the_task_still_ends(store: Store) -> None:
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", {**NODE_INFO, "prefetch": 8}, 30, [])
    control = make_control(store, lanes=2, recall=DynamicRecall(threshold=30, max_recalls=2),
                           allocation=_Caps(cap=lambda s: s))
    control.tick()
    [(first, token)] = _drain(store, "n1")
    assert finish_at(store, "n1", first, token, 3, total=9)
    control.tick()
    (a, ta), (b, tb) = sorted(_drain(store, "n1"), key=lambda x: x[0].first_page)
    assert finish_at(store, "n1", a, ta, 3, ok=False, total=9)  # fails at its first page: recalled, then dead
    assert finish_at(store, "n1", b, tb, 9, total=9)
    control.tick()
    [(again, tg)] = _drain(store, "n1")  # a recalled slice: its next attempt, wherever it goes
    assert again.id == a.id and again.attempt == 1
    assert finish_at(store, "n1", again, tg, 3, ok=False, total=9)
    control.tick()
    task = _task_record(store)
    assert task["done"] is True and task["open"] == 0
    [dead] = [json.loads(v) for v in store.redis.hvals(store.keys.dead)]
    assert dead["subtask"]["first_page"] == 3 and dead["subtask"]["page_limit"] == 3


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_recalled_slice_runs_beside_its_task_which_goes_on(store: Store, lanes: int) -> None:
    """A failed run's remainder (mostly a page or two) is recalled, and with SCHEDEXT_TASK_LANES > 1 its task
    keeps its lanes of fresh slices beside it instead of waiting for it: one lane more while any recalled slice is
    out, not one per recalled slice (a site where every run fails does not burn through its tasks). With one lane:
    the paper's one subtask at a time."""
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", {**NODE_INFO, "prefetch": 8}, 30, [])
    control = make_control(store, lanes=lanes, allocation=_Caps(cap=lambda s: s),
                           recall=DynamicRecall(threshold=30, max_recalls=5, backoff=0.0))

    def pages(out: list[tuple[Subtask, str]]) -> list[tuple[int, int, int]]:
        return sorted((st.first_page, st.page_limit, st.attempt) for st, _ in out)

    def counts() -> tuple[int, int, int]:
        task = _task_record(store)
        return task["next_page"], task["open"], task["retrying"]

    control.tick()
    [(first, token)] = _drain(store, "n1")
    assert finish_at(store, "n1", first, token, 3)
    control.tick()
    out = sorted(_drain(store, "n1"), key=lambda x: x[0].first_page)
    assert pages(out) == [(3, 3, 0), (6, 3, 0)][:lanes]
    assert finish_at(store, "n1", *out[0], 4, ok=False)  # page 4 failed: pages 4 and 5 are recalled
    control.tick()
    recalled = _drain(store, "n1")
    if lanes == 1:  # the task waits for its recalled pages
        assert pages(recalled) == [(4, 2, 1)] and counts() == (6, 1, 1)
        return
    # The site runs dry for n1: the task's next slice opens beside its recalled pages at once.
    assert pages(recalled) == [(4, 2, 1), (9, 3, 0)] and counts() == (12, 3, 1)
    fresh = [x for x in recalled if x[0].attempt == 0]
    for st, tok in [out[1], *fresh]:  # the task's other slices fail on their first page: recalled whole ...
        assert finish_at(store, "n1", st, tok, st.first_page, ok=False)
    control.tick()
    again = _drain(store, "n1")  # ... and no slice opens beside them: one lane more, not one per recalled slice
    assert pages(again) == [(6, 3, 1), (9, 3, 1)] and counts() == (12, 3, 3)
    for st, tok in [*recalled[:1], *again]:
        assert finish_at(store, "n1", st, tok, st.first_page + st.page_limit)
    control.tick()
    rest = _drain(store, "n1")  # the recalled slices done: back to the task's own lanes
    assert rest and all(st.attempt == 0 for st, _ in rest) and counts()[1:] == (len(rest), 0)


def test_a_task_record_with_a_bad_count_is_refused_by_name() -> None:
    from scheduler_ext.exceptions import InvalidInput
    from scheduler_ext.models import Task

    assert Task.from_json('{"id": "t", "site": "a.com", "open": null}').open == 1  # absent or null: the default
    for field, value in (("open", -1), ("next_page", "3"), ("total_pages", 1.5)):
        with pytest.raises(InvalidInput, match=f"field '{field}'"):
            Task.from_json(json.dumps({"id": "t", "site": "a.com", field: value}))


def test_a_nodes_view_counts_the_subtasks_its_heartbeat_says_it_holds() -> None:
    raw = json.dumps({"type": [0], "prefetch": 4, "subtasks": ["7", "9"]})
    view = node_view("n1", raw, 1)
    assert view is not None and (view.held, view.free, view.queued) == (2, 3, 1)
    old = node_view("n1", json.dumps({"type": [0], "prefetch": 4, "subtasks": "7"}), 0)  # not a list: nothing
    assert old is not None and old.held == 0


def test_a_control_reserves_ids_a_block_at_a_time_and_never_hands_one_out_twice(store: Store) -> None:
    # A tick made one Redis round trip per subtask it made, for its id. Ids now come from a block reserved at once;
    # two controls (a leader and the standby that follows it) and a control that forgot its state never share one.
    a, b = make_control(store, "c1"), make_control(store, "c2")
    first = a._ids.take(1) + a._ids.take(2)
    assert int(store.redis.get(store.keys.seq)) == ID_BLOCK  # one reservation for the three
    second = b._ids.take(ID_BLOCK + 1)  # more than a block: one reservation of what it asks
    a.forget()  # after a Redis error: the pool goes, the next ids come from seq
    third = a._ids.take(1)
    ids = first + second + third
    assert len(set(ids)) == len(ids) and first == ["1", "2", "3"]
    assert min(map(int, third)) > max(map(int, second))


def test_nothing_is_allocated_to_a_node_after_its_close_returned_its_queue(store: Store) -> None:
    """`scrapy cluster down` stops the nodes while the controls still run. A tick that read a closing node as
    registered (and idle: an idle node is served first) must not push into its crawl queue after the node's close
    drained it: the subtask would sit there until a recall. The close deregisters and drains in one step and an
    allocation is guarded by the registry entry, so the subtask stays waiting instead."""
    from scheduler_ext.control import CountingIds, Entry, Snapshot, Strategies, decide
    from scheduler_ext.strategies import NodeView

    k = store.keys
    raw = json.dumps({"name": "p", "sites": ["a.com", "b.com"]})
    store.redis.lpush(k.virtual, raw)
    store.heartbeat("n1", NODE_INFO, 30, [])
    snap = Snapshot(keys=k, now=store.now(), estimates=NoEstimates(), ids=CountingIds(),
                    virtual=[Entry(k.virtual, raw, len(raw))], nodes=[NodeView(id="n1", types=[0, 1], free=2)])
    strategies = Strategies(allocation=SharedAllocation(), modification=FixedModification(3, 20.0),
                            recall=DynamicRecall(), splitter=splitter)
    split, *allocations = decide(snap, strategies, snap.now)
    assert split.kind == "split" and [d.kind for d in allocations] == ["allocate", "allocate"]
    assert store.commit_many([(split.guards, split.writes), (allocations[0].guards, allocations[0].writes)]) == [
        True, True]
    assert store.redis.llen(k.crawl("n1")) == 1  # registered: the first allocation landed
    # The node closes between the tick's read and its commit of the second allocation.
    assert store.release("n1", [], deregister=True) == 1
    assert not store.redis.hexists(k.nodes, "n1") and store.redis.zscore(k.node_seen, "n1") is None
    assert store.commit_many([(allocations[1].guards, allocations[1].writes)]) == [False]
    assert store.redis.llen(k.crawl("n1")) == 0 and store.redis.zcard(k.queued) == 0
    assert store.redis.zcard(k.waiting) == 2  # both wait for another node: nothing lost, nothing stranded


def test_a_subtask_dead_lettered_without_a_report_leaves_its_task(store: Store) -> None:
    """A dead letter is one subtask fewer out of its task whichever recall sent it there: its task record is read
    for lapsed leases, stale crawl-queue entries and silent nodes' queues too, so the task can still end (and keeps
    its lanes)."""
    k = store.keys
    for lapse in ("lease", "queue", "silent"):
        store.redis.flushdb()
        inject(store, {"name": "p", "sites": ["a.com"]})
        store.heartbeat("n1", NODE_INFO, 30, [])
        control = make_control(store, recall=DynamicRecall(threshold=30, max_recalls=3, backoff=0.0))  # 3 runs
        control.tick()
        for _ in range(3):  # each run on another node (a recalled subtask avoids the nodes it failed on)
            for node in ("n1", "n2", "n3"):
                store.heartbeat(node, NODE_INFO, 30, [])
            if lapse == "lease":
                [node] = [n for n in ("n1", "n2", "n3") if store.redis.llen(k.crawl(n))]
                st, _, _ = take(store, node)
                store.redis.zadd(k.leases, {st.id: 1.0})  # its deadline passed: the node died mid-run
            elif lapse == "queue":
                [sid] = store.redis.zrange(k.queued, 0, -1)
                store.redis.zadd(k.queued, {sid: 1.0})  # queued long ago, never taken
            else:
                [node] = [n for n in ("n1", "n2", "n3") if store.redis.llen(k.crawl(n))]
                store.redis.zadd(k.node_seen, {node: 1.0})  # the node holding it stopped heartbeating
            control.tick()
        assert store.redis.hlen(k.dead) == 1, lapse
        assert _task_record(store)["open"] == 0, lapse


class _RaisingRecall(DynamicRecall):
    def decide(self, subtask: Subtask, node: str | None, reason: str, *, failed: bool) -> Any:
        raise RuntimeError("a recall plug-in's bug")


def test_a_subtask_dead_lettered_because_its_recall_failed_leaves_its_task(store: Store) -> None:
    """A recall plug-in that raises on a lapsed lease, a stale crawl-queue entry or a silent node's queue
    dead-letters that one subtask (the tick goes on) and counts it out of its task, once: the task can still end.
    (A dead-lettered report or failure is not counted out: requeued whole, it does that itself.)"""
    k = store.keys
    for lapse in ("lease", "queue", "silent"):
        store.redis.flushdb()
        inject(store, {"name": "p", "sites": ["a.com"]})
        store.heartbeat("n1", NODE_INFO, 30, [])
        control = make_control(store, recall=_RaisingRecall(threshold=30, max_recalls=3))
        control.tick()
        assert _task_record(store)["open"] == 1, lapse
        if lapse == "lease":
            st, _, _ = take(store, "n1")
            store.redis.zadd(k.leases, {st.id: 1.0})
        elif lapse == "queue":
            [sid] = store.redis.zrange(k.queued, 0, -1)
            store.redis.zadd(k.queued, {sid: 1.0})
        else:
            store.redis.zadd(k.node_seen, {"n1": 1.0})
        control.tick()
        assert store.redis.hlen(k.dead) == 1, lapse
        assert _task_record(store)["open"] == 0, lapse


def test_a_task_record_changed_after_the_tick_read_it_is_not_written_over(store: Store) -> None:
    """The control is not the only writer of task records: ``scrapy deadletter drop`` counts a subtask out. A tick
    that had read a record wrote what it decided on it over a change made meanwhile (the drop's count was lost, and
    the task could never end). Its decision is refused now, and the next tick decides again on the new record."""
    k = store.keys
    inject(store, {"name": "p", "sites": ["a.com"]})
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store)
    control.tick()
    st, token, _ = take(store, "n1")
    assert finish(store, "n1", st, token)
    snapshot = control.read()
    meanwhile = {**_task_record(store), "priority": 7.0}  # a change by another writer, after the read
    store.redis.hset(k.tasks, st.task, json.dumps(meanwhile))
    result = control.apply(decide(snapshot, control.strategies, snapshot.now), snapshot.tasks)
    assert result.refused >= 1 and result.reports == 0
    assert _task_record(store) == meanwhile and store.redis.llen(k.sleeping) == 1  # the report waits, whole
    control.tick()
    record = _task_record(store)
    assert record["priority"] == 7.0 and record["collected"] == 30 and store.redis.llen(k.sleeping) == 0
