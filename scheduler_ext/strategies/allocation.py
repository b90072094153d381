"""Allocation strategies: which waiting subtask goes to which node's crawl queue.

:class:`DynamicAllocation` (default) is the paper's: route by expected collected results per second,
``rate(node) = completion(site, node) / seconds_per_page(product, site, node)``, from moving estimates that the
nodes' finish script corrects with every run (recent runs weigh more). Per tick, over a window of the first
waiting subtasks in priority order:

1. Candidates are the live nodes of the subtask's type; the nodes it just failed on (``avoid``) are left out unless
   no other node is alive.
2. A (site, node) pair with fewer than ``SCHEDEXT_EXPLORE_RUNS`` runs, or whose last run is older than
   ``SCHEDEXT_ESTIMATE_STALE`` seconds, is *unexplored*: it is tried once (one exploration in flight per pair) so
   that every node gets measured and a site that changed gets measured again.
3. The paper's exclusion rule: a node whose seconds per page for this (product, site) is more than
   ``SCHEDEXT_SLOW_FACTOR`` times the best node's is excluded.
4. Late binding: a subtask goes to a free node only if that node's rate is at least ``SCHEDEXT_RATE_FLOOR`` times
   the best rate among all live candidates (busy ones included): a better node will soon be free. After
   ``SCHEDEXT_PATIENCE`` seconds of waiting, any non-excluded candidate will do (nothing waits forever).
5. Pairs (subtask, free node) are matched greedily: subtasks past their patience first (so that a site whose only
   good node is always busy with better-paying work still progresses), then highest rate, then priority.

Baselines: :class:`SharedAllocation` (any free node takes the next subtask in FIFO order, as with one shared
scrapy-redis queue) and :class:`RoundRobinAllocation` (static: a task's subtasks always go to one node, chosen by
task id). Every strategy honours ``avoid`` (the nodes a recalled subtask failed on) when another node is
alive: that is part of what a recall means, not of how a strategy ranks nodes (the bandit: when another node suited
to the site is alive, :meth:`~scheduler_ext.strategies.bandit.BanditAllocation._avoidable`). The oracle baseline,
which is told the truth, lives with the simulated web that knows it (product_crawl/oracle.py).
"""

from __future__ import annotations

import functools
import heapq
import math
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..config import config_for
from ..models import Subtask
from . import Allocation, Estimate, Estimates, NodeView


def _candidates(subtask: Subtask, nodes: Sequence[NodeView]) -> list[NodeView]:
    typed = [n for n in nodes if subtask.type in n.types]
    preferred = [n for n in typed if n.id not in subtask.avoid]
    return preferred or typed


_MIN_SPP = 1e-3  # seconds per page below which a rate is not believed (a division guard)
NOBODY: frozenset[str] = frozenset()  # no node excluded: one object for every subtask that avoids no node


def _spp(e: Estimate | None) -> float:
    """Seconds per page used in a rate: the estimate if positive, else 1 s (failures only: no speed known yet;
    the low completion still ranks the node)."""
    return e.value if e is not None and e.value > 0 else 1.0


class _PerNode:
    """:class:`Estimates` without ``site_figures``/``group_figures`` (a simulator's, a test's), asked node by
    node: every node's product figure is taken as an override, which is exact and costs O(nodes) per key."""

    def __init__(self, estimates: Estimates, nodes: Sequence[NodeView]) -> None:
        self.estimates, self.nodes = estimates, nodes

    def site_figures(self, site: str) -> dict[str, tuple[Estimate | None, Estimate | None]]:
        return {n.id: (self.estimates.completion(site, n.id), None) for n in self.nodes}

    def group_figures(self, group: str, site: str) -> dict[str, Estimate | None]:
        return {n.id: self.estimates.seconds_per_page(group, site, n.id) for n in self.nodes}


