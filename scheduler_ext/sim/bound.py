"""The best possible collection a world allows: an upper bound for any scheduling of the same nodes and tasks.

Between two changes of the truth (a phase change of some behaviour, a node joining or leaving) every rate is
constant, so the best schedule of that phase is a static assignment of node time to sites, and the bound is the sum
over phases of ``(phase length) x (value of the best assignment)``:

    maximize    sum_{n,s} r[n,s] x[n,s]
    subject to  sum_s x[n,s] <= 1           a node's capacity (its page slots and its own CPU)
                sum_n x[n,s] <= T_s         a site has T_s tasks, each crawled by one node at a time
                sum_{n,s} q[n,s] x[n,s] <= C    the machine: C cores shared by every node, the web and the storage
                x >= 0, x[n,s] = 0 unless node n serves the type of site s's tasks

``r[n,s]`` is the results node ``n`` collects per second on site ``s`` crawling nothing else, from the node's
machinery (:class:`~scheduler_ext.sim.engine.NodeModel`) and the site's behaviour: per page requested it collects
``served x share x PAGE_SIZE`` results, and it requests pages at most ``min(concurrency / latency, 1 / (node CPU a
page requested), 1 / delay)`` a second (its page slots; its own process, one core at most; its
``DOWNLOAD_DELAY``). ``q[n,s]`` is the CPU seconds per second of the whole machine that crawl costs
(:class:`Machine`: a page served and its items cost CPU in the node, the web server and the storage; blocked and
failed pages are counted free, which only raises the bound).

Without the machine row the constraint matrix is that of a transportation problem (totally unimodular), so an
optimal ``x`` is integral: each live node crawls one site, and a site takes at most ``T_s`` nodes. :func:`assign`
solves it exactly by successive shortest augmenting paths (a min-cost flow), which costs little when, as at scale,
the site limits do not bind (each node then takes its best site at once). The machine row couples everything; it
is relaxed with a multiplier ``lam >= 0`` (Lagrangian relaxation):

    L(lam) = lam C + max { sum (r - lam q)[n,s] x[n,s] : the assignment constraints }

For every ``lam >= 0``, ``L(lam)`` is at least the programme's value (a feasible ``x`` pays ``lam (C - q x) >= 0``
more), so any ``lam`` gives a valid bound; ``L`` is convex, and its minimum over ``lam`` equals the value of the
linear programme (the inner problem's polytope is integral). :func:`machine_assign` minimizes it by a golden-section
search and keeps the lowest ``L`` it evaluated: a true upper bound whatever the search's precision.

The bound ignores every cost a real schedule cannot avoid and the bound need not count: per-subtask overheads,
learning, waiting for a report before a task's next subtask, pages re-crawled after a failure, the end of a task's
results, Redis and the control, the CPU of blocked and failed pages. The total is also capped by the results the
tasks hold.

The costs are measured, not fitted: :data:`MACHINE` and :data:`MACHINE_NODE` are the CPU of the cheapest crawler on
this machine (plain Scrapy in as many processes as the paper profile's nodes, the same parser, pipeline and
storage, the same simulated web: ``benchmarks/bench_machine.py``, whose JSON ``tests/test_sim.py`` checks them
against). A simulated cluster's bound uses the simulator's own node model and no shared machine (its nodes each
have their own CPU).

One caveat: the capacity ``sum_s x[n,s] <= 1`` charges a node the larger of its two limits on each site, so a node
splitting its time between a site where its CPU binds (latency under ``concurrency x`` its CPU a page) and one where
the network binds could in principle beat it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .engine import NodeModel, SimNode
from .world import PAGE_SIZE, Behaviour, World


@dataclass(frozen=True)
class Machine:
    """A machine every node of a run shares with the web server and the storage: ``cores``, and the CPU seconds
    (all processes together) a page served and an item stored cost."""

    cores: float
    page_cpu: float
    item_cpu: float


#: This machine, for the cheapest crawler (benchmarks/results/bench_machine.json: plain Scrapy in four processes at
#: once, its pages and items in the crawlers, the simulated web and nx-27017; the cheapest of its rounds).
MACHINE = Machine(cores=2.0, page_cpu=0.00348, item_cpu=0.000388)
#: One crawler process of the cheapest crawler (the same benchmark: a crawler's own CPU), 8 pages in flight.
MACHINE_NODE = NodeModel(page_cpu=0.0029, item_cpu=0.000278)


@dataclass(frozen=True)
class SiteWork:
    """The work on one site: its tasks' node type, how many tasks, and the results they hold in all."""

    type: int
    tasks: int
    results: int


def node_rate(b: Behaviour, model: NodeModel) -> float:
    """Results per second of a node crawling only this site (see the module doc).

    >>> round(node_rate(Behaviour(share=1.0, latency=0.1), NodeModel(page_cpu=0.0, item_cpu=0.0)), 1)
    800.0
    >>> round(node_rate(Behaviour(share=1.0, latency=0.1), NodeModel(page_cpu=0.02, item_cpu=0.0)), 1)
    500.0
    >>> round(node_rate(Behaviour(share=1.0, latency=0.1), NodeModel(page_cpu=0.0, item_cpu=0.0, delay=2.0)), 1)
    5.0
    """
    return node_rates(b, model, None)[0]


