"""Tests of scheduler_ext.strategies: the allocation contract on every implementation, the paper's allocation,
modification and recall rules, and loading strategies by dotted path.

The estimates are an in-memory fake: these are pure decisions on numbers, which no Redis behaviour can change
(the aggregates that feed the real estimates are tested in test_store.py).
"""

from __future__ import annotations

import doctest
import math
import random
import zlib
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from scrapy.utils.test import get_crawler

from scheduler_ext.exceptions import ConfigurationError
from scheduler_ext.models import Report, Subtask
from scheduler_ext.sim.estimates import MemoryEstimates
from scheduler_ext.strategies import (
    Allocation,
    Estimate,
    NodeView,
    RecallDecision,
    load_strategy,
)
from scheduler_ext.strategies import bandit as bandit_module
from scheduler_ext.strategies import modification as modification_module
from scheduler_ext.strategies import posterior as posterior_module
from scheduler_ext.strategies.allocation import DynamicAllocation, RoundRobinAllocation, SharedAllocation
from scheduler_ext.strategies.bandit import (
    AHEAD,
    EXPLORE_PAGES,
    EXPLORE_REST,
    EXPLORE_ROOM,
    EXPLORE_SAMPLE,
    BanditAllocation,
)
from scheduler_ext.strategies.modification import DynamicModification, FixedModification, RelativeModification
from scheduler_ext.strategies.posterior import PACE_MAX, Posterior, Sums, update_sums
from scheduler_ext.strategies.recall import DynamicRecall, NoRecall

NOW = 10_000.0


class FakeEstimates:
    """Estimates from two dicts: (site, node) -> completion and (group, site, node) -> seconds per page."""

    def __init__(self) -> None:
        self.c: dict[tuple[str, str], Estimate] = {}
        self.s: dict[tuple[str, str, str], Estimate] = {}

    def set(
        self,
        site: str,
        node: str,
        completion: float,
        spp: float,
        *,
        group: str = "g",
        runs: int = 5,
        last_run: float = NOW - 1,
    ) -> FakeEstimates:
        self.c[(site, node)] = Estimate(completion, runs, last_run)
        self.s[(group, site, node)] = Estimate(spp, runs, last_run)
        return self

    def completion(self, site: str, node: str) -> Estimate | None:
        return self.c.get((site, node))

    def seconds_per_page(self, group: str, site: str, node: str) -> Estimate | None:
        return self.s.get((group, site, node))


class RefusingEstimates:
    """For strategies that must not look at estimates."""

    def completion(self, site: str, node: str) -> Estimate | None:
        raise AssertionError("estimates read")

    def seconds_per_page(self, group: str, site: str, node: str) -> Estimate | None:
        raise AssertionError("estimates read")


def st(
    sid: str,
    *,
    task: str | None = None,
    site: str = "a.com",
    type: int = 0,
    since: float = NOW,
    avoid: list[str] | None = None,
    group: str = "g",
) -> Subtask:
    return Subtask(
        id=sid,
        task=task or "t" + sid,
        site=site,
        first_page=0,
        page_limit=5,
        time_limit=30.0,
        group=group,
        type=type,
        since=since,
        avoid=avoid or [],
    )


def node(nid: str, free: int = 1, types: tuple[int, ...] = (0,)) -> NodeView:
    return NodeView(id=nid, types=list(types), free=free)


def assigned(result: list[tuple[Subtask, str]]) -> dict[str, str]:
    return {s.id: n for s, n in result}


# --- the allocation contract, on every implementation -------------------------------------------------------

ALLOCATIONS = [DynamicAllocation, SharedAllocation, RoundRobinAllocation, BanditAllocation]


def _scenario(seed: int) -> tuple[list[Subtask], list[NodeView], FakeEstimates]:
    rng = random.Random(seed)
    sites = ["a.com", "b.com", "c.com"]
    nodes = [
        NodeView(id=f"n{i}", types=rng.choice([[0], [1], [0, 1]]), free=rng.randint(0, 3))
        for i in range(rng.randint(1, 6))
    ]
    est = FakeEstimates()
    for site in sites:
        for n in nodes:
            if rng.random() < 0.7:
                est.set(site, n.id, rng.random(), rng.uniform(0.1, 5.0), last_run=NOW - rng.uniform(0, 900))
    subtasks = [
        st(
            f"s{i}",
            task=f"t{rng.randint(0, 4)}",
            site=rng.choice(sites),
            type=rng.randint(0, 1),
            since=NOW - rng.uniform(0, 60),
            avoid=[n.id for n in nodes if rng.random() < 0.2],
        )
        for i in range(rng.randint(0, 15))
    ]
    return subtasks, nodes, est


@pytest.mark.parametrize("cls", ALLOCATIONS)
@pytest.mark.parametrize("seed", range(40))
def test_allocation_contract(cls: type[Allocation], seed: int) -> None:
    subtasks, nodes, est = _scenario(seed)
    strategy = cls()
    for tick in range(3):  # strategies may keep state between ticks
        result = strategy.allocate(subtasks, nodes, est, NOW + tick)
        by_id = {n.id: n for n in nodes}
        given = {s.id for s in subtasks}
        ids = [s.id for s, _ in result]
        assert len(ids) == len(set(ids)), "a subtask assigned twice"
        assert set(ids) <= given
        originals = {s.id: s for s in subtasks}
        assert all(s.is_capped_of(originals[s.id]) for s, _ in result), "not the subtask nor its first pages"
        for s, nid in result:
            assert nid in by_id, "assigned to a node that is not live"
            assert s.type in by_id[nid].types, "assigned to a node of another type"
        for nid, count in Counter(nid for _, nid in result).items():
            assert count <= by_id[nid].free, f"{nid} got {count} > free {by_id[nid].free}"


@pytest.mark.parametrize("cls", ALLOCATIONS)
def test_allocation_empty_inputs(cls: type[Allocation]) -> None:
    est = FakeEstimates().set("a.com", "n1", 1.0, 1.0)
    assert cls().allocate([], [node("n1", 2)], est, NOW) == []
    assert cls().allocate([st("s1")], [], est, NOW) == []
    assert cls().allocate([st("s1")], [node("n1", 0)], est, NOW) == []
    assert cls().allocate([st("s1", type=1)], [node("n1", 2, types=(0,))], est, NOW) == []


@pytest.mark.parametrize("cls", ALLOCATIONS)
def test_allocation_uses_free_capacity(cls: type[Allocation]) -> None:
    # A task per subtask, one node with room for all: every implementation gives it all (nothing better
    # exists).
    est = FakeEstimates().set("a.com", "n1", 1.0, 1.0)
    result = cls().allocate([st("s1"), st("s2"), st("s3")], [node("n1", 3)], est, NOW)
    assert sorted(assigned(result).items()) == [("s1", "n1"), ("s2", "n1"), ("s3", "n1")]


@pytest.mark.parametrize("cls", ALLOCATIONS)
@pytest.mark.parametrize("task", ["T", "a"])  # round robin: home n1 for "T", n2 for "a"
def test_allocation_honours_avoid(cls: type[Allocation], task: str) -> None:
    homes = {t: zlib.crc32(t.encode()) % 2 for t in ("T", "a")}
    assert homes == {"T": 0, "a": 1}  # both home nodes are exercised
    est = FakeEstimates().set("a.com", "n1", 1.0, 1.0).set("a.com", "n2", 1.0, 1.0)
    s = st("s1", task=task, avoid=["n1"])
    assert assigned(cls().allocate([s], [node("n1"), node("n2")], est, NOW)) == {"s1": "n2"}
    # Another node is alive but busy: the subtask waits rather than go back to the node it failed on.
    assert cls().allocate([s], [node("n1"), node("n2", 0)], est, NOW) == []
    # No other node of its type is alive: the avoided node will do.
    alone = [node("n1"), node("n3", types=(1,))]
    assert assigned(cls().allocate([s], alone, est, NOW)) == {"s1": "n1"}


# --- DynamicAllocation --------------------------------------------------------------------------------------


def test_dynamic_prefers_higher_rate_not_higher_completion() -> None:
    # n1: 0.5 results/page at 0.5 s/page = 1.0 results/s; n2: 0.9 at 1.5 s/page = 0.6 results/s.
    est = FakeEstimates().set("a.com", "n1", 0.5, 0.5).set("a.com", "n2", 0.9, 1.5)
    assert assigned(DynamicAllocation().allocate([st("s1")], [node("n2"), node("n1")], est, NOW)) == {
        "s1": "n1"
    }
    est.set("a.com", "n1", 0.5, 1.0)  # now 0.5 results/s: n2 is better
    assert assigned(DynamicAllocation().allocate([st("s1")], [node("n2"), node("n1")], est, NOW)) == {
        "s1": "n2"
    }


def test_dynamic_fills_the_best_node_first_then_the_next() -> None:
    est = FakeEstimates().set("a.com", "n1", 0.9, 1.0).set("a.com", "n2", 0.8, 1.0)
    result = DynamicAllocation().allocate([st("s1"), st("s2"), st("s3")], [node("n2"), node("n1")], est, NOW)
    assert assigned(result) == {"s1": "n1", "s2": "n2"}


def test_dynamic_explores_an_unexplored_pair_once() -> None:
    est = FakeEstimates().set("a.com", "n1", 0.9, 1.0)  # n2 never ran on a.com
    alloc = DynamicAllocation(explore_timeout=60.0)
    first = assigned(alloc.allocate([st("s1"), st("s2")], [node("n1"), node("n2")], est, NOW))
    assert first == {"s1": "n2", "s2": "n1"}  # exploration goes first, in priority order
    # The exploration is in flight: n2 is free again but gets no second a.com subtask ...
    second = assigned(alloc.allocate([st("s3"), st("s4")], [node("n1", 0), node("n2")], est, NOW + 5))
    assert second == {}
    # ... though it is explored on another site,
    third = assigned(alloc.allocate([st("s5", site="b.com")], [node("n1", 0), node("n2")], est, NOW + 6))
    assert third == {"s5": "n2"}
    # and explored again if the first exploration never reported back within the timeout.
    fourth = assigned(alloc.allocate([st("s6")], [node("n1", 0), node("n2")], est, NOW + 61))
    assert fourth == {"s6": "n2"}


def test_dynamic_explores_when_runs_are_below_explore_runs() -> None:
    est = FakeEstimates().set("a.com", "n1", 0.9, 1.0).set("a.com", "n2", 0.01, 1.0, runs=1)
    busy_best = [node("n1", 0), node("n2")]
    assert assigned(DynamicAllocation(explore_runs=2).allocate([st("s1")], busy_best, est, NOW)) == {
        "s1": "n2"
    }
    assert assigned(DynamicAllocation(explore_runs=1).allocate([st("s1")], busy_best, est, NOW)) == {}


def test_dynamic_excludes_a_node_slower_than_slow_factor_times_the_best() -> None:
    aged = NOW - 1000  # past patience: late binding does not hold it back, only the exclusion rule can
    est = FakeEstimates().set("a.com", "n1", 0.3, 1.0).set("a.com", "n2", 1.0, 3.5)
    nodes = [node("n1", 0), node("n2")]
    assert (
        assigned(DynamicAllocation(slow_factor=3.0).allocate([st("s1", since=aged)], nodes, est, NOW)) == {}
    )
    est.set("a.com", "n2", 1.0, 2.9)
    assert assigned(DynamicAllocation(slow_factor=3.0).allocate([st("s1", since=aged)], nodes, est, NOW)) == {
        "s1": "n2"
    }


