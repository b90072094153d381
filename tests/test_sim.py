"""Tests of the cluster simulator (scheduler_ext/sim), the upper bound and ``scrapy experiment --sim``.

The simulator's estimates must be the finish script's: a test runs the same runs through ``lua/finish.lua`` on a
real Redis and through :class:`MemoryEstimates`, and compares. The bound must bound: no simulated schedule collects
more. And the simulator must agree with real runs: a short real experiment on the paper profile, its ratio compared
with the simulator's.
"""

from __future__ import annotations

import gc
import io
import itertools
import json
import multiprocessing
import os
import random
import signal
import statistics
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import run_scrapy

from product_crawl.experiment.runner import Progress
from scheduler_ext import control as control_module
from scheduler_ext.control import Decision, Entry, EstimateCache, Snapshot, backing_off
from scheduler_ext.keys import Keys
from scheduler_ext.models import Report, Subtask, Task
from scheduler_ext.sim import FREE_CONTROL, Behaviour, ControlModel, NodeModel, SimNode, Simulation, TaskSpec
from scheduler_ext.sim import engine as engine_module
from scheduler_ext.sim.bound import MACHINE, MACHINE_NODE, SiteWork, assign, best_possible, machine_assign
from scheduler_ext.sim.configs import CONFIGS
from scheduler_ext.sim.estimates import MemoryEstimates
from scheduler_ext.sim.families import FAMILIES, generate
from scheduler_ext.store import Store, Write
from scheduler_ext.strategies import Allocation, NodeView
from scheduler_ext.strategies.posterior import GROUP_NODES, changed_since


@pytest.fixture
def store(redis, prefix: str) -> Store:  # type: ignore[no-untyped-def]
    return Store(redis, Keys(prefix))

# --- the estimates are the finish script's ------------------------------------------------------------------------

RUNS = [  # offered, collected, pages, seconds, ok, attempted, node seconds: good runs, a captcha run (4 block pages in
    # flight), a change point to bad (a report without counts: charged its pages and the failing one), a timeout (2
    # pages cut), two runs of a node that measures its node time (charged instead of the seconds, and no recall for
    # the failed one), a run whose first page failed with an error, 2 more in flight (left out of the share:
    # Sums.err; a blank run: left out of the pace too, Sums.xp and Sums.bl)
    (100, 90, 10, 2.0, True, 10, None), (50, 47, 5, 1.1, True, 5, None), (0, 0, 0, 0.4, False, 4, None),
    (80, 10, 8, 5.0, False, None, None), (30, 4, 3, 2.5, True, 5, None), (100, 92, 10, 3.0, True, 10, 0.21),
    (40, 30, 4, 2.0, False, 6, 0.35), (0, 0, 0, 6.0, True, 0, None), (0, 0, 0, 0.5, False, 3, None),
]


def test_memory_estimates_match_the_finish_script(store: Store) -> None:
    k = store.keys
    mem = MemoryEstimates(alpha=0.3, fail_cost=1.0)
    for i, (offered, collected, pages, seconds, ok, attempted, node_seconds) in enumerate(RUNS):
        st = Subtask(id=f"s{i}", task="t", site="a.com", group="milk", first_page=0, page_limit=10, time_limit=30)
        store.redis.lpush(k.crawl("n1"), st.to_json())
        taken = store.take("n1", 30.0, 10.0)
        assert taken is not None
        report = Report(subtask=st, node="n1", outcome="done" if ok else "failed", offered=offered,
                        collected=collected, pages=pages)
        blocked = 4 if i == 2 else 0
        errors = (pages + (0 if ok else 1) if attempted is None else attempted) - pages - blocked
        assert store.finish(st.id, taken[1], report.to_json(), node="n1", site="a.com", group="milk",
                            offered=offered, collected=collected, pages=pages, seconds=seconds, ok=ok, alpha=0.3,
                            runs_maxlen=100, attempted=attempted, fail_cost=1.0, errors=errors,
                            node_seconds=node_seconds)
        sec_before = mem.sites["a.com"]["n1"].sums.sec if i else 0.0  # type: ignore[union-attr]
        mem.finish(site="a.com", group="milk", node="n1", offered=offered, collected=collected, pages=pages,
                   seconds=seconds, ok=ok, now=float(i + 1), attempted=attempted, blocked=blocked,
                   node_seconds=node_seconds)
        lua = json.loads(store.redis.hget(k.est_site("a.com"), "n1"))
        py = mem.sites["a.com"]["n1"]
        assert py.sums is not None
        fields = (lua["n"], lua["pg"], lua["got"], lua["sec"], lua["fl"], lua["err"], lua["xp"],
                  lua.get("cp", 0.0) > 0, lua.get("bl", 0.0) > 0)
        s = py.sums
        assert fields == pytest.approx((s.n, s.pages, s.got, s.sec, s.fl, s.err, s.xp, s.cp > 0, s.bl > 0)), \
            f"after run {i}"
        assert (lua.get("c"), lua.get("spp"), lua["runs"]) == pytest.approx((py.c, py.spp, py.runs))
        group = json.loads(store.redis.hget(k.est_group_site("milk", "a.com"), "n1"))
        assert group["pg"] == pytest.approx(mem.groups[("milk", "a.com")]["n1"].sums.pages)  # type: ignore[union-attr]
        if node_seconds is not None:  # the pace is charged the node time, not the seconds nor the recall
            assert s.sec == pytest.approx((0.7 * sec_before if s.n > 1 else 0.0) + node_seconds)  # n 1: restarted
        if i == 2:  # 4 block pages after runs that collected ~90 %: a change point, the sums restarted from it
            assert (py.sums.n, py.sums.pages, py.sums.got) == (1.0, 4.0, 0.0)
    # The control reads the same sums (EstimateCache, the bandit's EstimateSums protocol), and follows new runs.
    cache = EstimateCache(store)
    got = cache.site_sums("a.com")["n1"]
    mine = mem.site_sums("a.com")["n1"]
    assert (got.n, got.pages, got.got, got.sec, got.fl, got.err, got.xp, got.bl > 0) == pytest.approx(
        (mine.n, mine.pages, mine.got, mine.sec, mine.fl, mine.err, mine.xp, True)) and mine.fl > 0 and mine.err > 0
    assert cache.group_sums("milk", "a.com")["n1"].pages == pytest.approx(mem.group_sums("milk", "a.com")["n1"].pages)


def test_group_figures_keep_the_nodes_that_ran_the_product_last(store: Store) -> None:
    """est:gs keeps GROUP_NODES nodes' figures per (product, site), those of the nodes that ran it most recently,
    in the finish script and in the simulator alike, and the control's cache drops the ones that go."""
    k = store.keys
    mem = MemoryEstimates(alpha=0.3)
    cache = EstimateCache(store)
    order = [f"n{i}" for i in range(GROUP_NODES + 2)] + ["n0", "n5"]
    # fields the finish script did not write (not JSON, a time that is not finite): the first to go, no error
    store.redis.hset(k.est_group_site("milk", "a.com"), mapping={"bad1": '{"last": 1e999}', "bad2": "not json"})
    for i, node in enumerate(order):
        st = Subtask(id=f"s{i}", task="t", site="a.com", group="milk", first_page=0, page_limit=10, time_limit=30)
        store.redis.lpush(k.crawl(node), st.to_json())
        taken = store.take(node, 30.0, 10.0)
        assert taken is not None
        report = Report(subtask=st, node=node, outcome="done", offered=50, collected=45, pages=5)
        assert store.finish(st.id, taken[1], report.to_json(), node=node, site="a.com", group="milk", offered=50,
                            collected=45, pages=5, seconds=1.0, ok=True, alpha=0.3, runs_maxlen=100)
        mem.finish(site="a.com", group="milk", node=node, offered=50, collected=45, pages=5, seconds=1.0, ok=True,
                   now=float(i + 1))
        if i == GROUP_NODES - 1:  # the control has read the hash whole, with every node in it
            assert set(cache.group_sums("milk", "a.com")) == set(order[:GROUP_NODES])
            store.redis.delete(k.est_dirty)
    recent = list(dict.fromkeys(reversed(order)))[:GROUP_NODES]  # n5, n0, then the last ones run
    assert set(store.redis.hkeys(k.est_group_site("milk", "a.com"))) == set(recent)
    assert set(mem.group_sums("milk", "a.com")) == set(mem.groups[("milk", "a.com")]) == set(recent)
    assert len(store.redis.hkeys(k.est_site("a.com"))) == len(set(order))  # the site's figures keep every node
    fields = cache.changed(store.redis.smembers(k.est_dirty))
    with store.redis.pipeline(transaction=False) as pipe:
        cache.queue_reads(fields, pipe)
        cache.update(fields, pipe.execute())
    assert set(cache.group_sums("milk", "a.com")) == set(cache.group_figures("milk", "a.com")) == set(recent)