class _Ranking:
    """The candidates of one (site, node type) ranked by their site-wide figures: ``c`` (what a node collects, or
    for the bandit its expected rate) over ``spp`` (seconds per page, 1 for the bandit) is a node's rate. Built
    once and kept across calls by :class:`Rankings` while the live nodes, the site's figures and the time allow.
    ``data``: what the strategy keeps beside it (the bandit: the site's sums and prior)."""

    def __init__(self, typed: _Typed, c: dict[str, float], spp: dict[str, float],
                 unexplored: list[str], valid_until: float, data: Any = None,
                 by_rate: list[tuple[float, int, str]] | None = None) -> None:
        self.ids, self.index = typed.ids, typed.index
        self.c = c  # explored nodes -> completion
        self.spp = spp  # explored nodes -> site-wide seconds per page (as used in a rate)
        self.unexplored = unexplored  # in node order
        self.valid_until = valid_until  # when the ranking must be rebuilt (an estimate goes stale)
        self.data = data
        index = self.index
        # ``by_rate``: the same rows already sorted (a strategy that moved a few rows of the previous ranking)
        self.by_rate = by_rate if by_rate is not None else sorted(
            [(-(v / max(spp[n], _MIN_SPP)), index[n], n) for n, v in c.items()])
        self._by_spp: list[tuple[float, int, str]] | None = None
        self._under: dict[float, list[tuple[float, int, str]]] = {}

    @property
    def by_spp(self) -> list[tuple[float, int, str]]:
        """The explored nodes, fastest first (made when first asked: the bandit never asks)."""
        if self._by_spp is None:
            self._by_spp = sorted((self.spp[n], self.index[n], n) for n in self.c)
        return self._by_spp

    def under(self, threshold: float) -> list[tuple[float, int, str]]:
        """``by_rate`` without the nodes slower than ``threshold`` seconds per page (kept per threshold)."""
        if threshold == math.inf:
            return self.by_rate  # every node (the bandit's: no node is too slow)
        rows = self._under.get(threshold)
        if rows is None:
            spp = self.spp
            rows = self._under[threshold] = [row for row in self.by_rate if spp[row[2]] <= threshold]
        return rows

    def rate(self, nid: str, spp: float | None = None) -> float:
        return self.c[nid] / max(self.spp[nid] if spp is None else spp, _MIN_SPP)


class _Typed:
    """The live nodes of one type: (index among the live nodes, id) in node order, their ids, id -> index."""

    def __init__(self, nodes: Sequence[NodeView], node_type: int) -> None:
        self.pairs = [(i, n.id) for i, n in enumerate(nodes) if node_type in n.types]
        self.ids = {nid for _, nid in self.pairs}
        self.index = {nid: i for i, nid in self.pairs}


class Rankings:
    """Each (site, node type)'s :class:`_Ranking`, kept across calls: rebuilt only when the live nodes change, the
    site's figures change (the mapping the estimates return is a new object: copy on write) or the ranking's
    ``valid_until`` has passed. One per strategy instance; shared by the dynamic and the bandit allocation.
    Call :meth:`begin` with the live nodes once per allocate call, then :meth:`get` per (site, type)."""

    MAX = 10_000  # (site, type) rankings kept; all are dropped past it (sites no longer seen)

    def __init__(self) -> None:
        self._kept: dict[tuple[str, int], tuple[Any, Any, _Ranking]] = {}
        self._signature: list[tuple[str, list[int]]] = []
        self._typed: dict[int, _Typed] = {}
        self._nodes: Sequence[NodeView] = ()

    def begin(self, nodes: Sequence[NodeView]) -> None:
        """The live nodes of this call: the rankings of another set of nodes (or types) are not reused."""
        signature = [(n.id, n.types) for n in nodes]
        if signature != self._signature:
            self._signature, self._typed = signature, {}
        self._nodes = nodes

    def typed(self, node_type: int) -> _Typed:
        t = self._typed.get(node_type)
        if t is None:
            t = self._typed[node_type] = _Typed(self._nodes, node_type)
        return t

    def get(self, site: str, node_type: int, source: Any, now: float,
            build: Callable[[_Typed, _Ranking | None], _Ranking], cacheable: bool = True) -> _Ranking:
        """The ranking of (site, type) built from ``source`` (the site's figures, compared by identity);
        ``build(typed, previous)`` makes a new one, given the previous ranking of the same nodes if there is one
        (to update what changed only; it may be past its ``valid_until``)."""
        kept = self._kept.get((site, node_type))
        previous = None
        if cacheable and kept is not None and kept[0] is self._signature:
            if kept[1] is source and now <= kept[2].valid_until:
                return kept[2]
            previous = kept[2]
        if len(self._kept) > self.MAX:
            self._kept.clear()
        ranking = build(self.typed(node_type), previous)
        self._kept[(site, node_type)] = (self._signature, source, ranking)
        return ranking


