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

import zlib
from collections.abc import Sequence
from typing import Any

from ..config import config_for
from ..models import Subtask
from . import Allocation, Estimates, NodeView


def _candidates(subtask: Subtask, nodes: Sequence[NodeView]) -> list[NodeView]:
    typed = [n for n in nodes if subtask.type in n.types]
    preferred = [n for n in typed if n.id not in subtask.avoid]
    return preferred or typed


class DynamicAllocation(Allocation):
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
        spp = p.value if p is not None and p.value > 0 else None
        if spp is None:  # failures only so far: no speed known; its completion (low) still ranks it
            spp = 1.0
        return c.value / max(spp, 1e-3), spp

    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                 now: float) -> list[tuple[Subtask, str]]:
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
            if not eligible:
                continue
            best_rate = max(eligible.values())
            aged = now - st.since >= self.patience
            floor = 0.0 if aged else self.rate_floor * best_rate
            for nid, r in eligible.items():
                # Past its patience even a node that collected nothing so far may try (and fail: recall decides).
                if nid in free and r >= floor and (r > 0 or aged):
                    pairs.append((aged, r, order, st, nid))
        assigned: dict[str, str] = {}
        result: list[tuple[Subtask, str]] = []

        def take(st: Subtask, nid: str) -> None:
            assigned[st.id] = nid
            free[nid] -= 1
            result.append((st, nid))

        # Exploration first, in priority order: one subtask per unexplored (site, node) pair.
        for _, st, nid in explore:
            if st.id not in assigned and free.get(nid, 0) > 0 and (st.site, nid) not in self._exploring:
                self._exploring[(st.site, nid)] = now
                take(st, nid)
        for _, _, _, st, nid in sorted(pairs, key=lambda p: (not p[0], -p[1], p[2])):
            if st.id not in assigned and free.get(nid, 0) > 0:
                take(st, nid)
        return result


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