def test_the_controls_cache_tells_which_nodes_of_a_site_changed(store: Store) -> None:
    """A tick's refresh gives a changed site a new mapping (SiteSums) naming the nodes that changed since the one
    it replaced, so that readers look at those only; a mapping two refreshes old is not told (None: compare)."""
    k = store.keys
    cache = EstimateCache(store)

    def run(node: str, i: int, collected: int) -> None:
        st = Subtask(id=f"s{i}", task="t", site="a.com", group="milk", first_page=0, page_limit=10, time_limit=30)
        store.redis.lpush(k.crawl(node), st.to_json())
        taken = store.take(node, 30.0, 10.0)
        assert taken is not None
        report = Report(subtask=st, node=node, outcome="done", offered=50, collected=collected, pages=5)
        assert store.finish(st.id, taken[1], report.to_json(), node=node, site="a.com", group="milk", offered=50,
                            collected=collected, pages=5, seconds=1.0, ok=True, alpha=0.3, runs_maxlen=100)

    def refresh() -> None:
        fields = cache.changed(store.redis.smembers(k.est_dirty))
        with store.redis.pipeline(transaction=False) as pipe:
            cache.queue_reads(fields, pipe)
            cache.update(fields, pipe.execute())
        store.redis.delete(k.est_dirty)

    for i, node in enumerate(["n1", "n2", "n3"]):
        run(node, i, 45)
    first = cache.site_sums("a.com")
    store.redis.delete(k.est_dirty)
    assert set(first) == {"n1", "n2", "n3"} and changed_since(first, {}) is None
    run("n2", 3, 5)
    run("n4", 4, 40)
    refresh()
    second = cache.site_sums("a.com")
    assert second is not first and changed_since(second, first) == {"n2", "n4"}
    assert second["n1"] is first["n1"] and second["n2"].got < first["n2"].got and set(first) == {"n1", "n2", "n3"}
    store.redis.hdel(k.est_site("a.com"), "n3")  # a field gone (by hand), marked as the finish script marks
    store.redis.sadd(k.est_dirty, "s|n3|a.com")
    refresh()
    third = cache.site_sums("a.com")
    assert set(third) == {"n1", "n2", "n4"} and changed_since(third, second) == {"n3"}
    assert changed_since(third, first) is None and changed_since(third, third) == set()


# --- the bound ------------------------------------------------------------------------------------------------------

def test_assign_is_the_best_assignment() -> None:
    rng = random.Random(7)
    for _ in range(40):
        nodes, sites = [f"n{i}" for i in range(rng.randint(1, 5))], [f"s{j}" for j in range(rng.randint(1, 4))]
        rates = {n: {s: rng.choice([0.0, rng.uniform(0.1, 10)]) for s in sites} for n in nodes}
        rates = {n: {s: r for s, r in per.items() if r > 0} for n, per in rates.items()}
        caps = {s: rng.randint(0, 2) for s in sites}
        value, chosen = assign(rates, caps)
        assert all(sum(1 for v in chosen.values() if v == s) <= caps[s] for s in sites)
        assert value == pytest.approx(sum(rates[n][s] for n, s in chosen.items()))
        best = 0.0  # brute force: every node picks a site or nothing
        for pick in itertools.product(*[[None, *per] for per in rates.values()]):
            if all(sum(1 for p in pick if p == s) <= caps[s] for s in sites):
                best = max(best, sum(rates[n][p] for n, p in zip(rates, pick, strict=True) if p is not None))
        assert value == pytest.approx(best)


def test_machine_bound_is_above_every_schedule_that_fits_the_machine_and_below_the_unshared_one() -> None:
    rng = random.Random(11)
    for _ in range(30):
        nodes, sites = [f"n{i}" for i in range(rng.randint(1, 4))], [f"s{j}" for j in range(rng.randint(1, 3))]
        rates = {n: {s: rng.uniform(0.5, 10) for s in sites if rng.random() < 0.8} for n in nodes}
        cpu = {n: {s: rng.uniform(0.05, 1.0) for s in per} for n, per in rates.items()}
        caps, cores = {s: rng.randint(1, 2) for s in sites}, rng.uniform(0.2, 2.0)
        bound, chosen, lam = machine_assign(rates, cpu, caps, cores)
        assert lam >= 0 and bound <= assign(rates, caps)[0] + 1e-9
        # Every integral assignment, slowed down until it fits the machine, is a feasible schedule.
        for pick in itertools.product(*[[None, *per] for per in rates.values()]):
            if all(sum(1 for p in pick if p == s) <= caps[s] for s in sites):
                used = [(n, p) for n, p in zip(rates, pick, strict=True) if p is not None]
                load = sum(cpu[n][p] for n, p in used)
                value = sum(rates[n][p] for n, p in used) * (min(1.0, cores / load) if load else 1.0)
                assert value <= bound + 1e-6


def test_machine_constants_are_the_measured_ones() -> None:
    measured = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results"
                           / "bench_machine.json").read_text(encoding="utf-8"))
    assert (MACHINE.page_cpu, MACHINE.item_cpu, MACHINE.cores) == (measured["page_cpu"], measured["item_cpu"],
                                                                  measured["cores"])
    assert (MACHINE_NODE.page_cpu, MACHINE_NODE.item_cpu) == (measured["node_page_cpu"], measured["node_item_cpu"])


def _tasks(world_sites: list[str], products: int, seed: int) -> list[TaskSpec]:
    rng = random.Random(seed)
    return [TaskSpec(f"p{p}", s, rng.randint(2000, 20000)) for p in range(products) for s in world_sites]


@pytest.mark.parametrize("family", ["specialists", "drift", "captcha", "churn"])
def test_no_simulated_schedule_beats_the_bound(family: str) -> None:
    world = generate(family, nodes=6, sites=5, duration=120, seed=3)
    tasks = _tasks(world.sites, 4, 3)
    work = {s: SiteWork(0, sum(1 for t in tasks if t.site == s), sum(t.results for t in tasks if t.site == s))
            for s in world.sites}
    bound = best_possible(world, world.nodes, work, 120)["items"]  # the simulator's own node model
    # No looser than the bound of nodes alone on a core each (7 ms a page, items free: the bound before the node
    # model; where the pages' latency binds, as in these worlds at 10 ms a page, the two are equal).
    assert bound <= best_possible(world, world.nodes, work, 120, NodeModel(page_cpu=0.007, item_cpu=0.0))["items"]
    assert best_possible(world, world.nodes, work, 120, NodeModel(page_cpu=0.05))["items"] < bound  # CPU-bound
    for name, make in CONFIGS.items():
        allocation, modification, recall = make(0)
        raw = Simulation(world, world.nodes, tasks, allocation=allocation, modification=modification,
                         recall=recall, duration=120, seed=0).run()
        assert 0 < raw["samples"][-1]["items"] <= bound, name


# --- the simulator ---------------------------------------------------------------------------------------------------

def _run(name: str, family: str, seed: int, duration: float = 120, nodes: int = 6, sites: int = 5,
         products: int = 4) -> dict:
    world = generate(family, nodes=nodes, sites=sites, duration=duration, seed=seed)
    allocation, modification, recall = CONFIGS[name](seed)
    return Simulation(world, world.nodes, _tasks(world.sites, products, seed), allocation=allocation,
                      modification=modification, recall=recall, duration=duration, seed=seed).run()


def test_a_simulation_is_reproducible_and_samples_like_a_real_run() -> None:
    a, b = _run("bandit", "specialists", 1, 60), _run("bandit", "specialists", 1, 60)
    assert a["samples"] == b["samples"] and a["items_by_node"] == b["items_by_node"]
    last = a["samples"][-1]
    assert last["t"] == 60 and last["items"] == sum(a["items_by_node"].values()) > 0
    pair = next(iter(last["pairs"].values()))
    assert len(pair) == 6 and pair[0] >= pair[1] >= 0  # offered, collected, runs, pages, estimate, pace
    assert all(p[5] is None or p[5] > 0 for p in last["pairs"].values())
    assert any(p[5] is not None for p in last["pairs"].values())


class _Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_simulation_collects_its_cycles_apart_and_gives_the_collector_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # The automatic collector is off while a simulation runs (its passes over the run's heap were a fifth of a large
    # run's CPU); the cycles made meanwhile are freed by the run's own collections, every COLLECT_EVERY simulated
    # seconds; after the run the collector is on again and nothing stays frozen.
    monkeypatch.setattr(engine_module, "COLLECT_EVERY", 10.0)
    world = generate("specialists", nodes=2, sites=2, duration=40, seed=0)
    allocation, modification, recall = CONFIGS["bandit"](0)
    made: list[tuple[float, weakref.ref[_Cycle]]] = []
    during: list[bool] = []
    alive_later: list[bool] = []  # a cycle made 6 s before a sample, still there (no collection in between)
    dead_later: list[bool] = []  # a cycle made 20 s before a sample (a collection in between), freed

    def sample(s: dict[str, Any]) -> None:
        t = s["t"]
        during.append(gc.isenabled())
        alive_later.extend(ref() is not None for t0, ref in made if t - t0 == 6.0 and t % 10 > 6)
        dead_later.extend(ref() is None for t0, ref in made if t - t0 >= 20.0)
        made.append((t, weakref.ref(_Cycle())))

    assert gc.isenabled()
    Simulation(world, world.nodes, _tasks(world.sites, 2, 0), allocation=allocation, modification=modification,
               recall=recall, duration=40, seed=0, sample_interval=3.0, on_sample=sample).run()
    assert during and not any(during)
    assert alive_later and all(alive_later) and dead_later and all(dead_later)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def _prefetches(heartbeat: float) -> tuple[set[int], int]:
    """Every prefetch value a 20 s run of a small world shows, sampled every 0.25 s, and the adaptive minimum."""
    world = generate("specialists", nodes=3, sites=3, duration=20, seed=0)
    allocation, modification, recall = CONFIGS["bandit"](0)
    seen: set[int] = set()
    sims: list[Simulation] = []
    sims.append(Simulation(world, world.nodes, _tasks(world.sites, 4, 0), allocation=allocation,
                           modification=modification, recall=recall, duration=20, seed=0, sample_interval=0.25,
                           heartbeat=heartbeat, on_sample=lambda _: seen.update(sims[0].prefetch.values())))
    sims[0].run()
    return seen, sims[0].prefetch_min


