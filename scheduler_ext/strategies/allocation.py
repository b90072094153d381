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
alive: that is part of what a recall means, not of how a strategy ranks nodes. The oracle baseline, which is
told the truth, lives with the simulated web that knows it (product_crawl/oracle.py).
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Sequence
from typing import Any

from ..config import config_for
from ..models import Subtask
from . import Allocation, Estimate, Estimates, NodeView


def _candidates(subtask: Subtask, nodes: Sequence[NodeView]) -> list[NodeView]:
    typed = [n for n in nodes if subtask.type in n.types]
    preferred = [n for n in typed if n.id not in subtask.avoid]
    return preferred or typed


_MIN_SPP = 1e-3  # seconds per page below which a rate is not believed (a division guard)


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


class _Site:
    """One (site, node type) for one allocate call: its candidate nodes ranked once, shared by every subtask."""

    def __init__(self, alloc: DynamicAllocation, site: str, typed: list[tuple[int, str]],
                 figures: dict[str, tuple[Estimate | None, Estimate | None]], free: dict[str, int],
                 now: float) -> None:
        self.site, self.typed = site, typed
        self.ids = {nid for _, nid in typed}
        self.c: dict[str, float] = {}  # explored nodes -> completion
        self.spp: dict[str, float] = {}  # explored nodes -> site-wide seconds per page (as used in a rate)
        unexplored = []
        for _, nid in typed:
            c, p = figures.get(nid, (None, None))
            if c is None or c.runs < alloc.explore_runs or now - c.last_run > alloc.stale_after:
                if free.get(nid, 0) > 0:
                    unexplored.append(nid)
                continue
            self.c[nid], self.spp[nid] = c.value, _spp(p)
        self.unexplored, self.explore_at = unexplored, 0
        self.index = {nid: idx for idx, nid in typed}
        self.by_spp = sorted((self.spp[n], self.index[n], n) for n in self.c)
        self.by_rate = sorted((-self.rate(n), self.index[n], n) for n in self.c)
        self._free_lists: dict[float, _FreeList] = {}

    def rate(self, nid: str, spp: float | None = None) -> float:
        return self.c[nid] / max(self.spp[nid] if spp is None else spp, _MIN_SPP)

    def free_list(self, threshold: float, free: dict[str, int]) -> _FreeList:
        """The free explored nodes no slower than ``threshold``, best rate first (shared per threshold)."""
        fl = self._free_lists.get(threshold)
        if fl is None:
            rows = [(r, i, n) for r, i, n in self.by_rate if free.get(n, 0) > 0 and self.spp[n] <= threshold]
            fl = self._free_lists[threshold] = _FreeList(rows)
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


class _Key:
    """What every subtask of one (product, site, type, avoid) shares: who is excluded, who has a product
    figure (overrides), the best seconds per page and rate, and the ranked free nodes."""

    def __init__(self, base: _Site, excluded: set[str], overrides: dict[str, float], slow_factor: float,
                 free: dict[str, int]) -> None:
        self.base, self.excluded = base, excluded
        skip = excluded | overrides.keys()
        o_rates = {n: base.rate(n, spp) for n, spp in overrides.items()}
        base_best = next((spp for spp, _, n in base.by_spp if n not in skip), None)
        candidates = [*overrides.values(), *([base_best] if base_best is not None else [])]
        self.known = bool(candidates)
        if not self.known:
            return
        self.threshold = slow_factor * min(candidates)
        t = self.threshold
        best_o = max((r for n, r in o_rates.items() if overrides[n] <= t), default=None)
        best_b = next((-negr for negr, _, n in base.by_rate if n not in skip and base.spp[n] <= t), None)
        rates = [r for r in (best_o, best_b) if r is not None]
        self.eligible = bool(rates)  # the fastest node is always eligible: False only if rates are not numbers
        self.best_rate = max(rates) if rates else 0.0
        self.skip = skip
        self.free_list = base.free_list(t, free)
        self.others = sorted((-r, base.index[n], n) for n, r in o_rates.items()
                             if overrides[n] <= t and free.get(n, 0) > 0)


class _Cursor:
    """One subtask's walk through its free eligible nodes, best rate first (merging the shared ranked list
    with its product's overrides)."""

    __slots__ = ("st", "key", "floor", "aged", "i", "j", "order")

    def __init__(self, st: Subtask, key: _Key, floor: float, aged: bool, order: int) -> None:
        self.st, self.key, self.floor, self.aged, self.order = st, key, floor, aged, order
        self.i = self.j = 0

    def best(self, free: dict[str, int]) -> tuple[float, int, str] | None:
        key, fl = self.key, self.key.free_list
        i = fl.first(self.i, free)
        while i < len(fl.rows) and fl.rows[i][2] in key.skip:
            i = fl.first(i + 1, free)
        self.i = i
        while self.j < len(key.others) and free[key.others[self.j][2]] <= 0:
            self.j += 1
        a = fl.rows[i] if i < len(fl.rows) else None
        b = key.others[self.j] if self.j < len(key.others) else None
        pick = a if b is None or (a is not None and a[:2] < b[:2]) else b
        if pick is None:
            return None
        r = -pick[0]
        # Past its patience even a node that collected nothing so far may try (and fail: recall decides).
        if r < self.floor or (r <= 0 and not self.aged):
            return None
        return pick


