"""Hostile input in every list and hash the control and the nodes read, against a real Redis.

Each case pushes one bad entry by hand (bytes as they would arrive from ``redis-cli`` or another program: a
pickle, invalid UTF-8, JSON of the wrong shape or types, oversized, deeply nested, huge lists, unknown engines,
dotted paths to things that are not engines), then a valid virtual task behind it, and runs the control and a
node (played by the store's own node operations, as tests/test_control.py does) until that task is done. The bad
entry must end in the dead-letter list with a reason (or, where it is not an entry of work, be set aside without
harm), and the valid work must complete: no entry can stop the loop.

Plus property tests (hypothesis) of the decoders and of ``decide``: whatever the bytes, they raise InvalidInput
or return a valid record, and ``decide`` returns decisions without raising.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import redis as redis_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from test_control import NODE_INFO, make_control  # noqa: I001  (tests/ is on the path)

from product_crawl.tasks import splitter
from scheduler_ext.control import CountingIds, Entry, EstimateCache, Snapshot, Strategies, decide
from scheduler_ext.exceptions import InvalidInput
from scheduler_ext.keys import Keys
from scheduler_ext.models import Report, Subtask, Task
from scheduler_ext.status import collect_status
from scheduler_ext.store import GARBAGE_KEPT, Store, load_script
from scheduler_ext.strategies import Allocation, NodeView
from scheduler_ext.strategies.allocation import DynamicAllocation, SharedAllocation
from scheduler_ext.strategies.bandit import BanditAllocation
from scheduler_ext.strategies.modification import DynamicModification, FixedModification
from scheduler_ext.strategies.recall import DynamicRecall

VALID = {"name": "光明高钙牛奶", "sites": ["ok.example"]}
PICKLE = pickle.dumps({"name": "x", "sites": ["a.com"]})


@pytest.fixture
def store(redis: redis_lib.Redis, prefix: str) -> Store:
    return Store(redis, Keys(prefix))


@pytest.fixture
def raw(redis_url: str) -> redis_lib.Redis:
    """A client that writes bytes as given (no encoding), as any other program could."""
    return redis_lib.Redis.from_url(redis_url)


def run_valid_task(store: Store, control: Any, node: str = "n1", ticks: int = 30,
                   tick: Callable[[], Any] | None = None, name: str | None = None) -> None:
    """Push the valid virtual task, then tick (``control.tick``, unless ``tick`` says how) and play the node until
    its task is done; with ``name``, push nothing and play until the task of that product is done."""
    if name is None:
        store.redis.lpush(store.keys.virtual, json.dumps(VALID, ensure_ascii=False))
    name = name or VALID["name"]
    k = store.keys
    for _ in range(ticks):
        store.heartbeat(node, NODE_INFO, 30, [])
        (tick or control.tick)()
        if store.redis.hget(k.progress, f"{name}|done") == "1":
            return
        got = store.take(node, lease_ttl=30, grace=5)
        if got is None:
            continue
        st = Subtask.from_json(got[0])
        report = Report(subtask=st, node=node, outcome="done", reported=10, offered=10, collected=10,
                        pages=st.page_limit, next_page=st.first_page + st.page_limit, exhausted=True,
                        total_pages=1, started=got[2], ended=got[2] + 1)
        store.finish(st.id, got[1], report.to_json(), node=node, site=st.site, group=st.group, offered=10,
                     collected=10, pages=st.page_limit, seconds=1.0, ok=True, alpha=0.3, runs_maxlen=100)
    raise AssertionError(f"the task of {name} did not complete in {ticks} ticks")


def dead(store: Store) -> list[dict[str, Any]]:
    return [json.loads(v) for v in store.redis.hvals(store.keys.dead)]


class StubCrawler:
    """What :class:`ControlExtension` asks of a crawler: stats and signals that take anything."""

    class stats:  # noqa: N801 - a stand-in for Scrapy's stats collector
        @staticmethod
        def inc_value(*a: Any) -> None: ...

        @staticmethod
        def set_value(*a: Any) -> None: ...

    class signals:  # noqa: N801
        @staticmethod
        def connect(*a: Any, **kw: Any) -> None: ...


def extension(control: Any) -> Any:
    """``control`` in the loop the control process runs it in (``run_once``: a failed tick is recorded, never
    raised)."""
    from scheduler_ext.control import ControlExtension

    return ControlExtension(StubCrawler(), control, 0.01, alarm=3, backoff_max=0.01)


# --- every input list of the control ------------------------------------------------------------------------------

BAD_ENTRIES: dict[str, bytes] = {
    "pickle": PICKLE,
    "invalid utf-8": b"\xff\xfe\x80 not text",
    "nul bytes": b"\x00\x00\x00",
    "empty": b"",
    "json list": b"[1, 2, 3]",
    "json number": b"42",
    "json string": b'"name"',
    "json null": b"null",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "wrong types": json.dumps({"name": 7, "sites": "a.com", "v": "1"}).encode(),
    "wrong version": json.dumps({**VALID, "v": 99}).encode(),
    "unknown field": json.dumps({**VALID, "colour": "red"}).encode(),
    "huge list of sites": json.dumps({"name": "x", "sites": [f"s{i}.com" for i in range(50_000)]}).encode(),
    "huge list of keywords": json.dumps({"name": "x", "keywords": ["k"] * 50_000}).encode(),
    "unknown engine": json.dumps({**VALID, "engines": ["google"]}).encode(),
    "dotted path, not an engine": json.dumps({**VALID, "engines": ["os.path.join"]}).encode(),
    "dotted path, no such module": json.dumps({**VALID, "engines": ["no_such_module.Engine"]}).encode(),
    "oversized": b'{"name": "' + b"x" * 2_000_000 + b'"}',
}


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_bad_virtual_task_is_dead_lettered_and_work_behind_it_completes(
        store: Store, raw: redis_lib.Redis, case: str) -> None:
    raw.lpush(store.keys.virtual, BAD_ENTRIES[case])
    run_valid_task(store, make_control(store))
    [entry] = dead(store)
    assert entry["kind"] == "virtual" and entry["reason"], entry
    assert entry["source"] == store.keys.virtual
    assert store.redis.llen(store.keys.virtual) == 0
    if case in ("pickle", "invalid utf-8"):
        assert "UTF-8" in entry["reason"] and "\\x" in entry["raw"]  # the bytes, shown safely
    if case == "oversized":
        assert entry["cut"] and entry["size"] > 2_000_000 and "SCHEDEXT_MAX_ENTRY_BYTES" in entry["reason"]


@pytest.mark.parametrize("lst", ["sleeping", "failed"])
@pytest.mark.parametrize("case", ["pickle", "invalid utf-8", "json list", "wrong types", "oversized", "empty",
                                  "deep nesting"])
def test_bad_report_or_failure_is_dead_lettered_and_work_completes(
        store: Store, raw: redis_lib.Redis, lst: str, case: str) -> None:
    key = getattr(store.keys, lst)
    raw.lpush(key, BAD_ENTRIES[case])
    run_valid_task(store, make_control(store))
    [entry] = dead(store)
    assert entry["reason"] and entry["kind"] in ("report", "failure", "malformed"), entry
    assert store.redis.llen(key) == 0


def _report_json(**overrides: Any) -> str:
    st = Subtask(id="999", task="998", site="a.com", first_page=0, page_limit=3, time_limit=20.0)
    obj = json.loads(Report(subtask=st, node="n9", outcome="done", collected=1, offered=1, pages=1,
                            next_page=1).to_json())
    obj.update(overrides)
    return json.dumps(obj)


@pytest.mark.parametrize("lst", ["sleeping", "failed"])
@pytest.mark.parametrize("fields", [{"collected": "many"}, {"next_page": [1]}, {"total_pages": "x"},
                                    {"subtask": {"id": "1"}}, {"outcome": "exploded"}, {"blocked": -1},
                                    {"attempted": 0}, {"failed": 1.5}])
def test_report_of_the_right_shape_with_wrong_types_is_dead_lettered(
        store: Store, lst: str, fields: dict[str, Any]) -> None:
    # A task record for it, so that the report reaches the arithmetic that its wrong types would break.
    store.redis.hset(store.keys.tasks, "998", Task(id="998", site="a.com").to_json())
    store.redis.lpush(getattr(store.keys, lst), _report_json(**fields))
    run_valid_task(store, make_control(store))
    assert len(dead(store)) == 1 and dead(store)[0]["reason"]


def test_dead_letter_of_a_report_kept_whole_can_be_requeued(store: Store) -> None:
    from scheduler_ext import deadletter

    store.redis.lpush(store.keys.sleeping, _report_json(collected="many"))
    run_valid_task(store, make_control(store))
    [entry] = dead(store)
    assert deadletter.requeue(store, entry["id"]) == "sleeping"
    assert store.redis.lrange(store.keys.sleeping, 0, -1) == [_report_json(collected="many")]


# --- hashes and sorted sets the control reads --------------------------------------------------------------------


def test_waiting_ids_with_bad_records(store: Store, raw: redis_lib.Redis) -> None:
    k = store.keys
    raw.zadd(k.waiting, {"w1": 0, "w2": 0, "w3": 0, "w4": 0})
    raw.hset(k.subtasks, "w1", PICKLE)
    raw.hset(k.subtasks, "w2", b'{"v": 1, "id": "w2"}')
    raw.hset(k.subtasks, "w3", Subtask(id="other", task="t", site="a.com", first_page=0, page_limit=1,
                                       time_limit=5.0).to_json())  # the record of another id
    # w4 has no record at all
    run_valid_task(store, make_control(store))
    assert sorted(e["id"] for e in dead(store)) == ["w1", "w2", "w3", "w4"]
    assert all(e["kind"] == "waiting" and e["reason"] for e in dead(store))
    assert not store.redis.zscore(k.waiting, "w1")


def test_lapsed_leases_with_bad_lease_or_record(store: Store, raw: redis_lib.Redis) -> None:
    k = store.keys
    good = Subtask(id="L2", task="t", site="a.com", first_page=0, page_limit=1, time_limit=5.0)
    raw.zadd(k.leases, {"L1": 1, "L2": 1, "L3": 1})
    raw.hset(k.lease_info, "L1", PICKLE)  # unreadable lease, unreadable record: dead-lettered
    raw.hset(k.subtasks, "L1", b"\xff")
    raw.hset(k.lease_info, "L2", b"[1]")  # unreadable lease, readable record: recalled
    raw.hset(k.subtasks, "L2", good.to_json())
    # L3: a deadline with nothing behind it: dropped
    run_valid_task(store, make_control(store))
    assert [e["id"] for e in dead(store)] == ["L1"] and dead(store)[0]["kind"] == "lease"
    assert store.redis.zcard(k.leases) == 0 and not store.redis.hexists(k.lease_info, "L1")
    runs = [json.loads(r[1]["report"])["subtask"] for r in store.redis.xrange(k.runs)]
    assert [r["attempt"] for r in runs if r["id"] == "L2"] == [1]  # recalled, run again, one attempt more


def test_stale_queued_ids_with_bad_records(store: Store, raw: redis_lib.Redis) -> None:
    k = store.keys
    raw.zadd(k.queued, {"Q1": 1, "Q2": 1})
    raw.hset(k.subtasks, "Q1", PICKLE)
    run_valid_task(store, make_control(store))
    assert store.redis.zcard(k.queued) == 0  # set aside: no record to recall (a crawl entry fails on take)


def test_bad_node_registry_entries(store: Store, raw: redis_lib.Redis) -> None:
    k = store.keys
    now = store.now()
    raw.hset(k.nodes, mapping={"bad1": PICKLE, "bad2": b'{"type": "x", "prefetch": "lots"}', "bad3": b"[]"})
    raw.zadd(k.node_seen, {"bad1": now + 3600, "bad2": now + 3600, "bad3": now + 3600})
    run_valid_task(store, make_control(store))  # entries the control cannot read get no work
    assert not dead(store)


def test_silent_node_with_garbage_in_its_crawl_queue(store: Store, raw: redis_lib.Redis) -> None:
    k = store.keys
    raw.zadd(k.node_seen, {"gone": 1})
    raw.hset(k.nodes, "gone", json.dumps(NODE_INFO))
    raw.lpush(k.crawl("gone"), PICKLE, b"not json")
    run_valid_task(store, make_control(store))
    assert len(dead(store)) == 2 and all(e["kind"] == "malformed" for e in dead(store))
    assert not store.redis.exists(k.crawl("gone")) and not store.redis.hexists(k.nodes, "gone")


def test_crawl_queue_garbage_is_moved_to_failed_by_take_then_dead_lettered(store: Store, raw: redis_lib.Redis
                                                                          ) -> None:
    k = store.keys
    raw.lpush(k.crawl("n1"), PICKLE, b'{"v": 1, "id": 5}', b"")
    run_valid_task(store, make_control(store))
    assert len(dead(store)) == 3 and all(e["reason"] for e in dead(store))


def test_corrupt_task_record_does_not_stop_the_report(store: Store, raw: redis_lib.Redis) -> None:
    raw.hset(store.keys.tasks, "998", PICKLE)
    store.redis.lpush(store.keys.sleeping, _report_json())
    run_valid_task(store, make_control(store))
    assert store.redis.hget(store.keys.counters, "corrupt_tasks") == "1"


def test_garbage_estimates_are_ignored(store: Store, raw: redis_lib.Redis) -> None:
    raw.hset(store.keys.est_site("ok.example"), mapping={"n1": PICKLE, "n2": b'{"c": "x", "runs": []}',
                                                         "n3": b'{"c": -5, "spp": -1, "runs": 1, "last": 1}'})
    raw.hset(store.keys.est_group_site(VALID["name"], "ok.example"), "n1", b"[]")
    raw.sadd(store.keys.est_groups, f"{VALID['name']}|ok.example")
    run_valid_task(store, make_control(store, allocation=DynamicAllocation(),
                                        modification=DynamicModification(base_pages=3)))
    assert not dead(store)
    est = EstimateCache(store)
    assert est.completion("ok.example", "n3") is None  # negative: no data, as unreadable
    assert est.seconds_per_page(VALID["name"], "ok.example", "n3") is None


@pytest.mark.parametrize("sums", [
    b'{"n": 1, "pg": NaN, "got": 1, "sec": 1, "last": 1}',  # json.loads reads NaN: a draw from it never ended
    b'{"n": 1, "pg": 5, "got": 3, "sec": -1e9, "last": 1}',
    b'{"n": 1, "pg": 5, "got": 3, "sec": 1, "xp": 1e9, "last": 1}',
    b'{"n": 1, "pg": -5, "got": 3, "sec": 1, "last": 1}',
    b'{"n": 1, "pg": 5, "got": 3, "sec": "Infinity", "last": 1}',
], ids=["nan", "negative seconds", "pace pages above pages", "negative pages", "infinite seconds"])
def test_hostile_numbers_in_estimates_do_not_stop_the_bandit(store: Store, raw: redis_lib.Redis,
                                                             sums: bytes) -> None:
    # Numbers that parse but no finish script writes: each once made the bandit's Thompson draws raise (or loop).
    for node in ("n1", "n2"):
        raw.hset(store.keys.est_site("ok.example"), node, sums)
    raw.hset(store.keys.est_group_site(VALID["name"], "ok.example"), "n1", sums)
    raw.sadd(store.keys.est_groups, f"{VALID['name']}|ok.example")
    run_valid_task(store, make_control(store, allocation=BanditAllocation(seed=0)))
    assert store.redis.hget(store.keys.progress, f"{VALID['name']}|done") == "1" and not dead(store)


@pytest.mark.parametrize("damage", ["text", "fraction", "another type"])
def test_counters_a_hand_edit_broke_start_over_and_stop_nothing(store: Store, raw: redis_lib.Redis,
                                                              damage: str) -> None:
    """Counters hold what scripts increment: the id and token sequence, the pairs' run counters, the products'
    progress, the cluster's and the nodes' counts, the politeness holdings. One that holds no whole number made
    every script that counts there fail: every take and every id (the control's tick), every finish of a pair,
    every politeness sync of a site. Now such a counter starts over (the sequence above any id it gave), and
    status shows the rest."""
    k = store.keys
    given = store.reserve_ids(3)

    def spoil(key: str, field: str | None = None) -> None:
        if damage == "another type":
            raw.delete(key)
            raw.rpush(key, "not a counter")
        elif field is None:
            raw.set(key, {"text": "many", "fraction": "2.5"}[damage])
        else:
            raw.hset(key, field, {"text": "many", "fraction": "2.5"}[damage])

    group, site = VALID["name"], VALID["sites"][0]
    spoil(k.seq)
    spoil(k.agg_site_node(site, "n1"), "runs")
    spoil(k.agg_group_site_node(group, site, "n1"), "pages")
    spoil(k.progress, f"{group}|collected")
    spoil(k.counters, "tasks_done")
    run_valid_task(store, make_control(store))
    assert not dead(store)
    after = store.reserve_ids(3)
    assert int(after[0]) > int(given[-1]) and len(set(after)) == 3  # no id given twice
    assert int(raw.hget(k.agg_site_node(site, "n1"), "runs") or 0) >= 1
    assert int(raw.hget(k.agg_group_site_node(group, site, "n1"), "pages") or 0) >= 1
    assert int(raw.hget(k.progress, f"{group}|collected") or 0) >= 10
    assert int(raw.hget(k.counters, "tasks_done") or 0) >= 1
    if damage != "another type":  # (status reads the hashes it shows as hashes)
        spoil(k.node_counters("n1"), "subtasks_done")
    status = collect_status(store)  # and status reads what it can of a counter still spoiled
    assert status["nodes"] and status["nodes"][0]["counts"]

    # The politeness of a site: a spoiled holding reads as none, a spoiled sum is counted again from the holdings.
    polite = raw.register_script(load_script("polite"))
    slots, seen, bucket = k.polite_slots("s"), k.polite_seen("s"), k.polite_bucket("s")
    assert polite(keys=[slots, seen, bucket], args=["n2", 4, 0, 3, 30, 0, 0, 0]) == [3, 0]
    spoil(slots, "|sum")
    if damage != "another type":
        spoil(slots, "n3")
        raw.zadd(seen, {"n3": 1})  # a lapsed holder: its spoiled holding is given back as none
    assert polite(keys=[slots, seen, bucket], args=["n1", 4, 0, 3, 30, 0, 0, 0])[0] >= 1
    holdings = {f: int(v) for f, v in raw.hgetall(slots).items() if f != b"|sum"}
    assert int(raw.hget(slots, "|sum")) == sum(holdings.values()) <= 4
    assert holdings.get(b"n2", 0) == (0 if damage == "another type" else 3)  # (replacing the key dropped it)


def test_a_stat_a_hand_edit_spoiled_starts_over_and_the_others_count_once(redis: redis_lib.Redis,
                                                                        prefix: str) -> None:
    """A node's stats go in one MULTI of increments, which runs all of them; one whose field held no number failed
    alone, yet made the flush raise, keep every delta and send them all again next time: each flush counted the
    node's other stats once more, forever."""
    from scrapy.utils.test import get_crawler

    from scheduler_ext.stats import RedisStatsCollector

    crawler = get_crawler(settings_dict={"SCHEDEXT_PREFIX": prefix, "SCHEDEXT_NODE_ID": "n1"})
    stats = RedisStatsCollector(crawler, client=redis)
    node = Keys(prefix).stats("node", "n1")
    redis.hset(node, "spoiled", "many")
    for _ in range(3):
        stats.inc_value("pages", 2)
        stats.inc_value("spoiled", 1)
        stats.flush()
    assert redis.hget(node, "pages") == "6" and redis.hget(node, "spoiled") == "3"


# --- plug-ins that fail ---------------------------------------------------------------------------------------


def test_splitter_that_raises_anything_dead_letters_only_its_entry(store: Store) -> None:
    def flaky(raw: str) -> list[dict[str, Any]]:
        if "boom" in raw:
            raise ZeroDivisionError("a bug in the splitter")
        return splitter(raw)

    control = make_control(store)
    control.strategies.splitter = flaky
    store.redis.lpush(store.keys.virtual, json.dumps({"name": "boom", "sites": ["a.com"]}))
    run_valid_task(store, control)
    [entry] = dead(store)
    assert entry["kind"] == "virtual" and entry["reason"] == "ZeroDivisionError: a bug in the splitter"


class PickyAllocation(Allocation):
    """Raises whenever the window holds a subtask of site bad.example; allocates the rest like Shared."""

    def allocate(self, subtasks: Any, nodes: Any, estimates: Any, now: float) -> list[tuple[Subtask, str]]:
        if any(st.site == "bad.example" for st in subtasks):
            raise RuntimeError("cannot place bad.example")
        return SharedAllocation().allocate(subtasks, nodes, estimates, now)


def test_allocation_that_raises_for_one_subtask_does_not_stop_the_others(store: Store) -> None:
    store.redis.lpush(store.keys.virtual, json.dumps({"name": "p", "sites": ["bad.example"]}))
    run_valid_task(store, make_control(store, allocation=PickyAllocation()))
    [entry] = dead(store)
    assert entry["kind"] == "subtask" and "cannot place bad.example" in entry["reason"]
    assert entry["subtask"]["site"] == "bad.example"  # requeueable once the strategy is fixed


class BrokenModification(FixedModification):
    def next_limits(self, report: Any, estimates: Any) -> tuple[int, float]:
        if report.subtask.group == "p":
            raise KeyError("estimates")
        return super().next_limits(report, estimates)


def test_modification_that_raises_dead_letters_the_report_kept_whole(store: Store) -> None:
    store.redis.hset(store.keys.tasks, "998", Task(id="998", site="a.com", group="p").to_json())
    report = _report_json(subtask={**json.loads(_report_json())["subtask"], "group": "p"}, exhausted=False)
    store.redis.lpush(store.keys.sleeping, report)
    run_valid_task(store, make_control(store, modification=BrokenModification(3, 20.0)))
    [entry] = dead(store)
    assert entry["kind"] == "report" and entry["raw"] == report and "KeyError" in entry["reason"]


def test_a_control_that_cannot_tick_says_so_in_status(store: Store) -> None:
    from scheduler_ext.status import collect_status

    class Boom(Exception):
        pass

    control = make_control(store)

    def broken() -> Any:
        raise Boom("every tick")

    ext = extension(control)
    control.tick = broken  # type: ignore[method-assign]
    for _ in range(3):
        assert ext.run_once() is None
    [row] = collect_status(store)["controls"]
    assert row["stuck"] and row["failed_in_row"] == 3 and "Boom: every tick" in row["last_error"]


# --- property tests ----------------------------------------------------------------------------------------------

json_values = hs.recursive(hs.none() | hs.booleans() | hs.integers() | hs.floats(allow_nan=False) | hs.text(),
                           lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(), inner, max_size=4),
                           max_leaves=20)