class _Site:
    """One (site, node type) within one allocate call: its ranking plus what this call's free slots make of it."""

    def __init__(self, site: str, ranking: _Ranking, free: dict[str, int]) -> None:
        self.site, self.ranking, self.free = site, ranking, free
        self.explore_at = 0  # unexplored nodes before this point are full or being explored: skip them for all
        self._free_lists: dict[float, _FreeList] = {}
        self.memo: dict[str, Any] = {}  # what a strategy keeps per (site, type) for this call (the bandit's retry)

    def rewind(self) -> None:
        """Forgets which nodes were found full: the free lists are made again as asked."""
        self._free_lists.clear()

    def free_list(self, threshold: float) -> _FreeList:
        """The free explored nodes no slower than ``threshold``, best rate first (shared per threshold)."""
        fl = self._free_lists.get(threshold)
        if fl is None:  # full nodes are skipped as they are met (_FreeList.first), not filtered here
            fl = self._free_lists[threshold] = _FreeList(self.ranking.under(threshold))
        return fl


class _FreeList:
    """Nodes in rank order; ``first(i)`` skips the ones that filled up (path-compressed: amortized O(1))."""

    def __init__(self, rows: list[tuple[float, int, str]]) -> None:
        self.rows = rows
        self.nxt = list(range(1, len(rows) + 1))

    def first(self, i: int, free: dict[str, int]) -> int:
        path = []
        rows, nxt = self.rows, self.nxt
        while i < len(rows) and free[rows[i][2]] <= 0:
            path.append(i)
            i = nxt[i]
        for p in path:
            nxt[p] = i
        return i


class _Class:
    """Subtasks that rank nodes alike: same site and type, same nodes excluded, same product figures (most
    products have none). Within a class the greedy only ever needs its first subtask past its patience and its
    first one within it (priority order): they beat the others on every node.

    ``others``: node -> rate for the nodes whose rate for these subtasks is not the ranking's (product figures),
    already filtered by ``threshold``; ``skip``: nodes taken from the ranking (excluded, or in ``others``);
    ``threshold``: the slowest seconds per page still eligible."""

    def __init__(self, site: _Site, skip: set[str], others: dict[str, float], threshold: float,
                 rate_floor: float) -> None:
        r = site.ranking
        self.site, self.skip, self.rates = site, skip, others
        self.posts: dict[str, Any] = {}  # what the strategy keeps per node of ``others`` (the bandit: pace sums)
        best_b = next((-negr for negr, _, n in r.under(threshold) if n not in skip), None)
        rates = [v for v in (max(others.values(), default=None), best_b) if v is not None]
        self.top = max(rates, default=0.0)  # the best rate among all candidates, busy ones included
        self.known = bool(rates)
        self.queues: tuple[list[tuple[int, Subtask]], list[tuple[int, Subtask]]] = ([], [])  # (aged, fresh)
        self.heads = [0, 0]
        self.floors = (0.0, rate_floor * self.top)  # aged subtasks take any eligible node
        self.threshold = threshold
        self.free_list = site.free_list(threshold)
        self.others = sorted((-v, r.index[n], n) for n, v in others.items())
        self.i, self.j = 0, 0

    def best(self, aged: bool, free: dict[str, int]) -> tuple[float, int, str] | None:
        """The best free eligible node for this class's subtasks (aged or not), as (-rate, node index, id)."""
        fl = self.free_list
        i = fl.first(self.i, free)
        while i < len(fl.rows) and fl.rows[i][2] in self.skip:
            i = fl.first(i + 1, free)
        self.i = i
        while self.j < len(self.others) and free[self.others[self.j][2]] <= 0:
            self.j += 1
        a = fl.rows[i] if i < len(fl.rows) else None
        b = self.others[self.j] if self.j < len(self.others) else None
        pick = a if b is None or (a is not None and a[:2] < b[:2]) else b
        if pick is None:
            return None
        rate = -pick[0]
        # Past its patience even a node that collected nothing so far may try (and fail: recall decides).
        if rate < self.floors[not aged] or (rate <= 0 and not aged):
            return None
        return pick

    def rewind(self) -> None:
        """Starts the walk of the free nodes over: the greedy runs again with more free slots than it left
        (call :meth:`_Site.rewind` first)."""
        self.free_list = self.site.free_list(self.threshold)
        self.i, self.j = 0, 0

    def head(self, aged: bool) -> tuple[int, Subtask] | None:
        q, h = self.queues[not aged], self.heads[not aged]
        return q[h] if h < len(q) else None