def test_dynamic_slow_rule_is_per_group() -> None:
    aged = NOW - 1000
    est = (
        FakeEstimates()
        .set("a.com", "n1", 0.3, 1.0, group="milk")
        .set("a.com", "n2", 1.0, 3.5, group="milk")
        .set("a.com", "n1", 0.3, 3.0, group="tea")
        .set("a.com", "n2", 1.0, 3.5, group="tea")
    )
    nodes = [node("n1", 0), node("n2")]
    alloc = DynamicAllocation(slow_factor=3.0)
    result = alloc.allocate(
        [st("s1", since=aged, group="milk"), st("s2", since=aged, group="tea")], nodes, est, NOW
    )
    assert assigned(result) == {"s2": "n2"}


def test_dynamic_late_binding_waits_for_a_better_busy_node_until_patience() -> None:
    # n1 (busy) earns 1.0 results/s, n2 (free) 0.5: below 0.6 x the best.
    est = FakeEstimates().set("a.com", "n1", 1.0, 1.0).set("a.com", "n2", 0.5, 1.0)
    nodes = [node("n1", 0), node("n2")]
    alloc = DynamicAllocation(rate_floor=0.6, patience=30.0)
    assert assigned(alloc.allocate([st("s1", since=NOW - 29)], nodes, est, NOW)) == {}
    assert assigned(alloc.allocate([st("s1", since=NOW - 30)], nodes, est, NOW)) == {"s1": "n2"}
    est.set("a.com", "n2", 0.7, 1.0)  # above the floor: no need to wait
    assert assigned(alloc.allocate([st("s1", since=NOW)], nodes, est, NOW)) == {"s1": "n2"}


def test_dynamic_aged_subtasks_are_matched_first() -> None:
    est = (
        FakeEstimates().set("a.com", "n1", 1.0, 1.0).set("b.com", "n1", 0.2, 1.0).set("b.com", "n2", 0.2, 1.0)
    )
    # s1 (a.com) pays better on n1, but s2 (b.com) has waited past patience: it gets n1's only slot.
    result = DynamicAllocation(patience=30.0).allocate(
        [st("s1"), st("s2", site="b.com", since=NOW - 100)], [node("n1"), node("n2", 0)], est, NOW
    )
    assert assigned(result) == {"s2": "n1"}


def test_dynamic_avoids_the_node_a_subtask_failed_on() -> None:
    est = FakeEstimates().set("a.com", "n1", 1.0, 1.0).set("a.com", "n2", 0.7, 1.0)
    alloc = DynamicAllocation()
    assert assigned(alloc.allocate([st("s1", avoid=["n1"])], [node("n1"), node("n2")], est, NOW)) == {
        "s1": "n2"
    }
    # Another node is alive but busy: the subtask waits rather than go back to the node it failed on.
    assert assigned(alloc.allocate([st("s1", avoid=["n1"])], [node("n1"), node("n2", 0)], est, NOW)) == {}
    # No other node alive (of its type): the avoided node will do.
    nodes = [node("n1"), node("n3", types=(1,))]
    assert assigned(alloc.allocate([st("s1", avoid=["n1"])], nodes, est, NOW)) == {"s1": "n1"}


def test_dynamic_does_not_explore_an_avoided_node() -> None:
    est = FakeEstimates().set("a.com", "n2", 0.9, 1.0)  # n1 unexplored, but the subtask just failed on it
    result = DynamicAllocation().allocate([st("s1", avoid=["n1"])], [node("n1"), node("n2", 0)], est, NOW)
    assert assigned(result) == {}


def test_dynamic_explores_stale_estimates_again() -> None:
    # n2 was bad on a.com long ago: with a fresh estimate it waits for n1, with a stale one it is measured
    # again.
    nodes = [node("n1", 0), node("n2")]
    fresh = FakeEstimates().set("a.com", "n1", 1.0, 1.0).set("a.com", "n2", 0.1, 1.0, last_run=NOW - 599)
    assert assigned(DynamicAllocation(stale_after=600.0).allocate([st("s1")], nodes, fresh, NOW)) == {}
    stale = FakeEstimates().set("a.com", "n1", 1.0, 1.0).set("a.com", "n2", 0.1, 1.0, last_run=NOW - 601)
    assert assigned(DynamicAllocation(stale_after=600.0).allocate([st("s1")], nodes, stale, NOW)) == {
        "s1": "n2"
    }


def test_dynamic_only_nodes_of_the_subtask_type() -> None:
    est = FakeEstimates().set("a.com", "n0", 1.0, 1.0).set("a.com", "n1", 0.9, 1.0)
    result = DynamicAllocation().allocate(
        [st("s1", type=1), st("s2", type=0)], [node("n0", 2, types=(0,)), node("n1", 2, types=(1,))], est, NOW
    )
    assert assigned(result) == {"s1": "n1", "s2": "n0"}


# --- baselines ----------------------------------------------------------------------------------------------


def test_shared_is_fifo_and_ignores_estimates() -> None:
    subtasks = [st("s1"), st("s2"), st("s3"), st("s4")]
    result = SharedAllocation().allocate(subtasks, [node("n1", 1), node("n2", 1)], RefusingEstimates(), NOW)
    assert sorted(assigned(result)) == ["s1", "s2"]
    assert sorted(assigned(result).values()) == ["n1", "n2"]


def test_shared_skips_subtasks_no_free_node_can_take_but_keeps_order() -> None:
    subtasks = [st("s1", type=1), st("s2"), st("s3")]
    result = SharedAllocation().allocate(subtasks, [node("n1", 1, types=(0,))], RefusingEstimates(), NOW)
    assert assigned(result) == {"s2": "n1"}


def test_round_robin_keeps_a_task_on_one_node() -> None:
    nodes = [node("n1", 50), node("n2", 50), node("n3", 50)]
    subtasks = [st(f"s{t}-{i}", task=f"task{t}") for t in range(12) for i in range(3)]
    alloc = RoundRobinAllocation()
    first = assigned(alloc.allocate(subtasks, nodes, RefusingEstimates(), NOW))
    assert len(first) == len(subtasks)
    home: dict[str, str] = {}
    for s in subtasks:
        assert home.setdefault(s.task, first[s.id]) == first[s.id]
    assert len(set(home.values())) > 1  # tasks are spread over the nodes
    later = assigned(alloc.allocate([st("x", task="task0")], list(reversed(nodes)), RefusingEstimates(), NOW))
    assert later == {"x": home["task0"]}


def test_round_robin_waits_if_the_task_node_is_full() -> None:
    nodes = [node("n1", 5), node("n2", 5)]
    home = assigned(RoundRobinAllocation().allocate([st("s1", task="T")], nodes, RefusingEstimates(), NOW))[
        "s1"
    ]
    full = [node(n.id, 0 if n.id == home else 5) for n in nodes]
    assert RoundRobinAllocation().allocate([st("s2", task="T")], full, RefusingEstimates(), NOW) == []
    one = [node(n.id, 1) for n in nodes]
    result = RoundRobinAllocation().allocate(
        [st("s3", task="T"), st("s4", task="T")], one, RefusingEstimates(), NOW
    )
    assert assigned(result) == {"s3": home}


# --- modification -------------------------------------------------------------------------------------------


def test_modification_doctests() -> None:
    result = doctest.testmod(modification_module)
    assert result.attempted >= 3
    assert result.failed == 0


def test_posterior_doctests() -> None:  # page equivalents, change points, the share bound of the page rule
    result = doctest.testmod(posterior_module)
    assert result.attempted >= 5
    assert result.failed == 0


@pytest.mark.parametrize(
    ("kwargs", "completion", "spp", "expected"),
    [
        ({}, 0.1, 0.5, (1, 5.0)),  # low completion -> fewer pages; time limit at its minimum
        ({}, 0.3, 0.5, (3, 5.0)),
        ({}, 0.5, 1.0, (5, 10.0)),
        ({}, 1.0, 1.0, (10, 20.0)),  # high completion -> more pages
        ({}, 1.0, 0.1, (10, 5.0)),  # fast pages -> short limit (clamped to the minimum)
        ({}, 1.7, 1.0, (10, 20.0)),  # completion is clamped to [0, 1]
        ({}, -0.2, 1.0, (1, 5.0)),
        ({}, 0.0, 1.0, (1, 5.0)),  # never below the minimum page count
        ({}, None, 1.0, (5, 10.0)),  # no completion yet: taken as 0.5
        ({}, 0.8, None, (8, 30.0)),  # no speed yet: the default time limit, within the budget
        ({}, 0.8, 0.0, (8, 30.0)),
        ({"default_time": 100.0}, 0.8, None, (8, 30.0)),  # ... never above half the recall threshold
        ({}, 1.0, 4.0, (3, 24.0)),  # slow pages: as many as fit into half the recall threshold
        ({}, 1.0, 4.1, (3, 24.6)),  # 30 / 8.2 = 3.66 pages fit: rounded down
        ({}, 1.0, 20.0, (1, 40.0)),  # nothing fits: one page, with its time (a limit of the budget cut every page)
        ({}, 1.0, 100.0, (1, 120.0)),  # ... up to the maximum
        ({"base_pages": 15}, 1.0, 0.1, (20, 5.0)),  # bounded by the maximum page count
        ({"min_pages": 2}, 0.1, 0.5, (2, 5.0)),  # bounded by the minimum page count
        ({"recall_threshold": 600.0}, 1.0, 10.0, (10, 120.0)),  # time limit bounded by its maximum
        ({"min_time": 1.0}, 1.0, 0.1, (10, 2.0)),
    ],
)
def test_modification_limits(
    kwargs: dict[str, Any], completion: float | None, spp: float | None, expected: tuple[int, float]
) -> None:
    assert DynamicModification(**kwargs).limits(completion, spp) == expected


def test_modification_limits_properties() -> None:
    mod = DynamicModification()
    for spp in (0.05, 0.2, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 15.0):
        previous = 0
        for completion in (0.0, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95, 1.0):
            pages, limit = mod.limits(completion, spp)
            assert mod.min_pages <= pages <= mod.max_pages
            assert pages >= previous, "more completion must never mean fewer pages"
            previous = pages
            assert mod.min_time <= limit <= min(mod.max_time, 30.0)
            assert pages * spp * mod.safety <= 30.0 + 1e-9, "expected duration over half the recall threshold"
            assert limit >= min(pages * spp * mod.safety, 30.0) - 1e-9, (
                "limit shorter than the expected duration"
            )


def _report(**over: Any) -> Report:
    fields: dict[str, Any] = dict(
        subtask=st("s1"),
        node="n1",
        outcome="done",
        offered=10,
        collected=10,
        pages=5,
        started=100.0,
        ended=105.0,
    )
    fields.update(over)
    return Report(**fields)


def test_next_limits_falls_back_to_the_report_own_figures() -> None:
    mod = DynamicModification()
    # 10/10 collected, 1 s a page -> limits(1.0, 1.0)
    assert mod.next_limits(_report(), FakeEstimates()) == (10, 20.0)
    # 1/10 collected -> limits(0.1, 1.0)
    assert mod.next_limits(_report(collected=1), FakeEstimates()) == (1, 5.0)
    # nothing offered, nothing crawled -> limits(None, None)
    assert mod.next_limits(_report(offered=0, collected=0, pages=0), FakeEstimates()) == (5, 30.0)
    # estimates of another node do not count
    other = FakeEstimates().set("a.com", "n2", 0.1, 4.0)
    assert mod.next_limits(_report(), other) == (10, 20.0)