def node_rates(b: Behaviour, model: NodeModel, machine: Machine | None) -> tuple[float, float]:
    """(results per second, machine CPU seconds per second) of a node crawling only this site.

    >>> node_rates(Behaviour(share=1.0, latency=0.1), NodeModel(page_cpu=0.02, item_cpu=0.0), Machine(2, 0.01, 0.001))
    (500.0, 1.0)
    """
    items = b.served * b.share * PAGE_SIZE  # per page requested
    seconds = max(b.latency / max(1, model.concurrency), b.served * model.page_cpu + items * model.item_cpu,
                  model.delay)
    if seconds <= 0:
        return 0.0, 0.0
    cpu = 0.0 if machine is None else (b.served * machine.page_cpu + items * machine.item_cpu) / seconds
    return items / seconds, cpu


def assign(rates: Mapping[str, Mapping[str, float]], caps: Mapping[str, int]) -> tuple[float, dict[str, str]]:
    """The best assignment of nodes to sites: (total rate, node -> site).

    ``rates[node][site]`` > 0 for the sites a node may crawl; ``caps[site]`` nodes at most per site. Exact: a
    min-cost flow by successive shortest paths (Bellman-Ford, so negative reduced costs need no potentials), each
    node one unit of flow, with a site "none" of unlimited room and rate 0 (a node may be better left out).

    >>> assign({"a": {"x": 3, "y": 2}, "b": {"x": 3, "y": 1}}, {"x": 1, "y": 1})
    (5.0, {'a': 'y', 'b': 'x'})
    >>> assign({"a": {"x": 8, "y": 2}, "b": {"x": 7, "y": 3}, "c": {"x": 1, "y": 5}}, {"x": 1, "y": 1})
    (13.0, {'a': 'x', 'c': 'y'})
    """
    chosen: dict[str, str] = {}
    load: dict[str, int] = dict.fromkeys(caps, 0)
    # Fast path: every node's best site, if no site is over its limit.
    for n, per in rates.items():
        if per:
            chosen[n] = max(per, key=lambda s: per[s])
            load[chosen[n]] = load.get(chosen[n], 0) + 1
    if all(load[s] <= caps.get(s, 0) for s in load):
        return float(sum(rates[n][s] for n, s in chosen.items())), chosen
    chosen, load = {}, dict.fromkeys(caps, 0)
    for n in sorted(rates, key=lambda n: -max(rates[n].values(), default=0.0)):
        _augment(n, rates, caps, chosen, load)
    chosen = {n: s for n, s in chosen.items() if s != _NONE}
    return float(sum(rates[n][s] for n, s in chosen.items())), chosen


_NONE = ""  # the site "none" of :func:`assign` (no site is named "")


def _augment(start: str, rates: Mapping[str, Mapping[str, float]], caps: Mapping[str, int], chosen: dict[str, str],
             load: dict[str, int]) -> None:
    """Add node ``start`` to the assignment along the best augmenting path (Bellman-Ford over the sites and
    "none"): it takes a site, or pushes a holder onwards, possibly out to "none"."""
    holders: dict[str, list[str]] = {}
    for n, s in chosen.items():
        holders.setdefault(s, []).append(n)

    def rate(n: str, s: str) -> float:
        return 0.0 if s == _NONE else rates[n][s]

    def moves(n: str) -> list[tuple[str, float]]:
        return [(t, r) for t, r in rates[n].items() if t in caps] + [(_NONE, 0.0)]

    # dist[site]: best gain of reaching ``site`` from start (start takes it, or pushes a holder onwards).
    dist: dict[str, float] = {}
    prev: dict[str, tuple[str, str | None]] = {}  # site -> (node moved into it, site that node left)
    for s, r in moves(start):
        if r > dist.get(s, -math.inf):
            dist[s], prev[s] = r, (start, None)
    for _ in range(len(caps) + 2):
        changed = False
        for s in list(dist):
            for n in holders.get(s, ()):
                for t, r in moves(n):
                    if t != s:
                        gain = dist[s] - rate(n, s) + r
                        if gain > dist.get(t, -math.inf) + 1e-12:
                            dist[t], prev[t], changed = gain, (n, s), True
        if not changed:
            break
    end: str | None = max((s for s in dist if s == _NONE or load.get(s, 0) < caps[s]), key=lambda s: dist[s])
    if end != _NONE:
        load[end] += 1  # type: ignore[index]
    while end is not None:
        node, left = prev[end]
        chosen[node] = end
        end = left


