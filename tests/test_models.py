"""Tests of scheduler_ext.models: versioned JSON round trips and validation of what is read from Redis."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

import pytest

from scheduler_ext import SCHEMA_VERSION
from scheduler_ext.exceptions import InvalidInput
from scheduler_ext.models import Report, Subtask, Task, loads_object


def _subtask(**over: Any) -> Subtask:
    fields: dict[str, Any] = dict(
        id="s1",
        task="t1",
        site="a.com",
        first_page=5,
        page_limit=3,
        time_limit=20.0,
        group="牛奶",
        type=1,
        priority=7.0,
        attempt=2,
        avoid=["n1"],
        prev_node="n1",
        node="n2",
        since=1234.5,
        payload={"q": "光明&牛奶", "engine": "baidu"},
    )
    fields.update(over)
    return Subtask(**fields)


def _valid() -> dict[str, Any]:
    return {
        "v": SCHEMA_VERSION,
        "id": "s1",
        "task": "t1",
        "site": "a.com",
        "first_page": 0,
        "page_limit": 5,
        "time_limit": 30,
    }


# --- round trips --------------------------------------------------------------------------------------------


def test_subtask_round_trip_keeps_every_field() -> None:
    st = _subtask()
    raw = st.to_json()
    assert json.loads(raw)["v"] == SCHEMA_VERSION
    assert Subtask.from_json(raw) == st
    assert Subtask.from_json(raw.encode("utf-8")) == st  # bytes from a client without decode_responses


def test_subtask_minimal_payload_gets_defaults() -> None:
    st = Subtask.from_json(json.dumps(_valid()))
    assert (st.id, st.task, st.site, st.first_page, st.page_limit, st.time_limit) == (
        "s1",
        "t1",
        "a.com",
        0,
        5,
        30.0,
    )
    assert isinstance(st.time_limit, float)
    assert (
        st.group,
        st.type,
        st.priority,
        st.attempt,
        st.avoid,
        st.prev_node,
        st.node,
        st.since,
        st.payload,
    ) == ("", 0, 0.0, 0, [], None, None, 0.0, {})


def test_subtask_numeric_task_id_becomes_string() -> None:
    assert Subtask.from_json(json.dumps({**_valid(), "task": 42})).task == "42"


def test_subtask_without_version_is_read_as_current() -> None:
    obj = _valid()
    del obj["v"]
    assert Subtask.from_json(json.dumps(obj)).id == "s1"


def test_task_round_trip() -> None:
    task = Task(
        id="t9",
        site="b.com",
        group="奶粉",
        type=1,
        priority=3.0,
        payload={"engine": "weibo"},
        next_page=10,
        total_pages=40,
        reported=395,
        subtasks=2,
        collected=17,
        done=False,
        last_node="n3",
        page_limit=5,
        time_limit=12.5,
    )
    raw = task.to_json()
    assert json.loads(raw)["v"] == SCHEMA_VERSION
    assert Task.from_json(raw) == task


def test_report_round_trip() -> None:
    report = Report(
        subtask=_subtask(),
        node="n2",
        outcome="timeout",
        reason="time limit",
        reported=120,
        offered=30,
        collected=21,
        pages=3,
        next_page=8,
        exhausted=False,
        total_pages=12,
        started=100.0,
        ended=112.5,
    )
    raw = report.to_json()
    obj = json.loads(raw)
    assert obj["v"] == SCHEMA_VERSION and obj["subtask"]["v"] == SCHEMA_VERSION
    assert Report.from_json(raw) == report


def test_report_ignores_unknown_fields() -> None:
    obj = Report(subtask=_subtask(), node="n2", outcome="done").to_dict()
    obj["added_by_a_newer_node"] = 1
    assert Report.from_json(json.dumps(obj)).node == "n2"


@pytest.mark.parametrize(("outcome", "ok"), [("done", True), ("timeout", True), ("failed", False)])
def test_report_ok(outcome: str, ok: bool) -> None:
    assert Report(subtask=_subtask(), node="n", outcome=outcome).ok is ok


@pytest.mark.parametrize(
    ("started", "ended", "seconds"), [(10.0, 12.5, 2.5), (10.0, 10.0, 0.0), (10.0, 9.0, 0.0)]
)
def test_report_seconds_never_negative(started: float, ended: float, seconds: float) -> None:
    assert (
        Report(subtask=_subtask(), node="n", outcome="done", started=started, ended=ended).seconds == seconds
    )


# --- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"id": None}, "id"),
        ({"id": ""}, "id"),
        ({"id": 5}, "id"),
        ({"task": None}, "task"),
        ({"task": True}, "task"),
        ({"site": ""}, "site"),
        ({"site": ["a.com"]}, "site"),
        ({"first_page": -1}, "first_page"),
        ({"first_page": "0"}, "first_page"),
        ({"first_page": 1.5}, "first_page"),
        ({"first_page": False}, "first_page"),
        ({"page_limit": 0}, "page_limit"),
        ({"page_limit": True}, "page_limit"),
        ({"page_limit": None}, "page_limit"),
        ({"time_limit": 0}, "time_limit"),
        ({"time_limit": -3.5}, "time_limit"),
        ({"time_limit": "30"}, "time_limit"),
        ({"time_limit": True}, "time_limit"),
        ({"type": -1}, "type"),
        ({"type": True}, "type"),
        ({"attempt": -1}, "attempt"),
        ({"attempt": 1.0}, "attempt"),
        ({"priority": "high"}, "priority"),
        ({"avoid": "n1"}, "avoid"),
        ({"payload": [1, 2]}, "payload"),
        ({"since": "yesterday"}, "since"),
        ({"group": 3}, "group"),
        ({"prev_node": 7}, "prev_node"),
    ],
)
def test_subtask_validation_names_the_field(change: dict[str, Any], field: str) -> None:
    obj = {k: v for k, v in {**_valid(), **change}.items() if v is not None}
    with pytest.raises(InvalidInput, match=rf"subtask: field '{field}': expected"):
        Subtask.from_json(json.dumps(obj))


def test_subtask_validation_names_the_context() -> None:
    with pytest.raises(InvalidInput, match=r"^crawl:n1: field 'id'"):
        Subtask.from_dict({**_valid(), "id": ""}, "crawl:n1")


def test_pickle_is_refused_as_binary() -> None:
    with pytest.raises(InvalidInput, match="not UTF-8 JSON.*pickle"):
        Subtask.from_json(pickle.dumps({"a": 1}))


@pytest.mark.parametrize("raw", ["{'id': 's1'}", "s1", "", '{"id": "s1"'])
def test_non_json_is_refused(raw: str) -> None:
    with pytest.raises(InvalidInput, match="subtask: not JSON"):
        Subtask.from_json(raw)


@pytest.mark.parametrize(
    ("raw", "kind"), [("[1, 2]", "list"), ('"s1"', "str"), ("3", "int"), ("null", "NoneType")]
)
def test_json_that_is_not_an_object_is_refused(raw: str, kind: str) -> None:
    with pytest.raises(InvalidInput, match=f"expected a JSON object, got {kind}"):
        loads_object(raw, "subtask")


@pytest.mark.parametrize("version", [2, 0, "1", None])
def test_other_schema_version_is_refused(version: Any) -> None:
    raw = json.dumps({**_valid(), "v": version})
    with pytest.raises(InvalidInput, match="schema version"):
        Subtask.from_json(raw)
    with pytest.raises(InvalidInput, match="schema version"):
        Task.from_json(json.dumps({"v": version, "id": "t1", "site": "a.com"}))


def test_report_validates_its_subtask() -> None:
    obj = Report(subtask=_subtask(), node="n2", outcome="done").to_dict()
    obj["subtask"]["page_limit"] = 0
    with pytest.raises(InvalidInput, match=r"report\.subtask: field 'page_limit'"):
        Report.from_json(json.dumps(obj))


@pytest.mark.parametrize("sub", [None, "s1", [1]])
def test_report_without_subtask_object_is_refused(sub: Any) -> None:
    obj = Report(subtask=_subtask(), node="n2", outcome="done").to_dict()
    obj["subtask"] = sub
    with pytest.raises(InvalidInput, match="report: field 'subtask'"):
        Report.from_json(json.dumps(obj))


def test_malformed_failure_record_is_not_a_report() -> None:
    # What Store.take pushes to `failed` for a crawl-queue entry it cannot read.
    raw = json.dumps(
        {"v": 1, "malformed": True, "id": None, "node": "n1", "outcome": "failed", "reason": "x"}
    )
    with pytest.raises(InvalidInput, match="subtask"):
        Report.from_json(raw)


def test_report_refuses_pickle_and_non_json() -> None:
    with pytest.raises(InvalidInput, match="report: not UTF-8"):
        Report.from_json(pickle.dumps({"a": 1}))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="report: not JSON"):
        Report.from_json("done")


# The module's contract: everything read from Redis "is JSON or it is refused with a reason" (InvalidInput,
# which the control catches to dead-letter the entry), never another exception type.


@pytest.mark.parametrize("missing", ["node", "outcome"])
def test_report_missing_required_field_is_invalid_input(missing: str) -> None:
    obj = Report(subtask=_subtask(), node="n2", outcome="done").to_dict()
    del obj[missing]
    with pytest.raises(InvalidInput, match=missing):
        Report.from_json(json.dumps(obj))


@pytest.mark.parametrize(("fields", "match"), [
    ({"blocked": -2}, "field 'blocked': expected an integer >= 0, got -2"),
    ({"failed": "3"}, "field 'failed': expected an integer >= 0"),
    ({"attempted": 2, "pages": 2, "blocked": 1},
     r"field 'attempted': expected at least pages \+ blocked \+ failed \(3\)"),
    ({"node_seconds": -0.5}, "field 'node_seconds': expected a finite number of seconds >= 0 or null, got -0.5"),
    ({"node_seconds": "0.5"}, "field 'node_seconds': expected a finite number of seconds >= 0"),
    ({"node_seconds": float("inf")}, "field 'node_seconds': expected a finite number of seconds >= 0"),
    ({"node_seconds": True}, "field 'node_seconds': expected a finite number of seconds >= 0"),
])
def test_report_page_counts_are_validated(fields: dict[str, Any], match: str) -> None:
    obj = {**Report(subtask=_subtask(), node="n2", outcome="failed").to_dict(), **fields}
    with pytest.raises(InvalidInput, match=match):
        Report.from_json(json.dumps(obj))


def test_report_charges_every_page_attempted_and_accepts_a_report_without_counts() -> None:
    full = Report(subtask=_subtask(), node="n2", outcome="failed", pages=3, attempted=8, blocked=4, failed=1)
    assert Report.from_json(full.to_json()).charged == 8
    old = full.to_dict()
    for name in ("attempted", "blocked", "failed"):
        del old[name]
    assert Report.from_json(json.dumps(old)).charged == 4  # an older node's report: the pages and the failing one


def test_report_keeps_its_node_time_and_an_older_nodes_report_has_none() -> None:
    timed = Report(subtask=_subtask(), node="n2", outcome="done", pages=3, node_seconds=0.125)
    assert Report.from_json(timed.to_json()).node_seconds == 0.125
    old = timed.to_dict()
    del old["node_seconds"]
    assert Report.from_json(json.dumps(old)).node_seconds is None


def test_task_missing_id_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="id"):
        Task.from_json(json.dumps({"v": SCHEMA_VERSION, "site": "a.com"}))


def test_task_refuses_pickle_and_non_json() -> None:
    with pytest.raises(InvalidInput, match="task: not UTF-8"):
        Task.from_json(pickle.dumps({"a": 1}))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="task: not JSON"):
        Task.from_json("{")


def test_models_doctests() -> None:  # resume_page, Subtask.capped
    import doctest

    from scheduler_ext import models

    result = doctest.testmod(models)
    assert result.attempted > 0 and result.failed == 0


def test_a_capped_subtask_is_recognised_and_nothing_else_is() -> None:
    st = Subtask("s1", "t1", "a.example", first_page=4, page_limit=5, time_limit=30.0, payload={"q": "x"})
    assert st.is_capped_of(st) and st.capped(3).is_capped_of(st) and st.capped(1).is_capped_of(st)
    assert not st.is_capped_of(st.capped(3))  # more pages than the original
    assert not Subtask.from_json(st.to_json()).is_capped_of(st)  # an equal copy is not the object passed in
    assert not dataclasses.replace(st.capped(3), first_page=5).is_capped_of(st)  # other pages
    assert not dataclasses.replace(st.capped(3), payload={"q": "y"}).is_capped_of(st)  # another query