def test_a_run_cut_before_any_page_gives_the_next_subtask_twice_its_time() -> None:
    # Pages of 40 s against a limit of 30 s (the default before any pace is known): every run was cut before its
    # first page ended, said nothing of the pace, and the next got 30 s again; the site's work was never done.
    mod = DynamicModification()
    cut = _report(outcome="timeout", offered=0, collected=0, pages=0, started=100.0, ended=130.0)
    assert mod.next_limits(cut, FakeEstimates()) == (5, 60.0)
    longer = _report(subtask=replace(st("s1"), time_limit=90.0), outcome="timeout", offered=0, collected=0, pages=0)
    assert mod.next_limits(longer, FakeEstimates()) == (5, 120.0)  # up to the maximum
    assert mod.next_limits(_report(outcome="timeout"), FakeEstimates()) == (10, 20.0)  # pages crawled: the pace


def test_next_limits_prefers_the_estimates_of_the_node_that_ran_it() -> None:
    est = FakeEstimates().set("a.com", "n1", 1.0, 4.0)
    assert DynamicModification().next_limits(_report(), est) == (3, 24.0)


def test_relative_modification_shrinks_only_where_a_node_does_better() -> None:
    est = MemoryEstimates()
    for node in ("n1", "n2"):  # every node known on a.com is served 30 % of its results
        est.finish(site="a.com", group="g", node=node, offered=100, collected=30, pages=10, seconds=2.0, ok=True,
                   now=NOW)
    est.finish(site="b.com", group="g", node="n3", offered=100, collected=95, pages=10, seconds=2.0, ok=True, now=NOW)
    est.read()  # a control tick reads the estimates
    report = _report(collected=3)
    paper, relative = DynamicModification(), RelativeModification()
    assert paper.next_limits(report, est)[0] == 3  # round(2 x 0.3 x 5)
    assert relative.next_limits(report, est)[0] == 10  # nobody does better on a.com: the full 2 x P0
    # A node that is served 90 % of a.com appears: the task should come back sooner, as in the paper's rule.
    est.finish(site="a.com", group="g", node="n3", offered=100, collected=90, pages=10, seconds=2.0, ok=True, now=NOW)
    est.read()
    assert relative.next_limits(report, est)[0] == 3  # round(2 x 0.3 / 0.9 x 5)
    assert relative.next_limits(_report(node="n3"), est)[0] == 10
    # Estimates without sums: the paper's rule.
    assert relative.next_limits(report, FakeEstimates().set("a.com", "n1", 0.3, 0.2)) == \
        paper.next_limits(report, FakeEstimates().set("a.com", "n1", 0.3, 0.2))


def test_relative_modification_shrinks_where_the_node_has_better_work_elsewhere() -> None:
    # Nobody does better than 30 % on a.com; n1 is served 95 % of b.com, where it ran 10 s ago: its subtasks on
    # a.com come back sooner (the paper's share of the pages) so that it returns to b.com's work.
    def estimates(runs_on_b: int, pages_a_run: int) -> MemoryEstimates:
        est = MemoryEstimates()
        for node in ("n1", "n2"):
            for _ in range(5):
                est.finish(site="a.com", group="g", node=node, offered=100, collected=30, pages=10, seconds=2.0,
                           ok=True, now=NOW)
        for _ in range(runs_on_b):
            est.finish(site="b.com", group="g", node="n1", offered=10 * pages_a_run, collected=19 * pages_a_run // 2,
                       pages=pages_a_run, seconds=2.0, ok=True, now=NOW)
        est.read()
        return est

    def pages(mod: RelativeModification, est: MemoryEstimates, site: str, ended: float) -> int:
        return mod.next_limits(_report(subtask=st("s1", site=site), ended=ended, collected=3), est)[0]

    est = estimates(5, 10)
    mod = RelativeModification(recall_threshold=20.0)
    assert pages(mod, est, "a.com", NOW) == 10  # no run of n1 on b.com reported yet: as good as any node
    pages(mod, est, "b.com", NOW - 10)
    assert pages(mod, est, "a.com", NOW) == 3  # round(2 x 0.3 / 0.95 x 5)
    # Its run on b.com is older than twice the recall threshold: b.com's work may be gone; the full pages again.
    assert pages(mod, est, "a.com", NOW + 35) == 10
    # A share elsewhere that rests on one page is believed only as far as a page can tell (a lower bound of it):
    # among many sites, one lucky page must not shrink a node that is as good as any on every site.
    mod, est = RelativeModification(recall_threshold=20.0), estimates(1, 1)
    pages(mod, est, "b.com", NOW - 10)
    assert 3 < pages(mod, est, "a.com", NOW) < 10


def test_fixed_modification_is_constant() -> None:
    mod = FixedModification(page_limit=7, time_limit=12.5)
    est = FakeEstimates().set("a.com", "n1", 0.1, 9.0)
    assert mod.next_limits(_report(), est) == (7, 12.5)
    assert mod.next_limits(_report(collected=0, pages=0), FakeEstimates()) == (7, 12.5)


# --- recall -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("failed", [True, False])
@pytest.mark.parametrize("max_recalls", [1, 2, 5])
def test_dynamic_recall_runs_a_subtask_exactly_max_times(max_recalls: int, failed: bool) -> None:
    recall = DynamicRecall(threshold=60.0, max_recalls=max_recalls)
    subtask, executions = st("s1"), 0
    while True:
        executions += 1
        decision = recall.decide(subtask, "n1", "blocked", failed=failed)
        if decision is RecallDecision.DEAD:
            break
        assert decision is RecallDecision.REQUEUE
        subtask = Subtask(**{**subtask.__dict__, "attempt": subtask.attempt + 1})
        assert executions < 100
    assert executions == max_recalls


def test_dynamic_recall_retries_at_once_then_backs_off_doubling_up_to_the_recall_age() -> None:
    recall = DynamicRecall(threshold=20.0, max_recalls=8, backoff=2.0)
    delays = [recall.retry_delay(Subtask(**{**st("s1").__dict__, "attempt": a})) for a in range(8)]
    assert delays == [0.0, 0.0, 2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    assert DynamicRecall(backoff=0.0).retry_delay(Subtask(**{**st("s1").__dict__, "attempt": 4})) == 0.0
    assert NoRecall().retry_delay(st("s1")) == 0.0  # the base class: at once


def test_dynamic_recall_boundary() -> None:
    recall = DynamicRecall(max_recalls=5)
    assert recall.decide(st("s1"), "n1", "x", failed=True) is RecallDecision.REQUEUE
    assert (
        recall.decide(Subtask(**{**st("s1").__dict__, "attempt": 3}), "n1", "x", failed=True)
        is RecallDecision.REQUEUE
    )
    assert (
        recall.decide(Subtask(**{**st("s1").__dict__, "attempt": 4}), None, "x", failed=False)
        is RecallDecision.DEAD
    )


@pytest.mark.parametrize("attempt", [0, 4, 50])
def test_no_recall(attempt: int) -> None:
    recall = NoRecall()
    subtask = Subtask(**{**st("s1").__dict__, "attempt": attempt})
    assert recall.decide(subtask, "n1", "blocked", failed=True) is RecallDecision.ABANDON
    assert recall.decide(subtask, "n1", "lease lapsed", failed=False) is RecallDecision.KEEP
    assert recall.decide(subtask, None, "node lapsed", failed=False) is RecallDecision.KEEP


# --- load_strategy ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["no_such_module.Allocation", "scheduler_ext.strategies.allocation.NoSuchClass", "nodots"]
)
def test_load_strategy_bad_path_names_the_setting(path: str) -> None:
    crawler = get_crawler(settings_dict={"SCHEDEXT_ALLOCATION": path})
    with pytest.raises(ConfigurationError, match=rf"^SCHEDEXT_ALLOCATION: cannot load strategy '{path}'"):
        load_strategy(crawler, "SCHEDEXT_ALLOCATION")


def test_load_strategy_refuses_the_wrong_kind() -> None:
    crawler = get_crawler(
        settings_dict={"SCHEDEXT_RECALL": "scheduler_ext.strategies.allocation.SharedAllocation"}
    )
    with pytest.raises(
        ConfigurationError, match="^SCHEDEXT_RECALL: .*SharedAllocation.* is not a Recall strategy"
    ):
        load_strategy(crawler, "SCHEDEXT_RECALL")


def test_load_strategy_builds_defaults_and_reads_settings() -> None:
    crawler = get_crawler(
        settings_dict={
            "SCHEDEXT_SLOW_FACTOR": 5,
            "SCHEDEXT_RECALL_MAX": 3,
            "SCHEDEXT_RECALL_THRESHOLD": 90,
            "SCHEDEXT_PAGE_LIMIT": 8,
            "SCHEDEXT_ESTIMATE_HALF_LIFE": 45,
            "SCHEDEXT_EXPLORE_SHARE": 0.05,
            "SCHEDEXT_EXPLORE_PAGES": 2,
            "SCHEDEXT_RETRY_BACKOFF": 5,
        }
    )
    alloc = load_strategy(crawler, "SCHEDEXT_ALLOCATION")  # the default: the bandit
    assert isinstance(alloc, BanditAllocation) and alloc.explore_timeout == 90.0
    assert (alloc.half_life, alloc.explore_share, alloc.explore_pages, alloc.unit) == (45.0, 0.05, 2, 2)
    whole = load_strategy(get_crawler(settings_dict={"SCHEDEXT_EXPLORE_PAGES": 0}), "SCHEDEXT_ALLOCATION")
    assert (whole.explore_pages, whole.unit) == (math.inf, 5)  # whole subtasks; the budget's unit a first one
    paper = load_strategy(get_crawler(settings_dict={
        "SCHEDEXT_ALLOCATION": "scheduler_ext.strategies.allocation.DynamicAllocation", "SCHEDEXT_SLOW_FACTOR": 5}),
        "SCHEDEXT_ALLOCATION")
    assert isinstance(paper, DynamicAllocation) and paper.slow_factor == 5.0
    assert alloc.rate_floor == paper.rate_floor == 0.6  # SCHEDEXT_RATE_FLOOR's default
    for path in ("scheduler_ext.strategies.bandit.BanditAllocation",
                 "scheduler_ext.strategies.allocation.DynamicAllocation"):
        set_floor = get_crawler(settings_dict={"SCHEDEXT_ALLOCATION": path, "SCHEDEXT_RATE_FLOOR": 0.75})
        assert load_strategy(set_floor, "SCHEDEXT_ALLOCATION").rate_floor == 0.75
    recall = load_strategy(crawler, "SCHEDEXT_RECALL")
    assert isinstance(recall, DynamicRecall) and (recall.threshold, recall.max_recalls) == (90.0, 3)
    assert recall.backoff == 5.0
    mod = load_strategy(crawler, "SCHEDEXT_MODIFICATION")
    assert isinstance(mod, RelativeModification) and mod.base_pages == 8 and mod.budget == 45.0
    crawler = get_crawler(
        settings_dict={
            "SCHEDEXT_ALLOCATION": "scheduler_ext.strategies.allocation.SharedAllocation",
            "SCHEDEXT_MODIFICATION": "scheduler_ext.strategies.modification.FixedModification",
            "SCHEDEXT_RECALL": "scheduler_ext.strategies.recall.NoRecall",
        }
    )
    assert isinstance(load_strategy(crawler, "SCHEDEXT_ALLOCATION"), SharedAllocation)
    assert isinstance(load_strategy(crawler, "SCHEDEXT_MODIFICATION"), FixedModification)
    assert isinstance(load_strategy(crawler, "SCHEDEXT_RECALL"), NoRecall)