def test_a_node_re_paces_its_prefetch_at_its_heartbeats_only() -> None:
    # The real node measures its take rate over a heartbeat interval and advertises the prefetch it sizes at each
    # heartbeat; between them only a starved node's doubling moves it. So with heartbeats far apart every
    # prefetch seen is prefetch_min x a power of two, and with frequent ones it follows the take rate.
    rare, low = _prefetches(1000.0)
    assert rare <= {low * 2 ** k for k in range(8)} and len(rare) > 1
    often, _ = _prefetches(0.5)
    assert often - {low * 2 ** k for k in range(8)}  # paced by the rate: other values too


class _OneATick(Allocation):
    """Gives the first waiting subtask to the first node with a free slot, one a tick: a control that holds work
    back (as the bandit does for a better node) and never fills what a node asks for."""

    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Any,
                 now: float) -> list[tuple[Subtask, str]]:
        free = [n.id for n in nodes if n.free > 0]
        return [(subtasks[0], free[0])] if subtasks and free else []


def test_a_node_asks_for_more_only_once_it_got_what_it_asked_for() -> None:
    # A busy node whose crawl queue runs dry doubles its prefetch, but only once it has taken a whole prefetch
    # since the prefetch last changed: a node the control feeds one subtask a tick asked for more at every refill
    # interval before (up to 16 between two heartbeats), which at 1,000 nodes only widened every tick's window.
    world = generate("specialists", nodes=1, sites=1, duration=30, seed=0)
    _, modification, recall = CONFIGS["bandit"](0)
    seen: set[int] = set()
    sims: list[Simulation] = []
    sims.append(Simulation(world, world.nodes, _tasks(world.sites, 40, 0), allocation=_OneATick(),
                           modification=modification, recall=recall, duration=30, seed=0, wake=0.0,
                           sample_interval=0.1, on_sample=lambda _: seen.update(sims[0].prefetch.values())))
    raw = sims[0].run()
    assert raw["allocated"] >= 50  # one a tick (0.5 s), every one taken at once: the queue ran dry all along
    assert max(seen) <= 4 * sims[0].prefetch_min, sorted(seen)
    fed = Simulation(world, world.nodes, _tasks(world.sites, 40, 0), allocation=CONFIGS["fifo"](0)[0],
                     modification=modification, recall=recall, duration=30, seed=0, sample_interval=0.1)
    grown: set[int] = set()
    fed.on_sample = lambda _: grown.update(fed.prefetch.values())
    fed.run()
    assert max(grown) >= 4 * fed.prefetch_min  # fed all it asks for, it grows as before


def test_a_download_delay_spaces_a_nodes_pages_and_bounds_the_best_possible() -> None:
    world = generate("specialists", nodes=2, sites=2, duration=30, seed=0)
    tasks = _tasks(world.sites, 4, 0)
    work = {s: SiteWork(0, sum(1 for t in tasks if t.site == s), sum(t.results for t in tasks if t.site == s))
            for s in world.sites}
    requests = {}
    for delay in (0.0, 0.5):
        model = NodeModel(delay=delay, randomize_delay=False)
        allocation, modification, recall = CONFIGS["bandit"](0)
        raw = Simulation(world, world.nodes, tasks, allocation=allocation, modification=modification, recall=recall,
                         duration=30, seed=0, model=model).run()
        requests[delay] = {n: c["requests"] for n, c in raw["web"]["by_address"].items()}
        bound = best_possible(world, world.nodes, work, 30, model)["items"]
        assert 0 < raw["samples"][-1]["items"] <= bound
        if delay:
            # one page every 0.5 s at most, per node, whatever its page slots: 61 pages in 30 s, and the pages of a
            # subtask taken before the end that start after it (counted when it is taken: 20 pages at most)
            assert all(r <= 30 / delay + 1 + 20 for r in requests[delay].values()), requests
            assert bound <= 2 * (30 / delay) * 10  # two nodes, a page of 10 results every 0.5 s at most
    assert all(requests[0.0][n] > 3 * requests[0.5][n] for n in requests[0.5]), requests