def greedy(classes: Iterable[_Class], free: dict[str, int]) -> list[tuple[Subtask, str]]:
    """The greedy matching of the classes' queued subtasks to free nodes: subtasks past their patience first,
    then the highest rate, then priority. The heap holds the best pair of each class's first aged and first
    fresh subtask; a popped pair whose node filled up meanwhile goes back with its next best (keys only get
    worse), so the pairs chosen are exactly those of the greedy over every (subtask, node) pair."""
    result: list[tuple[Subtask, str]] = []
    ready: list[tuple[bool, float, int, int, int, _Class]] = []
    for n, cls in enumerate(classes):
        for aged in (True, False):
            _push(ready, cls, aged, free, n)
    heapq.heapify(ready)
    left = sum(v for v in free.values() if v > 0)
    while ready and left:
        entry = heapq.heappop(ready)
        aged, cls, n = not entry[0], entry[5], entry[4]
        best, head = cls.best(aged, free), cls.head(aged)
        if best is None or head is None:
            continue
        if (best[0], best[1]) != (entry[1], entry[3]):
            heapq.heappush(ready, (entry[0], best[0], head[0], best[1], n, cls))
            continue
        free[best[2]] -= 1
        left -= 1
        result.append((head[1], best[2]))
        cls.heads[not aged] += 1
        _push(ready, cls, aged, free, n, heap=True)
    return result


def _push(ready: list[tuple[bool, float, int, int, int, _Class]], cls: _Class, aged: bool, free: dict[str, int],
          n: int, heap: bool = False) -> None:
    head = cls.head(aged)
    best = cls.best(aged, free) if head is not None else None
    if head is None or best is None:
        return
    entry = (not aged, best[0], head[0], best[1], n, cls)
    if heap:
        heapq.heappush(ready, entry)
    else:
        ready.append(entry)