def machine_assign(rates: Mapping[str, Mapping[str, float]], cpu: Mapping[str, Mapping[str, float]],
                   caps: Mapping[str, int], cores: float, iterations: int = 50) -> tuple[float, dict[str, str], float]:
    """The bound of one phase with the machine's row: ``(min over the multipliers tried of L(lam), the assignment
    at that multiplier, lam)`` (see the module doc); ``cpu[node][site]`` is the CPU per second of ``rates``'s crawl.

    >>> machine_assign({"a": {"x": 10.0}, "b": {"x": 10.0}}, {"a": {"x": 1.0}, "b": {"x": 1.0}}, {"x": 2}, 1.0)[0]
    10.0
    """
    def value(lam: float) -> tuple[float, dict[str, str]]:
        w = {n: {s: r - lam * cpu[n][s] for s, r in per.items() if r - lam * cpu[n][s] > 0} for n, per in rates.items()}
        v, chosen = assign(w, caps)
        return lam * cores + v, chosen

    best_v, best_x = value(0.0)
    best_lam = 0.0
    ratios = [r / cpu[n][s] for n, per in rates.items() for s, r in per.items() if cpu[n][s] > 0]
    if not ratios:
        return best_v, best_x, best_lam
    lo, hi = 0.0, max(ratios)  # past max r / q every weight is negative: L = lam C only grows
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    va, vb = value(a), value(b)
    for _ in range(iterations):
        for lam, (v, x) in ((a, va), (b, vb)):
            if v < best_v:
                best_v, best_x, best_lam = v, x, lam
        if va[0] <= vb[0]:
            hi, b, vb = b, a, va
            a = hi - g * (hi - lo)
            va = value(a)
        else:
            lo, a, va = a, b, vb
            b = lo + g * (hi - lo)
            vb = value(b)
    for lam, (v, x) in ((a, va), (b, vb), (hi, value(hi))):
        if v < best_v:
            best_v, best_x, best_lam = v, x, lam
    return best_v, best_x, best_lam


def phases(world: World, nodes: Sequence[SimNode], duration: float) -> list[tuple[float, float]]:
    """The intervals of [0, duration) in which neither the truth nor the set of live nodes changes."""
    cuts = {0.0, duration}
    cuts.update(t for t in world.changes() if 0 < t < duration)
    for n in nodes:
        cuts.update(t for t in (n.joins, n.leaves) if 0 < t < duration)
    times = sorted(cuts)
    return list(zip(times, times[1:], strict=False))


#: A pair *turns good* when the share of a page's results it is served (share x pages served) goes from below
#: NOT_GOOD to at least GOOD (also :meth:`scheduler_ext.sim.families.GeneratedWorld.turned_good`).
NOT_GOOD, GOOD = 0.5, 0.8
#: A pair that turned good is *clearly better* for its node when its rate is at least this many times the node's
#: best rate on another site at that moment.
CLEARLY = 1.25


def best_possible(world: World, nodes: Sequence[SimNode], work: Mapping[str, SiteWork], duration: float,
                  model: NodeModel | None = None, machine: Machine | None = None) -> dict[str, Any]:
    """The bound: ``{"items", "phases": [[start, end, results per second], ...], "assignments": [{node: site}, ...],
    "turned_good": [(node, site, when, clear), ...]}`` (see the module doc); ``assignments`` gives, per phase, the
    site each node crawls in the best schedule (at the multiplier of the machine's row that gave the bound).
    ``turned_good``: the pairs that turn good after the start (:data:`NOT_GOOD`, :data:`GOOD`) and that the best
    schedule crawls from then on, the pairs a scheduler must find at the time it could first find them; ``clear``:
    the pair is clearly better for its node (:data:`CLEARLY`). ``model``: the nodes' machinery (default: the
    simulator's :class:`~scheduler_ext.sim.engine.NodeModel`); ``machine``: the machine they share, if they share
    one."""
    model = model or NodeModel()
    total = 0.0
    out = []
    chosen_per_phase = []
    found: list[tuple[str, str, float, bool]] = []
    caps = {s: w.tasks for s, w in work.items()}
    for a, b in phases(world, nodes, duration):
        live = [n for n in nodes if n.joins <= a < n.leaves]
        both = {n.id: {s: node_rates(world.behaviour(n.id, s, a), model, machine) for s, w in work.items()
                       if w.type in n.types and w.tasks > 0} for n in live}
        rates = {n: {s: rq[0] for s, rq in per.items() if rq[0] > 0} for n, per in both.items()}
        if machine is None:
            value, chosen = assign(rates, caps)
        else:
            cpu = {n: {s: rq[1] for s, rq in per.items()} for n, per in both.items()}
            value, chosen, _ = machine_assign(rates, cpu, caps, machine.cores)
        for node, site in chosen.items() if a > 0 else ():
            before, after = world.behaviour(node, site, a - 1e-6), world.behaviour(node, site, a)
            if before.share * before.served < NOT_GOOD and after.share * after.served >= GOOD:
                elsewhere = max((r for s, r in rates[node].items() if s != site), default=0.0)
                found.append((node, site, float(a), rates[node][site] >= CLEARLY * elsewhere))
        total += value * (b - a)
        out.append([a, b, round(value, 3)])
        chosen_per_phase.append(chosen)
    cap = sum(w.results for w in work.values())
    return {"items": int(min(total, cap)), "phases": out, "assignments": chosen_per_phase, "turned_good": found}