def test_the_experiment_simulates_the_nodes_concurrency_and_delay(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    result = run_scrapy(["experiment", "--sim", "--strategies", "bandit", "--duration", "30", "--set",
                         "DOWNLOAD_DELAY=0.5", "--set", "RANDOMIZE_DOWNLOAD_DELAY=false", "--set",
                         "CONCURRENT_REQUESTS_PER_DOMAIN=4", "--out", str(out)],
                        env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["best_possible"]["model"]["delay"] == 0.5 and summary["best_possible"]["model"]["concurrency"] == 4
    assert summary["distribution"]["bandit"]["vs_best"]["n"] == 3  # a simulated experiment: three seeds by default
    raw = json.loads((out / "raw" / "bandit.json").read_text(encoding="utf-8"))
    assert all(c["requests"] <= 81 for c in raw["web"]["by_address"].values()), raw["web"]["by_address"]


def _as_json(writes: list[Any]) -> list[Any]:
    return [tuple(v.to_json() if isinstance(v, (Subtask, Task)) else v for v in w) for w in writes]


class Logged(Simulation):
    """A simulation that logs every decision it applies: (time, kind, subject, writes with records as JSON)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[float, str, str | None, list[Any]]] = []

    def _apply(self, decision: Decision) -> None:
        self.log.append((self.now, decision.kind, decision.subject, _as_json(decision.writes)))
        super()._apply(decision)


class EveryTick(Logged):
    """The simulator's former tick, the specification of the fast one: it decides every tick, whatever changed,
    on the control's JSON path: reports, task and waiting records as JSON that ``decide`` decodes, records in
    its writes as JSON (decoded here for the simulated state)."""

    def _nothing_to_decide(self, total_free: int) -> bool:
        return False

    def _snapshot(self, reports: list[Report], failures: list[Report], stale: list[tuple[str, str | None]],
                  stale_tasks: set[str], nodes: list[NodeView], window: list[Subtask]) -> Snapshot:
        k = self.keys
        return Snapshot(keys=k, now=self.now, estimates=self.estimates, ids=self.ids,
                        reports=[Entry(k.sleeping, raw, len(raw)) for raw in (r.to_json() for r in reports)],
                        failures=[Entry(k.failed, raw, len(raw)) for raw in (r.to_json() for r in failures)],
                        tasks={tid: s.task.to_json() if (s := self.tasks.get(tid)) else None
                               for tid in {r.subtask.task for r in (*reports, *failures)} | stale_tasks},
                        stale=stale, nodes=nodes, waiting=[(st.id, st.to_json()) for st in window])

    def _apply(self, decision: Decision) -> None:
        k = self.keys
        decode = {k.subtasks: Subtask.from_json, k.tasks: Task.from_json}
        writes = []
        for w in decision.writes:
            if w[0] == "hset" and w[1] in decode:
                w = Write((*w[:3], decode[w[1]](w[3])))
            elif w[0] == "lpush":
                w = Write((w[0], w[1], Subtask.from_json(w[2])))
            writes.append(w)
        super()._apply(replace(decision, writes=writes))


@pytest.mark.parametrize(("name", "family"), [("bandit", "specialists"), ("bandit", "churn"), ("paper", "drift")])
def test_the_fast_tick_decides_what_the_former_tick_did(name: str, family: str) -> None:
    # Ticks skipped when nothing can be decided, records encoded once and passed decoded: the same decisions at
    # the same times, so the same run.
    runs = []
    for cls in (Logged, EveryTick):
        world = generate(family, nodes=6, sites=5, duration=90, seed=4)
        allocation, modification, recall = CONFIGS[name](4)
        sim = cls(world, world.nodes, _tasks(world.sites, 4, 4), allocation=allocation, modification=modification,
                  recall=recall, duration=90, seed=4)
        runs.append((sim.run(), sim.log))
    (fast, fast_log), (ref, ref_log) = runs
    assert len(fast_log) > 20 and fast_log == ref_log
    assert fast["samples"] == ref["samples"] and fast["first_use"] == ref["first_use"]


class Scanned(MemoryEstimates):
    """Estimates whose sites' sums do not tell what changed (a plain copy of each mapping, one per mapping): every
    reader falls back to comparing the nodes one by one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plain: dict[int, tuple[Any, dict[str, Any]]] = {}

    def site_sums(self, site: str) -> Any:
        sums = super().site_sums(site)
        hit = self._plain.get(id(sums))
        if hit is None or hit[0] is not sums:
            hit = self._plain[id(sums)] = (sums, dict(sums))
        return hit[1]


@pytest.mark.parametrize(("family", "seed"), [("drift", 5), ("churn", 2), ("captcha", 1)])
def test_reading_only_the_nodes_that_changed_decides_what_a_scan_of_every_node_does(family: str, seed: int) -> None:
    # The bandit's ranking and prior, the site's latest change point and RelativeModification's best completion
    # follow the nodes whose sums changed (SiteSums, SiteMax); compared node by node instead, the same run.
    runs = []
    for scanned in (False, True):
        world = generate(family, nodes=8, sites=5, duration=90, seed=seed)
        allocation, modification, recall = CONFIGS["bandit"](seed)
        sim = Logged(world, world.nodes, _tasks(world.sites, 4, seed), allocation=allocation,
                     modification=modification, recall=recall, duration=90, seed=seed)
        if scanned:
            sim.estimates = Scanned(sim.estimates.alpha, fail_cost=sim.estimates.fail_cost)
        runs.append((sim.run(), sim.log))
    (fast, fast_log), (ref, ref_log) = runs
    assert len(fast_log) > 20 and fast_log == ref_log
    assert fast["samples"] == ref["samples"] and fast["samples"][-1]["items"] > 0


def test_nodes_that_leave_have_their_work_recalled_and_nodes_that_join_get_work() -> None:
    world = generate("churn", nodes=6, sites=5, duration=120, seed=2)
    late = next(n for n in world.nodes if n.joins > 0)
    raw = _run("bandit", "churn", 2)
    used = {k.split("|")[0] for k, v in raw["first_use"].items() if v}
    assert late.id in used
    left = [n for n in world.nodes if n.leaves < 120]
    assert left and all(min(t for k, v in raw["first_use"].items() if k.startswith(n.id + "|") for t in v) < n.leaves
                        for n in left if any(k.startswith(n.id + "|") for k in raw["first_use"]))


@pytest.mark.parametrize("family", FAMILIES)
def test_families_generate_valid_worlds(family: str) -> None:
    world = generate(family, nodes=5, sites=4, duration=90, seed=0)
    assert len(world.nodes) == 5 and len(world.sites) == 4
    b = world.behaviour("n0", "s0.example", 10)
    assert 0 <= b.share <= 1 and b.latency > 0 and 0 <= b.served <= 1
    if family == "drift":
        assert world.changes() == [33.3, 63.9] and world.turned_good()
    with pytest.raises(ValueError, match="family: expected one of"):
        generate("nope", nodes=1, sites=1, duration=1, seed=0)


#: The worlds of test_bandit_beats_the_paper_and_fifo_where_the_paper_loses: bench_quality.py's clusters (12 nodes,
#: 8 sites, 16 products), shorter (200 s). In the tests' smaller worlds (6 nodes, 5 sites), or in 120 s, the two
#: strategies are level on drift: too few pairs, or too little time, for what the bandit learns to pay. With 4
#: products the node model refitted on 2026-12-02 (10 ms a page) crawls every task to its end within 80 s.
BEATS = {"nodes": 12, "sites": 8, "duration": 200, "products": 16}


def test_bandit_beats_the_paper_and_fifo_where_the_paper_loses() -> None:
    """Drift, unlucky first runs, captcha-heavy nodes and sites no node suits: the bandit collects more than the
    paper's strategy over 6 worlds (deterministic seeds; on 2026-12-02 afternoon: 1.08, 1.22, 1.02 and 1.05 of it),
    no world far below it (lowest 1.04, 1.17, 0.99, 0.98), and it uses a pair that turned good sooner under drift.
    Captcha and unsuitable were lost (0.95, 0.89) before a recalled subtask weighed failures by the runs it has
    left and the page rule counted the node's better work elsewhere (docs/strategies.md). Every family: both above
    a FIFO queue."""
    families = (("drift", 1.03, 0.95), ("unlucky", 1.15, 0.95), ("captcha", 1.0, 0.95),  # (total, each world)
                ("unsuitable", 1.0, 0.93))  # / paper
    names = ("bandit", "paper", "fifo")
    # 72 simulations, each deterministic on its own: run on every core (the rest of the suite mostly waits).
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {(family, name, seed): pool.submit(_run, name, family, seed, **BEATS)
                   for family, *_ in families for name in names for seed in range(6)}
        done = {key: future.result() for key, future in futures.items()}
    for family, margin, floor in families:
        runs = {name: [done[family, name, seed] for seed in range(6)] for name in names}
        per_seed = {name: [r["samples"][-1]["items"] for r in rs] for name, rs in runs.items()}
        items = {name: sum(v) for name, v in per_seed.items()}
        assert items["paper"] > items["fifo"] and items["bandit"] > items["fifo"], (family, items)
        assert items["bandit"] > margin * items["paper"], (family, items)
        assert all(b > floor * p for b, p in zip(per_seed["bandit"], per_seed["paper"], strict=True)), per_seed
        if family == "drift":
            delays = {name: statistics.median(_delays_to_use(rs, family)) for name, rs in runs.items()}
            assert delays["bandit"] < delays["paper"], delays


def _delays_to_use(runs: list[dict], family: str) -> list[float]:
    """Seconds from each pair turning good to its first run (the run's end if never), over seeds 0, 1, ..."""
    out = []
    duration = BEATS["duration"]
    for seed, raw in enumerate(runs):
        world = generate(family, nodes=BEATS["nodes"], sites=BEATS["sites"], duration=duration, seed=seed)
        for node, site, when in world.turned_good():
            starts = [t for t in raw["first_use"].get(f"{node}|{site}", []) if t >= when]
            out.append(starts[0] - when if starts else duration - when)
    return out


def test_a_large_cluster_loses_no_subtask_and_allocates_none_twice() -> None:
    """The scale path (the object path through decide, the waiting heap, node views kept across ticks) on a few
    hundred nodes, nodes leaving included: at the end every open task has exactly one subtask somewhere (waiting,
    in a crawl queue, running, or lost with a node that left and not yet recalled) unless the recall strategy
    dead-lettered it (too many attempts), and each allocation took a subtask that was waiting."""
    world = generate("churn", nodes=300, sites=40, duration=40, seed=5)
    for n in world.nodes:  # leave early enough for the control to notice (recall age 20 s) within the run
        n.leaves = min(n.leaves, 12.0) if n.leaves < 40 else n.leaves
    allocation, modification, recall = CONFIGS["bandit"](5)

    class Checked(Simulation):
        allocations = 0
        dead: list[str] = []  # the tasks of dead-lettered subtasks

        def _apply(self, decision: Decision) -> None:
            if decision.kind == "allocate":
                assert decision.subject in self.subtasks, f"allocated {decision.subject}, not waiting"
                self.allocations += 1
            self.dead += [json.loads(w[3])["subtask"]["task"] for w in decision.writes
                          if w[0] == "hset" and w[1] == self.keys.dead]
            super()._apply(decision)

    rng = random.Random(5)  # small tasks, so that many finish and their records go
    tasks = [TaskSpec(f"p{p}", site, rng.randint(20, 300)) for p in range(60) for site in world.sites]
    sim = Checked(world, world.nodes, tasks, allocation=allocation, modification=modification,
                  recall=recall, duration=40, tick=1.0, seed=5, pair_samples=False)
    raw = sim.run()
    assert raw["samples"][-1]["items"] == sum(raw["items_by_node"].values()) > 10_000
    assert sim.allocations == raw["allocated"] > 3_000 and sim.tasks_done > 0
    assert sum(c.get("recalled", 0) for c in sim.counts.values()) > 0  # the leavers' work came back
    held: list[str] = [*(st.task for st in sim.subtasks.values()),
                       *(st.task for q in sim.queues.values() for st in q),
                       *(run.st.task for r in sim.running.values() for run in r.values()),
                       *(st.task for _, st in sim.lost)]
    assert sorted(held + sim.dead) == sorted(sim.tasks), "an open task has no subtask, or two"
    assert sim.tasks_made == sim.tasks_done + len(sim.tasks)


class Timed(Simulation):
    """Records every tick: (start, its cost, reports read) and when its decisions were applied."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ticks: list[tuple[float, float, int]] = []
        self.applied_at: list[float] = []
        self._read = 0

    def _snapshot(self, reports: list[Report], *args: Any) -> Snapshot:
        self._read = len(reports)
        return super()._snapshot(reports, *args)

    def _end_tick(self, cost: float, *args: Any) -> None:
        self.ticks.append((self.now, cost, self._read))
        self._read = 0
        super()._end_tick(cost, *args)

    def _applied(self) -> None:
        if self._pending[0]:
            self.applied_at.append(self.now)
        super()._applied()


def test_a_control_whose_ticks_take_time_ticks_less_often_and_reads_a_batch_at_a_time() -> None:
    """The control model (ControlModel): a tick's decisions are written at its end, no tick starts before the
    previous one ended, a report wakes a tick ``wake`` after that end at the soonest, and a tick reads at most
    ``batch`` reports (the rest wait for the next). A slow control then ticks less often than a free one."""
    world = generate("specialists", nodes=40, sites=6, duration=30, seed=3)
    runs = {}
    for name, control, batch in (("free", FREE_CONTROL, 500), ("slow", ControlModel(base=0.25, per_entry=0.001), 3)):
        allocation, modification, recall = CONFIGS["bandit"](3)
        sim = Timed(world, world.nodes, _tasks(world.sites, 8, 3), allocation=allocation, modification=modification,
                    recall=recall, duration=30, seed=3, control=control, batch=batch)
        raw = sim.run()
        assert raw["samples"][-1]["items"] > 0
        runs[name] = sim
    free, slow = runs["free"], runs["slow"]
    assert all(cost == 0 for _, cost, _ in free.ticks)
    assert max(read for *_, read in free.ticks) > 3
    assert all(cost >= 0.25 for _, cost, _ in slow.ticks) and max(read for *_, read in slow.ticks) == 3
    for (start, cost, _), (after, _, _) in itertools.pairwise(slow.ticks):
        assert after >= start + cost - 1e-9, "a tick started before the previous one ended"
    ends = {round(start + cost, 9) for start, cost, _ in slow.ticks}
    # written at a tick's end (but for a tick the run's end interrupted: written then)
    assert len(slow.applied_at) > 20 and all(round(t, 9) in ends for t in slow.applied_at[:-1])
    assert len(slow.ticks) < len(free.ticks) / 2


def test_a_tick_that_read_a_full_batch_is_followed_at_once_by_the_next() -> None:
    """Long ticks, no wake, a batch smaller than a tick's reports: a tick that read a full batch is followed by the
    next as soon as it ends (ControlExtension: more may wait), until one reads less; the reports never pile up.
    Before 2026-12-06 the rest waited for the next interval, and a cluster finishing more than a batch a tick fell
    further behind with every tick."""
    world = generate("specialists", nodes=40, sites=6, duration=60, seed=3)
    allocation, modification, recall = CONFIGS["bandit"](3)
    sim = Timed(world, world.nodes, _tasks(world.sites, 8, 3), allocation=allocation, modification=modification,
                recall=recall, duration=60, seed=3, tick=20, wake=0.0, batch=3,
                control=ControlModel(base=0.25, per_entry=0.001))
    sim.run()
    ticks = sim.ticks
    full = [i for i, (*_, read) in enumerate(ticks[:-1]) if read == 3]
    assert len(full) > 10
    for i in full:
        start, cost, _ = ticks[i]
        assert ticks[i + 1][0] == pytest.approx(start + cost), "a full batch's tick waited for the interval"
    # caught up: each interval's burst of ticks ended with one that read less than a batch (nothing carried over)
    on_grid = [i for i, (start, *_) in enumerate(ticks) if start % 20 == 0 and i > 0]
    assert on_grid and all(ticks[i - 1][2] < 3 for i in on_grid)


def test_waiting_offers_a_requeued_subtask_once() -> None:
    """A subtask requeued while an old entry of it is still in the waiting heap (allocated in the tick that made
    it, recalled later): the heap never compares the two records, and the window offers the current one once."""
    world = generate("specialists", nodes=2, sites=1, duration=10, seed=0)
    allocation, modification, recall = CONFIGS["fifo"](0)
    sim = Simulation(world, world.nodes, [], allocation=allocation, modification=modification, recall=recall,
                     duration=10)
    st = Subtask(id="7", task="1", site="s0.example", first_page=0, page_limit=5, time_limit=30.0)
    for attempt in range(20):
        sim._wait(replace(st, attempt=attempt))
    assert [entry[3].attempt for entry in sim._window(10)] == [19]


@pytest.mark.parametrize("seed", [0, 3])
def test_on_sites_whose_runs_mostly_finish_retries_are_not_delayed(seed: int, monkeypatch: Any) -> None:
    """The paper profile on 40 nodes: 36 of them fail a tenth of their pages everywhere, so subtasks are recalled
    two and three times, but every site's runs mostly finish. The retry delay (2 s, doubling) is for a site's passing
    trouble: past the first seconds (a site whose first runs failed is in trouble until more report) it holds no
    subtask here. Without the rule (a delay wherever a subtask was recalled twice) it holds subtasks all along.
    (Until 2026-12-06 the test compared the items of the runs with and without the delay, item for item; with
    tasks going on beside their recalled subtasks and idle nodes opening lanes, the few early holds send a 30 s run
    elsewhere, 13 % on seed 0 of 40 nodes; over 8 seeds of 90 s the medians are within 1 %: docs/experiment.md.
    Seed 2 is no such run since then: from 15 s on the paper's nodes 1 to 3, which weibo.com answers with errors
    or captchas on a sixth of their pages, run most of its work, most of its runs fail, and the delay holds there,
    as it should. The paper's count of recalls: with SCHEDEXT_RECALL_RESET a failed run that crawled pages starts
    it over, so these subtasks seldom reach a second recall, and the run without the rule held none either.)"""
    from product_crawl.experiment import make_options
    from product_crawl.experiment.sim import simulate_configuration

    held: list[float] = []

    def counted(recall: Any, st: Subtask, now: float, healthy: Any) -> bool:
        out = backing_off(recall, st, now, healthy)
        if out:
            held.append(now)
        return out

    monkeypatch.setattr(control_module, "backing_off", counted)  # the control's decision, which the simulator runs
    opts = make_options(profile="paper", nodes=40, sim=True, strategies="dynamic", duration=30,
                        overrides={"SCHEDEXT_RETRY_BACKOFF": 2.0, "SCHEDEXT_RECALL_RESET": False})
    raw = simulate_configuration("dynamic", opts, seed=seed)
    assert raw["samples"][-1]["items"] > 0 and not [t for t in held if t > 5.0]
    held.clear()

    def ruleless(recall: Any, st: Subtask, now: float, healthy: Any) -> bool:
        return counted(recall, st, now, lambda site: False)

    for module in (control_module, engine_module):
        monkeypatch.setattr(module, "backing_off", ruleless)
    opts = make_options(profile="paper", nodes=40, sim=True, strategies="dynamic", duration=30,
                        overrides={"SCHEDEXT_RETRY_BACKOFF": 2.0, "SCHEDEXT_RECALL_RESET": False})
    simulate_configuration("dynamic", opts, seed=seed)
    assert len([t for t in held if t > 5.0]) > 20


def test_a_tick_that_starts_the_instant_the_last_one_ends_reads_its_writes_first() -> None:
    """A tick whose cost ends it at the very time of the next tick (or wake) event: the next tick must not take the
    window before the last one's subtasks went back to waiting (they were lost from the heap: on a churn world a
    window of 32 subtasks never ran again)."""
    world = generate("specialists", nodes=2, sites=1, duration=10, seed=0)
    allocation, modification, recall = CONFIGS["bandit"](0)
    sim = Simulation(world, world.nodes, [], allocation=allocation, modification=modification, recall=recall,
                     duration=10, control=ControlModel(base=0.25, per_entry=0.0))
    backing_off = Subtask(id="7", task="1", site="s0.example", first_page=0, page_limit=5, time_limit=30.0,
                          attempt=3, since=0.0)  # recalled three times: waits 4 s, so it stays in the window
    sim._wait(backing_off)
    sim._tick()
    assert [entry[3].id for entry in sim._pending[1]] == ["7"] and not sim.waiting
    sim.now = sim._ticked  # the next tick starts as this one's writes land
    sim._tick()
    sim._applied()
    assert [entry[3].id for entry in sim.waiting] == ["7"] and sim.subtasks == {"7": backing_off}


def test_a_task_with_more_lanes_has_more_of_its_pages_crawled_at_once() -> None:
    """One long query and two nodes with slots to spare: with one lane (the paper's model) a subtask at a time
    crawls it; with two or three (the control's SCHEDEXT_TASK_LANES, the same decide code) as many at once."""
    world = generate("generalists", nodes=2, sites=1, duration=60, seed=0)
    items, subtasks = {}, {}
    for lanes in (1, 2, 3):
        allocation, modification, recall = CONFIGS["fifo"](0)
        raw = Simulation(world, world.nodes, [TaskSpec("p", world.sites[0], 100_000)], allocation=allocation,
                         modification=modification, recall=recall, duration=60, seed=0, lanes=lanes).run()
        items[lanes], subtasks[lanes] = raw["samples"][-1]["items"], raw["allocated"]
    assert items[2] > 1.7 * items[1] and items[3] > 1.3 * items[2]
    assert subtasks[2] > 1.7 * subtasks[1]


# --- scrapy experiment --sim -----------------------------------------------------------------------------------------

def test_experiment_sim_writes_the_summary_and_report(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    result = run_scrapy(["experiment", "--sim", "--strategies", "bandit,paper,shared,oracle", "--duration", "40",
                         "--repeat", "3", "--out", str(out)], env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["simulated"] is True
    best = summary["best_possible"]["items"]
    assert best > max(r["unique_items"] for r in summary["runs"].values())
    dist = summary["distribution"]["bandit"]
    assert dist["vs_best"]["n"] == 3 and 0 < dist["vs_best"]["min"] <= dist["vs_best"]["max"] < 1
    assert dist["vs_shared"]["median"] > 1.3  # 1.48 measured in 40 s (learning costs the first seconds); ~2 in 90 s
    assert "ratio distribution over simulated seeds" in result.stdout
    # Where a simulated run is, at each sample (a long one shows its progress): the status line on stderr.
    assert "[bandit 1/4 seed 0] 21/40 simulated s  items " in result.stderr.replace("\r", "\n")
    # The bandit's pace per pair, in node time: a suited pair's pages (0.1 to 0.2 s, 8 slots) well above 8 a second.
    final = summary["runs"]["bandit"]["final_completion"]
    assert final["node2"]["t.163.com"]["pace"] > 20 > final["node2"]["weibo.com"]["pace"] > 0
    for name in ("report.html", "ratios.png", "fig4.png"):
        assert (out / name).stat().st_size > 1000
    # No pair of the paper profile turns good (its drift at 40 s turns pairs bad): nothing to time.
    assert summary["good_pairs"]["pairs"] == [] and set(summary["good_pairs"]["delays"]) == set(summary["runs"])


class _TwoPhases:
    """A world of two nodes and two sites: n0 suits a from the start; n1 suits nothing until 30 s, then b (clearly
    its best); n0 also suits b from the start (a near-tie for b's work, which caps at one task)."""

    def behaviour(self, node: str, site: str, t: float) -> Behaviour:
        good = {("n0", "a"), ("n0", "b")} | ({("n1", "b")} if t >= 30 else set())
        return Behaviour(0.95, 0.1) if (node, site) in good else Behaviour(0.1, 0.6, error_rate=0.2)

    def changes(self) -> list[float]:
        return [30.0]


def test_the_bound_lists_the_pairs_that_turn_good_and_that_the_best_schedule_then_crawls() -> None:
    work = {"a": SiteWork(0, 1, 10**6), "b": SiteWork(0, 1, 10**6)}
    best = best_possible(_TwoPhases(), [SimNode("n0"), SimNode("n1")], work, 60.0)
    assert best["assignments"] == [{"n0": "a", "n1": "b"}, {"n0": "a", "n1": "b"}]  # n1 on b at 0.1 share before
    # n1|b turned good at 30 s and is clearly n1's best site; n0|a was good from the start (not listed).
    assert best["turned_good"] == [("n1", "b", 30.0, True)]


def test_good_pairs_are_timed_from_turning_good_to_first_use_in_real_and_simulated_runs() -> None:
    from product_crawl.experiment.summary import first_use, good_pairs

    pairs = [("n1", "b", 30.0, True), ("n0", "b", 30.0, False)]
    simulated = {"first_use": {"n1|b": [1.0, 33.5, 40.0]}, "samples": [{"t": 0, "items": 0}]}
    real = {"samples": [{"t": t, "pairs": {"n1|b": [0, 0, runs, 0, 0, 0]}} for t, runs in
                        ((27, 1), (30, 1), (33, 1), (36, 2), (39, 3))]}
    assert first_use(simulated, "n1", "b", 30.0) == 33.5
    assert first_use(real, "n1", "b", 30.0) == 36.0  # the first sample after 30 s with a run more than at 30 s
    assert first_use(real, "n0", "b", 30.0) is None
    scrapy_redis = {"samples": [{"t": 3, "items": 10}]}  # no pairs kept: not timed
    out = good_pairs({"dynamic": simulated, "other": real, "scrapy_redis": scrapy_redis}, pairs, 60.0)
    assert out["delays"] == {"dynamic": [3.5, None], "other": [6.0, None]}
    assert out["stats"]["other"]["clear"]["max"] == 6.0 and out["stats"]["other"]["never"] == 1
    # never used: as long as its site had work, until the site's last run (39 s), not the run's end (60 s)
    assert out["stats"]["other"]["all"]["max"] == 9.0 and out["stats"]["dynamic"]["all"]["max"] == 10.0
    assert out["stats"]["other"]["after_their_sites_work"] == 0
    # A pair that turned good after its site's last run: the site's work was done, nothing to use it for. Counted
    # apart, not as a wait to the run's end (a simulated 100-node drift world done in 54 of 90 s reported medians
    # of 26 s for pairs that turned good at 64 s).
    late = good_pairs({"dynamic": simulated, "other": real}, [("n0", "b", 45.0, True)], 60.0)
    assert late["delays"] == {"dynamic": [None], "other": [None]}
    assert late["stats"]["dynamic"]["all"] is None and late["stats"]["dynamic"]["after_their_sites_work"] == 1
    assert late["stats"]["other"]["after_their_sites_work"] == 1


def test_a_busy_nodes_pair_that_turns_good_with_nothing_else_changing_is_found(tmp_path: Path) -> None:
    # The paper profile, and node2 turns good on cca.org.cn (node4's site, which node4 shares with weibo.com) at
    # 60 s. Nothing anyone runs changes then: only a look at the pair can find it (the bandit's probes). Before
    # them it went unused for the rest of the run in seeds 1 to 3, and after 17.6 s in seed 0; with probes from
    # idle nodes only it was used after 8.3, 13.4, 1.0 and 22.7 s (node2's queue seldom empties); with a node with
    # work queued probing too, once per PROBE_AGE, after 14.8, 5.3, 7.0 and 12.6 s, and in seeds 26, 32 and 37 after
    # 17.0, 17.9 and 15.8 s (a probe due just before the pair was stale went to another pair, and so might the
    # next); now that it probes once per 1 / BUSY_PROBE_SHARE pages it is given (every few seconds here), after 4.9,
    # 4.2, 2.2, 12.8, 8.6, 8.6 and 2.3 s (and at most 12.8 s in 64 seeds).
    import pkgutil

    from product_crawl.experiment import make_options, run_experiment

    profile = json.loads(pkgutil.get_data("product_crawl.simweb", "profiles/paper.json") or b"")
    profile["name"] = "a pair turns good"
    profile["nodes"]["127.0.0.3"]["sites"]["cca.org.cn"]["phases"] = [
        {"after": 60, "share": 0.97, "latency": {"mean": 0.08, "spread": 0.02}, "error_rate": 0.01,
         "block_rate": 0.0}]
    path = tmp_path / "turns-good.json"
    path.write_text(json.dumps(profile), encoding="utf-8")
    delays = []
    for seed in (0, 1, 2, 3, 26, 32, 37):
        opts = make_options(profile=str(path), sim=True, strategies="dynamic", seed=seed, out=tmp_path / f"{seed}")
        summary, _ = run_experiment(opts, progress=Progress(io.StringIO()))
        assert [p[:3] for p in summary["good_pairs"]["pairs"]] == [["node2", "cca.org.cn", 60.0]]
        delays += summary["good_pairs"]["delays"]["dynamic"]
    assert None not in delays and max(delays) <= 15.0, delays


def test_a_goal_shows_the_seeds_beside_the_first_seeds_ratio() -> None:
    from product_crawl.experiment.report import goal_lines

    q = {"min": 0.47, "p10": 0.47, "median": 1.39, "p90": 1.45, "max": 1.45, "n": 3}
    summary = {"ratios": {"dynamic_vs_shared": 0.47}, "goals": {"dynamic_vs_shared>=1.5": False},
               "distribution": {"dynamic": {"vs_shared": q}}}
    assert goal_lines(summary) == [
        "dynamic_vs_shared>=1.5: NOT reached (dynamic / shared = 0.47; over 3 seeds median 1.39, min 0.47)"]
    summary["distribution"] = None  # one seed
    assert goal_lines(summary) == ["dynamic_vs_shared>=1.5: NOT reached (dynamic / shared = 0.47)"]


def test_experiment_sim_refuses_repeat_without_sim(tmp_path: Path) -> None:
    result = run_scrapy(["experiment", "--repeat", "3", "--out", str(tmp_path / "x")], env={"PATH": "/usr/bin:/bin"},
                        timeout=60)
    assert result.returncode == 2 and "--repeat: expected 1, or more with --sim" in result.stderr


def test_the_paper_configuration_counts_every_recall_and_the_default_only_runs_that_crawl_nothing() -> None:
    from product_crawl.experiment import CONFIGURATIONS
    from product_crawl.experiment.sim import build_strategies
    from product_crawl.simweb.profile import load_profile

    recalls = {name: build_strategies(CONFIGURATIONS[name][1], load_profile("paper"))[2] for name in ("dynamic",
                                                                                                     "paper")}
    assert recalls["dynamic"].reset is True and recalls["paper"].reset is False  # the paper: 5 recalls, any kind
    assert CONFIGS["paper"](0)[2].reset is False and CONFIGS["bandit"](0)[2].reset is True


def test_a_long_simulated_run_says_how_long_the_rest_takes_at_its_pace() -> None:
    import doctest

    from product_crawl.experiment import make_options
    from product_crawl.experiment import sim as sim_module

    assert doctest.testmod(sim_module).failed == 0
    opts = make_options(profile="paper", duration=100, sim=True)
    shown = io.StringIO()
    sample = {"t": 25.0, "items": 7, "waiting": 3, "tasks_done": 1, "tasks": 20}
    sim_module._progress(Progress(shown), "dynamic", opts, time.monotonic() - 100, sample)  # a quarter in 100 s
    assert shown.getvalue().rstrip().endswith("tasks done 1/20  1 min 40 s so far, 5 min 0 s left at this pace")
    quick = io.StringIO()
    sim_module._progress(Progress(quick), "dynamic", opts, time.monotonic(), sample)  # nothing to say yet
    assert quick.getvalue().rstrip().endswith("tasks done 1/20")


def test_experiment_names_an_output_folder_it_cannot_make(tmp_path: Path) -> None:
    """--out naming a file (or a folder under one) ended in a traceback of ``mkdir``; now one line names it."""
    taken = tmp_path / "a-file"
    taken.write_text("kept")
    result = run_scrapy(["experiment", "--sim", "--duration", "20", "--repeat", "1", "--strategies", "dynamic",
                         "--out", str(taken)], env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"--out {taken}: expected a folder the experiment can write its results in" in result.stderr
    assert taken.read_text() == "kept"


def test_experiment_sim_runs_a_generated_cluster_with_many_products(tmp_path: Path) -> None:
    from product_crawl.experiment import make_options, run_experiment
    from product_crawl.experiment.report import console_table

    opts = make_options(profile="generated:drift", nodes=16, sites=5, products=8, duration=24, sim=True, repeat=2,
                        strategies="dynamic,shared", out=tmp_path / "gen")
    assert len(opts.nodes) == 16 and opts.sites == [f"s{j}.example" for j in range(5)]
    assert [p["name"] for p in opts.products][-2:] == ["product 7", "product 8"]
    summary, report = run_experiment(opts, progress=Progress(io.StringIO()))
    assert summary["corpus"]["queries"] == 40 and len(summary["corpus"]["per_query"]) == 8
    assert summary["profile"]["phases"] == [9.0, 17.0]  # drift's changes at 37 % and 71 % of the run, to the second
    assert summary["runs"]["dynamic"]["unique_items"] > summary["runs"]["shared"]["unique_items"] > 0
    assert summary["distribution"]["dynamic"]["vs_shared"]["n"] == 2
    lines = console_table(summary)
    assert "items per node over the 16 nodes (first stored by):" in lines
    assert any("... (4 more; over all 16 nodes: min" in line for line in lines)
    assert "Ratio distribution over simulated seeds" in report.read_text(encoding="utf-8")


def test_experiment_sim_runs_its_runs_in_parallel_processes_with_the_same_records(tmp_path: Path) -> None:
    """--jobs 2: the configurations' seeds run in forked processes, two at a time, and give exactly the records of
    one run at a time (a run depends on its configuration and seed only)."""
    from product_crawl.experiment import make_options
    from product_crawl.experiment.sim import simulate_all

    opts = make_options(profile="generated:unlucky", nodes=8, sites=4, products=3, duration=20, sim=True, repeat=2,
                        strategies="dynamic,shared", out=tmp_path / "x")
    one: set[int] = set()
    two: set[int] = set()
    alone = simulate_all(opts, jobs=1, progress=Progress(io.StringIO()), processes=one)
    shown = io.StringIO()
    parallel = simulate_all(opts, jobs=2, progress=Progress(shown), processes=two)
    assert one == {os.getpid()}
    assert len(two) >= 2 and os.getpid() not in two  # forked, more than one at a time (a process per run)
    assert json.dumps(parallel, sort_keys=True) == json.dumps(alone, sort_keys=True)
    assert [r["samples"][-1]["items"] for r in parallel["dynamic"]] == [r["samples"][-1]["items"]
                                                                        for r in alone["dynamic"]]
    done = [line for line in shown.getvalue().replace("\r", "\n").splitlines() if "simulated 20 s in" in line]
    assert len(done) == 4  # each run's last line, relayed by the parent


def _failing_run(name: str, opts: Any, *, seed: int, **kwargs: Any) -> dict[str, Any]:
    if seed == 1:
        raise RuntimeError("a strategy's bug")
    time.sleep(60)  # the other run: stopped when its peer fails
    return {}


def _killed_run(name: str, opts: Any, *, seed: int, **kwargs: Any) -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGKILL)  # the out-of-memory killer, say
    return {}


@pytest.mark.parametrize(("run", "message"), [
    (_failing_run, "simulated run dynamic 1/1 seed 1 failed:"),
    (_killed_run, "its process ended with exit code -9 (killed? out of memory?) before it sent its record"),
])
def test_a_parallel_simulated_run_that_fails_stops_the_others_and_names_itself(
        run: Any, message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from product_crawl.experiment import ExperimentError, make_options
    from product_crawl.experiment import sim as sim_module

    opts = make_options(profile="paper", duration=20, sim=True, repeat=2, strategies="dynamic", out=tmp_path / "x")
    monkeypatch.setattr(sim_module, "simulate_configuration", run)  # what the forked processes inherit
    started = time.monotonic()
    with pytest.raises(ExperimentError) as info:
        sim_module.simulate_all(opts, jobs=2, progress=Progress(io.StringIO()))
    assert message in str(info.value)
    if run is _failing_run:
        assert "RuntimeError: a strategy's bug" in str(info.value)  # its traceback
    assert time.monotonic() - started < 30  # the other run was stopped, not waited for
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("sim ")]


def test_the_runs_of_a_killed_simulated_experiment_stop_with_it(tmp_path: Path) -> None:
    # kill -9 (or the out-of-memory killer) of the command: its forked runs used to simulate on to their end.
    import subprocess
    import sys

    import psutil
    from conftest import PROJECT

    proc = subprocess.Popen([sys.executable, "-m", "scrapy", "experiment", "--sim", "--profile", "generated:drift",
                             "--nodes", "1000", "--duration", "7200", "--strategies", "dynamic", "--repeat", "2",
                             "--jobs", "2", "--out", str(tmp_path / "out")], cwd=PROJECT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    runs: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(runs) < 2 and proc.poll() is None:
            runs = [c for c in psutil.Process(proc.pid).children() if c.cmdline() == psutil.Process(proc.pid).cmdline()]
            time.sleep(0.2)
        assert len(runs) == 2, proc.poll()
        proc.kill()
        proc.wait(10)
        gone, alive = psutil.wait_procs(runs, timeout=30)
        assert alive == []
    finally:
        proc.kill()
        for run in runs:
            if run.is_running():
                run.kill()


@pytest.mark.parametrize(("options", "message"), [
    ({"jobs": 2}, "--jobs: expected 1, or more with --sim (a real run's configurations share the machine and its "
                  "services, one at a time), got 2"),
    ({"jobs": 0, "sim": True}, "--jobs: expected 1, or more with --sim"),

    ({"profile": "generated:churn", "sim": True}, "unknown generated family 'churn'"),
    ({"profile": "generated:drift"}, "a generated profile is for the simulator (--sim)"),
    ({"profile": "paper", "sites": 5, "sim": True}, "--sites: only with a generated profile"),
    ({"profile": "generated:drift", "sites": 0, "sim": True}, "--sites: expected 1 .. 10000 sites, got 0"),
    ({"profile": "generated:drift", "nodes": 0, "sim": True}, "--nodes: expected 1 .. 100000 simulated nodes"),
    # a built-in profile too, before the addresses of a hundred million nodes are made
    ({"profile": "paper", "nodes": 100_000_000, "sim": True}, "--nodes: expected 1 .. 100000 simulated nodes, got "
                                                                "100000000"),
    ({"repeat": 1001, "sim": True}, "--repeat: expected 1 .. 1000 seeds, got 1001"),
    ({"products": 10}, "--products: expected 1 .. 100000 products with --sim"),
    ({"products": 0, "sim": True}, "--products: expected 1 .. 100000 products with --sim (a real run searches the "
                                   "paper's four), got 0"),
])
def test_experiment_sim_refuses_bad_scale_options(options: dict[str, Any], message: str) -> None:
    from product_crawl.experiment import ExperimentError, make_options

    with pytest.raises(ExperimentError) as info:
        make_options(**options)
    assert message in str(info.value)


# --- agreement with real runs ----------------------------------------------------------------------------------------
# Not in `make test`: the real bandit / shared ratio of one 30 s run moved between 1.43 and 2.00 with the load of this
# 2-core machine (the simulator: 1.53-1.65), so on a shared machine it fails for reasons that are not the code's.
# Run it on a quiet machine with `make test-calibration`.

@pytest.mark.calibration
def test_simulated_ratios_agree_with_a_real_run(scrapy_env: dict[str, str], prefix: str, mongo_db: str,
                                                tmp_path: Path) -> None:
    """A short real experiment on the paper profile and the simulator on the same options: the real bandit / shared
    ratio within 10 % of the simulator's (of its range over 5 seeds: one real run of 30 s on a shared machine has
    noise of its own, which the seeds of the simulator show the size of)."""
    from product_crawl.experiment import make_options
    from product_crawl.experiment.sim import simulate_configuration

    out = tmp_path / "real"
    result = run_scrapy(["experiment", "--profile", "paper", "--strategies", "bandit,shared", "--duration", "30",
                         "--out", str(out), "--prefix", prefix, "--database", mongo_db], env=scrapy_env, timeout=200)
    assert result.returncode == 0, result.stderr[-3000:]
    real = json.loads((out / "summary.json").read_text(encoding="utf-8"))["runs"]
    real_ratio = real["bandit"]["unique_items"] / real["shared"]["unique_items"]
    opts = make_options(profile="paper", duration=30, strategies="bandit,shared")
    ratios = sorted(simulate_configuration("bandit", opts, seed=s)["samples"][-1]["items"]
                    / simulate_configuration("shared", opts, seed=s)["samples"][-1]["items"] for s in range(5))
    assert 0.9 * ratios[0] <= real_ratio <= 1.1 * ratios[-1], (real_ratio, ratios)


def test_the_paper_profiles_best_schedule_puts_each_node_on_its_fastest_site() -> None:
    # What benchmarks/bench_ceiling.py crawls: the bound's own plan, kept only when asked for.
    from product_crawl.experiment import runner
    from product_crawl.experiment import sim as exp_sim

    opts = runner.make_options(profile="paper", duration=90, strategies="dynamic")
    totals = runner.corpus_totals(opts.profile, opts.sites, opts.seed)
    assert "assignments" not in exp_sim.best_possible(opts, totals)
    plans = exp_sim.best_possible(opts, totals, assignments=True)["assignments"]
    assert plans and all(plan == {"node1": "12315.com", "node2": "t.163.com", "node3": "315tousu.org",
                                  "node4": "cca.org.cn"} for plan in plans)


def _benchmark(name: str) -> Any:
    """A script of ``benchmarks/`` loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "benchmarks"
                                                  / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_diag_pairs_charges_each_page_its_latency_by_the_pairs_worth_at_the_time() -> None:
    from product_crawl.simweb.profile import load_profile

    diag = _benchmark("diag_pairs")
    sites = ["12315.com", "315tousu.org", "t.163.com", "cca.org.cn", "weibo.com"]
    # node1: 10 pages on its best site (0.10 s), 10 on a suited one (0.15 s), 2 on weibo.com (0.7 s); then, after
    # t.163.com turned bad for it at 40 s, 4 pages there (0.7 s)
    raw = {"samples": [{"t": 0.0, "pairs": {}},
                       {"t": 30.0, "pairs": {"node1|12315.com": [0, 0, 1, 10], "node1|315tousu.org": [0, 0, 1, 10],
                                             "node1|weibo.com": [0, 0, 1, 2]}},
                       {"t": 60.0, "pairs": {"node1|12315.com": [0, 0, 1, 10], "node1|315tousu.org": [0, 0, 1, 10],
                                             "node1|weibo.com": [0, 0, 1, 2], "node1|t.163.com": [0, 0, 1, 4]}}]}
    out = diag.slots(raw, load_profile("paper"), sites)
    assert (out["best_pages"], out["other_pages"], out["poor_pages"]) == (10, 10, 6)
    seconds = 10 * 0.10 + 10 * 0.15 + 2 * 0.7 + 4 * 0.7
    assert out["best_slot_share"] == round(1.0 / seconds, 3) and out["mean_latency"] == round(seconds / 26, 4)


def test_bench_quality_counts_a_good_pair_never_used_as_waiting_while_its_site_had_work() -> None:
    bench = _benchmark("bench_quality")
    first_use = {"n0|a": [1.0, 12.0, 30.0], "n1|a": [5.0, 40.0], "n1|b": [2.0, 8.0], "n0|b": [3.0]}
    needed = [("n0", "a", 10.0, True),   # used at 12 s: 2 s
              ("n2", "a", 20.0, True),   # never used; n0 and n1 ran a until 40 s: it waited 20 s
              ("n2", "b", 9.0, False)]   # never used, but nobody ran b after 9 s: its work was over
    assert bench.use_delays(first_use, needed) == [2.0, 20.0, None]


def test_a_corpus_done_before_the_end_says_when_and_pairs_good_after_it_are_counted_apart(tmp_path: Path) -> None:
    # A hundred nodes for the paper's four products on 8 sites: the cluster does every task in about 55 s of 90.
    from product_crawl.experiment import make_options, run_experiment

    opts = make_options(profile="generated:drift", nodes=100, sim=True, repeat=1, strategies="dynamic",
                        out=tmp_path / "out")
    summary, _ = run_experiment(opts, progress=Progress(io.StringIO()))
    run = summary["runs"]["dynamic"]
    assert run["exhausted"] and 0 < run["exhausted_at"] < 90
    items = dict((t, i) for t, i in run["items_over_time"])
    assert items[run["exhausted_at"]] == run["unique_items"]  # nothing more after it
    assert max(i for t, i in items.items() if t < run["exhausted_at"]) < run["unique_items"]
    gp = summary["good_pairs"]
    late = [p for p in gp["pairs"] if p[2] > run["exhausted_at"]]
    assert late and all(d is None for p, d in zip(gp["pairs"], gp["delays"]["dynamic"], strict=True) if p in late)
    assert gp["stats"]["dynamic"]["after_their_sites_work"] >= len(late)
    assert gp["stats"]["dynamic"]["all"]["max"] < 90 - min(p[2] for p in gp["pairs"])  # no wait to the run's end


def test_a_polite_pace_with_the_default_settings_collects() -> None:
    """Under a DOWNLOAD_DELAY of 30 s the recall age, patience and longest time limit are at least what a subtask of
    SCHEDEXT_PAGE_LIMIT pages takes (scheduler_ext.config.paced_floor), as the control builds them from settings.
    With the paper's minute and no other change, modification's budget (half of it) held less than a page: one-page
    subtasks, cut by their own time limit, recalled and sent again (this world: 225 items, a tenth of the best
    possible; a 100-node cluster a fifth of what it collects now)."""
    from product_crawl.experiment.sim import build_strategies

    world = generate("specialists", nodes=8, sites=4, duration=1200, seed=0)
    tasks = _tasks(world.sites, 6, 0)
    work = {s: SiteWork(0, sum(1 for t in tasks if t.site == s), sum(t.results for t in tasks if t.site == s))
            for s in world.sites}
    model = NodeModel(delay=30.0, randomize_delay=False)
    settings = {"DOWNLOAD_DELAY": 30, "SCHEDEXT_ALLOCATION": "scheduler_ext.strategies.bandit.BanditAllocation",
                "SCHEDEXT_MODIFICATION": "scheduler_ext.strategies.modification.RelativeModification",
                "SCHEDEXT_BANDIT_SEED": 0}
    allocation, modification, recall, config = build_strategies(settings, None)
    assert (config.recall_age, config.patience, modification.max_time) == (600.0, 300.0, 300.0)
    raw = Simulation(world, world.nodes, tasks, allocation=allocation, modification=modification, recall=recall,
                     duration=1200, seed=0, model=model, recall_age=config.recall_age).run()
    bound = best_possible(world, world.nodes, work, 1200, model)["items"]
    assert raw["samples"][-1]["items"] >= 0.5 * bound, (raw["samples"][-1], bound)


class _SlowSite:
    """Every node is served 90 % of each page, but the pages of ``slow.example`` take 40 s."""

    def behaviour(self, node: str, site: str, t: float) -> Behaviour:
        return Behaviour(0.9, 40.0 if site == "slow.example" else 0.2, 2.0)

    def changes(self) -> list[float]:
        return []


@pytest.mark.parametrize("config", ["bandit", "paper"])
def test_a_site_whose_pages_outlast_the_budget_is_still_crawled(config: str) -> None:
    """Pages of 40 s, a recall age of 60 s: modification's budget (30 s) holds no page. Each subtask got a limit of
    30 s, was cut before its first page ended, and said nothing of the pace: 0 items in 600 s. Now the fewest pages
    get their time, and a run cut before any page doubles the next limit (scheduler_ext.strategies.modification)."""
    nodes = [SimNode(f"n{i}") for i in range(4)]
    tasks = _tasks(["slow.example"], 4, 0)
    allocation, modification, recall = CONFIGS[config](0, recall_age=60.0, patience=30.0)
    raw = Simulation(_SlowSite(), nodes, tasks, allocation=allocation, modification=modification, recall=recall,
                     duration=600, seed=0, recall_age=60.0).run()
    assert raw["samples"][-1]["items"] >= 500, raw["samples"][-1]