class DynamicAllocation(Allocation):
    """The paper's allocation (see the module docstring), in time proportional to what it allocates.

    Work per call: each (site, node type) in the window ranks its candidate nodes once; each (product, site,
    type, avoid) adjusts that ranking only for the nodes with a product figure (few) and the nodes it avoids
    (at most three); the greedy matching takes the best remaining (subtask, free node) pair from a heap holding
    one candidate per subtask, skipping filled nodes in amortized O(1). That is O(window log window + sites x
    nodes log nodes), not O(window x nodes), and it chooses exactly the pairs the plain greedy over every
    (subtask, node) pair would (tests/test_strategies.py checks this against that reference).

    ``estimates`` may offer ``site_figures(site)`` and ``group_figures(group, site)`` (every node at once, as
    :class:`scheduler_ext.control.EstimateCache` does); without them each node is asked in turn (exact, slower).
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

    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                 now: float) -> list[tuple[Subtask, str]]:
        self._exploring = {k: t for k, t in self._exploring.items() if now - t < self.explore_timeout}
        free = {n.id: n.free for n in nodes if n.free > 0}
        if not free or not subtasks:
            return []
        figures: Any = estimates if hasattr(estimates, "site_figures") and hasattr(estimates, "group_figures") \
            else _PerNode(estimates, nodes)
        for n in nodes:
            free.setdefault(n.id, 0)
        sites: dict[tuple[str, int], _Site] = {}
        keys: dict[tuple[Any, ...], _Key] = {}
        result: list[tuple[Subtask, str]] = []
        cursors: list[_Cursor] = []
        for order, st in enumerate(subtasks):
            base = sites.get((st.site, st.type))
            if base is None:
                typed = [(i, n.id) for i, n in enumerate(nodes) if st.type in n.types]
                base = sites[(st.site, st.type)] = _Site(self, st.site, typed, figures.site_figures(st.site),
                                                         free, now)
            avoided = base.ids.intersection(st.avoid)
            excluded = avoided if avoided != base.ids else set()  # none else alive: the avoided will do
            # Exploration first, in priority order: one subtask per unexplored (site, node) pair.
            nid = self._explore(base, excluded, free)
            if nid is not None:
                self._exploring[(st.site, nid)] = now
                free[nid] -= 1
                result.append((st, nid))
                continue
            kk = (st.group, st.site, st.type, frozenset(excluded))
            key = keys.get(kk)
            if key is None:
                overrides = {n: _spp(e) for n, e in figures.group_figures(st.group, st.site).items()
                             if e is not None and n in base.c and n not in excluded}
                key = keys[kk] = _Key(base, excluded, overrides, self.slow_factor, free)
            if not key.known or not key.eligible:
                continue
            aged = now - st.since >= self.patience
            cursor = _Cursor(st, key, 0.0 if aged else self.rate_floor * key.best_rate, aged, order)
            cursors.append(cursor)
        # Greedy: subtasks past their patience first, then the highest rate, then priority. The heap holds each
        # subtask's best pair; a popped pair whose node filled up meanwhile goes back with the subtask's next best
        # (keys only get worse), so the pairs chosen are those of the greedy over every (subtask, node) pair.
        ready = []
        for cursor in cursors:
            best = cursor.best(free)
            if best is not None:
                ready.append((not cursor.aged, best[0], cursor.order, best[1], cursor))
        heapq.heapify(ready)
        while ready:
            entry = heapq.heappop(ready)
            cursor = entry[4]
            best = cursor.best(free)
            if best is None:
                continue
            if (best[0], best[1]) != (entry[1], entry[3]):
                heapq.heappush(ready, (entry[0], best[0], cursor.order, best[1], cursor))
                continue
            free[best[2]] -= 1
            result.append((cursor.st, best[2]))
        return result

    def _explore(self, base: _Site, excluded: set[str], free: dict[str, int]) -> str | None:
        """The first unexplored free node of this site not yet being explored and not excluded; None if none."""
        nodes = base.unexplored
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
        free = {n.id: n.free for n in nodes if n.free > 0}
        result = []
        for st in subtasks:
            typed = [n for n in _candidates(st, nodes) if free.get(n.id, 0) > 0]
            if not typed:
                continue
            self._turn += 1
            node = typed[self._turn % len(typed)]  # rotate so that no node is always first in line
            free[node.id] -= 1
            result.append((st, node.id))
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