shapes = hs.one_of(hs.binary(max_size=200).map(lambda b: b.decode("utf-8", "surrogateescape")),
                   json_values.map(json.dumps),
                   hs.dictionaries(hs.sampled_from(["v", "id", "task", "site", "first_page", "page_limit",
                                                    "time_limit", "node", "outcome", "subtask", "priority",
                                                    "avoid", "payload"]), json_values).map(json.dumps))


@given(shapes)
@settings(max_examples=300, deadline=None)
def test_decoders_raise_invalid_input_or_return_a_record(raw: str) -> None:
    for decode in (Subtask.from_json, Report.from_json, Task.from_json):
        try:
            decode(raw)
        except InvalidInput:
            pass


def _strategies() -> Strategies:
    return Strategies(allocation=DynamicAllocation(), modification=DynamicModification(), recall=DynamicRecall(),
                      splitter=splitter)


@given(virtual=hs.lists(shapes, max_size=4), reports=hs.lists(shapes, max_size=4),
       failures=hs.lists(shapes, max_size=4), waiting=hs.lists(shapes, max_size=4),
       nodes=hs.lists(hs.tuples(hs.lists(hs.integers(0, 1), max_size=2), hs.integers(0, 3)), max_size=3))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decide_never_raises_and_every_entry_gets_one_decision(
        virtual: list[str], reports: list[str], failures: list[str], waiting: list[str],
        nodes: list[tuple[list[int], int]]) -> None:
    from test_allocation import Figures

    keys = Keys("{prop}")
    snap = Snapshot(keys=keys, now=1000.0, estimates=Figures(), ids=CountingIds(),
                    virtual=[Entry(keys.virtual, r, len(r)) for r in virtual],
                    reports=[Entry(keys.sleeping, r, len(r)) for r in reports],
                    failures=[Entry(keys.failed, r, len(r)) for r in failures],
                    waiting=[(f"w{i}", r) for i, r in enumerate(waiting)],
                    nodes=[NodeView(id=f"n{i}", types=t or [0], free=f) for i, (t, f) in enumerate(nodes)])
    decisions = decide(snap, _strategies(), 1000.0)
    for lst, entries in ((keys.virtual, virtual), (keys.sleeping, reports), (keys.failed, failures)):
        consumed = [d for d in decisions for g in d.guards if g[0] == "tail_is" and g[1] == lst]
        assert len(consumed) == len(entries)  # each entry: exactly one decision (done, or dead-lettered)
    for d in decisions:
        json.dumps([list(d.guards), list(d.writes)], ensure_ascii=False).encode("utf-8", "surrogateescape")


