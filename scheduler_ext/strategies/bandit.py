"""Bandit allocation: expected results per second with their uncertainty, and a bounded exploration budget.

:class:`BanditAllocation` routes like the paper's dynamic allocation (by expected results per second, with late
binding and patience) but from the posteriors of :mod:`scheduler_ext.strategies.posterior` instead of moving
averages, so that

* blocked, failed and timed-out pages cost what they cost: their time is charged and nothing is collected;
* a single unlucky run cannot write a pair off: one run is one run of evidence against a weak prior, and the
  evidence fades with time while the pair is not used, so its posterior widens again;
* exploration goes where it can change a decision: a pair is tried only when a Thompson draw from its posterior
  beats the best *expected* rate on the site (a pair known to be bad almost never does; a pair not seen for a
  while, or never, often does), and only while the exploration budget lasts;
* the budget is a share of the pages sent (``SCHEDEXT_EXPLORE_SHARE`` of them, default 0.2), so exploration
  stays bounded however many pairs there are, and drift is caught without a staleness timer; an exploration
  crawls only the first ``SCHEDEXT_EXPLORE_PAGES`` (3) pages of its subtask (:data:`EXPLORE_PAGES`), and costs
  the budget what its node or its subtask forgoes, whichever is more: its pages times the node's best expected
  rate on the window's sites, or the rate of the node that would take the subtask now if it were not explored
  (a free node rated at least the floor of the site's best, not claimed by the window's subtasks before it), over
  the best of any node there. A node with nothing good to do gives up little by trying a pair, unless the work is
  what is scarce: taking a subtask a good node would run now costs its pages at that node's rate.

Per tick, over the window of waiting subtasks the control passes (priority order):

1. Candidates: live nodes of the subtask's type, minus its ``avoid`` nodes unless no other node suited to the site
   (rated at least the floor of its best) is alive (:meth:`BanditAllocation._avoidable`).
2. Posterior of every candidate that has run on the site (busy ones included): served share from its runs on the
   site, pace from its runs for this product on the site when it has some. The prior of an untried pair is the
   best share and the best pace seen on the site (optimism), with the weight of three pages (about a failed run).
3. Exploit: a free candidate whose expected rate is at least ``SCHEDEXT_RATE_FLOOR`` of the best expected rate
   (late binding, as in the paper's strategy); after ``SCHEDEXT_PATIENCE`` seconds of waiting, any candidate.
4. Explore: up to ``EXPLORE_SAMPLE`` free candidates are drawn; one whose Thompson draw is above the site's floor and
   beats every expected rate the node has on the window's sites (what it is given otherwise), and that step 3 would not
   pick (unless the pair's only runs were blank, or it is passed over: eligible, but below the floor of what its node
   has, so that nothing renews its evidence, and not run for :data:`PROBE_AGE`), is an exploration (on a site no
   candidate has data on, any draw: the prior's rate there says nothing). Explorations go first, the best draw per page
   of budget first (:func:`_per_page`), each costing its pages of the budget times what its node or its subtask forgoes
   (above); a site no candidate has data on needs no budget (there is nothing to exploit). One exploration per pair is
   in flight at a time: until the pair's run reports blank, until a run of it reported :data:`EXPLORE_REST` seconds ago,
   or for the recall age (:meth:`BanditAllocation._in_flight`). A pair last run before the site's latest change of
   treatment (any node's ``Sums.cp``) is drawn from the prior, as untried; so is any pair, with probability ``1 -
   exp(-H)`` for ``H`` the cluster's changes per pair since it was last seen (:class:`ChangeHazard`: a change counts
   once the pair's next run confirms it, a pair surely good that turned bad at once, taken back if its next run does not
   confirm it); a subtask that failed already explores only if no candidate is known to collect anything. Such a
   re-opened pair may also be explored once the budget is out, on what the changes found grant: each confirmed change,
   as many explorations as the changes it stands for among the cluster's pairs (:meth:`ChangeHazard.change`). A pair not
   run for :data:`PROBE_AGE` seconds is drawn as untried, and a draw that beats what its node has (in the window, or was
   given lately) sends a probe of :data:`PROBE_PAGES` page instead: a pair nobody runs can turn good with nothing to
   show it. A node with work queued probes once per probe page earned (:data:`BUSY_PROBE_SHARE` of the pages it is
   given), outside the budget. A probe that collected half its page re-opens its pair at once
   (:meth:`BanditAllocation._watch`).
5. Matching: explorations (of pairs never run first, then of re-opened pairs and probes, each best draw per page
   of budget first),
   then the exploit pairs as the dynamic allocation matches them (aged subtasks first,
   then the highest expected rate, then priority), first onto idle nodes (nothing held at their last heartbeat,
   nothing queued), then onto nodes with fewer than :data:`AHEAD` queued, then onto any free slot
   (:meth:`BanditAllocation._exploit`).

Rates are per second of node time (:func:`~scheduler_ext.strategies.posterior.run_seconds`): what a run cost the
node's page slots, not how long it took among the node's other work.

A subtask that failed already (``attempt > 0``) is one failure closer to the dead-letter list, where its task stops:
it is rated by its expected rate times the probability that it finishes before it is dead-lettered, if this node
runs it now and the most reliable other candidate runs the rest (:meth:`_retry_class`).

Cost per tick: the paper's allocation's mechanism (:class:`~scheduler_ext.strategies.allocation.Rankings`, its
classes and greedy): each (site, node type) ranks its nodes by expected rate once and keeps that ranking until the
site's sums change (the sums mapping of a site is replaced on change: copy on write), then re-rates only the nodes
whose sums changed. The exploiting rates are not discounted by time (:data:`EXPLOIT`), so nothing expires with the
clock; a ranking where a few nodes were re-rated moves their rows instead of sorting again; subtasks that rank
nodes alike share a class; a product's rates on a site (its nodes' own paces) are kept until their sums or the
site's prior change (:meth:`BanditAllocation._product_rates`); the check that a node has as good to do on the
window's sites scans its sites once per call; at most ``EXPLORE_SAMPLE`` draws per subtask, and
``2 x RETRY_SAMPLE`` nodes weighed per class of recalled subtasks, whose avoided nodes count only where the
weighing reaches them (:class:`_Weighing`); of a site's fresh subtasks, only as many are weighed as its free
eligible nodes can take, plus :data:`EXPLORE_ROOM` (:meth:`BanditAllocation._room`): the window's first subtasks
are mostly of sites whose nodes are busy, and the rest of them cost a lookup. O(free slots + what changed) per
tick; no (subtask x node) product.

Settings: ``SCHEDEXT_RATE_FLOOR``, ``SCHEDEXT_PATIENCE``, ``SCHEDEXT_EXPLORE_SHARE``, ``SCHEDEXT_EXPLORE_PAGES``,
``SCHEDEXT_ESTIMATE_HALF_LIFE``, ``SCHEDEXT_RECALL_THRESHOLD`` (how long an exploration counts as in flight at most),
``SCHEDEXT_BANDIT_SEED``.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..config import config_for
from ..models import Subtask
from . import Allocation, Estimates, NodeView
from .allocation import NOBODY, Rankings, _Class, _Ranking, _Site, _Typed, greedy
from .posterior import (
    CHANGE_PAGES,
    CHANGE_SHIFT,
    PRIOR_WEIGHT,
    Posterior,
    RateTable,
    SiteMax,
    Sums,
    changed_since,
    draw_rate,
    expected_rates,
    share_bound,
)

#: Subtasks a node may have waiting in its crawl queue before the exploit matching's second pass
#: (:meth:`BanditAllocation._exploit`): enough to keep it busy until the next tick. One sent a site's work to a
#: slower node whenever its best had one subtask waiting (on the paper profile, where each site has four tasks
#: and a task one subtask at a time, the best node then ran short of its site's work: simulator, 16 seeds,
#: dynamic / oracle 0.964 with one, 0.975 with two, 0.977 with three; bench_quality's families the same).
AHEAD = 2
#: Pages an exploration crawls at most (:meth:`Subtask.capped`; the task goes on from where the run ended): the fewest
#: that can show a change point (:data:`~scheduler_ext.strategies.posterior.CHANGE_PAGES`), as many as the prior
#: weighs. An unsuited pair's pages are slow (the paper profile: 0.5 to 0.8 s against 0.1 to 0.2 s, and errors), so
#: a whole subtask of them cost its node what dozens of suited pages collect: the simulator's paper profile, 16 seeds,
#: dynamic / oracle 0.956 uncapped, 0.970 at 3 pages, the first 9 s 0.82 -> 0.87. At 2 pages (0.98 there) a first
#: look weighs less than the prior: a pair seen bad once kept an expected rate above the floor, was neither explored
#: nor exploited, and on bench_quality's drift worlds some pairs that turned good were not used for minutes.
EXPLORE_PAGES = CHANGE_PAGES
#: Free candidates drawn per subtask for exploration: bounds the cost of a tick whatever the cluster's size. A site's
#: first subtask in a call draws twice as many (2026-12-04): at 30 nodes x 10 sites a drifted pair waited for its
#: node to be drawn, up to 30 s before its first use (20 s now; 16 for every subtask: 11 s, but a 1,000-node tick's
#: allocation half as long again; docs/experiment.md).
EXPLORE_SAMPLE = 8
#: Fresh subtasks of a site weighed beyond what its free eligible nodes can take (:meth:`BanditAllocation._room`): for
#: explorations. 8 since 2026-12-06 (2 before): 1,000 nodes x 200 sites x 10,000 products, 90 s, +11 % items for +7 %
#: CPU; the polite 1,000-node world +3.5 % at 1,800 s; the other worlds equal (docs/experiment.md).
EXPLORE_ROOM = 8
#: Seconds after a run of a pair being explored reports before the pair may be explored again (unless the run was
#: blank: at once; :meth:`BanditAllocation._in_flight`). Until the recall age instead (20 s in the benchmarks, 60 s
#: by default), an exploration sent just before its pair turned good, whose run met the last of its errors, held a
#: good pair for 18 to 20 s (bench_quality unlucky and drift, seeds 10 to 29); at 3 s the captcha family lost 2 % of
#: its items (blocked pairs explored again too soon), at 6 s none, and the longest wait fell to 9.7 s.
EXPLORE_REST = 6.0
#: Seconds after its last run that a pair which could change its node's work is probed (:meth:`BanditAllocation.
#: allocate`): a pair nobody runs may turn good with nothing in the cluster to show it (no pair that runs changes),
#: and only a look at it can tell. Such a pair is looked at about this often: a pair that turns good is run within
#: about this many seconds and a run, under the 15 s the issue asks (docs/strategies.md, "Probes").
PROBE_AGE = 10.0
#: Pages a node with work queued (whose queue may never empty) earns towards its next probe for each page it is
#: given (from none): a probe every 200 pages, a two-hundredth of its pages, whatever its pace. At the paper's pace
#: that is a probe every few seconds, so that each of a node's few stale pairs is looked at about every
#: :data:`PROBE_AGE`; a clock of its own (a probe per node every 10 s, until 2026-12-05) let a pair that turned good
#: just after its last look wait for the node's next probe, and the one after when another pair's draw won it (up
#: to 18 s; docs/experiment.md, "A busy node's probes by the pages it is given"). At a polite pace (a page every
#: 2 s) a probe every 400 s (a clock of 10 s was a fifth of a node's pages there: the 1,000-node polite run lost 2.5
#: to 3.2 % of its items to them).
BUSY_PROBE_SHARE = 0.005
#: Pages a probe crawls: one page tells a pair that serves most of its results (0.8 to 0.97 of a page, in a tenth
#: of a second) from one that serves a fifth in half a second or fails, and costs a third of an exploration.
PROBE_PAGES = 1
#: The half-life the exploiting rates are computed with: none (0: no discount). The time discount widens a
#: pair's posterior so that its draws can beat the best again (exploration); it must not move the pair's *mean*
#: towards the optimistic prior, or a pair measured bad minutes ago would be exploited again, without budget and
#: by recalled subtasks too (on the benchmarks' captcha family, the blocked nodes came back every minute or two).
EXPLOIT = 0.0
#: Nodes re-rated at most for a ranking to be updated in place (their rows moved) rather than sorted again.
RERANK = 64
#: Free candidates a recalled subtask's class weighs (the best-rated first): bounds its cost at any scale.
RETRY_SAMPLE = 16
#: Width of the time bins of :class:`ChangeHazard`, in seconds: its resolution in time (a burst of changes is
#: located to within a bin; the estimate does not depend on the width otherwise).
HAZARD_BIN = 5.0
#: Bins :class:`ChangeHazard` keeps (an hour at 5 s); a pair last seen before them is treated as seen at the first.
HAZARD_BINS = 720


class ChangeHazard:
    """How often pairs changed treatment, as a function of time: a binned Nelson-Aalen estimate.

    Every time a pair runs again, the interval since its previous run was watched (:meth:`watch`: its seconds are
    added to the time bins it covers); if that run was a change of treatment, one change is spread over the same
    bins in proportion (:meth:`change`; :meth:`take_back` removes it if the pair's next run says it was not). A
    bin's hazard is its changes over its watched pair-seconds, and :meth:`cumulative` integrates it:
    ``exp(-cumulative(t0, now))`` is the probability that a pair last seen at ``t0`` still treats its node as it did
    then. Changes that come in bursts (a site's new defences, a cluster's new addresses) raise it for exactly the
    pairs last seen before the burst; a quiet period adds nothing, however long, so a cluster whose sites never
    change never re-probes on this account.

    >>> h = ChangeHazard(width=5.0)
    >>> for i in range(20):  # 20 pairs watched from 0 to 10 s, a quarter of them change
    ...     h.watch(0.0, 10.0)
    ...     if i % 4 == 0:
    ...         _ = h.change(0.0, 10.0)
    >>> round(h.cumulative(0.0, 10.0), 3), round(h.cumulative(10.0, 60.0), 3)
    (0.25, 0.0)
    """

    def __init__(self, width: float = HAZARD_BIN, keep: int = HAZARD_BINS) -> None:
        self.width, self.keep = width, keep
        self._watched: dict[int, float] = {}  # bin -> pair-seconds watched in it (see watched)
        # The whole bins of the intervals watched since ``watched`` was last read, as a difference array: bin ->
        # pair-seconds that start there (``+width`` at an interval's first whole bin, ``-width`` past its last). A
        # pair last run an hour ago covers 720 bins; each watch costs two entries instead of a pass over them.
        self._whole: dict[int, float] = {}
        self.changes: dict[int, float] = {}  # bin -> changes (fractions of changes spread over their intervals)
        self._table: tuple[int, list[float]] | None = None  # (first bin, cumulative hazard at each bin's start)

    @property
    def watched(self) -> dict[int, float]:
        """Bin -> pair-seconds watched in it (the whole bins of the intervals watched since the last read added)."""
        if self._whole:
            watched, acc = self._watched, 0.0
            keys = sorted(self._whole)
            for b, end in zip(keys, keys[1:], strict=False):
                acc += self._whole[b]
                if acc > 0:
                    for k in range(b, end):
                        watched[k] = watched.get(k, 0.0) + acc
            self._whole = {}
        return self._watched

    @watched.setter
    def watched(self, value: dict[int, float]) -> None:
        self._watched, self._whole = value, {}

    def _spread(self, into: dict[int, float], t0: float, t1: float, total: float | None) -> None:
        """Adds to the bins of ``into`` the part of ``[t0, t1]`` each covers: in seconds, or as a share of
        ``total`` (one change spread over the interval)."""
        if t1 <= t0:
            return
        w = self.width
        lo = max(int(t0 // w), int(t1 // w) - self.keep)
        span = t1 - max(t0, lo * w)
        for b in range(lo, int(t1 // w) + 1):
            part = min(t1, (b + 1) * w) - max(t0, b * w)
            if part > 0:
                into[b] = into.get(b, 0.0) + (part if total is None else total * part / span)
        self._table = None

    def watch(self, t0: float, t1: float) -> None:
        """A pair ran at ``t0`` and again at ``t1``: it was watched in between (as :meth:`_spread` adds it: its part
        of its first and last bins now, its whole bins when ``watched`` is next read)."""
        if t1 <= t0:
            return
        w = self.width
        lo = max(int(t0 // w), int(t1 // w) - self.keep)
        hi = int(t1 // w)
        first = lo if max(t0, lo * w) <= lo * w else lo + 1  # the first bin the interval covers whole
        last = hi - 1 if t1 < (hi + 1) * w else hi  # the last
        if last - first < 8:  # a short interval: bin by bin
            self._spread(self._watched, t0, t1, None)
            return
        for b in (first - 1, last + 1):  # the partial bins at either end
            if lo <= b <= hi:
                part = min(t1, (b + 1) * w) - max(t0, b * w)
                if part > 0:
                    self._watched[b] = self._watched.get(b, 0.0) + part
        whole = self._whole
        whole[first] = whole.get(first, 0.0) + w
        whole[last + 1] = whole.get(last + 1, 0.0) - w
        self._table = None

    def take_back(self, parts: dict[int, float]) -> None:
        """Removes a change that :meth:`change` added (``parts``: what it added to each bin)."""
        for b, x in parts.items():
            if b in self.changes:
                self.changes[b] = max(0.0, self.changes[b] - x)
        self._table = None

    def change(self, t0: float, t1: float, parts: dict[int, float] | None = None) -> float:
        """The run at ``t1`` of a pair watched since ``t0`` (:meth:`watch` said so already) was a change; returns
        how much it raised the hazard of a pair unseen over the bins it went to.

        When in ``[t0, t1]`` it happened is not known (the pair was not run in between): the change is spread over
        the interval's bins in proportion to their watched seconds times the hazard already estimated there (plus
        the average hazard, so that bins without changes yet still get a share). A pair re-probed after 100 s
        then adds its change mostly to the burst that pairs run every second have already located, instead of
        thinning it over the 100 s (one step of Turnbull's estimator for interval-censored events). What it adds to
        each bin goes into ``parts`` if given (for :meth:`take_back`).

        The pairs watched over a bin are a sample of the cluster's pairs: a change found among ``watched / width``
        of them stands for ``pairs x width / watched`` changes among ``pairs`` (Horvitz-Thompson). The return
        value is that ratio without ``pairs``: times the number of pairs, the changes this one stands for, the
        others not seen yet (:attr:`BanditAllocation.granted`).

        >>> h = ChangeHazard(width=5.0)
        >>> for i in range(5):  # 5 pairs watched from 0 to 10 s
        ...     h.watch(0.0, 10.0)
        >>> round(h.change(0.0, 10.0) * 20, 3)  # one of them changed: if there are 20 pairs, about 4 did
        4.0
        """
        if t1 <= t0:
            return 0.0
        w = self.width
        watched, changes = self.watched, self.changes
        seen = sum(watched.values())
        average = sum(changes.values()) / seen if seen > 0 else 0.0
        lo = max(int(t0 // w), int(t1 // w) - self.keep)
        weights: dict[int, float] = {}
        for b in range(lo, int(t1 // w) + 1):
            part = min(t1, (b + 1) * w) - max(t0, b * w)
            if part > 0:
                here = watched.get(b, 0.0)
                weights[b] = part * (changes.get(b, 0.0) / here + average) if here > 0 and average > 0 else part
        total = sum(weights.values())
        rise = 0.0
        for b, x in weights.items():
            changes[b] = changes.get(b, 0.0) + x / total
            if parts is not None:
                parts[b] = x / total
            here = watched.get(b, 0.0)
            if here > 0:
                rise += x / total * w / here  # the bin's hazard rose by (x / total) / here per second
        self._table = None
        return rise

    def cumulative(self, t0: float, now: float) -> float:
        """Expected changes of treatment of one pair between ``t0`` and ``now`` (bins nobody watched: none)."""
        if not self.changes or now <= t0:
            return 0.0
        w = self.width
        if self._table is None:
            first, last = min(self.watched), max(self.watched)
            if last - first > self.keep:
                first = last - self.keep
                self.watched = {b: v for b, v in self.watched.items() if b >= first}
                self.changes = {b: v for b, v in self.changes.items() if b >= first}
            cum, acc = [0.0], 0.0
            for b in range(first, last + 1):
                watched = self.watched.get(b, 0.0)
                acc += self.changes.get(b, 0.0) / watched * w if watched > 0 else 0.0
                cum.append(acc)
            self._table = (first, cum)
        first, cum = self._table

        def at(t: float) -> float:
            x = t / w - first
            if x <= 0:
                return 0.0
            i = int(x)
            return cum[-1] if i >= len(cum) - 1 else cum[i] + (x - i) * (cum[i + 1] - cum[i])

        return at(now) - at(t0)


def site_sums(estimates: Estimates, site: str, nodes: Sequence[str] = ()) -> Mapping[str, Sums]:
    """Node -> sums of every node with runs on ``site``.

    Estimates that keep no sums (the protocol's two methods only) give sums made from the paper's moving
    estimates of ``nodes``, as if each run had been 5 pages at that completion and speed: the bandit then works
    on any :class:`~scheduler_ext.strategies.Estimates`, only without the failures' cost.
    """
    get = getattr(estimates, "site_sums", None)
    if get is not None:
        return get(site)  # type: ignore[no-any-return]
    out = {}
    for nid in nodes:
        c = estimates.completion(site, nid)
        if c is not None:
            spp = estimates.seconds_per_page("", site, nid)
            pages = 5.0 * min(c.runs, 4)
            out[nid] = Sums(n=float(c.runs), pages=pages, got=pages * c.value,
                            sec=pages * (spp.value if spp is not None else 1.0), t=c.last_run)
    return out


def group_sums(estimates: Estimates, group: str, site: str) -> Mapping[str, Sums]:
    """Node -> sums of every node with runs of ``group`` on ``site``; empty if ``estimates`` keeps no sums."""
    get = getattr(estimates, "group_sums", None)
    return get(group, site) if get is not None else {}


class _Weighing:
    """What the classes of recalled subtasks on one (site, type) weigh, within one allocate call
    (:meth:`BanditAllocation._retry_class`): the :data:`RETRY_SAMPLE` best-rated candidates and as many best-rated
    free ones, each at its rate times the probability that its run finishes. Recalled subtasks mostly avoid
    nodes of their own, so each makes a class of its own; what they share (the free nodes in rank order, each
    node's probability of finishing) is found once here. The free slots do not change until the matching, so
    neither does the list of free nodes."""

    def __init__(self, site: _Site) -> None:
        ranking = site.ranking
        self.by_rate, self.c, self.sums = ranking.by_rate, ranking.c, ranking.data[0]
        self.free_list, self.free = site.free_list(math.inf), site.free
        self.free_ids: list[str] = []  # the free candidates in rank order, as far as asked
        self.at = self.free_list.first(0, self.free)  # the next free row after them
        self.finishes: dict[str, float] = {}  # node -> posterior probability that a run of the pair finishes
        self.near: set[str] = set()  # the first ``reach`` rows of the ranking and of the free ones
        self.reach = 0

    def _finishes(self, nid: str) -> float:
        f = self.finishes.get(nid)
        if f is None:
            s = self.sums[nid]
            f = self.finishes[nid] = 1.0 - (s.fl + 0.5) / (s.n + 1.0)
        return f

    def _free_id(self, i: int) -> str | None:
        """The ``i``-th free candidate in rank order (None past the last)."""
        ids, rows = self.free_ids, self.free_list.rows
        while i >= len(ids):
            if self.at >= len(rows):
                return None
            ids.append(rows[self.at][2])
            self.at = self.free_list.first(self.at + 1, self.free)
        return ids[i]

    def relevant(self, excluded: set[str]) -> frozenset[str]:
        """The part of ``excluded`` that :meth:`weigh` can meet: its nodes among the first
        ``RETRY_SAMPLE + len(excluded)`` of the ranking and of the free candidates, beyond which both walks have
        found their nodes. Subtasks whose avoided nodes differ only further down (most avoid a node or two) are
        weighed alike and share a class: ``weigh(relevant(x))`` is ``weigh(x)``. (The rows looked at only grow
        within a call, and two sets equal on the rows seen when the first was asked are equal on the rows
        either walk reaches, so the equality holds whichever was asked first.)"""
        want = RETRY_SAMPLE + len(excluded)
        if want > self.reach:
            by_rate, near = self.by_rate, self.near
            for i in range(self.reach, want):
                if i < len(by_rate):
                    near.add(by_rate[i][2])
                nid = self._free_id(i)
                if nid is not None:
                    near.add(nid)
            self.reach = want
        return frozenset(excluded.intersection(self.near))

    def weigh(self, excluded: set[str] | frozenset[str], rates: Mapping[str, float],
              runs: int = 1) -> dict[str, float]:
        """Node -> its rate (``rates`` where given, else the site's) times the probability that a subtask with
        ``runs`` runs left finishes if the node runs it now and the most reliable other candidate the rest
        (:meth:`BanditAllocation._retry_class`), for the best-rated candidates not ``excluded`` (busy ones
        included: late binding) and the best free ones."""
        c: dict[str, float] = self.c
        weighed: list[str] = []
        for _, _, nid in self.by_rate:
            if len(weighed) >= RETRY_SAMPLE:
                break
            if nid not in excluded:
                weighed.append(nid)
        i, taken = 0, 0
        while taken < RETRY_SAMPLE:
            free_id = self._free_id(i)
            if free_id is None:
                break
            i += 1
            if free_id not in excluded:
                if free_id not in weighed:
                    weighed.append(free_id)
                taken += 1
        f = {nid: self._finishes(nid) for nid in weighed}
        first, second = [*heapq.nlargest(2, f.values()), 0.0, 0.0][:2]  # a node's best other: one of them
        finishing: dict[str, float] = {}
        for nid, fn in f.items():
            rest = 1.0 - (1.0 - (second if fn == first else first)) ** (runs - 1)  # a later run finishes
            finishing[nid] = rates.get(nid, c[nid]) * (fn + (1.0 - fn) * rest)
        return finishing


class _SiteSummary:
    """What the bandit reads from all of a site's sums, kept as the runs change them (:class:`SiteMax`: the nodes
    that changed only, not every node that ever ran the site): the prior's best share and best pace
    (:meth:`BanditAllocation._prior`) and the site's latest change point."""

    __slots__ = ("share", "sure", "paced", "cp")

    def __init__(self) -> None:
        self.share = SiteMax(lambda nid, s: (s.got + 0.5) / (s.pages + 1.0))
        self.sure = SiteMax(lambda nid, s: s.pace if s.pages - s.xp >= PRIOR_WEIGHT else None)
        self.paced = SiteMax(lambda nid, s: s.pace)
        self.cp = SiteMax(lambda nid, s: s.cp)

    def prior(self, sums: Mapping[str, Sums]) -> tuple[float, float]:
        if not sums:
            return 0.5, 1.0
        share = self.share.value(sums)
        pace = self.sure.value(sums)
        if pace is None:
            pace = self.paced.value(sums)
        assert share is not None
        return share, 1.0 if pace is None else pace


def _per_page(entry: tuple[int, float, int, bool, Subtask, str, bool, float, int]) -> tuple[int, float, int]:
    """The order explorations are sent in: pairs never run first, then the others (re-opened pairs, probes); in
    each, the highest draw (over the site's best) per page of budget it costs first (what its node forgoes: nothing
    for one outside the budget), then priority. Where the budget binds, it buys the explorations that promise most
    for what they cost: those of nodes with nothing good to do first (docs/strategies.md, steps 5 and 6)."""
    kind, minus_draw, order, needed, *_, forgone, _ = entry  # minus_draw: -draw / best (-inf: nobody known)
    return kind, minus_draw / (1e-9 if needed else max(forgone, 1e-9)), order


class BanditAllocation(Allocation):
    def __init__(self, *, rate_floor: float = 0.6, patience: float = 30.0, explore_share: float = 0.2,
                 half_life: float = 30.0, explore_timeout: float = 60.0, recall_max: int = 5,
                 seed: int | None = 0, explore_pages: int = EXPLORE_PAGES, page_limit: int = 5) -> None:
        self.rate_floor = rate_floor
        # Pages an exploration crawls at most (0: its whole subtask), and the pages of the budget's unit, one
        # exploration (SCHEDEXT_PAGE_LIMIT, a first subtask's, if explorations are not capped)
        self.explore_pages = explore_pages or math.inf
        self.unit = explore_pages or page_limit
        self.recall_max = recall_max  # runs a subtask gets before it is dead-lettered (SCHEDEXT_RECALL_MAX)
        self.patience = patience
        self.explore_share = explore_share
        self.half_life = half_life  # the prior's: the effective one is learnt (:attr:`effective_half_life`)
        self.changes = 0  # changes of treatment seen (a pair's ``cp`` moved), between consecutive runs of a pair
        self.exposure = 0.0  # pair-seconds between consecutive runs of a pair (where those changes could happen)
        self.hazard = ChangeHazard()  # when pairs changed treatment (see _watch)
        # (site, node) -> (its run before its change point, the change point's run, share before, share after, what
        # the change raised the hazard of a pair unseen by (ChangeHazard.change; None: not counted yet), what it
        # added to the hazard's bins)
        self._unconfirmed: dict[tuple[str, str], tuple[float, float, float, float, float | None, dict[int, float]]] = {}
        self.explore_timeout = explore_timeout
        self.rng = random.Random(seed)
        # exploration budget, in pages: starts at one exploration per node, refills with a share of the pages sent
        self.credit: float | None = None
        # Explorations granted by the changes found (see _watch): spent on pairs whose evidence is stale only
        self.granted = 0.0
        self._pairs: dict[str, int] = {}  # site -> pairs with runs on it
        self._exploring: dict[tuple[str, str], float] = {}  # (site, node) -> when an exploration was sent, in order
        self._sums_of: Any = None  # the tick's estimates' site_sums (see _in_flight)
        self._rankings = Rankings()  # (site, type) -> nodes ranked by expected rate, kept across ticks
        self.explored = 0  # explorations sent (for stats and tests)
        self.probed = 0  # probes sent (for stats and tests)
        self._probes: dict[tuple[str, str], float] = {}  # (site, node) -> when its probe was sent
        self._probe_credit: dict[str, float] = {}  # node -> pages earned towards its next probe with work queued
        self._reopened: set[tuple[str, str]] = set()  # pairs whose probe collected: drawn as untried (see _watch)
        self._doing: dict[str, tuple[float, float]] = {}  # node -> (the best rate it was given lately, when)
        # Sums -> (prior, when, posterior): a pair's posterior changes with a new run (new sums) or the prior, and
        # with time only by the slow discount, refreshed every half_life / 10; so a tick recomputes what changed.
        self._cache: dict[int, tuple[Sums, float, float, float, Posterior]] = {}
        # (product, site) -> (prior share, prior pace, node -> (sums, pace sums, expected rate)): _product_rates
        self._product: dict[tuple[str, str], tuple[float, float, dict[str, tuple[Sums, Sums, float]]]] = {}
        self._summaries: dict[str, _SiteSummary] = {}  # site -> its prior and latest change point, kept (see _summary)

    @classmethod
    def from_crawler(cls, crawler: Any) -> BanditAllocation:
        c = config_for(crawler)
        return cls(rate_floor=c.rate_floor, patience=c.patience, explore_share=c.explore_share,
                   half_life=c.estimate_half_life, explore_timeout=c.recall_age, recall_max=c.recall_max,
                   seed=c.bandit_seed, explore_pages=c.explore_pages, page_limit=c.page_limit)

    # --- the posteriors of one (product, site) ------------------------------------------------------------------
    def posteriors(self, group: str, site: str, estimates: Estimates, now: float,
                   memo: dict[Any, tuple[dict[str, Posterior], Posterior]] | None = None,
                   nodes: Sequence[str] = ()) -> tuple[dict[str, Posterior], Posterior]:
        """Node -> posterior of every node with runs on ``site``, and the prior of an untried node there.

        The served share comes from the node's runs on the site; the pace from its runs of this product there
        when it has some. ``memo`` (one per tick) keeps the site's part, shared by every product on the site.
        """
        memo = {} if memo is None else memo
        if site not in memo:
            memo[site] = self._site_posteriors(site_sums(estimates, site, nodes), now)
        posts, prior = memo[site]
        per_group = group_sums(estimates, group, site) if posts else {}
        if not per_group:
            return posts, prior
        sums = site_sums(estimates, site, nodes)
        theta0, rho0 = prior.share, prior.pace
        refined = dict(posts)
        for nid, pace in per_group.items():
            if nid in sums:
                refined[nid] = Posterior.of(sums[nid], now=now, half_life=self.effective_half_life, theta0=theta0,
                                            rho0=rho0,
                                            pace=pace)
        return refined, prior

    @staticmethod
    def _prior(sums: Mapping[str, Sums]) -> tuple[float, float]:
        """(share, pace) of the prior of an untried pair on a site with these sums: as good as the best seen on
        the site (optimism under uncertainty); (0.5, 1.0) on a site nobody ran.

        The share is the best smoothed share, ``(got + 1/2) / (pages + 1)``; the pace the best pages over seconds
        of a node with at least :data:`~scheduler_ext.strategies.posterior.PRIOR_WEIGHT` pages of pace there (of
        any node with a pace if none has that many). Pace is per second of node time, where a page costs a few
        hundredths of a second: the former ``(pages + 1) / (sec + 1)`` put the prior at a third of the best pace,
        so an untried or re-opened pair was drawn far below the site's best and a suited pair after its first
        3-page look was rated below the floor (the simulator's drift worlds: a pair that turned good used after
        18.7 s at the p90, 7.3 s with this prior)."""
        return _SiteSummary().prior(sums)  # the allocation keeps one per site, updated as the runs report

    def _site_posteriors(self, sums: Mapping[str, Sums], now: float) -> tuple[dict[str, Posterior], Posterior]:
        """Node -> posterior on a site from the site's sums, and the prior of an untried node there."""
        theta0, rho0 = self._prior(sums)
        return ({nid: self._posterior(s, now, theta0, rho0) for nid, s in sums.items()},
                Posterior.prior(theta0, rho0))

    def _posterior(self, sums: Sums, now: float, theta0: float, rho0: float) -> Posterior:
        hit = self._cache.get(id(sums))
        if hit is not None and hit[0] is sums and hit[1] == theta0 and hit[2] == rho0 \
                and now - hit[3] < self.half_life / 10:
            return hit[4]
        post = Posterior.of(sums, now=now, half_life=self.effective_half_life, theta0=theta0, rho0=rho0)
        self._cache[id(sums)] = (sums, theta0, rho0, now, post)
        return post

    @property
    def effective_half_life(self) -> float:
        """The half-life of unused evidence, learnt from how often pairs are seen to change.

        Evidence should fade at the rate the world changes: a pair not run for ``age`` seconds has kept its
        treatment with probability ``exp(-h age)``, for a hazard ``h`` of changes per pair-second. ``h`` is
        estimated from the runs themselves: the changes of treatment seen (a run that is a change point of its
        pair, :func:`~scheduler_ext.strategies.posterior.changed` with a shift) over the pair-seconds between
        consecutive runs of a pair, where they happened; with a Gamma prior of one change per ``half_life /
        ln 2`` pair-seconds (the setting: what is believed before any evidence). Posterior mean
        ``h = (1 + changes) / (half_life / ln 2 + exposure)``, half-life ``ln 2 / h``. A cluster whose sites never
        change stops re-exploring pairs it measured (each re-exploration costs a subtask on a pair likely bad);
        one whose sites drift keeps a short memory.

        >>> b = BanditAllocation(half_life=30.0)
        >>> round(b.effective_half_life, 6)  # no evidence yet: the setting
        30.0
        >>> b.exposure, b.changes = 10_000.0, 0  # 10,000 pair-seconds between runs and no change seen
        >>> round(b.effective_half_life)
        6961
        >>> b.changes = 20  # 20 changes in them: a sixth of that
        >>> round(b.effective_half_life)
        331
        """
        prior = self.half_life / math.log(2)
        return math.log(2) * (prior + self.exposure) / (1.0 + self.changes)

    def _watch(self, site: str, nid: str, was: Sums, new: Sums) -> None:
        """The pair ran at ``was.t`` and again at ``new.t`` (sums ``new``): feed :attr:`hazard`.

        A change point with a shift (``cp`` moved) is confirmed by the pair's next run if that run is no change point
        and its share is nearer the share the change point moved to than the one it moved from. One lucky run of a
        captcha-heavy node, or one failed first page of a good one, is a change point that the next run takes back;
        it must not keep every stale pair of the cluster looking changed. A pair that turned good is run again
        soon (it is exploited), so its change counts once confirmed. A pair that was surely served at least
        ``CHANGE_SHIFT`` of its results (one standard deviation below its share) and turned bad is seldom run again
        (nothing is sent to it), so its change counts at once and is taken back if its next run does not confirm
        it: counted only once confirmed (until 2026-12-04), a burst in which pairs turned bad re-opened nothing, and
        the pairs that turned good in it waited for their node's posterior alone (docs/strategies.md). A
        captcha-heavy pair's runs swing between nothing and most of its results; its falls are not counted at once.
        The explorations a change grants (:attr:`granted`) wait for its confirmation either way.
        """
        self.hazard.watch(was.t, new.t)
        key = (site, nid)
        sent = self._probes.pop(key, None)
        if sent is not None and sent <= new.t and was.pages > 0 and 0.0 <= new.pages - PROBE_PAGES <= was.pages:
            # The probe's run: its page's collected share, from the sums before and after (update_sums: older runs
            # weigh keep = (pages after - the probe's page) / pages before). Half a page or more: the pair is
            # drawn as untried, and explored at once (no rest).
            got = new.got - (new.pages - PROBE_PAGES) / was.pages * was.got
            if got >= 0.5 * PROBE_PAGES:
                if len(self._reopened) > 65536:
                    self._reopened.clear()
                self._reopened.add(key)
                self._exploring.pop(key, None)
        share = (new.got + 0.5) / (new.pages + 1.0)
        pending = self._unconfirmed.pop(key, None)
        if pending is not None:
            t0, t1, before, after, rise, added = pending
            if new.cp == was.cp and abs(share - after) < abs(share - before):
                if rise is None:  # counted only now
                    rise = self.hazard.change(t0, t1)
                # The changes this one stands for among the pairs not seen since are so many pairs whose
                # evidence is wrong: each is worth one exploration, beyond the share of the assignments.
                pairs = sum(self._pairs.values())
                self.granted = min(self.granted + rise * pairs, float(pairs))
            elif rise is not None:
                self.hazard.take_back(added)
        if new.cp > was.cp:
            if len(self._unconfirmed) > 65536:
                self._unconfirmed.clear()
            before = (was.got + 0.5) / (was.pages + 1.0)
            parts: dict[int, float] = {}
            # a pair surely good that turned bad, counted now (it may never run again); any other, once confirmed
            fell = share < before and share_bound(was) >= CHANGE_SHIFT
            rise = self.hazard.change(was.t, new.t, parts) if fell else None
            self._unconfirmed[key] = (was.t, new.t, before, share, rise, parts)

    def _summary(self, site: str) -> _SiteSummary:
        summary = self._summaries.get(site)
        if summary is None:
            if len(self._summaries) > 65536:  # sites no longer seen: start over
                self._summaries.clear()
            summary = self._summaries[site] = _SiteSummary()
        return summary

    def _ranking(self, site: str, sums: Mapping[str, Sums], now: float, typed: _Typed,
                 previous: _Ranking | None) -> _Ranking:
        """The site's nodes of one type ranked by expected rate (the ranking's ``c``; seconds per page 1), with
        the site's sums and prior as its ``data``. The exploiting rate is what the evidence says, not discounted by
        its age (:data:`EXPLOIT`), so a ranking changes only with the sums: it is kept until they do.

        From ``previous`` (the same nodes, older sums): if the prior did not move, only the nodes whose sums
        changed are rated again; else every node. The nodes that changed come from the sums mapping when it
        tells them (:class:`SiteSums`), the prior from the site's summary (:class:`_SiteSummary`)."""
        theta0, rho0 = self._summary(site).prior(sums)
        index = typed.index
        self._pairs[site] = len(sums)
        gone: Iterable[str] = ()
        if previous is not None:
            old = previous.data[0]
            names = changed_since(sums, old)
            if names is None:  # an older mapping, or one that does not tell: compare them all
                names = {nid for nid, new in sums.items() if old.get(nid) is not new}
                names.update(old.keys() - sums.keys())
            # in node id order, whichever way they were found (a set's order follows the process's string hashing;
            # the hazard's sums below follow this order)
            changed = {nid: new for nid in sorted(names) if (new := sums.get(nid)) is not None and nid in index}
            gone = [nid for nid in names if nid not in sums]
            for nid, new in changed.items():  # the evidence of how often pairs change (effective_half_life)
                was = old.get(nid)
                if was is not None and new.t > was.t:
                    self.exposure += new.t - was.t
                    self.changes += new.cp > was.cp
                    self._watch(site, nid, was, new)
        # The rows of the site's rates (RateTable), moved from the previous ranking when they hold its sums (a node
        # gone: made again, as the rows keep the sums' order), else made from the sums.
        table = previous.data[3] if previous is not None and not gone else None
        if table is not None and previous is not None and table.of is previous.data[0]:
            for nid, new in changed.items():
                table.put(nid, new, index[nid])
        else:
            table = RateTable()
            for nid, new in sums.items():
                if nid in index:
                    table.put(nid, new, index[nid])
        table.of = sums
        by_rate = None
        if previous is not None and previous.data[1:3] == (theta0, rho0) and len(changed) <= RERANK:
            # A few nodes re-rated under the same prior: move their rows (the same rows _Ranking sorts: spp 1)
            # instead of sorting them all
            c = previous.c.copy()
            for nid in gone:
                c.pop(nid, None)
            fresh = expected_rates(changed, now=now, half_life=EXPLOIT, theta0=theta0, rho0=rho0)
            if len(c) == len(previous.c):
                by_rate = previous.by_rate.copy()
                for nid, r in fresh.items():
                    if nid in c:
                        i = bisect.bisect_left(by_rate, (-c[nid], index[nid], nid))
                        if i == len(by_rate) or by_rate[i][2] != nid:
                            by_rate = None  # not the row expected: sort them all (never seen; a safety net)
                            break
                        del by_rate[i]
                    bisect.insort(by_rate, (-r, index[nid], nid))
            c.update(fresh)
        else:  # the prior moved (every node's rate with it), or many nodes re-rated: every row at once
            rates = table.rates(theta0=theta0, rho0=rho0)
            c = dict(zip(table.ids, rates.tolist(), strict=True))
            by_rate = table.ranked(rates)
        return _Ranking(typed, c, dict.fromkeys(c, 1.0), [], math.inf,
                        (sums, theta0, rho0, table, Posterior.prior(theta0, rho0)), by_rate=by_rate)

    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                 now: float) -> list[tuple[Subtask, str]]:
        if len(self._cache) > 65536:  # entries of sums replaced since: drop them all now and then
            self._cache.clear()
        free = {n.id: max(0, n.free) for n in nodes}
        if not any(free.values()) or not subtasks:
            return []
        if self.credit is None:
            self.credit = float(len(nodes) * self.unit)
        self._expire(estimates, now)
        free_by_type: dict[int, list[str]] = {}
        for n in nodes:
            for t in n.types:
                free_by_type.setdefault(t, [])
                if free[n.id] > 0:
                    free_by_type[t].append(n.id)
        self._rankings.begin(nodes)
        cacheable = hasattr(estimates, "site_sums")  # sums made from the paper's estimates are new every call
        sites: dict[tuple[str, int], _Site] = {}
        classes: dict[tuple[Any, ...], _Class] = {}
        window: list[tuple[int, Subtask, _Class]] = []
        for order, st in enumerate(subtasks):
            if st.type not in free_by_type:
                continue  # no live node of its type
            site = sites.get((st.site, st.type))
            if site is None:
                typed = self._rankings.typed(st.type)
                source = site_sums(estimates, st.site, [nid for _, nid in typed.pairs] if not cacheable else ())
                ranking = self._rankings.get(st.site, st.type, source, now,
                                             functools.partial(self._ranking, st.site, source, now), cacheable)
                site = sites[(st.site, st.type)] = _Site(st.site, ranking, free)
            if not st.attempt and now - st.since < self.patience and not self._room(site):
                continue  # as many of the site's subtasks offered as its free nodes can take (see _room)
            avoided = site.ranking.ids.intersection(st.avoid)
            excluded = avoided if avoided and self._avoidable(site, avoided) else set()
            runs_left = max(1, self.recall_max - st.attempt) if st.attempt > 0 else 0
            cls = self._class(site, st.group, excluded, estimates, now, classes, runs_left)  # found if made
            window.append((order, st, cls))
            if cls.known:
                cls.queues[now - st.since < self.patience].append((order, st))
        # Exploration: a few free candidates per subtask, each a Thompson draw. A run can change a decision if the
        # draw is above the site's floor (the node would be eligible here) and beats every expected rate the node has
        # on the window's sites, what it would otherwise be given. (Until 2026-12-04 a draw above the site's best
        # explored whatever the node had elsewhere: at 1,000 nodes x 200 sites, nodes that had found their suited
        # site kept trying others; docs/experiment.md, "An exploration costs what its node forgoes".) An exploration
        # costs the budget its pages times what the node forgoes: its best rate on the window's sites over the best
        # of any node there (see the module doc).
        overridden: dict[str, float] = {}  # node -> its best product-specific rate among the window's classes
        for cls in classes.values():
            for nid, m in cls.rates.items():
                overridden[nid] = max(m, overridden.get(nid, 0.0))
        tops = sorted(((-r.by_rate[0][0], i, r) for i, r in enumerate(s.ranking for s in sites.values())
                       if r.by_rate), reverse=True)

        top = tops[0][0] if tops else 0.0  # the best expected rate of any node on the window's sites
        owns: dict[str, float] = {}  # node -> its best expected rate on the window's sites (see own)

        def own(nid: str) -> float:
            """``nid``'s best expected rate on the window's sites (its classes' product rates included): what it is
            given if it does not explore. A node's rate on a site is at most the site's best, so the sites are
            scanned best first and only while their best beats what was found; once per node and call."""
            found = owns.get(nid)
            if found is None:
                found = overridden.get(nid, 0.0)
                for site_best, _, ranking in tops:
                    if site_best <= found:
                        break
                    rate = ranking.c.get(nid, 0.0)
                    if rate > found:
                        found = rate
                owns[nid] = found
            return found

        explore: list[tuple[int, float, int, bool, Subtask, str, bool, float, int]] = []
        in_flight = self._in_flight
        half_life = self.effective_half_life
        hazard = self.hazard

        doing = self._doing
        queued = {n.id: n.queued for n in nodes}

        def busy_rate(nid: str) -> float:
            """The best expected rate of the work ``nid`` was given in the last :data:`PROBE_AGE` seconds."""
            d = doing.get(nid)
            return d[0] if d is not None and now - d[1] < PROBE_AGE else 0.0

        changes: dict[str, tuple[Mapping[str, Sums], float]] = {}  # site -> (its sums, site_change): per call

        def site_change(site: str, sums: Mapping[str, Sums]) -> float:
            """The time of the last change point of any pair of the site with these sums: a site that starts
            treating one node differently may have changed for the others too, so their older evidence is not
            trusted to explore. Kept per site as its runs report (_SiteSummary); asked once per site and call."""
            hit = changes.get(site)
            if hit is None or hit[0] is not sums:
                hit = changes[site] = (sums, self._summary(site).cp.value(sums) or 0.0)
            return hit[1]

        # id(site) -> [the next row of its ranking to claim from, the free slots left at the row before it, the
        # floor (as -rate), the best free eligible rate over top]
        claims: dict[int, list[Any]] = {}

        def claimed(site: _Site) -> float:
            """What the next subtask of ``site`` in the window forgoes if explored, over ``top``: the rate of the
            site's best free node rated at least the floor of its best while the window's subtasks before it have
            not claimed every such slot (it would be exploited now: where work is scarce, an exploration takes a
            good node's work), else nothing (it would wait: the exploring node's time is the whole cost). The
            ranking's rows are walked as the slots are claimed: O(the site's subtasks + the full rows passed)."""
            rows = site.ranking.by_rate
            claim = claims.get(id(site))
            if claim is None:
                known = bool(rows) and rows[0][0] < 0  # some node collects there: else nothing is exploited
                claim = claims[id(site)] = [0 if known else len(rows), 0, self.rate_floor * rows[0][0] if known
                                            else 0.0, 0.0]
            i, left, cut, rate = claim
            while left <= 0:
                if i >= len(rows) or rows[i][0] > cut:
                    claim[0], claim[1] = i, 0
                    return 0.0
                left = free.get(rows[i][2], 0)
                if left > 0 and not rate:
                    rate = -rows[i][0] / top if top > 0 else 0.0
                i += 1
            claim[:] = [i, left - 1, cut, rate]
            return rate

        assert self.credit is not None
        drawn: set[str] = set()  # the sites a subtask of which was drawn for in this call
        for order, st, cls in window:
            work = claimed(cls.site)
            if cls.top > 0 and st.attempt > 0:
                continue  # a subtask that failed already must not risk another recall on a pair being tried,
                # unless no candidate is known to collect anything (it would wait for its patience, or forever)
            best = cls.top
            floor = self.rate_floor * best
            if now - st.since >= self.patience:
                floor = 0.0
            cands = free_by_type[st.type]
            take = EXPLORE_SAMPLE if st.site in drawn else 2 * EXPLORE_SAMPLE  # a site's first subtask: twice as many
            drawn.add(st.site)
            pool = cands if len(cands) <= take else self.rng.sample(cands, take)
            sums, theta0, rho0, _, prior = cls.site.ranking.data
            rates, skip, site_rates = cls.rates, cls.skip, cls.site.ranking.c
            for nid in pool:
                if nid in rates:
                    known: float | None = rates[nid]
                elif nid in skip:
                    continue  # avoided (or too slow: never for the bandit)
                else:
                    known = site_rates.get(nid)
                passed_over = False
                if known is not None and known >= floor and known > 0:
                    s = sums.get(nid)
                    if s is None or s.xp < s.pages:
                        if s is None or known >= self.rate_floor * own(nid) or now - s.t < PROBE_AGE:
                            continue  # exploiting it would do (unless its only runs were blank: drawn as untried)
                        # Eligible here, but its node has work better by far (its rate here is below the floor of
                        # what it has): it is seldom given this site's work, so nothing renews the evidence. Once
                        # not run for PROBE_AGE, drawn from its fading posterior like a pair below the site's floor
                        # (not probed: a busy node's probes are for the pairs nobody would give it).
                        passed_over = True
                if in_flight((st.site, nid), now):
                    continue  # it is being explored
                s = seen = sums.get(nid)  # s: the evidence drawn from (None: the prior)
                if s is not None and (st.site, nid) in self._reopened:
                    s = None  # its probe collected: as good as untried
                elif not passed_over and s is not None and now - s.t >= PROBE_AGE and best > 0 and (
                        not queued.get(nid) or self._busy_probe_due(nid)):
                    # Not run for PROBE_AGE seconds: drawn as untried; a draw that beats what the node has (in the
                    # window, or was given lately) is a probe of PROBE_PAGES, which tells whether it turned good.
                    # A node with nothing waiting in its queue probes on the budget (the page takes a slot that
                    # would wait for work); a node with work queued, whose queue may never empty, once per
                    # 1 / BUSY_PROBE_SHARE pages it is given, outside the budget (``needed``: the budget is the
                    # re-opened pairs')
                    draw = prior.sample(self.rng)
                    if draw > self.rate_floor * best and draw > max(own(nid), busy_rate(nid)):
                        explore.append((1, -draw / best, order, bool(queued.get(nid)), st, nid, False,
                                        max(work, min(1.0, own(nid) / top)) if top > 0 else 1.0, PROBE_PAGES))
                    continue
                elif s is not None and s.t < site_change(st.site, sums):
                    s = None  # tried before the site changed how it treats some node: as good as untried
                elif s is not None:
                    lost = hazard.cumulative(s.t, now)  # expected changes since it was last seen
                    if lost > 0 and self.rng.random() >= math.exp(-lost):
                        s = None  # it changed since it was seen, by how often the cluster's pairs did: untried
                draw = prior.sample(self.rng) if s is None else draw_rate(
                    self.rng, s, now=now, half_life=half_life, theta0=theta0, rho0=rho0, pace=cls.posts.get(nid))
                if draw <= self.rate_floor * best:
                    continue
                # On a site nobody has data on anything is an exploration, and needs no budget (the prior's rate says
                # nothing); elsewhere one is worth it only if the draw beats what the node is given in the window.
                mine = own(nid) if best > 0 else 0.0
                if mine >= draw:
                    continue
                explore.append((int(seen is not None), -draw / best if best > 0 else -math.inf, order, best <= 0, st,
                                nid, seen is not None and s is None,
                                max(work, min(1.0, mine / top)) if top > 0 else 1.0, 0))
        held = {n.id: n.held for n in nodes}
        result, exploited = self._match(explore, classes.values(), free, now, len(nodes), queued, held)
        if exploited:  # what each node was given, for the probes (busy_rate)
            of = {st.id: cls for _, st, cls in window}
            for st, nid in exploited:
                cls = of[st.id]
                rate = cls.rates.get(nid, cls.site.ranking.c.get(nid, 0.0))
                d = doing.get(nid)
                if d is None or now - d[1] >= PROBE_AGE or rate >= d[0]:
                    doing[nid] = (rate, now)
        return result + exploited

    def _room(self, site: _Site) -> bool:
        """Takes one subtask's room on ``site``: True if the site can still place one more of this call's
        subtasks. A site's room is the free slots of its nodes rated at least ``SCHEDEXT_RATE_FLOOR`` of its
        best (those a subtask of it may be sent to), counted in rank order as its subtasks ask, plus
        :data:`EXPLORE_ROOM` for explorations; a site nobody ran has no bound (anything there is an exploration).
        The window holds the first waiting subtasks in priority order, most of them of sites whose nodes are
        busy (that is why they wait): each is classed and drawn for every tick, and cannot be placed. O(the
        subtasks offered + the site's nodes walked, amortized by the free list)."""
        state = site.memo.get("room")
        if state is None:
            r = site.ranking
            if not r.by_rate or r.by_rate[0][0] >= 0:
                return True  # no node collects anything there: no bound
            state = site.memo["room"] = [EXPLORE_ROOM, 0, site.free_list(math.inf), self.rate_floor * r.by_rate[0][0]]
        if state[0] > 0:
            state[0] -= 1
            return True
        fl, cut = state[2], state[3]
        i = fl.first(state[1], site.free)
        if i < len(fl.rows) and fl.rows[i][0] <= cut:
            state[0], state[1] = site.free[fl.rows[i][2]] - 1, i + 1
            return True
        state[1] = i
        return False

    def _avoidable(self, site: _Site, avoided: set[str]) -> bool:
        """True if a recalled subtask of ``site`` keeps away from the nodes it failed on (``avoided``): another node
        of its type is alive and, where some node is known to collect there, one rated at least
        ``SCHEDEXT_RATE_FLOOR`` of the site's best is not among them, or the site's best (avoided) fails most of
        its runs there (``(fl + 1/2) / (n + 1) > 1/2``: errors at the moment, as a node that just turned bad or
        not yet good). A run fails on its first failed page, so a site's one good node fails a subtask now and then
        (1 % of errors a page is one 10-page run in ten); sent away from it, the subtask waited for its patience
        and went to a node that site does not suit (docs/strategies.md, "Avoid"). O(the avoided nodes) in the
        site's ranking."""
        if avoided == site.ranking.ids:
            return False  # none else alive: the avoided will do
        rows = site.ranking.by_rate
        if not rows or rows[0][0] >= 0:
            return True  # nobody known to collect anything there: any other node will do
        cut, sums = self.rate_floor * rows[0][0], site.ranking.data[0]
        for rate, _, nid in rows:  # best first (rows hold -rate)
            if rate > cut:
                break
            if nid not in avoided:
                return True
        s = sums[rows[0][2]]  # the best, avoided: back to it only if it finishes most of its runs there
        return (s.fl + 0.5) / (s.n + 1.0) > 0.5

    @staticmethod
    def _exploit(classes: list[_Class], free: dict[str, int], queued: Mapping[str, int],
                 held: Mapping[str, int], rate_floor: float) -> list[tuple[Subtask, str]]:
        """The greedy matching of the exploit queues, in four passes: first the idle nodes (nothing held at their
        last heartbeat, ``held``, and nothing queued) up to :data:`AHEAD` subtasks each, then every node up to
        :data:`AHEAD` subtasks in its crawl queue (``queued``, what it holds beyond what its slots run), then the
        spare nodes below the floor that are served as complete a share (:meth:`_spare`), then every node up to its
        free slots.

        A node's free slots (its adaptive prefetch, less its queue) do not say whether it can start more work soon:
        a busy node that ran its queue dry doubles its prefetch, and then the fastest node on a site, free more
        often than not, took every subtask there, to wait behind ten others in its queue, while a node almost as
        good stayed idle (the simulator, specialists: 0.8 of its best rate, running a fifth of what its peers ran;
        0.80 of the best possible against 0.88). Since the rates measure what a pair yields per second of node time
        (:func:`~scheduler_ext.strategies.posterior.run_seconds`), not how long work waits at the node, the
        matching looks at the queues: work goes first where a node will start it at once, as fast as the floor
        allows, and only then queues behind the best.

        A queue does not show a busy node, though: a real node takes a subtask as soon as fewer pages wait in it
        than its slots start at once, so its queue is empty most of the time while it holds two or three subtasks.
        Among nodes alike (every pair as good), the nodes that registered first took every task's chain, and the
        node ranked last got none: real runs of a profile where every pair serves everything in 0.1 s, 40 s, one
        node of four crawled 145 and 290 pages against about 2,800 for each of the others. The first pass gives
        such a node work before the others queue more (2026-12-04; docs/strategies.md, step 6)."""
        passes = 0

        def matched(rooms: dict[str, int]) -> list[tuple[Subtask, str]]:
            """The greedy over ``rooms`` (at most each node's free slots), charged to the free slots."""
            nonlocal passes
            if passes:  # the walks of the free nodes start over with the new rooms
                for site in {id(cls.site): cls.site for cls in classes}.values():
                    site.rewind()
                for cls in classes:
                    cls.rewind()
            passes += 1
            given = dict(rooms)
            pairs = greedy(classes, rooms)
            if rooms is not free:
                for nid, f in given.items():
                    free[nid] -= f - rooms[nid]
            return pairs

        idle = {nid: min(f, AHEAD) if not held.get(nid) and not queued.get(nid) else 0 for nid, f in free.items()}
        result = matched(idle) if any(idle.values()) else []
        now_queued = Counter(nid for _, nid in result)  # what the idle nodes got waits in their queues now
        ahead = {nid: min(f, max(0, AHEAD - queued.get(nid, 0) - now_queued[nid])) for nid, f in free.items()}
        if any(ahead.values()):
            result += matched(ahead)
        given = Counter(nid for _, nid in result)
        spare = {nid: int(f > 0 and not queued.get(nid) and not given[nid]) for nid, f in free.items()}
        if any(spare.values()):
            result += BanditAllocation._spare(classes, spare, free, rate_floor)
        if any(f > 0 for f in free.values()):
            result += matched(free)
        return result

    @staticmethod
    def _spare(classes: list[_Class], spare: dict[str, int], free: dict[str, int],
               rate_floor: float) -> list[tuple[Subtask, str]]:
        """The spare nodes' pass (``spare``: node -> 1 for a node with a free slot, nothing in its crawl queue and
        nothing given by the passes before; 0 for the others): the fresh subtasks left, whose nodes above the
        floor are all full or have :data:`AHEAD` waiting, in priority order, each to the best-rated spare node
        that collects as complete a share of a page there as the site's best-rated node (:func:`share_bound` of
        its evidence at least ``SCHEDEXT_RATE_FLOOR`` times that node's share), however slower it is.

        The floor keeps a site's work from nodes that collect less of it while a better one frees up soon. Results
        a node is not served are lost with the pages it crawled; time is not, and a node about to run dry has
        little else to do with it, while the nodes above the floor have work queued. Before this pass such subtasks
        queued behind the site's best (the third pass) while a node of the same share ran dry, until their
        patience ran out (bench_quality's 4-node unlucky worlds, seed 3: one node suited to four sites held all
        their work, another of the same share on one of them ran a third of the time; bandit / paper 0.93, now
        1.01). O(the subtasks left x log + the rows walked of their sites' free lists)."""
        left = sorted((entry[0], k, cls) for k, cls in enumerate(classes)
                      for entry in cls.queues[1][cls.heads[1]:])
        if not left:
            return []
        for site in {id(cls.site): cls.site for cls in classes}.values():
            site.rewind()  # the free lists are walked by ``spare`` here: the next pass rewinds them again
        result: list[tuple[Subtask, str]] = []
        # Per site, shared by its classes: where the walk of its free list stands (-1: no spare node left that
        # qualifies) and the share a node must be sure of there. O(the spare rows of the sites walked, once).
        walk: dict[int, int] = {}
        cuts: dict[int, float] = {}
        for _, _, cls in left:
            site = cls.site
            key = id(site)
            i = walk.get(key, 0)
            if i < 0:
                continue
            sums = site.ranking.data[0]
            cut = cuts.get(key)
            if cut is None:
                rows = site.ranking.by_rate
                top = sums.get(rows[0][2]) if rows and rows[0][0] < 0 else None  # nobody collects: none qualifies
                cut = cuts[key] = math.inf if top is None else rate_floor * share_bound(top, 0.0)
            fl = site.free_list(math.inf)
            i = fl.first(i, spare)
            while i < len(fl.rows):
                row = fl.rows[i]
                s = sums.get(row[2])
                if row[0] < 0 and s is not None and share_bound(s) >= cut:
                    break
                i = fl.first(i + 1, spare)
            walk[key] = i if i < len(fl.rows) else -1
            if i >= len(fl.rows):
                continue
            nid = fl.rows[i][2]
            if nid in cls.skip and cls.rates.get(nid, 0.0) <= 0:
                continue  # a node this class avoids (or rates at nothing): the site's next subtask may take it
            result.append((cls.queues[1][cls.heads[1]][1], nid))
            cls.heads[1] += 1
            spare[nid] -= 1
            free[nid] -= 1
        return result

    def _in_flight(self, key: tuple[str, str], now: float) -> bool:
        """True while an exploration of the pair ``key`` counts as in flight: sent less than ``explore_timeout`` ago
        (the recall age: a run that has not reported by then is recalled), no blank run of the pair since
        (``Sums.bl``: a run that crawled no page and failed from errors), and no run of the pair reported
        :data:`EXPLORE_REST` seconds ago or more. A blank run measured almost nothing (one failed page of share, no
        pace): the pair is as unexplored as before, and its draws decide again at once. Any other report keeps the
        lock for :data:`EXPLORE_REST` seconds, or the budget goes to the same few pairs again and again (measured:
        see docs/strategies.md); until the recall age, an exploration sent just before its pair turned good held
        the pair for 20 s (the benchmarks' unlucky worlds) or 60 s (the default recall age). Asked of the pairs a
        tick considers only (:meth:`_expire` drops the lapsed ones in the order they were sent)."""
        sent = self._exploring.get(key)
        if sent is None:
            return False
        if now - sent < self.explore_timeout:
            s = self._sums_of(key[0]).get(key[1]) if self._sums_of is not None else None
            if s is None or (s.bl <= sent and not sent < s.t <= now - EXPLORE_REST):
                return True
        del self._exploring[key]
        return False

    def _expire(self, estimates: Estimates, now: float) -> None:
        """Starts a tick: the explorations sent ``explore_timeout`` ago or more are no longer in flight. They are
        kept in the order they were sent (a pair is sent again only once its entry is gone), so the lapsed ones are
        the first: O(lapsed), however many are in flight."""
        self._sums_of = getattr(estimates, "site_sums", None)  # estimates without sums have no blank runs to tell
        exploring = self._exploring
        while exploring:
            key, sent = next(iter(exploring.items()))
            if now - sent < self.explore_timeout:
                break
            del exploring[key]

    def _class(self, site: _Site, group: str, excluded: set[str], estimates: Estimates, now: float,
               classes: dict[tuple[Any, ...], _Class], runs_left: int = 0) -> _Class:
        """The class of ``group``'s subtasks on the site excluding ``excluded``: a node that ran this product
        there is rated with the pace of those runs (a refined posterior), every other from the site's ranking.
        ``runs_left`` > 0: the class of subtasks that failed already and have that many runs left before they are
        dead-lettered (:meth:`_retry_class`)."""
        sums, theta0, rho0, _, _ = site.ranking.data
        per_group = group_sums(estimates, group, site.site) if sums else {}
        paces = {nid: pace for nid, pace in per_group.items() if nid in site.ranking.c and nid not in excluded}
        rates = self._product_rates(group, site.site, sums, site.ranking.data[3], theta0, rho0, paces) if paces else {}
        if runs_left:
            return self._retry_class(site, excluded, rates, classes, runs_left)
        if not rates:  # most products: the site's class
            ck: tuple[Any, ...] = (id(site), frozenset(excluded) if excluded else NOBODY)
            cls = classes.get(ck)
            if cls is None:
                cls = classes[ck] = _Class(site, excluded, {}, math.inf, self.rate_floor)
            return cls
        ck = (id(site), frozenset(excluded), *sorted(rates.items()))
        cls = classes.get(ck)
        if cls is None:
            cls = classes[ck] = _Class(site, excluded | rates.keys(), rates, math.inf, self.rate_floor)
            cls.posts = paces
        return cls

    def _product_rates(self, group: str, site: str, sums: Mapping[str, Sums], table: RateTable, theta0: float,
                       rho0: float, paces: dict[str, Sums]) -> dict[str, float]:
        """Node -> expected rate of ``group`` on ``site`` for the nodes with a pace of their own for it. A rate
        depends on the node's sums, its pace sums and the site's prior only (the exploiting rates are not
        discounted by time), so it is kept across calls until one of them is replaced: a subtask that waits is
        offered again every tick, and its rates are not computed again."""
        key = (group, site)
        hit = self._product.get(key)
        if hit is None or hit[0] != theta0 or hit[1] != rho0:
            if len(self._product) > 65536:
                self._product.clear()
            hit = self._product[key] = (theta0, rho0, {})
        kept = hit[2]
        rates = {}
        paced = None
        for nid, pace in paces.items():  # nodes of the ranking, so of its rows
            s, row = sums[nid], kept.get(nid)
            if row is None or row[0] is not s or row[1] is not pace:
                if paced is None:
                    paced = table.paced(theta0=theta0, rho0=rho0)
                row = kept[nid] = (s, pace, paced(nid, s, pace))  # its share from the site's rows
            rates[nid] = row[2]
        return rates

    def _retry_class(self, site: _Site, excluded: set[str], rates: dict[str, float],
                     classes: dict[tuple[Any, ...], _Class], runs_left: int) -> _Class:
        """The class of subtasks that failed already and have ``runs_left`` runs before ``SCHEDEXT_RECALL_MAX``
        dead-letters them, and their task stops with every result it has left. What a failed run collected is
        kept; what the failure costs is one of those runs. So the node is rated by its expected rate times the
        probability that the subtask finishes before it is dead-lettered if this node runs it now and its later
        runs go to the most reliable other candidate weighed: ``f + (1 - f) (1 - (1 - q)^(runs_left - 1))``, for
        ``f`` the posterior probability that a run of the pair finishes, ``1 - (fl + 1/2) / (n + 1)`` (failed runs
        over runs, Jeffreys' prior), and ``q`` that of the other node. On the last run it is ``f``: a node whose
        pages are mostly blocked collects fast while it lasts and almost never finishes a run, so it ranks below a
        slow node that does finish; with runs to spare and a node that finishes to fall back on, it is worth about
        its rate.
        The :data:`RETRY_SAMPLE` best-rated candidates (busy ones included: late binding) and as many best-rated
        free ones are weighed; the floor and patience apply to the products, as for any class, except that on the
        last run the floor holds past the patience too: a failure there stops the task, so the subtask waits for a
        node weighed near its best (on the benchmarks' captcha worlds it went, past its patience, to the next free
        captcha node: 37 tasks a world dead-lettered, 21 with the floor kept)."""
        weighing = site.memo.get("retry")
        if weighing is None:
            weighing = site.memo["retry"] = _Weighing(site)
        relevant = weighing.relevant(excluded)  # subtasks avoiding different nodes mostly weigh alike
        ordered = sorted(rates.items())
        ck = ("retry", runs_left, id(site), relevant, *ordered)
        cls = classes.get(ck)
        if cls is None:
            cls = classes[ck] = _Class(site, set(relevant), weighing.weigh(relevant, rates, runs_left), -math.inf,
                                       self.rate_floor)
        if cls.top <= 0 and len(relevant) < len(excluded):  # such a class explores: it must skip all it avoids
            ck = ("retry", runs_left, id(site), frozenset(excluded), *ordered)
            cls = classes.get(ck)
            if cls is None:
                cls = classes[ck] = _Class(site, set(excluded), weighing.weigh(relevant, rates, runs_left),
                                           -math.inf, self.rate_floor)
        if runs_left == 1:  # the last run: only a node weighed near the best, past its patience too (see above)
            cls.floors = (cls.floors[1], cls.floors[1])
        return cls

    def _match(self, explore: list[tuple[int, float, int, bool, Subtask, str, bool, float, int]],
               classes: Iterable[_Class], free: dict[str, int], now: float, cluster: int,
               queued: Mapping[str, int], held: Mapping[str, int],
               ) -> tuple[list[tuple[Subtask, str]], list[tuple[Subtask, str]]]:
        """The explorations and probes (``explore``, in :func:`_per_page`'s order), then the exploit matching:
        (explored, exploited)."""
        assigned: set[str] = set()
        result: list[tuple[Subtask, str]] = []
        assert self.credit is not None
        explore.sort(key=_per_page)
        for _, _, _, needed, st, nid, stale, forgone, probe in explore:
            if st.id in assigned or free.get(nid, 0) <= 0 or self._in_flight((st.site, nid), now):
                continue
            busy = bool(probe and queued.get(nid))
            if busy and not self._busy_probe_due(nid):
                continue  # a node with work queued probed lately
            pages = min(st.page_limit, probe or self.explore_pages)
            if not needed:
                if self.credit >= pages * forgone:
                    self.credit -= pages * forgone
                elif stale and self.granted >= 1:  # a pair re-opened as changed: what the changes found grant
                    self.granted -= 1
                else:
                    continue
            self._exploring[(st.site, nid)] = now
            if probe:
                if len(self._probes) > 65536:
                    self._probes.clear()
                self._probes[(st.site, nid)] = now
                if busy:
                    self._probe_credit[nid] = 0.0
                self.probed += 1
            else:
                self._reopened.discard((st.site, nid))
                self.explored += 1
            assigned.add(st.id)
            free[nid] -= 1
            result.append((st.capped(pages), nid))
        if assigned:  # the explored subtasks leave the exploit queues
            for cls in classes:
                for q in cls.queues:
                    q[:] = [e for e in q if e[1].id not in assigned]
        exploited = self._exploit(list(classes), free, queued, held, self.rate_floor)
        # The budget refills with a share of the pages sent and never banks more than a round of the cluster's nodes'
        # explorations.
        self.credit = min(self.credit + self.explore_share * sum(st.page_limit for st, _ in exploited),
                          (1.0 + self.explore_share * cluster) * self.unit)
        earned = self._probe_credit
        if len(earned) > 65536:  # nodes that came and went: start over
            earned.clear()
        for st, nid in exploited:
            earned[nid] = min(float(PROBE_PAGES), earned.get(nid, 0.0) + BUSY_PROBE_SHARE * st.page_limit)
        return result, exploited

    def _busy_probe_due(self, nid: str) -> bool:
        """Whether a node with work queued may probe: a probe's pages earned since its last, or since it was first
        given work (:data:`BUSY_PROBE_SHARE` of the pages it was given)."""
        return self._probe_credit.get(nid, 0.0) >= PROBE_PAGES - 1e-9
