"""Tests of scheduler_ext.deadletter (list, requeue, drop) and scheduler_ext.status, against a real Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis as redis_lib
from test_control import NODE_INFO, finish_at, make_control, take  # noqa: I001  (tests/ is on the path)

from scheduler_ext import deadletter
from scheduler_ext.deadletter import UnknownEntry
from scheduler_ext.exceptions import InvalidInput
from scheduler_ext.keys import Keys
from scheduler_ext.models import Report, Subtask, Task
from scheduler_ext.status import NODE_COUNTS, collect_status
from scheduler_ext.store import Guard, Store
from scheduler_ext.strategies.recall import DynamicRecall


@pytest.fixture
def store(redis: redis_lib.Redis, prefix: str) -> Store:
    return Store(redis, Keys(prefix))


def sub(sid: str = "s1", **over: Any) -> Subtask:
    fields: dict[str, Any] = dict(
        id=sid,
        task="t1",
        site="a.com",
        first_page=10,
        page_limit=5,
        time_limit=30.0,
        group="milk",
        priority=9.0,
        attempt=4,
        avoid=["n1"],
        prev_node="n1",
        node="n1",
        since=5.0,
        payload={"q": "x"},
    )
    fields.update(over)
    return Subtask(**fields)


def add(store: Store, entry_id: str, **entry: Any) -> None:
    store.redis.hset(store.keys.dead, entry_id, json.dumps({"id": entry_id, **entry}))


def _subtask_entry(store: Store, entry_id: str = "s1", at: float = 100.0) -> None:
    add(
        store,
        entry_id,
        kind="subtask",
        reason="recalled 5 times: blocked",
        attempts=5,
        last_node="n1",
        at=at,
        subtask=json.loads(sub(entry_id).to_json()),
    )


# --- dead letter --------------------------------------------------------------------------------------------


def test_list_entries_sorted_by_time_then_id(store: Store) -> None:
    assert deadletter.list_entries(store) == []
    _subtask_entry(store, "m-sub", at=200.0)
    add(store, "z-virtual", kind="virtual", raw="{}", at=100.0)
    add(store, "a-malformed", kind="malformed", raw="xx", at=100.0)
    add(store, "b-undated", kind="report", raw="yy")
    entries = deadletter.list_entries(store)
    assert [e["id"] for e in entries] == ["b-undated", "a-malformed", "z-virtual", "m-sub"]
    assert entries[3]["subtask"]["id"] == "m-sub" and entries[3]["reason"].startswith("recalled")


def test_requeue_a_subtask(store: Store) -> None:
    k = store.keys
    _subtask_entry(store, "s1")
    assert deadletter.requeue(store, "s1") == "waiting"
    assert store.redis.zscore(k.waiting, "s1") == 9.0
    fresh = Subtask.from_json(store.redis.hget(k.subtasks, "s1"))
    assert (fresh.attempt, fresh.avoid, fresh.node) == (0, [], None)
    assert fresh.since == pytest.approx(store.now(), abs=5)
    assert (fresh.task, fresh.site, fresh.first_page, fresh.page_limit, fresh.payload) == (
        "t1",
        "a.com",
        10,
        5,
        {"q": "x"},
    )
    assert not store.redis.hexists(k.dead, "s1")
    assert store.redis.hget(k.counters, "requeued") == "1"
    with pytest.raises(UnknownEntry, match="'s1'"):
        deadletter.requeue(store, "s1")  # once only


def test_requeue_a_virtual_task(store: Store) -> None:
    k = store.keys
    raw = json.dumps({"name": "光明高钙牛奶", "sites": 5}, ensure_ascii=False)
    add(store, "v1", kind="virtual", reason="field 'sites': expected a list", raw=raw, attempts=0, at=1.0)
    assert deadletter.requeue(store, "v1") == "virtual"
    assert store.redis.lrange(k.virtual, 0, -1) == [raw]
    assert not store.redis.hexists(k.dead, "v1")
    assert not store.redis.exists(k.waiting)


@pytest.mark.parametrize(
    "entry",
    [
        {"kind": "malformed", "raw": "\\x80\\x04"},
        {"kind": "report", "raw": "{}"},
        {"kind": "lease"},
        {"kind": "virtual"},
    ],
)
def test_requeue_refuses_an_entry_without_subtask_or_virtual_task(
    store: Store, entry: dict[str, Any]
) -> None:
    add(store, "e1", reason="x", at=1.0, **entry)
    with pytest.raises(InvalidInput, match="'e1'.*no subtask or virtual") as info:
        deadletter.requeue(store, "e1")
    assert not isinstance(info.value, UnknownEntry)
    assert store.redis.hexists(store.keys.dead, "e1")
    assert not store.redis.exists(store.keys.waiting) and not store.redis.exists(store.keys.virtual)


def test_requeue_refuses_an_invalid_subtask(store: Store) -> None:
    add(store, "s1", kind="subtask", at=1.0, subtask={**json.loads(sub().to_json()), "page_limit": 0})
    with pytest.raises(InvalidInput, match="dead-letter entry s1: field 'page_limit'"):
        deadletter.requeue(store, "s1")
    assert store.redis.hexists(store.keys.dead, "s1") and not store.redis.exists(store.keys.waiting)


@pytest.mark.parametrize("action", [deadletter.requeue, deadletter.drop])
def test_unknown_entry_is_named(store: Store, action: Any) -> None:
    _subtask_entry(store, "s1")
    with pytest.raises(UnknownEntry, match="'nope'"):
        action(store, "nope")
    assert store.redis.hexists(store.keys.dead, "s1")


def test_drop(store: Store) -> None:
    k = store.keys
    _subtask_entry(store, "s1")
    add(store, "m1", kind="malformed", raw="xx", at=1.0)
    deadletter.drop(store, "m1")
    assert store.redis.hkeys(k.dead) == ["s1"]
    assert store.redis.hget(k.counters, "dropped") == "1"
    assert not store.redis.exists(k.waiting)
    with pytest.raises(UnknownEntry, match="'m1'"):
        deadletter.drop(store, "m1")


def test_requeue_and_drop_are_audited_with_the_change_and_only_when_applied(store: Store) -> None:
    k = store.keys
    _subtask_entry(store, "s1")
    add(store, "m1", kind="malformed", raw="xx", at=1.0)
    deadletter.requeue(store, "s1", "cli:alice@host")
    with pytest.raises(UnknownEntry):
        deadletter.requeue(store, "s1", "cli:alice@host")  # not applied: not audited
    with pytest.raises(InvalidInput):
        deadletter.requeue(store, "m1", "cli:bob@host")
    deadletter.drop(store, "m1", "cli:bob@host")
    audit = deadletter.list_audit(store)
    assert [(a["action"], a["id"], a["actor"], a["to"]) for a in audit] == [
        ("drop", "m1", "cli:bob@host", None), ("requeue", "s1", "cli:alice@host", "waiting")]  # newest first
    assert audit[1]["entry"]["subtask"]["id"] == "s1" and audit[1]["at"] > 0
    for i in range(4):
        add(store, f"x{i}", kind="report", raw="?", at=1.0)
        deadletter.drop(store, f"x{i}", maxlen=3)
    assert [a["id"] for a in deadletter.list_audit(store)] == ["x3", "x2", "x1"]  # capped, newest kept
    assert store.redis.llen(k.audit) == 3


def test_an_unreadable_entry_is_listed_and_can_be_dropped(store: Store) -> None:
    store.redis.hset(store.keys.dead, "bad", "not json")
    _subtask_entry(store, "s1")
    entries = deadletter.list_entries(store)
    assert [(e["id"], e["kind"]) for e in entries] == [("bad", "unreadable"), ("s1", "subtask")]
    with pytest.raises(InvalidInput, match="'bad'"):
        deadletter.requeue(store, "bad")
    deadletter.drop(store, "bad")
    assert store.redis.hkeys(store.keys.dead) == ["s1"]


class _RaisingRecall(DynamicRecall):
    def decide(self, subtask: Subtask, node: str | None, reason: str, *, failed: bool) -> Any:
        raise RuntimeError("a recall plug-in's bug")


@pytest.mark.parametrize("kind", ["report", "failure", "malformed"])
def test_drop_of_a_dead_lettered_report_counts_its_subtask_out_and_its_task_ends(store: Store, kind: str) -> None:
    """The control leaves the subtask of a dead-lettered report, failure or unreadable failure report counted in
    its task (requeued whole, it counts itself out); dropped, it is counted out by the drop, and the task ends."""
    k = store.keys
    store.redis.lpush(k.virtual, json.dumps({"name": "p", "sites": ["a.com"]}))
    store.heartbeat("n1", NODE_INFO, 30, [])
    control = make_control(store)
    control.tick()
    st, token, _ = take(store, "n1")
    assert finish_at(store, "n1", st, token, 3, total=6)  # pages 0-2 of 6: the task's last slice is 3-5
    control.tick()
    last, token, _ = take(store, "n1")
    if kind == "failure":  # the recall strategy raises on the failed run
        assert finish_at(store, "n1", last, token, 3, ok=False, total=6)
        control = make_control(store, recall=_RaisingRecall(threshold=30, max_recalls=3))
    else:  # a report no one can read: a negative count, from a node's bug
        bad = json.loads(Report(subtask=last, node="n1", outcome="done" if kind == "report" else "failed",
                                collected=-1, pages=3, next_page=6, total_pages=6).to_json())
        assert store.finish(last.id, token, json.dumps(bad), node="n1", site="a.com", group="p", offered=30,
                            collected=0, pages=3, seconds=1.0, ok=kind == "report", alpha=0.3, runs_maxlen=100)
    control.tick()
    [entry] = deadletter.list_entries(store)
    assert entry["kind"] == kind
    task = Task.from_json(store.redis.hget(k.tasks, last.task))
    assert (task.open, task.done, task.next_page, task.total_pages) == (1, False, 6, 6)

    deadletter.drop(store, entry["id"])
    task = Task.from_json(store.redis.hget(k.tasks, last.task))
    assert (task.open, task.done) == (0, True)
    assert store.redis.hget(k.progress, "p|done") == "1" and store.redis.hget(k.counters, "tasks_done") == "1"
    control.tick()  # nothing of the task is made again
    assert Task.from_json(store.redis.hget(k.tasks, last.task)) == task
    assert not store.redis.exists(k.waiting) and not store.redis.exists(k.crawl("n1"))


def test_drop_counts_a_subtask_out_once_and_only_where_the_control_did_not(store: Store) -> None:
    """A subtask dead-lettered by a recall was counted out by the control: its drop changes nothing of the task. A
    report's is counted out by its drop, once: dropped again, the entry is gone and nothing is counted. A report
    cut in its dead letter, one whose subtask does not read, or whose task has no readable record is dropped all
    the same, counting nothing."""
    k = store.keys
    store.redis.hset(k.tasks, "t1", Task(id="t1", site="a.com", group="milk", open=2, retrying=1, next_page=20,
                                         total_pages=20).to_json())
    store.redis.hset(k.tasks, "t2", "not json")
    _subtask_entry(store, "s1")  # a subtask of t1 (attempt 4) that reached the recall maximum
    report = Report(subtask=sub("s2"), node="n1", outcome="failed", reason="HTTP 503").to_json()
    add(store, "f7", kind="failure", reason="x", attempts=0, at=1.0, raw=report, source=k.failed)
    add(store, "r1", kind="report", at=1.0, raw=report[:50], cut=True)
    add(store, "r2", kind="report", at=1.0, raw=json.dumps({"subtask": {"id": "s2", "task": "t1"}}))
    add(store, "r3", kind="report", at=1.0, raw=Report(subtask=sub("s3", task="t2"), node="n1",
                                                        outcome="done").to_json())
    add(store, "r4", kind="report", at=1.0, raw=Report(subtask=sub("s4", task="gone"), node="n1",
                                                        outcome="done").to_json())

    for entry_id in ("s1", "r1", "r2", "r3", "r4"):
        deadletter.drop(store, entry_id)
    assert Task.from_json(store.redis.hget(k.tasks, "t1")).open == 2
    deadletter.drop(store, "f7")
    task = Task.from_json(store.redis.hget(k.tasks, "t1"))
    assert (task.open, task.retrying, task.done) == (1, 0, False)  # a recalled subtask (attempt 4): retrying too
    with pytest.raises(UnknownEntry, match="'f7'"):
        deadletter.drop(store, "f7")
    assert Task.from_json(store.redis.hget(k.tasks, "t1")) == task
    assert store.redis.hget(k.tasks, "t2") == "not json" and not store.redis.hexists(k.tasks, "gone")
    assert not store.redis.exists(k.dead) and store.redis.hget(k.counters, "dropped") == "6"
    assert not store.redis.hexists(k.counters, "tasks_done")


def test_drop_never_writes_over_a_task_record_changed_since_it_read_it(store: Store) -> None:
    """The drop counts out on the task record it read, under the control's own guard (``hfield_is``): a tick that
    wrote the record in between is never written over (the drop reads it again), and no WATCH of the whole ``tasks``
    hash makes every drop on a busy cluster start over."""
    k = store.keys
    store.redis.hset(k.tasks, "t1", Task(id="t1", site="a.com", group="milk", open=2, next_page=20,
                                         total_pages=20).to_json())
    report = Report(subtask=sub("s2"), node="n1", outcome="failed", reason="HTTP 503").to_json()
    add(store, "f7", kind="failure", reason="x", attempts=0, at=1.0, raw=report, source=k.failed)
    entry = json.loads(store.redis.hget(k.dead, "f7"))
    guards, writes = deadletter._counted_out(store, entry)
    tick = Task(id="t1", site="a.com", group="milk", open=3, next_page=20, total_pages=20).to_json()
    store.redis.hset(k.tasks, "t1", tick)  # the control's tick, between the drop's read and its commit
    assert store.commit([Guard.hdel(k.dead, "f7"), *guards], writes) is False
    assert store.redis.hget(k.tasks, "t1") == tick and store.redis.hexists(k.dead, "f7")
    deadletter.drop(store, "f7")  # reads the new record
    assert Task.from_json(store.redis.hget(k.tasks, "t1")).open == 2 and not store.redis.hexists(k.dead, "f7")


# --- status -------------------------------------------------------------------------------------------------


def test_collect_status(store: Store) -> None:
    k, r = store.keys, store.redis
    # One finished run of n1 on a.com for "milk": aggregates, triples and progress as the finish script
    # writes them.
    r.lpush(k.crawl("n1"), sub("s0").to_json())
    taken = store.take("n1", 30.0, 10.0)
    assert taken is not None
    report = Report(subtask=sub("s0"), node="n1", outcome="done", offered=10, collected=8, pages=2)
    assert store.finish(
        "s0",
        taken[1],
        report.to_json(),
        node="n1",
        site="a.com",
        group="milk",
        offered=10,
        collected=8,
        pages=2,
        seconds=4.0,
        ok=True,
        alpha=0.3,
        runs_maxlen=100,
    )
    store.heartbeat(
        "n1", {"type": [0], "host": "h1", "pid": 7, "address": "127.0.0.2", "subtasks": ["s5"]}, 30.0, []
    )
    r.zadd(k.node_seen, {"n2": store.now() - 1000})  # lapsed heartbeat
    r.lpush(k.virtual, "a", "b")
    r.zadd(k.waiting, {"w1": 1, "w2": 2, "w3": 3})
    r.lpush(k.crawl("n1"), sub("c1").to_json(), sub("c2").to_json())
    r.lpush(k.crawl("n2"), sub("c3").to_json())
    r.zadd(k.leases, {"s5": store.now() + 30})
    r.lpush(k.failed, "f")
    _subtask_entry(store, "d1")
    store.lead("control-1", 30.0)
    r.hincrby(k.node_counters("n2"), "recalled", 3)
    r.hincrby(k.counters, "tasks", 4)
    r.hincrby(k.progress, "milk|tasks", 4)

    status = collect_status(store, recall_threshold=60.0)
    assert set(status) == {
        "v",
        "prefix",
        "time",
        "leader",
        "queues",
        "nodes",
        "controls",
        "completion",
        "seconds_per_page",
        "products",
        "cluster",
    }
    assert status["v"] == 1 and status["prefix"] == k.prefix and status["leader"] == "control-1"
    assert status["time"] == pytest.approx(store.now(), abs=5)
    assert status["queues"] == {
        "virtual": 2,
        "waiting": 3,
        "crawl": {"n1": 2, "n2": 1},
        "leased": 1,
        "sleeping": 1,
        "failed": 1,
        "dead": 1,
    }
    nodes = {n["id"]: n for n in status["nodes"]}
    assert sorted(nodes) == ["n1", "n2"]
    assert nodes["n1"]["alive"] is True and nodes["n2"]["alive"] is False
    assert (nodes["n1"]["host"], nodes["n1"]["pid"], nodes["n1"]["address"]) == ("h1", 7, "127.0.0.2")
    assert nodes["n1"]["subtasks"] == ["s5"] and nodes["n1"]["crawl_queue"] == 2
    assert set(nodes["n2"]["counts"]) == set(NODE_COUNTS) and nodes["n2"]["counts"]["recalled"] == 3
    row = status["completion"]["a.com"]["n1"]
    assert row["completion"] == pytest.approx(0.8) and row["ratio"] == pytest.approx(0.8)
    assert (row["runs"], row["failures"], row["offered"], row["collected"], row["pages"]) == (1, 0, 10, 8, 2)
    assert row["seconds_per_page"] == pytest.approx(2.0)
    assert row["pace"] == pytest.approx(0.5)  # the sums' 2 pages over 4 s (no node time in the report)
    assert status["seconds_per_page"] == {"milk": {"a.com": {"n1": pytest.approx(2.0)}}}
    assert status["products"] == {"milk": {"tasks": 4, "done": 0, "collected": 8, "pages": 2}}
    assert status["cluster"] == {"tasks": 4}
    json.dumps(status)  # JSON-ready


def test_collect_status_of_an_empty_deployment(store: Store) -> None:
    status = collect_status(store)
    assert status["queues"] == {
        "virtual": 0,
        "waiting": 0,
        "crawl": {},
        "leased": 0,
        "sleeping": 0,
        "failed": 0,
        "dead": 0,
    }
    assert (
        status["nodes"],
        status["completion"],
        status["seconds_per_page"],
        status["products"],
        status["cluster"],
        status["leader"],
    ) == ([], {}, {}, {}, {}, None)