# --- the same, against a running cluster ---------------------------------------------------------------------------


def test_hostile_entries_pushed_into_a_running_cluster(cluster: Any, redis_url: str) -> None:
    """While real nodes and two controls run: hostile entries into every list they read, then a valid task.
    Each hostile entry is dead-lettered with a reason; the valid task completes with all its items."""
    from conftest import FAST_PROFILE
    from test_cluster import NODES

    from product_crawl.simweb.corpus import corpus_size
    from product_crawl.tasks import keywords_for

    cluster.start_simweb(FAST_PROFILE)
    for node in NODES[:2]:
        cluster.start_node(node)
    for name in ("control-a", "control-b"):
        cluster.start_control(name)
    k = cluster.store.keys
    raw = redis_lib.Redis.from_url(redis_url)
    assert cluster.wait_for(lambda: cluster.redis.get(k.leader) is not None, 30)
    hostile = {k.virtual: [PICKLE, BAD_ENTRIES["json list"], BAD_ENTRIES["unknown engine"]],
               k.sleeping: [PICKLE, _report_json(collected="many").encode()],
               k.failed: [b"\xff\xfe", BAD_ENTRIES["wrong types"]],
               # the last one passes the take script's checks; the node itself must refuse it
               k.crawl("node1"): [PICKLE, b'{"v": 1, "id": 5}',
                                  b'{"v": 1, "id": "x1", "time_limit": 5, "site": "\xff\xfe"}']}
    for key, entries in hostile.items():
        raw.lpush(key, *entries)
    cluster.inject([{"name": "光明高钙牛奶", "sites": ["good.example"]}])
    def done() -> bool:  # (a malformed entry the node finished counts under product "": not a task)
        p = cluster.status()["products"].get("光明高钙牛奶", {})
        return bool(p.get("tasks")) and p.get("done") == p.get("tasks")

    assert cluster.wait_for(done, 90, interval=0.5)
    assert cluster.wait_for(lambda: cluster.redis.hlen(k.dead) == sum(map(len, hostile.values())), 30)
    assert all(json.loads(v)["reason"] for v in cluster.redis.hvals(k.dead))
    assert cluster.items() == corpus_size(keywords_for("光明高钙牛奶"), "good.example", 0, 40, 60)
    assert all(not cluster.redis.llen(key) for key in hostile)


