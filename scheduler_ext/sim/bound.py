"""The best possible collection a world allows: an upper bound for any scheduling of the same nodes and tasks.

Between two changes of the truth (a phase change of some behaviour, a node joining or leaving) every rate is
constant, so the best schedule of that phase is a static assignment of node time to sites, and the bound is the sum
over phases of ``(phase length) x (value of the best assignment)``:

    maximize    sum_{n,s} r[n,s] x[n,s]
    subject to  sum_s x[n,s] <= 1           a node's time (one subtask at a time)
                sum_n x[n,s] <= T_s         a site has T_s tasks, each crawled by one node at a time
                x >= 0, x[n,s] = 0 unless node n serves the type of site s's tasks

The constraint matrix is that of a transportation problem (totally unimodular), so an optimal ``x`` is integral:
each live node crawls one site, and a site takes at most ``T_s`` nodes. :func:`assign` solves it exactly by
successive shortest augmenting paths (a min-cost flow), which costs little when, as at scale, the site limits do
not bind (each node then takes its best site at once).

``r[n,s]`` is the results a node collects per second on site ``s`` crawling nothing else, from the node's machinery
(:class:`~scheduler_ext.sim.engine.NodeModel`) and the site's behaviour, at the best subtask size in
``page_limits`` (larger subtasks spread the per-subtask overhead over more pages): expected results
``P x served x share x PAGE_SIZE`` over ``overhead + max(ceil(P / concurrency) x latency, CPU time)``. It ignores
every cost a real schedule cannot avoid and the bound need not count: learning, waiting for a report before a task's
next subtask, pages re-crawled after a failure, the end of a task's results. The total is also capped by the results
the tasks hold. So no schedule of the same machinery collects more.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .engine import NodeModel, SimNode
from .world import PAGE_SIZE, Behaviour, World


@dataclass(frozen=True)
class SiteWork:
    """The work on one site: its tasks' node type, how many tasks, and the results they hold in all."""

    type: int
    tasks: int
    results: int


def node_rate(b: Behaviour, model: NodeModel, page_limits: Iterable[int] = range(1, 21)) -> float:
    """Results per second of a node crawling only this site, at the best subtask size (see the module doc).

    >>> round(node_rate(Behaviour(share=1.0, latency=0.1), NodeModel(overhead=0.2, page_cpu=0.0, item_cpu=0.0),
    ...                 [8]), 1)
    266.7
    """
    served = b.served
    best = 0.0
    for p in page_limits:
        items = p * served * b.share * PAGE_SIZE
        cpu = p * served * model.page_cpu + items * model.item_cpu
        network = math.ceil(p / max(1, model.concurrency)) * b.latency
        best = max(best, items / (model.overhead + max(network, cpu)))
    return best


def assign(rates: Mapping[str, Mapping[str, float]], caps: Mapping[str, int]) -> tuple[float, dict[str, str]]:
    """The best assignment of nodes to sites: (total rate, node -> site).

    ``rates[node][site]`` > 0 for the sites a node may crawl; ``caps[site]`` nodes at most per site. Exact: a
    min-cost flow by successive shortest paths (Bellman-Ford, so negative reduced costs need no potentials).

    >>> assign({"a": {"x": 3, "y": 2}, "b": {"x": 3, "y": 1}}, {"x": 1, "y": 1})
    (5.0, {'a': 'y', 'b': 'x'})
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
    return float(sum(rates[n][s] for n, s in chosen.items())), chosen


def _augment(start: str, rates: Mapping[str, Mapping[str, float]], caps: Mapping[str, int], chosen: dict[str, str],
             load: dict[str, int]) -> None:
    """Add node ``start`` to the assignment along the best augmenting path (Bellman-Ford over sites)."""
    holders: dict[str, list[str]] = {}
    for n, s in chosen.items():
        holders.setdefault(s, []).append(n)
    # dist[site]: best gain of reaching ``site`` from start (start takes it, or pushes a holder onwards).
    dist: dict[str, float] = {}
    prev: dict[str, tuple[str, str | None]] = {}  # site -> (node moved into it, site that node left)
    for s, r in rates[start].items():
        if s in caps and r > dist.get(s, -math.inf):
            dist[s], prev[s] = r, (start, None)
    for _ in range(len(caps) + 1):
        changed = False
        for s in list(dist):
            for n in holders.get(s, ()):
                for t, r in rates[n].items():
                    if t != s and t in caps:
                        gain = dist[s] - rates[n][s] + r
                        if gain > dist.get(t, -math.inf) + 1e-12:
                            dist[t], prev[t], changed = gain, (n, s), True
        if not changed:
            break
    free_sites = [s for s in dist if load.get(s, 0) < caps[s] and dist[s] > 0]
    if not free_sites:
        return
    end: str | None = max(free_sites, key=lambda s: dist[s])
    load[end] += 1  # type: ignore[index]
    while end is not None:
        node, left = prev[end]
        chosen[node] = end
        end = left


def phases(world: World, nodes: Sequence[SimNode], duration: float) -> list[tuple[float, float]]:
    """The intervals of [0, duration) in which neither the truth nor the set of live nodes changes."""
    cuts = {0.0, duration}
    cuts.update(t for t in world.changes() if 0 < t < duration)
    for n in nodes:
        cuts.update(t for t in (n.joins, n.leaves) if 0 < t < duration)
    times = sorted(cuts)
    return list(zip(times, times[1:], strict=False))


def best_possible(world: World, nodes: Sequence[SimNode], work: Mapping[str, SiteWork], duration: float,
                  model: NodeModel | None = None, page_limits: Iterable[int] = range(1, 21)) -> dict[str, object]:
    """The bound: ``{"items", "phases": [[start, end, results per second], ...], "assignments": [{node: site}, ...]}``
    (see the module doc); ``assignments`` gives, per phase, the site each node crawls in the best schedule."""
    model = model or NodeModel()
    limits = list(page_limits)
    total = 0.0
    out = []
    chosen_per_phase = []
    for a, b in phases(world, nodes, duration):
        live = [n for n in nodes if n.joins <= a < n.leaves]
        rates = {n.id: {s: r for s, w in work.items() if w.type in n.types and w.tasks > 0
                        and (r := node_rate(world.behaviour(n.id, s, a), model, limits)) > 0} for n in live}
        value, chosen = assign(rates, {s: w.tasks for s, w in work.items()})
        total += value * (b - a)
        out.append([a, b, round(value, 3)])
        chosen_per_phase.append(chosen)
    cap = sum(w.results for w in work.values())
    return {"items": int(min(total, cap)), "phases": out, "assignments": chosen_per_phase}
