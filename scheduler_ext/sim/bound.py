"""The best possible collection a world allows: an upper bound for any scheduling of the same nodes and tasks.

Between two changes of the truth (a phase change of some behaviour, a node joining or leaving) every rate is
constant, so the best schedule of that phase is a static assignment of node time to sites, and the bound is the sum
over phases of ``(phase length) x (value of the best assignment)``:

    maximize    sum_{n,s} r[n,s] x[n,s]
    subject to  sum_s x[n,s] <= 1           a node's capacity (its page slots and its CPU)
                sum_n x[n,s] <= T_s         a site has T_s tasks, each crawled by one node at a time
                x >= 0, x[n,s] = 0 unless node n serves the type of site s's tasks

The constraint matrix is that of a transportation problem (totally unimodular), so an optimal ``x`` is integral:
each live node crawls one site, and a site takes at most ``T_s`` nodes. :func:`assign` solves it exactly by
successive shortest augmenting paths (a min-cost flow), which costs little when, as at scale, the site limits do
not bind (each node then takes its best site at once).

``r[n,s]`` is the results a node collects per second on site ``s`` crawling nothing else, from the node's machinery
(:class:`~scheduler_ext.sim.engine.NodeModel`, by default :data:`OPTIMISTIC`) and the site's behaviour. A node holds
many subtasks at once and overlaps their overheads with other subtasks' pages, so its limits are its page slots and
its CPU: per page requested it collects ``served x share x PAGE_SIZE`` results, and it requests pages at most
``min(concurrency / latency, 1 / (served x page_cpu + results per page x item_cpu))`` a second. No overhead is
charged. A task is crawled by one node at a time, so a site's ``T_s`` limit in whole nodes is optimistic too. The
bound ignores every cost a real schedule cannot avoid and the bound need not count: overheads, learning, waiting for
a report before a task's next subtask, pages re-crawled after a failure, the end of a task's results, other
processes on the machine. The total is also capped by the results the tasks hold.

One caveat: the capacity ``sum_s x[n,s] <= 1`` charges a node the larger of its two limits on each site, so a node
splitting its time between a site where the CPU binds (latency under ``concurrency x page_cpu``) and one where the
network binds could in principle beat it. With :data:`OPTIMISTIC` the CPU binds only below 0.056 s of latency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .engine import NodeModel, SimNode
from .world import PAGE_SIZE, Behaviour, World

#: The bound's machinery: a node alone on a core of this machine (benchmarks/results/bench_node.json: 7 ms of node CPU
#: per page of 10 results, items stored included), faster than any node of a real cluster sharing the machine.
OPTIMISTIC = NodeModel(page_cpu=0.007, item_cpu=0.0)


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
    """
    items = b.served * b.share * PAGE_SIZE  # per page requested
    seconds = max(b.latency / max(1, model.concurrency), b.served * model.page_cpu + items * model.item_cpu)
    return items / seconds if seconds > 0 else 0.0


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
                  model: NodeModel | None = None) -> dict[str, object]:
    """The bound: ``{"items", "phases": [[start, end, results per second], ...], "assignments": [{node: site}, ...]}``
    (see the module doc); ``assignments`` gives, per phase, the site each node crawls in the best schedule."""
    model = model or OPTIMISTIC
    total = 0.0
    out = []
    chosen_per_phase = []
    for a, b in phases(world, nodes, duration):
        live = [n for n in nodes if n.joins <= a < n.leaves]
        rates = {n.id: {s: r for s, w in work.items() if w.type in n.types and w.tasks > 0
                        and (r := node_rate(world.behaviour(n.id, s, a), model)) > 0} for n in live}
        value, chosen = assign(rates, {s: w.tasks for s, w in work.items()})
        total += value * (b - a)
        out.append([a, b, round(value, 3)])
        chosen_per_phase.append(chosen)
    cap = sum(w.results for w in work.values())
    return {"items": int(min(total, cap)), "phases": out, "assignments": chosen_per_phase}