def test_status_and_dead_letter_tools_read_garbage_without_failing(store: Store, raw: redis_lib.Redis) -> None:
    from scheduler_ext import deadletter
    from scheduler_ext.status import collect_status

    k = store.keys
    raw.hset(k.nodes, "n9", PICKLE)
    raw.zadd(k.node_seen, {"n9": 1})
    raw.hset(k.est_site("a.com"), "n9", b"[1]")
    raw.sadd(k.agg_index, "a.com|n9")
    raw.hset(k.controls, "c9", PICKLE)
    raw.hset(k.dead, mapping={"d1": PICKLE, "d2": b'{"id": "d2", "kind": "virtual", "at": "soon"}'})
    status = collect_status(store)
    assert [n["id"] for n in status["nodes"]] == ["n9"] and status["controls"][0]["id"] == "c9"
    entries = {e["id"]: e for e in deadletter.list_entries(store)}
    assert entries["d1"]["kind"] == "unreadable" and "\\x80" in entries["d1"]["raw"]
    with pytest.raises(InvalidInput, match="'d1'"):
        deadletter.requeue(store, "d1")
    deadletter.drop(store, "d1")
    assert not store.redis.hexists(k.dead, "d1")


DEEP = BAD_ENTRIES["deep nesting"]


def test_json_nested_too_deeply_is_garbage_to_every_reader(store: Store, raw: redis_lib.Redis,
                                                           tmp_path: Any) -> None:
    """JSON nested past Python's recursion limit, in Redis or in a file the user names, is a record that is not
    one (skipped, or refused with an error naming the input), never a RecursionError out of a reader."""
    from product_crawl.dashboard.data import DashboardData
    from product_crawl.simweb.profile import ProfileError, load_profile
    from product_crawl.tasks import parse_virtual_task
    from scheduler_ext import deadletter
    from scheduler_ext.history import History
    from scheduler_ext.store import lease_node

    k = store.keys
    raw.hset(k.tasks, "t9", DEEP)
    raw.xadd(k.runs, {"report": DEEP})
    raw.lpush(k.audit, DEEP)
    raw.rpush(k.history, DEEP)
    data = DashboardData(store, History(store))
    assert data.products("p")["tasks"] == [] and data.deadletters()["failures"] == []
    assert deadletter.list_audit(store) == [] and History(store).read() == []
    assert lease_node(DEEP) is None and lease_node(b'{"node": "n1"}') == "n1" and lease_node(b"[1]") is None
    with pytest.raises(InvalidInput, match="nested too deeply"):
        parse_virtual_task(DEEP.decode())
    profile = tmp_path / "deep.json"
    profile.write_bytes(DEEP)
    with pytest.raises(ProfileError, match="deep.json.*nested too deeply"):
        load_profile(str(profile))
    from lxml import etree

    from product_crawl.engines.baidu import _json_attr
    from product_crawl.experiment.runner import parse_overrides

    block = etree.fromstring('<div data-tools="' + DEEP.decode()[:5000] + '"/>')  # past the limit, as a page can
    assert _json_attr(block, "@data-tools") == {}
    assert parse_overrides(["SCHEDEXT_PREFETCH=" + DEEP.decode()]) == {"SCHEDEXT_PREFETCH": DEEP.decode()}