class DynamicAllocation(Allocation):
    """The paper's allocation (see the module docstring), in time proportional to what it allocates.

    Work per call: each (site, node type) ranks its candidate nodes once and keeps that ranking across calls
    (:class:`Rankings`, the mechanism the bandit allocation shares) until a node joins or leaves, the site's
    estimates change or one goes stale; subtasks that rank nodes alike
    (same site, type, avoided nodes and product figures) form one class; the greedy matching takes the best
    remaining (subtask, free node) pair from a heap holding the first subtask of each class, skipping filled
    nodes in amortized O(1). That is O(window + free slots x log), not O(window x nodes), and it chooses exactly
    the pairs of the plain greedy over every (subtask, node) pair (tests/test_allocation.py checks this against
    that reference).

    ``estimates`` may offer ``site_figures(site)`` and ``group_figures(group, site)`` (every node at once, as
    :class:`scheduler_ext.control.EstimateCache` does; a mapping returned by ``site_figures`` must be a new
    object when its content changes); without them each node is asked in turn (exact, O(nodes) per product).
    """

    def __init__(self, *, explore_runs: int = 1, stale_after: float = 600.0, slow_factor: float = 3.0,
                 rate_floor: float = 0.6, patience: float = 30.0, explore_timeout: float = 60.0) -> None:
        self.explore_runs = explore_runs
        self.stale_after = stale_after
        self.slow_factor = slow_factor
        self.rate_floor = rate_floor
        self.patience = patience
        self.explore_timeout = explore_timeout
        self._exploring: dict[tuple[str, str], float] = {}  # (site, node) -> when an exploration was sent
        self._rankings = Rankings()

    @classmethod
    def from_crawler(cls, crawler: Any) -> DynamicAllocation:
        c = config_for(crawler)
        return cls(explore_runs=c.explore_runs, stale_after=c.estimate_stale, slow_factor=c.slow_factor,
                   rate_floor=c.rate_floor, patience=c.patience, explore_timeout=c.recall_age)

    def rate(self, subtask: Subtask, node: NodeView, estimates: Estimates, now: float) -> tuple[float, float] | None:
        """(expected results per second, seconds per page) of ``node`` for ``subtask``; None if unexplored."""
        c = estimates.completion(subtask.site, node.id)
        p = estimates.seconds_per_page(subtask.group, subtask.site, node.id)
        if c is None or c.runs < self.explore_runs or now - c.last_run > self.stale_after:
            return None
        spp = _spp(p)
        return c.value / max(spp, _MIN_SPP), spp

    def _build(self, figures: dict[str, tuple[Estimate | None, Estimate | None]], now: float, typed: _Typed,
               previous: _Ranking | None) -> _Ranking:
        """A ranking of the explored nodes from the site's figures (built anew: a change to one node's figures
        is cheap to re-rank, ``previous`` is not needed)."""
        c: dict[str, float] = {}
        spp: dict[str, float] = {}
        unexplored: list[str] = []
        valid_until = math.inf  # when the first explored estimate goes stale
        for _, nid in typed.pairs:
            ce, p = figures.get(nid, (None, None))
            if ce is None or ce.runs < self.explore_runs or now - ce.last_run > self.stale_after:
                unexplored.append(nid)
                continue
            c[nid], spp[nid] = ce.value, _spp(p)
            valid_until = min(valid_until, ce.last_run + self.stale_after)
        return _Ranking(typed, c, spp, unexplored, valid_until)

    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                 now: float) -> list[tuple[Subtask, str]]:
        if type(self).rate is not DynamicAllocation.rate:  # a subclass rates pairs its own way
            return self.allocate_pairwise(subtasks, nodes, estimates, now)
        figures: Any = estimates if hasattr(estimates, "site_figures") and hasattr(estimates, "group_figures") \
            else _PerNode(estimates, nodes)
        return self.allocate_ranked(subtasks, nodes, figures, now)

    def allocate_ranked(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], figures: Any,
                        now: float) -> list[tuple[Subtask, str]]:
        """:meth:`allocate` on ``figures``, which offer ``site_figures(site)`` and ``group_figures(group, site)``
        (a subclass whose rates come from elsewhere, the oracle, gives its own)."""
        self._exploring = {k: t for k, t in self._exploring.items() if now - t < self.explore_timeout}
        free = {n.id: max(0, n.free) for n in nodes}
        if not any(free.values()) or not subtasks:
            return []
        self._rankings.begin(nodes)
        sites: dict[tuple[str, int], _Site] = {}
        keys: dict[tuple[Any, ...], _Class] = {}
        classes: dict[tuple[Any, ...], _Class] = {}
        result: list[tuple[Subtask, str]] = []
        for order, st in enumerate(subtasks):
            site = sites.get((st.site, st.type))
            if site is None:
                source = figures.site_figures(st.site)
                ranking = self._rankings.get(st.site, st.type, source, now,
                                             functools.partial(self._build, source, now),
                                             cacheable=not isinstance(figures, _PerNode))
                site = sites[(st.site, st.type)] = _Site(st.site, ranking, free)
            avoided = site.ranking.ids.intersection(st.avoid)
            excluded = avoided if avoided != site.ranking.ids else set()  # none else alive: the avoided will do
            # Exploration first, in priority order: one subtask per unexplored (site, node) pair.
            nid = self._explore(site, excluded, free)
            if nid is not None:
                self._exploring[(st.site, nid)] = now
                free[nid] -= 1
                result.append((st, nid))
                continue
            kk = (st.group, st.site, st.type, frozenset(excluded) if excluded else NOBODY)
            cls = keys.get(kk)
            if cls is None:
                c = site.ranking.c
                overrides = {n: _spp(e) for n, e in figures.group_figures(st.group, st.site).items()
                             if e is not None and n in c and n not in excluded}
                ck = (st.site, st.type, kk[3], tuple(sorted(overrides.items())))
                cls = classes.get(ck)
                if cls is None:
                    cls = classes[ck] = self._class(site, excluded, overrides)
                keys[kk] = cls
            if cls.known:
                cls.queues[now - st.since < self.patience].append((order, st))
        return result + greedy(classes.values(), free)

    def allocate_pairwise(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                          now: float) -> list[tuple[Subtask, str]]:
        """The same choice through :meth:`rate` for every (subtask, candidate node) pair: O(window x nodes).

        The specification of :meth:`allocate`, and the path for subclasses that override :meth:`rate` (whose
        rates need not come from the estimates, so cannot be ranked once per site).
        """
        free = {n.id: n.free for n in nodes if n.free > 0}
        self._exploring = {k: t for k, t in self._exploring.items() if now - t < self.explore_timeout}
        pairs: list[tuple[bool, float, int, Subtask, str]] = []
        explore: list[tuple[int, Subtask, str]] = []
        memo: dict[tuple[Any, ...], tuple[list[NodeView], dict[str, tuple[float, float]]]] = {}
        for order, st in enumerate(subtasks):
            # Subtasks of one (product, site, type) with the same nodes to avoid rank nodes alike: rate them once.
            key = (st.group, st.site, st.type, tuple(st.avoid))
            if key not in memo:
                cands = _candidates(st, nodes)
                memo[key] = cands, {n.id: rs for n in cands if (rs := self.rate(st, n, estimates, now)) is not None}
            cands, known = memo[key]
            for n in cands:
                if n.id not in known and n.id in free and (st.site, n.id) not in self._exploring:
                    explore.append((order, st, n.id))
            if not known:
                continue
            best_spp = min(spp for _, spp in known.values())
            eligible = {nid: r for nid, (r, spp) in known.items() if spp <= self.slow_factor * best_spp}
            best_rate = max(eligible.values())
            aged = now - st.since >= self.patience
            floor = 0.0 if aged else self.rate_floor * best_rate
            for nid, r in eligible.items():
                # Past its patience even a node that collected nothing so far may try (and fail: recall decides).
                if nid in free and r >= floor and (r > 0 or aged):
                    pairs.append((aged, r, order, st, nid))
        assigned: set[str] = set()
        result: list[tuple[Subtask, str]] = []
        # Exploration first, in priority order: one subtask per unexplored (site, node) pair.
        for _, st, nid in explore:
            if st.id not in assigned and free.get(nid, 0) > 0 and (st.site, nid) not in self._exploring:
                self._exploring[(st.site, nid)] = now
                assigned.add(st.id)
                free[nid] -= 1
                result.append((st, nid))
        for _, _, _, st, nid in sorted(pairs, key=lambda p: (not p[0], -p[1], p[2])):
            if st.id not in assigned and free.get(nid, 0) > 0:
                assigned.add(st.id)
                free[nid] -= 1
                result.append((st, nid))
        return result

    def _class(self, site: _Site, excluded: set[str], overrides: dict[str, float]) -> _Class:
        """The class of subtasks excluding ``excluded`` whose product figures are ``overrides`` (node -> seconds
        per page): the paper's exclusion rule sets its threshold, ``SCHEDEXT_SLOW_FACTOR`` x the fastest."""
        r = site.ranking
        skip = excluded | overrides.keys()
        base_best = next((spp for spp, _, n in r.by_spp if n not in skip), None)
        fastest = min([*overrides.values(), *([base_best] if base_best is not None else [])], default=None)
        t = -math.inf if fastest is None else self.slow_factor * fastest
        return _Class(site, skip, {n: r.rate(n, spp) for n, spp in overrides.items() if spp <= t}, t,
                      self.rate_floor)

    def _explore(self, base: _Site, excluded: set[str], free: dict[str, int]) -> str | None:
        """The first unexplored free node of this site not yet being explored and not excluded; None if none."""
        nodes = base.ranking.unexplored
        while base.explore_at < len(nodes) and (free[nodes[base.explore_at]] <= 0
                                                or (base.site, nodes[base.explore_at]) in self._exploring):
            base.explore_at += 1  # filled or being explored: for the rest of this call, for every subtask
        for i in range(base.explore_at, len(nodes)):  # past the shared point, skip only what this subtask avoids
            nid = nodes[i]
            if nid not in excluded and free[nid] > 0 and (base.site, nid) not in self._exploring:
                return nid
        return None


