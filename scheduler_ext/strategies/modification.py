"""Modification strategies: the page limit and time limit of a task's next subtask.

:class:`DynamicModification`, the paper's rule made explicit. With ``c`` the completion estimate of
(site, node) and ``s`` the seconds-per-page estimate of (product, site, node) of the node that ran the last subtask
(falling back to that run's own figures), ``P0`` = ``SCHEDEXT_PAGE_LIMIT``, ``k`` = ``SCHEDEXT_TIME_SAFETY`` and
``B`` = half the recall age (the longest a subtask should expect to run):

    pages      = clamp(round(2 * c * P0), PAGE_LIMIT_MIN, PAGE_LIMIT_MAX)     low completion -> fewer pages
    pages      = max(PAGE_LIMIT_MIN, min(pages, floor(B / (k * s))))          ... but expected duration <= B
    time_limit = clamp(k * s * pages, TIME_LIMIT_MIN, min(TIME_LIMIT_MAX, B'))  fast pages -> shorter limit
    B'         = max(B, k * s * PAGE_LIMIT_MIN)                                 ... the fewest pages their time

The two are chosen together: the page count is cut first so that ``k * s * pages`` fits under ``B``, then the
time limit follows from the same product, so a subtask's expected duration stays well under the recall threshold,
unless even the fewest pages do not fit: a site whose pages take longer than ``B / k`` (40 s pages against a budget
of 30 s) gets its pages' time, up to ``TIME_LIMIT_MAX``, instead of a limit that cuts every page (its work was never
done). A run that the time limit cut before any page was crawled says only that a page takes longer: the next
subtask's limit is at least twice its (up to ``TIME_LIMIT_MAX``) until a page fits and the pace is known.

:class:`RelativeModification` (default): the same rule with the completion taken relative to the best completion
any node has on the site, ``c / max_n c(site, n)``. The paper shrinks a subtask on a node that collects little so that
the task comes back sooner for a better node; where no node does better (every node is served a third of a site's
results, say), shrinking only multiplies the per-subtask costs (the take, the report, the wait for a tick), so the
node gets the full page count; where a better node exists, the page count shrinks with the node's share of its
completion. The node's own better work counts too: where it was recently served surely more of another site (a
lower bound of its share there, from a run within twice the recall threshold), its subtask here comes back sooner
so that the node returns to that work (docs/strategies.md).

:class:`FixedModification` (baseline): always ``SCHEDEXT_PAGE_LIMIT`` pages and ``SCHEDEXT_TIME_LIMIT`` seconds.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from ..config import config_for
from ..models import Report
from . import Estimates, Modification
from .posterior import SiteMax, Sums, share_bound


class FixedModification(Modification):
    def __init__(self, page_limit: int = 5, time_limit: float = 30.0) -> None:
        self.page_limit, self.time_limit = page_limit, time_limit

    @classmethod
    def from_crawler(cls, crawler: Any) -> FixedModification:
        c = config_for(crawler)
        return cls(c.page_limit, c.time_limit)

    def next_limits(self, report: Report, estimates: Estimates) -> tuple[int, float]:
        return self.page_limit, self.time_limit


class DynamicModification(Modification):
    def __init__(self, *, base_pages: int = 5, min_pages: int = 1, max_pages: int = 20, min_time: float = 5.0,
                 max_time: float = 120.0, safety: float = 2.0, recall_threshold: float = 60.0,
                 default_time: float = 30.0) -> None:
        self.base_pages, self.min_pages, self.max_pages = base_pages, min_pages, max_pages
        self.min_time, self.max_time, self.safety = min_time, max_time, safety
        self.budget = recall_threshold / 2
        self.default_time = default_time

    @classmethod
    def from_crawler(cls, crawler: Any) -> DynamicModification:
        c = config_for(crawler)
        return cls(base_pages=c.page_limit, min_pages=c.page_limit_min, max_pages=c.page_limit_max,
                   min_time=c.time_limit_min, max_time=c.time_limit_max, safety=c.time_safety,
                   recall_threshold=c.recall_age, default_time=c.time_limit)

    def limits(self, completion: float | None, seconds_per_page: float | None) -> tuple[int, float]:
        """The formula itself, on plain numbers (None: no data yet).

        >>> DynamicModification().limits(1.0, 0.5)    # all collected, fast: more pages, a short limit
        (10, 10.0)
        >>> DynamicModification().limits(0.1, 0.5)    # little collected: fewer pages
        (1, 5.0)
        >>> DynamicModification().limits(1.0, 4.0)    # slow pages: as many as fit in half the threshold
        (3, 24.0)
        >>> DynamicModification().limits(1.0, 40.0)   # not even one fits: one page, with its time
        (1, 80.0)
        """
        c = 0.5 if completion is None else min(1.0, max(0.0, completion))
        pages = min(self.max_pages, max(self.min_pages, round(2 * c * self.base_pages)))
        if seconds_per_page is None or seconds_per_page <= 0:
            return pages, min(self.max_time, max(self.min_time, min(self.default_time, self.budget)))
        fit = math.floor(self.budget / (self.safety * seconds_per_page))
        pages = max(self.min_pages, min(pages, fit))
        limit = self.safety * seconds_per_page * pages
        budget = max(self.budget, self.safety * seconds_per_page * self.min_pages)  # the fewest pages: their time
        return pages, round(min(self.max_time, budget, max(self.min_time, limit)), 3)

    def next_limits(self, report: Report, estimates: Estimates) -> tuple[int, float]:
        st = report.subtask
        c = estimates.completion(st.site, report.node)
        s = estimates.seconds_per_page(st.group, st.site, report.node)
        completion = c.value if c is not None else (report.collected / report.offered if report.offered else None)
        spp = s.value if s is not None else (report.seconds / report.pages if report.pages else None)
        pages, limit = self.limits(self._completion(completion, report, estimates), spp)
        if report.outcome == "timeout" and not report.pages:  # cut before any page: a page takes longer than that
            limit = max(limit, min(self.max_time, 2 * st.time_limit))
        return pages, limit

    def _completion(self, completion: float | None, report: Report, estimates: Estimates) -> float | None:
        """The completion the page count follows: the node's own, in the paper's rule."""
        return completion


class RelativeModification(DynamicModification):
    """The paper's rule on the node's completion relative to the best on the site (the module doc).

    The best is read from the nodes with sums on the site (``site_sums``, the
    :class:`~scheduler_ext.strategies.EstimateSums` protocol) as their runs report: kept per site and updated
    from the nodes whose sums changed (:class:`~scheduler_ext.strategies.posterior.SiteMax`); estimates without
    sums give the paper's rule.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._best: dict[str, SiteMax] = {}  # site -> the best completion of a node with sums there
        self._estimates: Estimates | None = None  # the estimates of the report being read
        # node -> site -> (the share it is surely served there, when its last run there ended), from its reports
        self._seen: dict[str, dict[str, tuple[float, float]]] = {}
        self.horizon = 4 * self.budget  # twice the recall threshold: how long a node's other work counts

    def _node_completion(self, site: str, node: str, sums: Sums) -> float | None:
        """A node's completion on a site (it changes with the node's sums: the same run writes both)."""
        assert self._estimates is not None
        e = self._estimates.completion(site, node)
        return None if e is None else e.value

    def _completion(self, completion: float | None, report: Report, estimates: Estimates) -> float | None:
        get = getattr(estimates, "site_sums", None)
        if completion is None or get is None:
            return completion
        site, node, now = report.subtask.site, report.node, report.ended
        sums = get(site)
        top = self._best.get(site)
        if top is None:
            if len(self._best) > 65536:  # sites no longer seen: start over
                self._best.clear()
            top = self._best[site] = SiteMax(functools.partial(self._node_completion, site))
        self._estimates = estimates
        if node not in self._seen and len(self._seen) >= 65536:
            self._seen.clear()  # nodes that came and went: start over (a node's next report refills its own)
        seen = self._seen.setdefault(node, {})
        mine = sums.get(node)
        if mine is not None:
            seen[site] = (share_bound(mine), now)
        elsewhere = 0.0
        for other, (c, t) in list(seen.items()):
            if now - t > 2 * self.horizon:  # long past the horizon: gone (a report costs the node's recent sites)
                del seen[other]
            elif other != site and now - t <= self.horizon and c > elsewhere:
                elsewhere = c
        best = max(top.value(sums) or 0.0, elsewhere, completion)
        return completion / best if best > 0 else completion