# --- readers of shared state: status, history, dashboard, commands, stats, politeness ------------------------------


def test_status_reads_numbers_past_any_float_and_names_that_do_not_split(store: Store, raw: redis_lib.Redis
                                                                        ) -> None:
    """A control's figures of 1e999 / -Infinity read as none; a pair, triple or progress field that does not
    split as its key's schema says counts nothing. Neither stops status, its rendering or the history sample."""
    from product_crawl.commands.status import render
    from product_crawl.dashboard.data import DashboardData
    from scheduler_ext.history import History

    k = store.keys
    raw.hset(k.controls, mapping={"c1": b'{"failed_in_row": 1e999, "alarm": 3, "at": 1e999}',
                                  "c2": b'{"failed_in_row": 2, "alarm": -Infinity, "ok_at": NaN}'})
    raw.sadd(k.agg_index, "no-pipe", "a.com|n1")
    raw.sadd(k.agg_triples, "one|pipe", "no-pipe", "p|a.com|n1")
    raw.hset(k.progress, mapping={"no-pipe": 5, PICKLE: 1, "p|tasks": 2})
    raw.hset(k.nodes, "n1", json.dumps({"type": 5, "address": ["x"], "subtasks": [1, None]}))
    status = collect_status(store)
    c1, c2 = status["controls"]
    assert (c1["failed_in_row"], c1["stuck"], c1["at"]) == (0, False, None)
    assert (c2["failed_in_row"], c2["stuck"], c2["ok_at"]) == (2, False, None)
    assert list(status["completion"]) == ["a.com"] and [n["id"] for n in status["nodes"]] == ["n1"]
    assert status["seconds_per_page"] == {"p": {"a.com": {"n1": None}}}
    assert status["products"] == {"p": {"tasks": 2, "done": 0, "collected": 0, "pages": 0}}
    json.dumps(status, allow_nan=False)  # nothing non-finite reaches the JSON contract
    assert any(line.startswith("n1 ") for line in render(status))
    assert DashboardData(store, History(store)).sample() is True


def test_text_that_is_not_utf8_reaches_every_output_readable(store: Store, raw: redis_lib.Redis,
                                                             scrapy_env: dict[str, str]) -> None:
    """Bytes that are not UTF-8 inside valid JSON or a member name (they arrive as lone surrogates) are shown
    escaped by the dashboard's API and the commands; requeuing such a dead letter writes an audit record that is
    valid UTF-8."""
    from conftest import run_scrapy
    from twisted.web.test.requesthelper import DummyRequest

    from product_crawl.dashboard.data import DashboardData
    from product_crawl.dashboard.server import _json
    from scheduler_ext import deadletter
    from scheduler_ext.history import History

    k = store.keys
    raw.sadd(k.agg_index, b"\xff.example|n1")
    raw.hset(k.nodes, "n1", b'{"type": [0], "host": "h\xff"}')
    raw.zadd(k.node_seen, {"n1": 1})
    raw.hset(k.progress, b"\xfe|tasks", 1)
    raw.xadd(k.runs, {"report": b'{"subtask": {"group": "p", "site": "a.com"}, "outcome": "failed", '
                                b'"node": "\xff"}'})
    raw.hset(k.dead, "d1", b'{"id": "d1", "kind": "virtual", "at": 1, "raw": "\xff\xfe", "reason": "r\xff"}')
    raw.hset(k.dead, "d2", b'{"id": "d2", "kind": ["virtual"], "at": 2}')  # (a kind that is no text, listed too)
    data = DashboardData(store, History(store))
    for body in (data.status(), data.products("p"), data.deadletters()):
        served = json.loads(_json(DummyRequest([b"api"]), 200, body))
        assert "\udcff" in json.dumps(served, ensure_ascii=False)  # escaped on the wire, as read once parsed
    opts = ["-s", f"SCHEDEXT_PREFIX={k.prefix}"]
    for args in (["status", "--json"], ["status"], ["deadletter", "list"], ["deadletter", "list", "--json"]):
        result = run_scrapy([*args, *opts], scrapy_env)
        assert result.returncode == 0 and "\\udcff" in result.stdout, (args, result.stderr)

    assert deadletter.requeue(store, "d1", "tester") == "virtual"
    assert raw.lindex(k.virtual, 0) == b"\xff\xfe"  # requeued as it came
    record = json.loads(raw.lindex(k.audit, 0).decode("utf-8"))  # the audit record is UTF-8
    assert record["entry"]["raw"] == "\\xff\\xfe"
    served = json.loads(_json(DummyRequest([b"api"]), 200, data.deadletters()))
    assert served["audit"][0]["id"] == "d1"