class SharedAllocation(Allocation):
    """Baseline: one shared FIFO queue; whichever node has room takes the next subtask of its type."""

    def __init__(self) -> None:
        self._turn = 0

    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                 now: float) -> list[tuple[Subtask, str]]:
        """Each subtask in turn to the next free candidate in rotation: its type's free nodes in node order
        (without the ones it avoids, unless it avoids every live node of its type), the ``turn``-th of them.
        The free nodes of each type are listed once and a node leaves the list when it fills: a subtask costs
        what it avoids, not the cluster's nodes."""
        free = {n.id: n.free for n in nodes if n.free > 0}
        by_type: dict[int, tuple[list[str], set[str]]] = {}  # type -> (its free nodes in node order, all its nodes)
        result = []
        for st in subtasks:
            listed = by_type.get(st.type)
            if listed is None:
                typed = [n.id for n in nodes if st.type in n.types]
                listed = by_type[st.type] = ([nid for nid in typed if free.get(nid, 0) > 0], set(typed))
            candidates, every = listed
            avoided = [nid for nid in st.avoid if nid in every] if st.avoid else []
            if avoided and len(set(avoided)) < len(every):  # others are alive: the avoided ones are left out
                skip = set(avoided)
                count = len(candidates) - sum(1 for nid in skip if free.get(nid, 0) > 0)
                if not count:
                    continue
                self._turn += 1
                k = self._turn % count  # the k-th free candidate it does not avoid
                nid = next(nid for nid in candidates if nid not in skip and (k := k - 1) < 0)
            else:
                if not candidates:
                    continue
                self._turn += 1
                nid = candidates[self._turn % len(candidates)]  # rotate so that no node is always first in line
            free[nid] -= 1
            if not free[nid]:
                for typed_free, every in by_type.values():  # it leaves every type's list it is on
                    if nid in every:
                        typed_free.remove(nid)
            result.append((st, nid))
        return result


class RoundRobinAllocation(Allocation):
    """Baseline: static assignment; all subtasks of a task go to one node, chosen by the task id."""

    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                 now: float) -> list[tuple[Subtask, str]]:
        free = {n.id: n.free for n in nodes}
        result = []
        for st in subtasks:
            typed = sorted((n for n in nodes if st.type in n.types), key=lambda n: n.id)
            if not typed:
                continue
            home = zlib.crc32(st.task.encode()) % len(typed)
            ring = typed[home:] + typed[:home]
            node = next((n for n in ring if n.id not in st.avoid), ring[0])  # its home, unless it failed there
            if free[node.id] > 0:
                free[node.id] -= 1
                result.append((st, node.id))
        return result