# --- contract suites for modification and recall: every implementation, baselines included -----------------------

MODIFICATIONS = [DynamicModification(), FixedModification(), DynamicModification(base_pages=20, max_pages=20)]


@pytest.mark.parametrize("strategy", MODIFICATIONS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("completion,spp", [(None, None), (0.0, 0.1), (0.5, 1.0), (1.0, 0.05), (1.0, 30.0)])
def test_modification_contract(strategy: Any, completion: float | None, spp: float | None) -> None:
    est = FakeEstimates()
    if completion is not None and spp is not None:
        est.set("a.com", "n1", completion, spp)
    report = Report(subtask=st("m1"), node="n1", outcome="done", offered=50, collected=25, pages=5,
                    started=NOW - 10, ended=NOW)
    pages, limit = strategy.next_limits(report, est)
    assert isinstance(pages, int) and pages >= 1
    assert isinstance(limit, float | int) and limit > 0


RECALLS = [DynamicRecall(threshold=60, max_recalls=5), NoRecall(threshold=60)]


@pytest.mark.parametrize("strategy", RECALLS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("failed", [True, False])
def test_recall_contract(strategy: Any, failed: bool) -> None:
    decisions = [strategy.decide(Subtask(**{**st("r1").__dict__, "attempt": a}), "n1", "why", failed=failed)
                 for a in range(8)]
    assert all(isinstance(d, RecallDecision) for d in decisions)
    assert strategy.threshold == 60
    # Once a strategy gives a subtask up (dead-letter), it never takes it back up at a higher attempt count.
    dead_at = [a for a, d in enumerate(decisions) if d is RecallDecision.DEAD]
    if dead_at:
        assert dead_at == list(range(dead_at[0], 8))


# --- BanditAllocation and its model ----------------------------------------------------------------------------


class SumsEstimates(FakeEstimates):
    """FakeEstimates plus the bandit's sums per (site, node)."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[str, dict[str, Sums]] = {}

    def runs(self, site: str, nid: str, *runs: tuple[int, int, int, float, bool], at: float = NOW - 1) -> SumsEstimates:
        """Each run: (pages done, offered, collected, seconds, ok)."""
        for pages, offered, collected, seconds, ok in runs:
            old = self.sums.setdefault(site, {}).get(nid)
            self.sums[site][nid] = update_sums(old, pages_done=pages, failed_pages=0 if ok else 1, offered=offered,
                                               collected=collected, seconds=seconds, alpha=0.3, now=at,
                                               failed=not ok)
        return self

    def put(self, site: str, nid: str, sums: Sums) -> SumsEstimates:
        """Set a pair's sums (a new mapping for the site, as the control's cache makes on change)."""
        self.sums[site] = {**self.sums.get(site, {}), nid: sums}
        return self

    def site_sums(self, site: str) -> dict[str, Sums]:
        return self.sums.get(site, {})

    def group_sums(self, group: str, site: str) -> dict[str, Sums]:
        return {}


GOOD = (10, 100, 93, 1.0, True)  # 10 pages, 93 % served, 0.1 s a page


def test_bandit_single_failed_run_does_not_write_a_pair_off() -> None:
    # n1 is known good and busy; n2's only run failed on its first page; n3 ran 6 bad runs just now.
    est = (SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
           .runs("a.com", "n2", (0, 0, 0, 0.3, False), at=NOW - 120)
           .runs("a.com", "n3", *[(10, 100, 10, 6.0, True)] * 6))
    nodes = [node("n1", 0), node("n2"), node("n3")]
    tried = Counter()
    for tick in range(200):
        strategy = BanditAllocation(seed=tick)
        for _, nid in strategy.allocate([st("s1")], nodes, est, NOW):
            tried[nid] += 1
    assert tried["n2"] > 20, tried  # drawn again: one failed page is one page of evidence, two minutes old
    assert tried["n3"] < tried["n2"] / 4, tried  # a pair measured bad, recently, is rarely drawn
    # The paper's allocation on the same data: n2's completion is 0, it never qualifies before patience.
    paper = FakeEstimates().set("a.com", "n1", 0.93, 0.1).set("a.com", "n2", 0.0, 1.0, last_run=NOW - 120)
    assert DynamicAllocation().allocate([st("s1")], [node("n1", 0), node("n2")], paper, NOW) == []


def test_bandit_prior_pace_is_the_best_pace_per_node_second() -> None:
    # Rates are per second of node time, where a page costs hundredths of a second: n1 ran 3 runs of 10 pages at
    # 0.02 s a page (50 pages a second). n2's only run is a 3-page first look as good. The prior of the site
    # (which every posterior includes, 3 pages of it) is as fast as the best pair: then the first look alone
    # makes n2 about n1's peer, and n2 gets the subtask n1 has no slot for.
    fast = (10, 100, 93, 0.2, True)
    est = SumsEstimates().runs("a.com", "n1", fast, fast, fast).runs("a.com", "n2", (3, 30, 28, 0.06, True))
    bandit = BanditAllocation(explore_share=0)
    posts, prior = bandit.posteriors("g", "a.com", est, NOW)
    assert prior.pace == pytest.approx(50.0, rel=0.01)  # (pages + 1) / (sec + 1) said 16
    assert posts["n2"].mean > 0.9 * posts["n1"].mean  # the former prior: 0.64 of it
    assert assigned(bandit.allocate([st("s1")], [node("n1", 0), node("n2")], est, NOW)) == {"s1": "n2"}
    # A node with fewer pages of pace than the prior weighs does not set the prior's pace, unless none has more.
    lucky = SumsEstimates().runs("a.com", "n1", fast).runs("a.com", "n2", (1, 10, 10, 0.001, True))
    assert BanditAllocation().posteriors("g", "a.com", lucky, NOW)[1].pace == pytest.approx(50.0, rel=0.01)
    alone = SumsEstimates().runs("a.com", "n2", (1, 10, 10, 0.01, True))
    assert BanditAllocation().posteriors("g", "a.com", alone, NOW)[1].pace == pytest.approx(100.0)
    # Seconds near 0 (an entry written by hand) bound the pace instead of making it infinite: allocation still
    # draws (a division by zero otherwise) and decides.
    instant = SumsEstimates().put("a.com", "n1", Sums(n=1, pages=5, got=5, sec=1e-320, t=NOW - 1))
    assert BanditAllocation().posteriors("g", "a.com", instant, NOW)[1].pace == PACE_MAX
    for seed in range(20):
        result = BanditAllocation(seed=seed).allocate([st("s1")], [node("n1", 0), node("n2")], instant, NOW)
        assert assigned(result) in ({}, {"s1": "n2"})


def test_bandit_charges_blocked_pages() -> None:
    # n1 was fast and good; now every run gets one page served (90 %), then a captcha that fails it. The paper's
    # completion counts the served page only (0.9) and its speed is not updated by failed runs (0.1 s a page), so
    # it still ranks n1 first. The bandit charges the captcha pages and their time.
    captcha = [(1, 10, 9, 0.5, False)] * 6
    est = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, *captcha).runs("a.com", "n2", *[(10, 100, 92, 2.0, True)] * 4)
    paper = FakeEstimates().set("a.com", "n1", 0.9, 0.1).set("a.com", "n2", 0.92, 0.2)
    assert assigned(DynamicAllocation().allocate([st("s1")], [node("n1"), node("n2")], paper, NOW)) == {"s1": "n1"}
    posts, _ = BanditAllocation().posteriors("g", "a.com", est, NOW)
    assert posts["n1"].share < 0.75 < 0.85 < posts["n2"].share
    assert posts["n2"].mean > posts["n1"].mean
    result = BanditAllocation(explore_share=0).allocate([st("s1")], [node("n1"), node("n2")], est, NOW)
    assert assigned(result) == {"s1": "n2"}


def test_bandit_change_point_follows_a_pair_that_turns_bad_in_one_run() -> None:
    est = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD).runs("a.com", "n2", GOOD, GOOD, GOOD)
    est.runs("a.com", "n1", (8, 80, 9, 6.0, False))  # the site starts refusing n1
    posts, _ = BanditAllocation().posteriors("g", "a.com", est, NOW)
    assert posts["n1"].mean < 0.6 * posts["n2"].mean  # below the floor at once, not after ~4 runs of averaging
    assert est.sums["a.com"]["n1"].n == 1.0  # the sums restarted from the run that changed
    # One failed page is not a change point.
    one = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, (0, 0, 0, 0.2, False))
    assert one.sums["a.com"]["n1"].n > 2


def test_bandit_change_point_on_a_site_makes_its_other_pairs_worth_trying_again() -> None:
    # n1 is good and busy on a.com; n2 (free, with a good site of its own to crawl) was measured bad there 8 s ago
    # (less than PROBE_AGE: no probe). Then a run of n3's on a.com is a change point (the site changed how it treats
    # n3): n2's evidence from before the change is no longer trusted, and n2 is tried again, where it was almost
    # never before.
    def tried(with_change: bool) -> int:
        est = (SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
               .runs("a.com", "n2", *[(10, 100, 10, 6.0, True)] * 4, at=NOW - 8)
               .runs("b.com", "n2", GOOD, GOOD, GOOD).runs("a.com", "n3", GOOD, GOOD, at=NOW - 30))
        if with_change:
            est.runs("a.com", "n3", (8, 80, 0, 6.0, False), at=NOW - 5)
        assert (est.sums["a.com"]["n3"].cp == NOW - 5) is with_change
        count = 0
        for tick in range(100):
            result = BanditAllocation(seed=tick).allocate([st("s1"), st("s2", site="b.com")],
                                                          [node("n1", 0), node("n2")], est, NOW)
            count += ("s1", "n2") in {(s.id, n) for s, n in result}
        return count

    before, after = tried(False), tried(True)
    assert before < 8 and after > 3 * before + 10, (before, after)


BAD = (10, 100, 10, 6.0, True)  # 10 pages, 10 % served, 0.6 s a page


def test_bandit_probes_a_pair_not_run_for_a_while_that_could_change_its_nodes_work() -> None:
    # n1 is good on a.com and busy; n2 was measured bad there. A pair nobody runs can turn good with nothing in the
    # cluster to show it: once its evidence is PROBE_AGE old it is drawn as untried, and a draw that beats what n2
    # has to do sends one page of a subtask to look, if n2's crawl queue is empty (with work queued: the next test).
    def sent(age: float, a_best: tuple[int, int, int, float, bool] = GOOD, b_site: bool = False,
             queued: int = 0) -> Counter[int]:
        est = (SumsEstimates().runs("a.com", "n1", a_best, a_best, a_best)
               .runs("a.com", "n2", BAD, BAD, BAD, BAD, at=NOW - age).runs("b.com", "n2", GOOD, GOOD, GOOD))
        window = [st("s1"), *([st("s2", site="b.com")] if b_site else [])]
        pages: Counter[int] = Counter()
        for tick in range(20):
            n2 = replace(node("n2", 2), queued=queued)
            for s, nid in BanditAllocation(seed=tick).allocate(window, [node("n1", 0), n2], est, NOW):
                if s.site == "a.com" and nid == "n2":
                    pages[s.page_limit] += 1
        return pages

    probes = sent(bandit_module.PROBE_AGE + 10)
    assert set(probes) == {bandit_module.PROBE_PAGES} and probes[bandit_module.PROBE_PAGES] >= 12, probes
    assert sent(bandit_module.PROBE_AGE / 2)[bandit_module.PROBE_PAGES] <= 1  # seen lately: hardly ever
    # work waits at n2, which this strategy never gave a page: no probe earned (the next test)
    assert sent(bandit_module.PROBE_AGE + 10, queued=1)[bandit_module.PROBE_PAGES] <= 1
    # n2 has far better to do on b.com than anyone does on a.com: finding n2 good there would change nothing
    assert sent(bandit_module.PROBE_AGE + 10, a_best=(10, 100, 50, 2.0, True), b_site=True)[1] <= 1


@pytest.mark.parametrize("queued", [1, 0])
@pytest.mark.parametrize("own_work", [True, False])
def test_bandit_a_node_with_work_queued_probes_now_and_then_outside_the_budget(queued: int, own_work: bool) -> None:
    # n2 crawls b.com and was measured bad on a.com and c.com a minute ago, where n1 (busy) is good. A node whose
    # crawl queue never empties must still look at its stale pairs now and then (the four-node profile of
    # test_sim: before, its pair that turned good waited for the queue to empty), but not at every tick: once per
    # 1 / BUSY_PROBE_SHARE pages it is given (a slow node's pages are few), outside the exploration budget (the
    # re-opened pairs' budget). With nothing queued, a node probes on the budget, and there is none here.
    est = (SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD).runs("c.com", "n1", GOOD, GOOD, GOOD)
           .runs("a.com", "n2", BAD, BAD, BAD, BAD, at=NOW - 60).runs("c.com", "n2", BAD, BAD, BAD, BAD, at=NOW - 60)
           .runs("b.com", "n2", GOOD, GOOD, GOOD))
    strategy = BanditAllocation(seed=1)
    n2 = replace(node("n2", 3), queued=queued)
    probes, given = [], 0
    for k in range(60):  # a tick every half second for 30 s; nothing reports meanwhile
        now = NOW + k / 2
        strategy.credit = 0.0  # no budget at any tick
        own = [replace(st(f"b{k}-{i}", site="b.com"), page_limit=20) for i in range(2)] if own_work else []
        window = [st(f"a{k}"), st(f"c{k}", site="c.com"), *own]
        for s, nid in strategy.allocate(window, [node("n1", 0), n2], est, now):
            assert nid == "n2", (s, nid)
            if s.site == "b.com":
                given += s.page_limit
            else:
                assert s.page_limit == bandit_module.PROBE_PAGES, s
                probes.append((given, s.site))
    assert strategy.probed == len(probes)
    if not queued:
        assert probes == []
        return
    per_probe = 1 / bandit_module.BUSY_PROBE_SHARE  # pages given, before the first probe and between two
    assert all(b[0] - a[0] >= per_probe for a, b in zip([(0, "")] + probes, probes, strict=False)), probes
    if own_work:  # given 40 pages a tick, far more than 1 / BUSY_PROBE_SHARE pages in 30 s
        assert given >= 10 * per_probe, given
        # each stale pair once (then it is in flight: nothing reports here), the second as soon as it is earned,
        # not held back by a clock (once per PROBE_AGE until 2026-12-05: 800 pages later)
        assert {site for _, site in probes} == {"a.com", "c.com"} and len(probes) == 2, probes
        assert probes[1][0] - probes[0][0] <= 2 * per_probe, probes
    else:  # given nothing: it earned no probe
        assert probes == [], probes


@pytest.mark.parametrize("served", [9, 1])
def test_a_probe_that_collects_has_its_pair_explored_at_once_one_that_does_not_leaves_it(served: int) -> None:
    probes = explored = 0
    for tick in range(20):
        est = (SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
               .runs("a.com", "n2", BAD, BAD, BAD, BAD, at=NOW - 60))
        strategy = BanditAllocation(seed=tick)
        nodes = [node("n1", 0), node("n2")]
        if [(s.page_limit, n) for s, n in strategy.allocate([st("s1")], nodes, est, NOW)] != [(1, "n2")]:
            continue  # its draw did not beat n2's rate there
        probes += 1
        # the probe's page, 9 or 1 of 10 served, in a new mapping (copy on write, as the control's cache makes)
        est.put("a.com", "n2", update_sums(est.sums["a.com"]["n2"], pages_done=1, failed_pages=0, offered=10,
                                           collected=served, seconds=0.1, alpha=0.3, now=NOW + 1))
        got = strategy.allocate([st("s2")], nodes, est, NOW + 2)
        explored += [(s.page_limit, n) for s, n in got] == [(bandit_module.EXPLORE_PAGES, "n2")]
    assert probes >= 12
    if served == 9:  # drawn as untried, and not held back by the rest after a report (EXPLORE_REST)
        assert explored >= 0.6 * probes, (explored, probes)
    else:
        assert explored == 0


def test_bandit_never_explores_with_a_subtask_that_failed_already() -> None:
    est = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
    again = replace(st("s1"), attempt=1)
    fresh = 0
    for tick in range(50):  # n2 never ran a.com: a fresh subtask explores it often
        assert BanditAllocation(seed=tick).allocate([again], [node("n1", 0), node("n2")], est, NOW) == []
        fresh += len(BanditAllocation(seed=tick).allocate([st("s1")], [node("n1", 0), node("n2")], est, NOW))
    assert fresh > 10
    # The site's one node known to collect there failed it: it goes back there, not to a node nobody tried.
    avoiding = replace(st("s2"), attempt=1, avoid=["n1"])
    assert assigned(BanditAllocation().allocate([avoiding], [node("n1"), node("n2")], est, NOW)) == {"s2": "n1"}
    # With no candidate known to collect anything, the recalled subtask explores rather than wait.
    elsewhere = replace(st("s3", site="b.com"), attempt=1, avoid=["n1"])
    assert assigned(BanditAllocation().allocate([elsewhere], [node("n1"), node("n2")], est, NOW)) == {"s3": "n2"}


def test_bandit_sends_a_recalled_subtask_back_to_a_sites_one_suited_node_only_if_it_finishes_its_runs() -> None:
    # n1 is the one node suited to a.com, n3 is known there and unsuited (below the floor); s1 failed on n1.
    unsuited = [(10, 100, 20, 4.0, True)] * 3
    failed = (2, 100, 90, 0.2, False)  # a run ended by an error on its third page
    lucky = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD, failed).runs("a.com", "n3", *unsuited)
    failing = SumsEstimates().runs("a.com", "n1", GOOD, failed, failed, failed).runs("a.com", "n3", *unsuited)
    again = replace(st("s1"), attempt=1, avoid=["n1"])
    nodes = [node("n1"), node("n3")]
    # n1 finishes most of its runs there: one failure is bad luck, and the subtask goes back to it rather than wait
    # for its patience and go to n3.
    assert assigned(BanditAllocation().allocate([again], nodes, lucky, NOW)) == {"s1": "n1"}
    # n1 fails most of its runs there (errors at the moment): the subtask keeps away from it.
    assert assigned(BanditAllocation().allocate([again], nodes, failing, NOW)) == {"s1": "n3"}
    # Another node suited to the site is alive (busy): the subtask waits for it, as every strategy's avoid does.
    lucky.runs("a.com", "n2", GOOD, GOOD, GOOD)
    assert BanditAllocation().allocate([again], [*nodes, node("n2", 0)], lucky, NOW) == []


def test_bandit_sends_a_recalled_subtask_on_its_last_run_to_a_node_that_finishes_runs() -> None:
    # n1 (good) failed the subtask: avoided. n2 collects fast but a captcha ends every run; n3 is slow and finishes.
    blocked = [(2, 20, 19, 0.4, False)] * 6
    slow = [(10, 100, 30, 2.0, True)] * 6
    est = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD).runs("a.com", "n2", *blocked).runs("a.com", "n3", *slow)
    posts, _ = BanditAllocation().posteriors("g", "a.com", est, NOW)
    assert posts["n2"].mean > 2 * posts["n3"].mean  # by rate alone, the blocked node
    nodes = [node("n1"), node("n2"), node("n3")]
    # With runs to spare, a failure on n2 keeps what it collected and costs one of them; n3 is there for the rest.
    spare = replace(st("s1"), attempt=1, avoid=["n1"])
    assert assigned(BanditAllocation(recall_max=5).allocate([spare], nodes, est, NOW)) == {"s1": "n2"}
    # On its last run a failure dead-letters the subtask and stops its task: the node that finishes runs.
    last = replace(st("s1"), attempt=4, avoid=["n1"])
    assert assigned(BanditAllocation(recall_max=5).allocate([last], nodes, est, NOW)) == {"s1": "n3"}
    # Past its patience, the last run still waits for such a node (n3 busy here) where any free node would do for a
    # subtask with runs to spare.
    busy = [node("n1"), node("n2"), node("n3", 0)]
    aged_last, aged_spare = replace(last, since=NOW - 60), replace(spare, since=NOW - 60)
    assert BanditAllocation(recall_max=5).allocate([aged_last], busy, est, NOW) == []
    assert assigned(BanditAllocation(recall_max=5).allocate([aged_spare], busy, est, NOW)) == {"s1": "n2"}
    # With no node that finishes runs to fall back on, a run to spare is worth little on a node that never does.
    est.runs("a.com", "n3", *[(10, 100, 30, 2.0, False)] * 12)
    both = [replace(st("s2"), attempt=3, avoid=["n1"]), spare]  # s2 first in priority
    weighed = BanditAllocation(recall_max=5).allocate(both, [node("n1"), node("n2", 1), node("n3", 0)], est, NOW)
    assert assigned(weighed) == {"s1": "n2"}  # n2's one slot: the subtask with more runs to spare


class _PlainRetryBandit(BanditAllocation):
    """The bandit with the plain weighing of a recalled subtask's class: every class walks the ranking and the
    free list itself (the specification that :class:`bandit._Weighing` shares between classes)."""

    def _retry_class(self, site: Any, excluded: set[str], rates: dict[str, float], classes: dict[Any, Any],
                     runs_left: int) -> Any:
        ck = ("retry", runs_left, id(site), frozenset(excluded), *sorted(rates.items()))
        if ck not in classes:
            sums, c, fl = site.ranking.data[0], site.ranking.c, site.free_list(float("inf"))
            weighed: list[str] = []
            for _, _, nid in site.ranking.by_rate:
                if len(weighed) >= bandit_module.RETRY_SAMPLE:
                    break
                if nid not in excluded:
                    weighed.append(nid)
            i, taken = fl.first(0, site.free), 0
            while i < len(fl.rows) and taken < bandit_module.RETRY_SAMPLE:
                if fl.rows[i][2] not in excluded:
                    if fl.rows[i][2] not in weighed:
                        weighed.append(fl.rows[i][2])
                    taken += 1
                i = fl.first(i + 1, site.free)
            finishes = {nid: 1.0 - (sums[nid].fl + 0.5) / (sums[nid].n + 1.0) for nid in weighed}
            finishing: dict[str, float] = {}
            for nid, f in finishes.items():  # this run finishes, or a later one on the most reliable other node
                other = max((g for m, g in finishes.items() if m != nid), default=0.0)
                finishing[nid] = rates.get(nid, c[nid]) * (f + (1.0 - f) * (1.0 - (1.0 - other) ** (runs_left - 1)))
            classes[ck] = bandit_module._Class(site, set(excluded), finishing, float("-inf"), self.rate_floor)
        return classes[ck]


def _random_run(rng: random.Random, failed: float = 0.0) -> tuple[int, int, int, float, bool]:
    """(pages, offered, collected, seconds, ok) of a run drawn at random, failed with probability ``failed``."""
    return rng.randint(1, 10), 100, rng.randint(0, 95), rng.uniform(0.5, 4.0), rng.random() >= failed


def _random_site(rng: random.Random, nodes: int, most_runs: int = 1, failed: float = 0.0
                 ) -> tuple[SumsEstimates, list[str]]:
    """Estimates of ``nodes`` nodes on a.com, each with 1 to ``most_runs`` random runs, and the node ids."""
    est, ids = SumsEstimates(), [f"n{i}" for i in range(nodes)]
    for nid in ids:
        est.runs("a.com", nid, *[_random_run(rng, failed) for _ in range(rng.randint(1, most_runs))])
    return est, ids


def test_bandit_weighs_recalled_subtasks_as_the_plain_weighing_does() -> None:
    # Many recalled subtasks on one site, each avoiding nodes of its own (a class each), over 60 nodes that finish
    # their runs more or less often, a few of them free: the shared weighing makes exactly the plain one's choice.
    # (Where a subtask avoids every node rated at the site's floor, it waits for them: some worlds place nothing.)
    placed = 0
    for seed in range(20):
        rng = random.Random(seed)
        est, ids = _random_site(rng, 60, most_runs=6, failed=0.3)
        nodes = [node(nid, rng.choice([0, 0, 0, 1, 2])) for nid in ids]
        window = [replace(st(f"s{i}"), attempt=rng.randint(1, 3), avoid=rng.sample(ids, rng.randint(0, 20)))
                  for i in range(40)]
        plain = _PlainRetryBandit(seed=seed).allocate(window, nodes, est, NOW)
        placed += bool(plain)
        assert BanditAllocation(seed=seed).allocate(window, nodes, est, NOW) == plain, seed
    assert placed >= 15, placed


@pytest.mark.parametrize("seed", range(10))
def test_bandit_ranking_updated_in_place_is_the_sorted_one(seed: int) -> None:
    # Runs of a few nodes change between calls: their rows move in the kept ranking, which stays what sorting
    # every node's expected rate gives.
    # Each node's rate is exactly (bit for bit) what expected_rates makes of the sums under the ranking's prior,
    # whether it came from the rows kept across calls (RateTable: the prior moved) or was rated alone; a node whose
    # sums are gone leaves the ranking.
    rng = random.Random(seed)
    est, ids = _random_site(rng, 50)
    strategy = BanditAllocation(seed=seed)
    nodes = [node(nid, 0) for nid in ids[:-1]] + [node(ids[-1], 1)]
    for call in range(20):
        est.sums["a.com"] = dict(est.sums["a.com"])  # a new mapping on change, as the control's cache makes
        for nid in rng.sample(ids, rng.randint(1, 5) if call % 5 else 40):  # now and then most of them
            est.runs("a.com", nid, _random_run(rng))
        if call % 7 == 3:
            del est.sums["a.com"][rng.choice(sorted(est.sums["a.com"]))]
        strategy.allocate([st("s1")], nodes, est, NOW)
        (_, _, ranking), = strategy._rankings._kept.values()
        sums, theta0, rho0 = ranking.data[:3]
        assert ranking.c == posterior_module.expected_rates(
            sums, now=NOW, half_life=0, theta0=theta0, rho0=rho0)
        assert ranking.by_rate == sorted((-v, ranking.index[n], n) for n, v in ranking.c.items())


def test_rate_table_rates_are_expected_rates_and_its_paced_rates_expected_rate() -> None:
    # The rows rate every node as expected_rates does (the same floats), through puts of new and changed sums and
    # priors that move; a product's pace gives expected_rate's rate with that pace (its own sums' pace if the
    # product's has no pages).
    rng = random.Random(7)

    def sums() -> Sums:
        pages = rng.choice([0.0, rng.uniform(0.5, 40.0)])
        return Sums(n=rng.uniform(0.5, 5), pages=pages, got=rng.uniform(0, pages), t=NOW - rng.uniform(0, 600),
                    sec=rng.choice([0.0, rng.uniform(0, 9)]), err=rng.uniform(0, pages / 4),
                    xp=rng.uniform(0, pages / 3))

    table, kept = posterior_module.RateTable(), {}
    for step in range(300):
        nid = f"n{rng.randrange(150)}"
        kept[nid] = sums()
        table.put(nid, kept[nid], int(nid[1:]))
        theta0, rho0 = rng.choice([0.0, 0.3, 0.97, 1.0]), rng.choice([0.0, 1e-9, 0.4, 12.0])
        if step % 10 == 0:
            rates = table.rates(theta0=theta0, rho0=rho0)
            expected = posterior_module.expected_rates(kept, now=NOW, half_life=0, theta0=theta0, rho0=rho0)
            assert dict(zip(table.ids, rates.tolist(), strict=True)) == expected
            assert table.ranked(rates) == sorted((-v, int(n[1:]), n) for n, v in expected.items())
        pace = sums()
        assert table.paced(theta0=theta0, rho0=rho0)(nid, kept[nid], pace) == posterior_module.expected_rate(
            kept[nid], now=NOW, half_life=0, theta0=theta0, rho0=rho0, pace=pace)


def test_bandit_exploits_what_the_evidence_says_however_old() -> None:
    # n2 was measured bad five minutes ago. Its evidence has faded (its draws may explore it again), but its
    # expected rate is still the measured one: without exploration budget it never gets a subtask.
    est = (SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
           .runs("a.com", "n2", *[(10, 100, 10, 6.0, True)] * 6, at=NOW - 300))
    for tick in range(50):
        strategy = BanditAllocation(seed=tick)
        strategy.credit = 0.0
        assert strategy.allocate([st("s1")], [node("n1", 0), node("n2")], est, NOW) == []


def test_bandit_doctests() -> None:  # the learnt half-life
    result = doctest.testmod(bandit_module)
    assert result.attempted >= 4 and result.failed == 0


def test_bandit_learns_how_fast_evidence_fades_from_the_changes_it_sees() -> None:
    # One pair runs every second for 100 s: first without change, then changing treatment every other run.
    strategy = BanditAllocation(half_life=30.0)
    sums = None
    for t in range(1, 101):
        good = t < 50 or t % 2
        sums = update_sums(sums, pages_done=10, failed_pages=0, offered=100, collected=93 if good else 5,
                           seconds=1.0, alpha=0.3, now=float(t))
        strategy.allocate([st("s1")], [node("n1")], SumsEstimates().put("a.com", "n1", sums), float(t))
        if t == 49:
            assert strategy.changes == 0 and strategy.effective_half_life > 60  # stable: a longer memory
    assert strategy.changes > 20 and strategy.effective_half_life < 10  # changing all the time: a short one


def test_bandit_explores_within_its_budget() -> None:
    # One node known good on a.com, 20 known as good on b.com and never tried on a.com; 300 ticks of a subtask of
    # each site. Every one of the 20 has work as good as any in the window: an exploration of a.com forgoes all of it.
    # ("good" is known on b.com too, so that it does not explore b.com and leave a.com's subtask waiting.)
    est = SumsEstimates().runs("a.com", "good", GOOD, GOOD, GOOD).runs("b.com", "good", GOOD, GOOD, GOOD)
    for i in range(20):
        est.runs("b.com", f"n{i}", GOOD, GOOD, GOOD)
    nodes = [node("good"), *[node(f"n{i}") for i in range(20)]]
    strategy = BanditAllocation(explore_share=0.1, explore_timeout=0.5)
    sent: list[tuple[Subtask, str]] = []
    for tick in range(300):
        sent += strategy.allocate([st(f"s{tick}"), st(f"b{tick}", site="b.com")], nodes, est, NOW + tick)
    assert len(sent) == 600
    # Explorations crawl their subtask's first EXPLORE_PAGES pages only; exploiting assignments all 5.
    explored = [s for s, _ in sent if s.page_limit < 5]
    assert len(explored) == strategy.explored >= 1
    assert all(s.page_limit == EXPLORE_PAGES for s in explored)
    exploited = sum(s.page_limit for s, _ in sent if s.page_limit == 5)
    # The budget is in pages: the start-up's (one exploration per node) plus a tenth of the exploiting pages.
    assert EXPLORE_PAGES * len(explored) <= EXPLORE_PAGES * len(nodes) + 0.1 * exploited


def test_bandit_charges_an_exploration_what_its_node_forgoes() -> None:
    # a.com's best is "good"; b.com's "b", twice as fast (GOOD's pages in half the time). A subtask of each waits.
    fast = (10, 100, 93, 0.5, True)
    bad = (10, 100, 20, 0.5, True)  # a fifth of "fast"'s share, as fast: a fifth of b.com's best rate
    est = (SumsEstimates().runs("a.com", "good", GOOD, GOOD, GOOD).runs("b.com", "b", fast, fast, fast)
           .runs("b.com", "n2", fast, fast, fast).runs("b.com", "n3", bad, bad, bad))
    window = [st("s1"), st("b1", site="b.com")]

    def explorers(free: str, credit: float) -> Counter[str]:
        """Who explores a.com, over 40 seeds, with ``credit`` pages of budget and only ``free`` free."""
        out: Counter[str] = Counter()
        for seed in range(40):
            strategy = BanditAllocation(explore_share=0, seed=seed)
            strategy.credit = credit
            for s, nid in strategy.allocate(window, [node("good", 0), node("b", 0), node(free)], est, NOW):
                if s.site == "a.com":
                    assert s.page_limit == EXPLORE_PAGES
                    out[nid] += 1
        return out

    # n1 never ran anywhere: it has nothing in the window, an exploration forgoes nothing and needs no budget.
    assert explorers("n1", 0.0)["n1"] >= 10
    # n2 collects on b.com twice what a.com's best does: a draw on a.com that beats a.com's best but not that
    # would take it from better work; it explores only when its draw beats its rate on b.com, seldom.
    assert explorers("n2", 1e9)["n2"] <= 4
    assert explorers("n1", 1e9)["n1"] >= 10  # n1, in its place, as often as without budget
    # n3 collects a fraction of b.com's best rate, the best in the window: its explorations cost that fraction of
    # their pages (its expected rate over the best, as the exploit ranking rates them).
    sums = est.site_sums("b.com")
    rates = posterior_module.expected_rates(sums, now=NOW, half_life=0, theta0=BanditAllocation._prior(sums)[0],
                                            rho0=BanditAllocation._prior(sums)[1])
    share = rates["n3"] / rates["b"]
    assert 0.1 < share < 0.5
    assert explorers("n3", EXPLORE_PAGES * share * 0.999)["n3"] == 0
    assert explorers("n3", EXPLORE_PAGES * share * 1.001)["n3"] >= 10


def test_bandit_charges_an_exploration_what_its_subtask_forgoes_where_work_is_scarce() -> None:
    # a.com's best is "good" (the window's best work); n1 never ran anywhere, so its time forgoes nothing. Where
    # "good" has a free slot for the subtask, exploring it on n1 takes that work from "good": it costs its pages
    # at "good"'s rate (the window's best: every page), however idle n1 is. (Until 2026-12-06 it cost nothing:
    # the paper profile with 996 more nodes the profile's default serves, `scrapy experiment --sim --nodes 1000`,
    # spent most of its 20 tasks' runs exploring them, half the items of the shared queue.)
    est = SumsEstimates().runs("a.com", "good", GOOD, GOOD, GOOD)

    def explored(window: list[Subtask], good_free: int, credit: float) -> tuple[int, int]:
        """Over 40 seeds: (explorations by n1, subtasks given to "good")."""
        by_n1 = by_good = 0
        for seed in range(40):
            strategy = BanditAllocation(explore_share=0, seed=seed)
            strategy.credit = credit
            for s, nid in strategy.allocate(window, [node("good", good_free), node("n1")], est, NOW):
                by_n1 += nid == "n1" and s.page_limit == EXPLORE_PAGES
                by_good += nid == "good"
        return by_n1, by_good

    assert explored([st("s1")], good_free=0, credit=0.0)[0] >= 10  # "good" is busy: the subtask would wait
    assert explored([st("s1")], good_free=1, credit=0.0) == (0, 40)  # it would run on "good" now
    assert explored([st("s1")], good_free=1, credit=EXPLORE_PAGES * 0.999)[0] == 0
    assert explored([st("s1")], good_free=1, credit=EXPLORE_PAGES * 1.001)[0] >= 10
    # Two subtasks, one free slot on "good": the first claims it, the second would wait, and n1 explores that
    # one without budget, while "good" takes the first.
    by_n1, by_good = explored([st("s1"), st("s2")], good_free=1, credit=0.0)
    assert by_n1 >= 10 and by_good == 40


def test_bandit_spends_its_budget_on_the_explorations_that_forgo_least_first() -> None:
    # a.com's best ("good") is the window's best work; on b.com "b" is the best, "mid" collects half its rate,
    # "low" a tenth (both below the floor: neither is given b.com's subtask). Neither ran a.com, so both draw
    # above what they have. The budget holds exactly one exploration by "mid" (3 pages x what it forgoes, its
    # rate over the window's best): spent on the best draw per page it costs, it buys "low"'s first (a fifth of
    # the price), and what is left is not enough for "mid"'s. (Best draw first, "mid" took the budget whenever
    # its draw was the higher: 18 of 40 seeds, "low" 21.)
    fast, mid, low = (10, 100, 93, 0.5, True), (10, 100, 47, 0.5, True), (10, 100, 9, 0.5, True)
    est = (SumsEstimates().runs("a.com", "good", *[(10, 100, 93, 0.2, True)] * 6).runs("b.com", "b", *[fast] * 6)
           .runs("b.com", "mid", *[mid] * 6).runs("b.com", "low", *[low] * 6))
    window = [st("s1"), st("s2"), st("b1", site="b.com")]

    def rates(site: str) -> dict[str, float]:
        sums = est.site_sums(site)
        theta0, rho0 = BanditAllocation._prior(sums)
        return posterior_module.expected_rates(sums, now=NOW, half_life=0, theta0=theta0, rho0=rho0)

    b = rates("b.com")
    top = max(rates("a.com")["good"], b["b"])
    assert 0.4 < b["mid"] / b["b"] < 0.6 and 0 < b["low"] / b["b"] < 0.25
    who: Counter[str] = Counter()
    for seed in range(40):
        strategy = BanditAllocation(explore_share=0, seed=seed)
        strategy.credit = EXPLORE_PAGES * b["mid"] / top * 1.001
        sent = strategy.allocate(window, [node("good", 0), node("b", 0), node("mid"), node("low")], est, NOW)
        explorers = "".join(sorted(nid for s, nid in sent if s.site == "a.com"))
        who[explorers] += 1
    # "mid" explores only in the seeds where "low"'s draw did not beat what it has
    assert who["low"] >= 30 and who["lowmid"] == 0, who


def test_bandit_draws_a_pair_its_node_is_never_given_from_its_fading_evidence() -> None:
    # n1 was measured on a.com long ago at two thirds of a.com's best (eligible there), but it is the best on
    # b.com, a third faster than a.com's best: at half of what it has, it is never given a.com's work, so nothing
    # renews that evidence (a suited pair whose first runs were unlucky stayed written down so for the whole run).
    # Once not run for PROBE_AGE, its fading evidence is drawn from like a pair below a.com's floor: now and then
    # n1 explores a.com again. (Skipped as "exploiting it would do", it never did; drawn from as soon as it ran, it
    # was explored again and again, and some four-node worlds lost 5 % of their items.)
    def explorations(age: float) -> int:
        est = (SumsEstimates().runs("a.com", "best", *[GOOD] * 6)
               .runs("a.com", "n1", *[(10, 100, 62, 1.0, True)] * 6, at=NOW - age)
               .runs("b.com", "n1", *[(10, 100, 93, 0.75, True)] * 6))
        window = [st("s1"), st("b1", site="b.com")]
        sent = 0
        for seed in range(100):
            strategy = BanditAllocation(seed=seed)
            ranked = strategy.allocate(window, [node("best", 0), node("n1", 2)], est, NOW)
            sent += sum(s.site == "a.com" and s.page_limit == EXPLORE_PAGES for s, _ in ranked)
        return sent

    fresh, old = explorations(bandit_module.PROBE_AGE / 2), explorations(600.0)
    assert old >= 10 and fresh == 0, (fresh, old)


def test_bandit_draws_twice_as_many_free_nodes_for_a_sites_first_subtask_in_a_call() -> None:
    import random

    class Counting(random.Random):
        def sample(self, population, k, **kw):  # type: ignore[no-untyped-def,override]
            sizes.append(k)
            return super().sample(population, k, **kw)

    sizes: list[int] = []
    # a.com's one known node is busy, 40 never-tried nodes are free: every subtask is drawn for.
    est = SumsEstimates().runs("a.com", "good", GOOD, GOOD, GOOD)
    nodes = [node("good", free=0), *[node(f"n{i}") for i in range(40)]]
    strategy = BanditAllocation()
    strategy.rng = Counting(0)
    strategy.allocate([st("s1"), st("s2"), st("s3", site="b.com")], nodes, est, NOW)
    assert sizes == [2 * EXPLORE_SAMPLE, EXPLORE_SAMPLE, 2 * EXPLORE_SAMPLE]
    # 15 free nodes: the site's first subtask draws every one (no sample), its second a sample of EXPLORE_SAMPLE.
    sizes.clear()
    strategy.allocate([st("s4"), st("s5")], nodes[:2 * EXPLORE_SAMPLE], est, NOW + 60)
    assert sizes == [EXPLORE_SAMPLE]


def test_bandit_explores_a_site_nobody_knows_without_budget() -> None:
    strategy = BanditAllocation(explore_share=0)
    strategy.credit = 0.0
    result = strategy.allocate([st("s1"), st("s2", site="b.com")], [node("n1", 2)], SumsEstimates(), NOW)
    assert sorted(s.id for s, _ in result) == ["s1", "s2"]


def test_posterior_discount_widens_unused_evidence() -> None:
    s = update_sums(None, pages_done=20, failed_pages=0, offered=200, collected=40, seconds=2.0, alpha=0.3, now=0)
    fresh = Posterior.of(s, now=0, half_life=60, theta0=0.9, rho0=10)
    old = Posterior.of(s, now=600, half_life=60, theta0=0.9, rho0=10)
    assert fresh.share < 0.3 < 0.8 < old.share  # ten half-lives later, back near the prior
    assert Posterior.of(None, now=0, half_life=60, theta0=0.9, rho0=10) == Posterior.prior(0.9, 10)



def test_a_run_failed_by_errors_before_any_page_keeps_the_share_near_the_prior() -> None:
    # A suited pair's first run: its first page fails with an HTTP error, 5 more were in flight with it.
    kw = {"pages_done": 0, "failed_pages": 6, "offered": 0, "collected": 0, "seconds": 1.0, "alpha": 0.3,
          "failed": True, "fail_cost": 1.5}
    errors = update_sums(None, **kw, error_pages=6, now=7.0)
    blocked = update_sums(None, **kw, now=7.0)  # the same pages answered by captchas: all charged to the share
    # A blank run (no page crawled, every page an error): a failure, no pace (neither its pages nor its seconds)
    assert (errors.pages, errors.err, errors.xp, errors.fl, errors.sec, errors.bl) == (6.0, 5.0, 6.0, 1.0, 0.0, 7.0)
    assert (blocked.xp, blocked.sec, blocked.bl) == (0.0, 2.5, 0.0)
    post = {name: Posterior.of(s, now=7.0, half_life=60, theta0=0.9, rho0=5) for name, s in
            (("errors", errors), ("blocked", blocked))}
    assert post["errors"].share == pytest.approx((3 * 0.9) / 4)  # only the page that failed counts against it
    assert post["blocked"].share == pytest.approx((3 * 0.9) / 9)
    assert post["errors"].pace == pytest.approx(5.0)  # the prior's: errors coming back say nothing of the pace
    assert post["blocked"].pace == pytest.approx(9 / (3 / 5 + 2.5))  # captchas are served pages: their time counts
    # A run that crawled pages before its error is evidence of its share and pace as before.
    some = update_sums(None, **{**kw, "pages_done": 3, "offered": 30, "collected": 30}, error_pages=6)
    assert (some.err, some.xp, some.sec, some.bl) == (0.0, 0.0, 2.5, 0.0)
    # Blank runs fade with the others; the next run keeps the time of the last blank one.
    after = update_sums(errors, pages_done=2, failed_pages=0, offered=20, collected=18, seconds=0.3, alpha=0.3,
                        now=9.0)
    assert (after.xp, after.bl) == (pytest.approx(0.7 * 6.0), 7.0)


def test_bandit_explores_a_pair_again_once_its_exploration_ran_blank() -> None:
    # n1 is known good and busy; n2 never ran a.com. An exploration of n2 is in flight for the recall age (20 s)
    # unless its run reports blank: then n2 is as unexplored as before, and its draws decide again at once. Any
    # other failure (here its pages blocked) keeps the pair locked.
    base = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
    kw = {"pages_done": 0, "failed_pages": 5, "offered": 0, "collected": 0, "seconds": 0.3, "alpha": 0.3,
          "failed": True, "fail_cost": 0.75, "now": NOW + 1}
    again = Counter()
    for tick in range(60):
        for name, errors in (("blank", 5), ("blocked", 0)):
            strategy = BanditAllocation(seed=tick, explore_timeout=20.0)
            nodes = [node("n1", 0), node("n2")]
            if assigned(strategy.allocate([st("s1")], nodes, base, NOW)) != {"s1": "n2"}:
                continue
            est = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
            est.put("a.com", "n2", update_sums(None, **kw, error_pages=errors))
            for t in (2, 3, 4, 5):
                if assigned(strategy.allocate([st(f"s{t}")], nodes, est, NOW + t)).get(f"s{t}") == "n2":
                    again[name] += 1
                    break
    assert again["blocked"] == 0 and again["blank"] > 5, again


def test_bandit_explores_a_pair_again_a_rest_after_its_exploration_reported_not_a_recall_age() -> None:
    # As above, but n2's exploration crawls one page and then meets an error (an unlucky first look at a pair about
    # to turn good): not blank, so the pair stays locked while the report is fresh, and is drawn again
    # EXPLORE_REST seconds after it, long before the recall age (60 s) lets the lock lapse.
    base = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
    unlucky = update_sums(None, pages_done=1, failed_pages=2, error_pages=2, offered=10, collected=2, seconds=0.3,
                          alpha=0.3, failed=True, now=NOW + 1)
    again = Counter()
    for tick in range(60):
        strategy = BanditAllocation(seed=tick, explore_timeout=60.0)
        nodes = [node("n1", 0), node("n2")]
        if assigned(strategy.allocate([st("s1")], nodes, base, NOW)) != {"s1": "n2"}:
            continue
        est = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
        est.put("a.com", "n2", unlucky)
        for t in (2, 3, 4, 5, 6, 1 + EXPLORE_REST, 2 + EXPLORE_REST, 3 + EXPLORE_REST, 4 + EXPLORE_REST):
            if assigned(strategy.allocate([st(f"s{t}")], nodes, est, NOW + t)).get(f"s{t}") == "n2":
                again["fresh" if t < 1 + EXPLORE_REST else "rested"] += 1
                break
    assert again["fresh"] == 0 and again["rested"] > 5, again


def test_bandit_draws_for_a_pair_whose_only_run_was_blank_even_above_the_floor() -> None:
    # n1 is known good and free; n2's only run was blank (its first page an HTTP error): rated at 3/4 of the prior,
    # above the floor, so the exploit matching always prefers n1, and without a draw n2 would never run a.com
    # again (one unlucky world kept such a good pair unused for the rest of its run). Its draws decide, as an untried
    # pair's would; n3, as well rated by runs that crawled, is left to the exploit matching.
    blank = update_sums(None, pages_done=0, failed_pages=3, error_pages=3, offered=0, collected=0, seconds=0.3,
                        alpha=0.3, failed=True, now=NOW)
    crawled = update_sums(None, pages_done=4, failed_pages=0, offered=40, collected=28, seconds=0.53, alpha=0.3,
                          now=NOW)
    got = Counter()
    for tick in range(60):
        strategy = BanditAllocation(seed=tick)
        for nid, sums in (("n2", blank), ("n3", crawled)):
            est = SumsEstimates().runs("a.com", "n1", GOOD, GOOD, GOOD)
            est.put("a.com", nid, sums)
            posts, _ = strategy.posteriors("", "a.com", est, NOW + 1)
            assert strategy.rate_floor * posts["n1"].mean <= posts[nid].mean < posts["n1"].mean, (nid, posts)
            got[nid] += assigned(strategy.allocate([st("s1")], [node("n1"), node(nid)], est, NOW + 1)) == {"s1": nid}
    assert got["n2"] > 5 and got["n3"] == 0, got


def test_bandit_gives_work_to_a_node_that_would_start_it_at_once_before_queueing_it_behind_the_best() -> None:
    # n1 is the best on a.com (0.1 s a page), n2 nearly as good (0.12 s), n3 far slower (below the floor) and with
    # work of its own waiting (else it is spare: see the next test). Both n1 and n2 have free slots. With n1's
    # crawl queue already holding AHEAD subtasks, the next go to n2, which would start them at once; beyond AHEAD
    # there, they wait in n1's queue (the second pass, by rate), never on n3.
    fast, near, slow = (10, 100, 93, 1.0, True), (10, 100, 93, 1.2, True), (10, 100, 93, 5.0, True)
    est = (SumsEstimates().runs("a.com", "n1", *[fast] * 4).runs("a.com", "n2", *[near] * 4)
           .runs("a.com", "n3", *[slow] * 4))

    def nodes(n1_queued: int) -> list[NodeView]:
        return [NodeView(id="n1", types=[0], free=4, queued=n1_queued), NodeView(id="n2", types=[0], free=4),
                NodeView(id="n3", types=[0], free=4, queued=1)]

    def run(subtasks: list[Subtask], n1_queued: int) -> dict[str, str]:
        strategy = BanditAllocation(explore_share=0)
        strategy.credit = 0.0
        return assigned(strategy.allocate(subtasks, nodes(n1_queued), est, NOW))

    more = [st(f"s{i}") for i in range(1, AHEAD + 2)]
    assert run([st("s1")], 0) == {"s1": "n1"}  # nothing queued anywhere: the best
    assert run([st("s1")], AHEAD) == {"s1": "n2"}  # n1 has its AHEAD waiting: n2 starts it now
    # n2 takes AHEAD, the one after them waits in n1's queue (the second pass, by rate), never n3's
    assert run(more, AHEAD) == {**{s.id: "n2" for s in more[:AHEAD]}, more[-1].id: "n1"}
    # AHEAD each to keep them busy, the best first
    assert run(more, 0) == {**{s.id: "n1" for s in more[:AHEAD]}, more[-1].id: "n2"}


def test_bandit_gives_work_its_best_nodes_have_queued_enough_of_to_a_node_that_runs_dry_if_as_complete() -> None:
    # n1 is the best on a.com (0.1 s a page) and has AHEAD subtasks waiting in its queue; n2 is five times slower
    # with the same share (below the floor), n3 faster than n2 but served a tenth of the results (below the floor
    # too). Neither has anything waiting. The subtasks n1 cannot start soon go to n2, one each call (it then has
    # work waiting), never to n3 (its pages lose nine results in ten); with n2 busy, they queue behind n1.
    fast, slow, thin = (10, 100, 93, 1.0, True), (10, 100, 93, 5.0, True), (10, 100, 10, 3.0, True)
    est = (SumsEstimates().runs("a.com", "n1", *[fast] * 4).runs("a.com", "n2", *[slow] * 4)
           .runs("a.com", "n3", *[thin] * 4))

    def run(n1_queued: int, n2_queued: int = 0, n2_held: int = 0) -> dict[str, str]:
        strategy = BanditAllocation(explore_share=0)
        strategy.credit = 0.0
        nodes = [NodeView(id="n1", types=[0], free=4, queued=n1_queued, held=2),
                 NodeView(id="n2", types=[0], free=4, queued=n2_queued, held=n2_held),
                 NodeView(id="n3", types=[0], free=4)]
        return assigned(strategy.allocate([st("s1"), st("s2")], nodes, est, NOW))

    assert run(0) == {"s1": "n1", "s2": "n1"}  # room ahead at the best: it waits for it
    assert run(AHEAD) == {"s1": "n2", "s2": "n1"}  # the best has enough waiting: the first to n2, busy or not
    assert run(AHEAD, n2_held=3) == {"s1": "n2", "s2": "n1"}
    assert run(AHEAD, n2_queued=1) == {"s1": "n1", "s2": "n1"}  # n2 has work waiting: behind the best


def test_bandit_gives_work_to_an_idle_node_before_a_busy_one_whose_queue_is_empty() -> None:
    # A real node takes a subtask as soon as fewer pages wait in it than its slots start, so a busy node's crawl
    # queue is empty most of the time; what it held at its last heartbeat says it is busy. n1 is the best on a.com,
    # n2 nearly as good: while n1 holds subtasks, the next goes to n2 if n2 holds none, however empty n1's queue.
    fast, near = (10, 100, 93, 1.0, True), (10, 100, 93, 1.2, True)
    est = SumsEstimates().runs("a.com", "n1", *[fast] * 4).runs("a.com", "n2", *[near] * 4)

    def run(subtasks: list[Subtask], n1_held: int, n2_held: int, n2_queued: int = 0) -> dict[str, str]:
        strategy = BanditAllocation(explore_share=0)
        strategy.credit = 0.0
        nodes = [NodeView(id="n1", types=[0], free=4, held=n1_held),
                 NodeView(id="n2", types=[0], free=4, held=n2_held, queued=n2_queued)]
        return assigned(strategy.allocate(subtasks, nodes, est, NOW))

    assert run([st("s1")], 3, 0) == {"s1": "n2"}  # n1 busy, n2 idle: n2 starts it now
    assert run([st("s1")], 3, 3) == {"s1": "n1"}  # both busy: the best
    assert run([st("s1")], 0, 0) == {"s1": "n1"}  # both idle: the best
    assert run([st("s1")], 3, 0, n2_queued=1) == {"s1": "n1"}  # n2 has work waiting: not idle, the best
    # the idle node takes AHEAD; the next waits in the best's queue, as when nobody is idle
    more = [st(f"s{i}") for i in range(1, AHEAD + 2)]
    assert run(more, 3, 0) == {**{s.id: "n2" for s in more[:AHEAD]}, more[-1].id: "n1"}


def test_bandit_weighs_no_more_of_a_sites_subtasks_than_its_free_nodes_can_take() -> None:
    # a.com: n1 good with one free slot, n2 as good and full, n3 below the floor with free slots. Ten fresh
    # subtasks of a.com wait first (their site's nodes are busy: that is why they wait), one past its patience, and
    # five of b.com, where nobody ran. Only the free room of a.com's eligible nodes (n1's slot) and EXPLORE_ROOM
    # more of its fresh subtasks are weighed; the aged one (any node will do), the recalled one (its class weighs
    # nodes of its own) and every one of b.com are.
    slow = (10, 100, 93, 5.0, True)
    est = SumsEstimates().runs("a.com", "n1", *[GOOD] * 4).runs("a.com", "n2", *[GOOD] * 4) \
        .runs("a.com", "n3", *[slow] * 4)
    strategy = BanditAllocation(explore_share=0)
    strategy.credit = 0.0
    weighed: list[str] = []
    inner = strategy._class

    def spy(site: Any, group: str, *args: Any, **kwargs: Any) -> Any:
        weighed.append(group)
        return inner(site, group, *args, **kwargs)

    strategy._class = spy  # type: ignore[method-assign]
    window = [*[st(f"a{i}", group=f"a{i}") for i in range(10)],
              st("old", group="old", since=NOW - strategy.patience - 1),
              replace(st("again", group="again"), attempt=1),  # recalled: its own nodes weighed (_retry_class)
              *[st(f"b{i}", site="b.com", group=f"b{i}") for i in range(5)]]
    result = assigned(strategy.allocate(window, [node("n1", 1), node("n2", 0), node("n3", 3)], est, NOW))
    assert weighed == [*[f"a{i}" for i in range(1 + EXPLORE_ROOM)], "old", "again", *[f"b{i}" for i in range(5)]]
    # b.com's first goes first (an exploration of a site nobody knows), the aged one to the node left
    assert result == {"b0": "n1", "b1": "n3", "old": "n3"}


def test_a_sites_maxima_kept_from_the_nodes_that_changed_are_those_of_a_scan() -> None:
    # The bandit's prior (best share, best pace) and a site's latest change point, kept by SiteMax from the nodes
    # each new mapping names, against a scan of every node: runs that raise and lower the best, nodes that go,
    # mappings skipped (not read: the next one does not name its changes relative to the last one read).
    rng = random.Random(11)
    summary = bandit_module._SiteSummary()
    sums = posterior_module.SiteSums()
    reads = 0
    for step in range(600):
        sums = sums.successor()
        for _ in range(rng.randint(0, 4)):
            node = f"n{rng.randrange(12)}"
            if rng.random() < 0.1:
                sums.put(node, None)
            else:
                pages = rng.choice([0.0, 1.0, 3.0, 10.0])
                sums.put(node, Sums(n=1.0, pages=pages, got=rng.uniform(0, pages), sec=rng.choice([0.0, 0.5, 2.0]),
                                    xp=rng.choice([0.0, pages]), cp=rng.choice([0.0, float(step)])))
        if rng.random() < 0.7:
            reads += 1
            paced = [(s.pages - s.xp, s.pace) for s in sums.values() if s.pace is not None]
            sure = [pace for pages, pace in paced if pages >= posterior_module.PRIOR_WEIGHT] or [p for _, p in paced]
            scanned = (max((s.got + 0.5) / (s.pages + 1.0) for s in sums.values()), max(sure, default=1.0)) \
                if sums else (0.5, 1.0)
            assert summary.prior(sums) == scanned == BanditAllocation._prior(sums), f"step {step}"
            assert (summary.cp.value(sums) or 0.0) == max((s.cp for s in sums.values()), default=0.0)
    assert reads > 300