def test_numbers_past_any_float_reach_the_dashboard_as_json_a_browser_reads(store: Store,
                                                                            raw: redis_lib.Redis) -> None:
    """A dead letter or a run written by hand with 1e999 or NaN is served as null: Python would write Infinity
    and NaN, which a browser's JSON.parse refuses (and the page with it)."""
    from twisted.web.test.requesthelper import DummyRequest

    from product_crawl.dashboard.data import DashboardData
    from product_crawl.dashboard.server import _json
    from scheduler_ext.history import History

    k = store.keys
    raw.hset(k.dead, "d1", b'{"id": "d1", "kind": "virtual", "at": 1e999, "attempts": NaN, "raw": "x"}')
    raw.xadd(k.runs, {"report": b'{"subtask": {"group": "p", "site": "a.com", "time_limit": 1e999}, '
                                b'"outcome": "failed", "node": "n1", "offered": -1e999}'})

    def strict(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON")

    data = DashboardData(store, History(store))
    for body in (data.products("p"), data.deadletters()):
        json.loads(_json(DummyRequest([b"api"]), 200, body), parse_constant=strict)
    served = json.loads(_json(DummyRequest([b"api"]), 200, data.deadletters()))
    assert served["entries"][0]["at"] is None and served["failures"][0]["offered"] is None


def test_numbers_past_any_float_reach_status_and_deadletter_json_as_null(store: Store, raw: redis_lib.Redis,
                                                                         scrapy_env: dict[str, str]) -> None:
    """A node registry entry or a dead letter written by hand with 1e999 or NaN: ``scrapy status --json`` and
    ``scrapy deadletter list --json`` write null, as the dashboard does; Python would write Infinity and NaN, which
    jq and browsers refuse."""
    from conftest import run_scrapy

    k = store.keys
    raw.hset(k.nodes, "n1", b'{"type": [0], "pid": 1e999, "host": NaN, "subtasks": [-1e999]}')
    raw.zadd(k.node_seen, {"n1": 1})
    raw.hset(k.dead, "d1", b'{"id": "d1", "kind": "virtual", "at": 1e999, "attempts": NaN, "raw": "x"}')

    def strict(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON")

    opts = ["-s", f"SCHEDEXT_PREFIX={k.prefix}"]
    done = run_scrapy(["status", "--json", *opts], scrapy_env)
    assert done.returncode == 0, done.stderr
    [node] = json.loads(done.stdout, parse_constant=strict)["nodes"]
    assert (node["pid"], node["host"], node["subtasks"]) == (None, None, [None])
    done = run_scrapy(["deadletter", "list", "--json", *opts], scrapy_env)
    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout, parse_constant=strict)
    assert (entry["id"], entry["at"], entry["attempts"]) == ("d1", None, None)


@pytest.mark.parametrize("t", [b'"soon"', b"[1]", b"null", b"true", b"1e999"])
def test_history_sample_whose_time_is_no_number_is_skipped(store: Store, raw: redis_lib.Redis, t: bytes) -> None:
    from scheduler_ext.history import History

    raw.rpush(store.keys.history, b'{"v": 1, "t": 1.0}', b'{"v": 1, "t": ' + t + b"}", b'{"v": 1, "t": 3.0}')
    history = History(store)
    assert [s["t"] for s in history.read(since=0.5)] == [1.0, 3.0]
    assert [s["t"] for s in history.read()] == [1.0, 3.0]


@pytest.mark.parametrize("slot", ["no expiry", "a hash"])
def test_history_slot_set_by_hand_does_not_stop_the_sampling(store: Store, raw: redis_lib.Redis,
                                                             slot: str) -> None:
    from scheduler_ext.history import History

    k = store.keys
    if slot == "no expiry":
        raw.set(k.history_slot, b"1")
    else:
        raw.hset(k.history_slot, "f", "v")
    history = History(store, interval=60)
    assert history.record(collect_status(store)) is True
    assert history.record(collect_status(store)) is False  # the slot it took is an ordinary one again
    assert 0 < store.redis.pttl(k.history_slot) <= 60_000 and len(history.read()) == 1


@pytest.mark.parametrize("scope", ["node", "site"])
def test_a_stats_key_of_another_type_is_replaced_and_counts_from_there(redis: redis_lib.Redis, prefix: str,
                                                                      scope: str) -> None:
    from scrapy.utils.test import get_crawler

    from scheduler_ext.stats import RedisStatsCollector

    crawler = get_crawler(settings_dict={"SCHEDEXT_PREFIX": prefix, "SCHEDEXT_NODE_ID": "n1"})
    stats = RedisStatsCollector(crawler, client=redis)
    key = Keys(prefix).stats(scope, "n1" if scope == "node" else "a.com")
    redis.set(key, "x")
    for _ in range(3):
        stats.inc_value("site/a.com/pages", 2)
        stats.inc_value("site/a.com/seconds", 0.5)
        stats.flush()
    field = "site/a.com/pages" if scope == "node" else "pages"
    assert redis.type(key) == "hash" and redis.hget(key, field) == "6"
    assert float(redis.hget(key, field.replace("pages", "seconds"))) == 1.5


@pytest.mark.parametrize("spoiled", ["seen", "bucket"])
def test_politeness_keys_of_another_type_are_replaced(store: Store, raw: redis_lib.Redis, spoiled: str) -> None:
    """polite:seen and polite:bucket of another type, like polite:slots, are replaced rather than failing every
    sync of every node for the site."""
    k = store.keys
    polite = raw.register_script(load_script("polite"))
    keys = [k.polite_slots("s"), k.polite_seen("s"), k.polite_bucket("s")]
    raw.hset(keys[0], mapping={"n2": 3, "|sum": 3})
    raw.set(keys[1] if spoiled == "seen" else keys[2], b"x")
    assert polite(keys=keys, args=["n1", 4, 0, 3, 30, 5, 5, 3]) == [(3 if spoiled == "seen" else 1), 3]
    assert raw.type(keys[1]) == b"zset" and raw.type(keys[2]) == b"hash"
    assert int(raw.hget(keys[0], "|sum")) == sum(int(v) for f, v in raw.hgetall(keys[0]).items() if f != b"|sum")


# --- numbers past any float, and keys set by hand, in the scripts' own state ----------------------------------------


def test_subtask_numbers_must_be_finite() -> None:
    good = {"id": "s1", "task": "t", "site": "a.com", "first_page": 0, "page_limit": 1, "time_limit": 5}
    assert Subtask.from_dict(good).time_limit == 5.0
    for name, value in (("time_limit", float("inf")), ("time_limit", float("nan")), ("priority", float("nan")),
                        ("priority", float("-inf")), ("since", float("inf"))):
        with pytest.raises(InvalidInput, match=name):
            Subtask.from_dict({**good, name: value})


def test_time_limit_past_any_float_is_malformed_before_take_writes(store: Store, raw: redis_lib.Redis) -> None:
    """cjson reads 1e999 as infinity and then cannot write the lease's hard deadline: the take script failed after
    its RPOP and ZADD, and the entry vanished (no lease info, no failure, no dead letter). In the crawl queue it is
    now a malformed entry; as a waiting record the control dead-letters it and never allocates it."""
    k = store.keys
    entry = b'{"v":1,"id":"cx","task":"t","site":"a.com","first_page":0,"page_limit":1,"time_limit":1e999}'
    raw.lpush(k.crawl("n1"), entry)
    raw.zadd(k.queued, {"cx": store.now()})
    assert store.take("n1", lease_ttl=30, grace=5) is None
    [failure] = [json.loads(v) for v in store.redis.lrange(k.failed, 0, -1)]
    assert failure["malformed"] and failure["id"] == "cx" and "time_limit" in failure["reason"]
    assert not store.redis.exists(k.leases, k.lease_info, k.queued)
    raw.zadd(k.waiting, {"w1": 0})
    raw.hset(k.subtasks, "w1", entry.replace(b'"cx"', b'"w1"'))
    run_valid_task(store, make_control(store))
    assert sorted((e["id"], e["kind"]) for e in dead(store)) == [("cx", "malformed"), ("w1", "waiting")]


@pytest.mark.parametrize("case", ["NaN in an unknown field", "infinity in an unknown field", "another type"])
def test_estimate_entry_the_finish_script_cannot_write_back_stops_nothing(
        store: Store, raw: redis_lib.Redis, case: str) -> None:
    """An entry with NaN or 1e999 in a field the finish script did not check made its cjson.encode fail after the
    report was pushed: the pair's estimates froze and the counters, indexes and dirty marks were skipped. The
    entry is now rebuilt from the fields the script knows, before its first write."""
    k = store.keys
    group, site = VALID["name"], VALID["sites"][0]
    site_key, group_key = k.est_site(site), k.est_group_site(group, site)
    if case == "another type":
        raw.rpush(site_key, b"not a hash")
        raw.set(group_key, b"not a hash")
    else:
        number = b"NaN" if case.startswith("NaN") else b"1e999"
        raw.hset(site_key, "n1", b'{"c":0.5,"spp":1,"runs":1,"last":1,"zz":' + number + b"}")
        raw.hset(group_key, "n1", b'{"spp":1,"runs":1,"last":1,"zz":' + number + b',"colour":"red"}')
    run_valid_task(store, make_control(store))
    runs = 1 if case == "another type" else 2
    for key in (site_key, group_key):
        entry = json.loads(store.redis.hget(key, "n1"))
        assert entry["runs"] == runs and not {"zz", "colour"} & set(entry), entry
    completion = 1.0 if runs == 1 else 0.5 + 0.3 * (1.0 - 0.5)  # the known fields kept: c moved from 0.5
    assert json.loads(store.redis.hget(site_key, "n1"))["c"] == pytest.approx(completion)
    assert int(store.redis.hget(k.progress, f"{group}|collected")) == 10
    assert store.redis.smembers(k.agg_index) == {f"{site}|n1"}
    assert store.redis.sismember(k.est_groups, f"{group}|{site}")


def test_a_run_log_or_report_list_of_another_type_loses_no_report(store: Store, raw: redis_lib.Redis) -> None:
    """The finish script's XADD to ``runs`` or LPUSH to ``sleeping`` failed on a key of another type (set by hand)
    after the lease was gone: the report was lost and the node's retry counted a stale finish. Such a key is now
    replaced before the first write, and the task completes."""
    k = store.keys
    raw.set(k.runs, b"not a stream")  # (sleeping of another type stops the control's reads: status says so)
    run_valid_task(store, make_control(store))
    assert raw.type(k.runs) == b"stream" and store.redis.xlen(k.runs) >= 1


@pytest.mark.parametrize("kind", ["string with no expiry", "hash"])
def test_leader_key_set_by_hand_is_taken_over(store: Store, raw: redis_lib.Redis, kind: str) -> None:
    """A leader key SET by hand with no TTL never lapsed (and one of another type made the lead script fail): no
    control ever led, and nothing moved. A lease set by a control is still honoured."""
    k = store.keys
    if kind == "hash":
        raw.hset(k.leader, "id", "ghost")
    else:
        raw.set(k.leader, "ghost")
    run_valid_task(store, make_control(store))
    assert store.redis.get(k.leader) == "c1" and 0 < store.redis.pttl(k.leader) <= 5000
    raw.set(k.leader, "other", px=5000)
    assert not store.lead("c1", 5)
    assert store.redis.get(k.leader) == "other"


@pytest.mark.parametrize("deadline", ["+inf", "1e300", "a day ahead"])
def test_lease_deadline_past_any_time_lapses(store: Store, raw: redis_lib.Redis, deadline: str) -> None:
    """No script writes a deadline further ahead than SCHEDEXT_LEASE_TTL from the Redis time it writes it at (take.lua,
    heartbeat.lua); one of +inf set by hand never lapsed and held its subtask for ever, and neither did a finite one
    far ahead (1e300, a day). Past LEASE_HORIZON lease TTLs ahead it is now lapsed, whatever lease stands behind
    it; a deadline a clock gone back a little could have left (two TTLs ahead) still holds its lease."""
    k = store.keys
    now = store.now()
    for sid in ("L1", "L2", "L4"):
        raw.hset(k.subtasks, sid, Subtask(id=sid, task="t", site="a.com", first_page=0, page_limit=1,
                                          time_limit=5.0).to_json())
    raw.hset(k.lease_info, "L1", json.dumps({"token": "dead:1", "node": "dead", "started": 1, "hard": 1e308}))
    raw.hset(k.lease_info, "L2", b"[1]")  # unreadable lease, readable record: recalled
    raw.hset(k.lease_info, "L4", json.dumps({"token": "slow:1", "node": "slow", "started": now, "hard": now + 90}))
    far = {"+inf": float("inf"), "1e300": 1e300, "a day ahead": now + 86_400}[deadline]
    raw.zadd(k.leases, {"L1": far, "L2": far, "L3": far})  # L3: nothing behind it
    raw.zadd(k.leases, {"L4": now + 2 * 30})  # make_control's lease TTL: its recall age, 30 s
    run_valid_task(store, make_control(store))
    assert store.redis.zrange(k.leases, 0, -1) == store.redis.hkeys(k.lease_info) == ["L4"] and not dead(store)
    assert store.redis.hget(k.node_counters("dead"), "recalled") == "1"
    runs = [json.loads(r[1]["report"])["subtask"] for r in store.redis.xrange(k.runs)]
    assert sorted(r["id"] for r in runs if r["id"] in ("L1", "L2")) == ["L1", "L2"]


def test_crawl_entry_with_priority_nan_is_released_not_lost(store: Store, raw: redis_lib.Redis) -> None:
    """cjson reads NaN, which ZADD refuses: the release script failed after popping the node's crawl queue, and
    the entries it had popped were lost. It now waits at score 0, for the control to dead-letter its record."""
    k = store.keys
    good = Subtask(id="r1", task="t", site="a.com", first_page=0, page_limit=1, time_limit=5.0).to_json()
    raw.lpush(k.crawl("n1"), b'{"v":1,"id":"r0","task":"t","site":"a.com","first_page":0,"page_limit":1,'
                             b'"time_limit":5,"priority":NaN}', good)
    assert store.release("n1", [], deregister=True) == 2
    assert store.redis.zrange(k.waiting, 0, -1, withscores=True) == [("r0", 0.0), ("r1", 0.0)]
    run_valid_task(store, make_control(store))
    assert [(e["id"], e["kind"]) for e in dead(store)] == [("r0", "waiting")]


def test_a_heartbeat_far_in_the_future_is_a_lapsed_node(store: Store, raw: redis_lib.Redis) -> None:
    """A heartbeat is written at the Redis time (heartbeat.lua): one of 1e308, or a day ahead, kept a ghost node
    alive for ever, and the control gave it work that nobody took. One further ahead than the node timeout (the
    clock skew allowed) is now a lapsed heartbeat: the node is silent, its crawl queue is recalled, its entry goes,
    and status shows it dead. One a little ahead (a clock gone back less than that) is still alive."""
    k = store.keys
    now = store.now()
    raw.hset(k.nodes, mapping={"ghost": json.dumps(NODE_INFO), "ahead": json.dumps(NODE_INFO),
                               "near": json.dumps({**NODE_INFO, "type": [5]})})  # (a type no subtask has)
    raw.zadd(k.node_seen, {"ghost": 1e308, "ahead": now + 86_400, "near": now + 10})
    queued = Subtask(id="g1", task="tg", site="ok.example", first_page=0, page_limit=1, time_limit=5.0, node="ghost")
    raw.lpush(k.crawl("ghost"), queued.to_json())
    raw.zadd(k.queued, {"g1": now})
    alive = {n["id"]: n["alive"] for n in collect_status(store, node_timeout=30)["nodes"]}
    assert alive == {"ghost": False, "ahead": False, "near": True}
    run_valid_task(store, make_control(store))  # (its node timeout: 30 s)
    assert set(store.redis.hkeys(k.nodes)) == set(store.redis.zrange(k.node_seen, 0, -1)) == {"n1", "near"}
    assert not store.redis.exists(k.crawl("ghost"))
    runs = [json.loads(r[1]["report"])["subtask"] for r in store.redis.xrange(k.runs)]
    assert [r["node"] for r in runs if r["id"] == "g1"] == ["n1"]  # recalled from the ghost, run by a live node


def test_resign_leaves_a_leader_key_of_another_type_alone(store: Store, raw: redis_lib.Redis) -> None:
    """resign.lua read the leader key with GET, which fails on a key of another type (a hash set by hand): a
    control's clean stop raised. Such a key holds no lease of ours: resign leaves it, and the next lead takes it
    over (lead.lua)."""
    k = store.keys
    control = make_control(store)
    assert control.tick().leader
    raw.delete(k.leader)
    raw.hset(k.leader, "id", "c1")
    control.resign()
    assert raw.type(k.leader) == b"hash" and not control.is_leader
    assert store.resign("c1") is False and raw.hget(k.leader, "id") == b"c1"
    assert store.lead("c1", 5) and store.redis.get(k.leader) == "c1"


# --- keys of another type than the schema gives them -------------------------------------------------------------

#: A key of each kind a control tick or a node uses, and the type a hand edit gave it instead (docs/redis-keys.md).
SPOILED = {"sleeping": "string", "waiting": "hash", "tasks": "string", "subtasks": "list", "leases": "hash",
           "lease_info": "string", "queued": "string", "failed": "hash", "virtual": "string", "dead": "list",
           "nodes": "string", "node_seen": "hash", "crawl:n1": "string", "est:site:ok.example": "string"}
#: The keys that held the first task's state when the hand edit overwrote them: that task cannot end in the ticks
#: of the test (`tasks`: never; `crawl:n1`: once its entry is stale, test_a_crawl_queue_entry_lost_by_hand_...).
HELD = {"tasks", "crawl:n1"}


def spoil(raw: redis_lib.Redis, key: str, kind: str) -> None:
    """What a person does by hand: a value of type ``kind`` at ``key`` (what was there is gone)."""
    raw.delete(key)
    {"string": lambda: raw.set(key, b"x"), "hash": lambda: raw.hset(key, "x", b"x"),
     "list": lambda: raw.rpush(key, b"x")}[kind]()


@pytest.mark.parametrize("name", sorted(SPOILED))
def test_a_key_of_another_type_is_set_aside_and_the_work_goes_on(store: Store, raw: redis_lib.Redis, name: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A hand SET on one key of the deployment, or on a node's crawl queue, failed every control tick (or every
    take, heartbeat or finish of the nodes) with WRONGTYPE until a person deleted it. The first call that fails so
    now sets the key aside, kept under ``garbage:<name>:<Redis time>`` with what it held, counted and logged; the
    tick after it runs. The work goes on: a task split before the hand edit (unless the edit overwrote its state)
    and one injected after it end, and a bad entry pushed meanwhile is dead-lettered, not lost."""
    k = store.keys
    key, kind = f"{k.prefix}:{name}", SPOILED[name]
    ext = extension(make_control(store, allocation=DynamicAllocation()))
    store.heartbeat("n1", NODE_INFO, 30, [])
    # (on a site of its own: the control reads ok.example's estimates, the valid task's, first after the edit)
    store.redis.lpush(k.virtual, json.dumps({"name": "before", "sites": ["early.example"]}))
    first = ext.run_once()
    assert first is not None and first.split == 1 and first.allocated == 1
    spoil(raw, key, kind)
    ticks: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="scheduler_ext.store"):
        store.heartbeat("n1", NODE_INFO, 30, [])
        ticks.append(ext.run_once())
        raw.lpush(k.virtual, PICKLE)  # a dead letter to write (into `dead`, where that is the key)
        run_valid_task(store, ext.control, tick=lambda: ticks.append(ext.run_once()))
    [aside] = store.redis.scan_iter(match=f"{k.prefix}:garbage:{name}:*")
    kept = {"string": lambda: raw.get(aside), "hash": lambda: raw.hget(aside, "x"),
            "list": lambda: raw.lindex(aside, 0)}[kind]()
    assert raw.type(aside) == kind.encode() and kept == b"x"
    assert GARBAGE_KEPT - 60 < raw.ttl(aside) <= GARBAGE_KEPT  # kept a week, not for ever
    assert store.redis.type(key) in ("none", k.expected_type(key))
    assert store.redis.hget(k.counters, "garbage_keys") == "1"
    assert f"{key} was a {kind} where a {k.expected_type(key)} belongs" in caplog.text
    assert ticks.count(None) <= 1  # at most the tick that met the key failed: every tick after it ran
    [entry] = dead(store)
    assert entry["kind"] == "virtual" and "UTF-8" in entry["reason"]
    if name not in HELD:
        assert store.redis.hget(k.progress, "before|done") == "1"


@pytest.mark.parametrize("op, name", [("take", "leases"), ("take", "crawl:n1"), ("finish", "subtasks"),
                                      ("finish", "sleeping"), ("release", "waiting")])
def test_a_node_operation_that_meets_a_key_of_another_type_sets_it_aside_and_loses_nothing(
        store: Store, raw: redis_lib.Redis, op: str, name: str) -> None:
    """Redis keeps what a script wrote before it failed: a take that met a ``leases`` of another type had popped
    its entry, a finish that met a ``subtasks`` of another type had removed the lease (its report was lost), a
    release that met a ``waiting`` of another type had popped the crawl queue. Each script now checks its keys'
    types before its first write; the node's call sets the wrong ones aside and runs again."""
    k = store.keys
    key = f"{k.prefix}:{name}"
    st = Subtask(id="s1", task="t", site="a.com", first_page=0, page_limit=1, time_limit=5.0, node="n1")
    raw.lpush(k.crawl("n1"), st.to_json())
    if op == "finish":
        _, token, started = store.take("n1", lease_ttl=30, grace=5) or ("", "", 0.0)
    spoil(raw, key, "string")
    if op == "take":
        got = store.take("n1", lease_ttl=30, grace=5)
        assert (got and got[0]) == (None if name == "crawl:n1" else st.to_json())  # (a crawl queue SET is gone)
        assert name == "crawl:n1" or store.redis.zscore(k.leases, "s1") is not None
    elif op == "finish":
        report = Report(subtask=st, node="n1", outcome="done", pages=1, next_page=1, started=started, ended=started)
        assert store.finish("s1", token, report.to_json(), node="n1", site="a.com", group="", offered=0, collected=0,
                            pages=1, seconds=1.0, ok=True, alpha=0.3, runs_maxlen=100)
        assert store.redis.lrange(k.sleeping, 0, -1) == [report.to_json()] and not store.redis.zcard(k.leases)
    else:
        assert store.release("n1", [], deregister=True) == 1
        assert store.redis.zrange(k.waiting, 0, -1) == ["s1"] and store.redis.hexists(k.subtasks, "s1")
    [aside] = store.redis.scan_iter(match=f"{k.prefix}:garbage:{name}:*")
    assert raw.get(aside) == b"x" and store.redis.hget(k.counters, "garbage_keys") == "1"


@pytest.mark.parametrize("how", ["deleted", "set aside"])
def test_a_crawl_queue_entry_lost_by_hand_is_recalled_once_stale(store: Store, raw: redis_lib.Redis,
                                                                  how: str) -> None:
    """An entry gone from its crawl queue without being taken (a hand ``DEL``; a crawl queue a hand ``SET`` made a
    string, set aside by the node's next take) left its subtask queued and its task open for ever: the stale
    recall's guard wanted the entry in the list. It is recalled once stale, like an entry nobody took, and the task
    ends. A take removes the queued entry in the same step, so an entry that was taken is never recalled so."""
    k = store.keys
    control = make_control(store, allocation=DynamicAllocation())
    lost = {"name": "lost", "sites": ["lost.example"]}
    store.heartbeat("n1", NODE_INFO, 30, [])
    store.redis.lpush(k.virtual, json.dumps(lost))
    control.tick()
    [sid] = store.redis.zrange(k.queued, 0, -1)
    if how == "deleted":
        raw.delete(k.crawl("n1"))
    else:
        spoil(raw, k.crawl("n1"), "string")
        assert store.take("n1", lease_ttl=30, grace=5) is None  # sets the string aside; the queue is empty
    control.tick()
    assert store.redis.zscore(k.queued, sid) is not None  # not stale yet: left alone
    store.redis.zadd(k.queued, {sid: 1.0})  # queued long ago
    run_valid_task(store, control, node="n2", name="lost")  # (a recalled subtask avoids the node it was on)
    assert store.redis.zcard(k.queued) == 0 and store.redis.hlen(k.subtasks) == 0


def test_a_queue_time_far_in_the_future_is_stale(store: Store) -> None:
    """A ``queued`` score the control never writes (1e300 by hand, a Redis clock gone back) never came due: a node
    that never took its entry held the subtask, and its task, for ever. Like a lease deadline or a heartbeat that
    far ahead, it counts as stale."""
    k = store.keys
    control = make_control(store, allocation=DynamicAllocation())
    store.heartbeat("n1", NODE_INFO, 30, [])
    store.redis.lpush(k.virtual, json.dumps({"name": "ahead", "sites": ["ahead.example"]}))
    control.tick()
    [sid] = store.redis.zrange(k.queued, 0, -1)
    store.redis.zadd(k.queued, {sid: 1e300})  # n1 stays alive and never takes it
    run_valid_task(store, control, node="n2", name="ahead")
