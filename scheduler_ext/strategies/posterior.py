"""Estimates with their uncertainty: what a (site, node) pair yields per second, and how sure we are of it.

Pure functions and small value objects, shared by the finish script (which keeps the sums in Redis; the Lua in
the finish script mirrors :func:`update_sums` line for line), by :class:`~scheduler_ext.strategies.bandit.
BanditAllocation` (which reads them) and by the simulator (scheduler_ext/sim), so that the three agree.

The model (docs/strategies.md, "The bandit model", gives the derivation):

* Every run of a subtask is charged in *pages attempted*: the pages it crawled plus every page that gave nothing
  (a captcha page, an HTTP or download error, a download cut short by the time limit), the pages in flight when the
  first one failed included: the node reports them all (``Report.attempted``, ``blocked``, ``failed``). Pages never
  started are not charged; the run's time is, whatever its outcome.
* ``got``: the page-equivalents of results it collected, ``pages_done x collected / offered`` (a page that
  served 9 of its 10 results counts 0.9). A failed or blocked page counts 0 here and 1 in ``pages``: it was
  offered and nothing was collected. That is what the paper's completion leaves out.
* ``sec``: the run's node time (:func:`run_seconds`: the seconds its pages held the node's page slots, over the
  node's slots), every outcome included; from a node that does not measure it, the run's seconds, and for a
  failed run also its recall (``fail_cost``).

The sums are kept per run with the same weight ``alpha`` as the paper's moving estimates (``x <- (1 - alpha) x +
new``), so a pair that is used keeps a memory of about ``1 / alpha`` runs and follows drift; a pair that is *not*
used keeps its sums, and the reader discounts them by the time since the last run (half-life ``half_life``), so
its posterior widens back towards the prior while nobody looks at it. No staleness timer: uncertainty grows
smoothly, and Thompson sampling turns it into a probability of being tried again.

Posterior of the served share ``theta`` (results collected per page attempted, as a share of a full page) and of
the pace ``rho`` (pages attempted per second of node time), with a weak prior of ``prior_weight`` pages centred on
``(theta0, rho0)``:

    theta ~ Beta(w theta0 + got, w (1 - theta0) + pages - err - got)
    rho   ~ Gamma(shape = w + pages - xp, rate = w / rho0 + sec)
    rate  = theta x rho                    (page-equivalents of results per second of node time)

``E[rate] = E[theta] E[rho]`` (independent posteriors). Doctest:

>>> s = update_sums(None, pages_done=10, failed_pages=0, offered=100, collected=90, seconds=2.0, alpha=0.3)
>>> (s.n, s.pages, s.got, s.sec)
(1.0, 10.0, 9.0, 2.0)
>>> p = Posterior.of(s, now=0.0, half_life=60.0, theta0=0.5, rho0=1.0, weight=1.0)
>>> round(p.mean, 3)    # theta = 9.5/11, rho = 11/3
3.167
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Pages of pseudo-evidence in the prior: about what one failed run attempts (its first failed page ends it; the
#: pages in flight are charged too), so that a single failed run cannot write a pair off: it leaves the pair's
#: mean share near half the site's best, and its draws still reach the best now and then; a run that serves,
#: or a second failure, outweighs it. (Measured on bench_quality's worlds, 5 each: with 1 page, unlucky first runs
#: left 10 % of the good pairs unused after 300 s, and the bandit was 1.10x the paper's strategy there; with 3,
#: 1.19x, and a drifted pair was used in a median 11.5 s instead of 16.)
PRIOR_WEIGHT = 3.0
#: Pages per second of node time no pair reaches (a page costs more than a microsecond of a slot): the bound of a
#: pace read from sums whose seconds are near 0 (an entry written by hand, a run timed at 0), which would
#: otherwise make the prior's pace infinite and its draws a division by zero.
PACE_MAX = 1e6
#: Nodes whose (product, site) figures are kept per (product, site), at most: the ones that ran it most recently.
#: A long task runs on more and more nodes (every exploration of its site is one); figures of a node that ran the
#: product long ago say little the site-wide figures do not, and keeping them all made memory and the bandit's
#: work per waiting subtask grow with the run (docs/strategies.md, "A day at scale").
GROUP_NODES = 8
#: A run this many binomial standard deviations off the pair's share, over at least CHANGE_PAGES pages attempted,
#: is a change point: the sums restart from it instead of averaging it in.
CHANGE_Z = 3.0
CHANGE_PAGES = 3
#: A change point whose run's share is at least this far from the share before it is a change of the site's
#: treatment (suited to unsuited or back), recorded in ``Sums.cp``; the bandit then re-examines the site's other pairs.
#: Smaller ones (a captcha-heavy pair's runs vary between 0 and 0.6) only restart the pair's own sums.
CHANGE_SHIFT = 0.5
# A run that crawled no page and failed from errors (not blocks) is charged to the served share for the page that
# failed only, not for the pages in flight with it: they offered no results, so they say nothing of how many results
# the node is served, and a good pair whose first pages fail by bad luck would otherwise need many runs to look good
# again. The run still counts as a failure (``fl``). Blocked pages always count in full (a captcha-heavy node must not
# look good). The pages left out are kept in ``Sums.err``.
# Such a run is *blank* when every page it attempted failed from errors: it measured no pace either (no page was
# served, so its seconds and its recall say how fast errors come back, not how fast pages do), so its pages and
# seconds are left out of the pace (``Sums.xp``; its seconds are not added to ``sec``), and its time is kept
# (``Sums.bl``): the bandit ends the exploration that sent it (``BanditAllocation``). Charged as time, a blank run
# of a suited pair held its pace at about half the site's best (0.6 s of its own and 0.75 s of recall for 1 to 5
# pages), and with its share at three quarters, its draws beat the site's best about once in 500 (bench_quality's
# unlucky worlds, instrumented).


#: The JSON fields of an estimate entry that :meth:`Sums.from_entry` reads, in the order of :class:`Sums`'s fields.
_FIELDS = ("n", "pg", "got", "sec", "last", "cp", "fl", "err", "xp", "bl")


@dataclass(frozen=True)
class Sums:
    """The sufficient statistics of one pair, as the finish script keeps them (JSON fields in brackets).

    ``n`` [n] runs, ``pages`` [pg] pages attempted, ``got`` [got] page-equivalents collected, ``sec`` [sec]
    seconds, ``fl`` [fl] failed runs, ``err`` [err] pages left out of the served share, ``xp`` [xp] pages left out
    of the pace (of blank runs), all weighted (each run multiplies the old sums by ``1 - alpha``); ``t`` [last] the
    time of the last run; ``cp`` [cp] the time of the last change point (:func:`changed`), 0 if none; ``bl`` [bl]
    the time of the last blank run (see the comment above), 0 if none.
    """

    n: float = 0.0
    pages: float = 0.0
    got: float = 0.0
    sec: float = 0.0
    t: float = 0.0
    cp: float = 0.0
    fl: float = 0.0
    err: float = 0.0
    xp: float = 0.0
    bl: float = 0.0

    @property
    def pace(self) -> float | None:
        """Pages attempted per second of node time, the pace's evidence without its prior (at most
        :data:`PACE_MAX`); None before any.

        >>> Sums(pages=6, xp=1, sec=0.1).pace, Sums(pages=3, xp=3).pace, Sums(pages=5, sec=1e-320).pace
        (50.0, None, 1000000.0)
        """
        if self.sec <= 0 or self.pages <= self.xp:
            return None
        return min(PACE_MAX, (self.pages - self.xp) / self.sec)

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> Sums | None:
        """The sums of an estimate entry (``est:site`` / ``est:gs`` field JSON); None if it has none yet, or if a
        value is not a finite number >= 0 (an entry the finish script did not write).

        >>> Sums.from_entry({"n": 2, "pg": 4, "got": 9, "sec": 1.5, "xp": 7}).got  # parts above the pages: cut
        4.0
        >>> [Sums.from_entry(e) for e in ({"pg": float("nan")}, {"pg": 4, "sec": -1}, {"pg": "1e999"}, {"pg": "x"})]
        [None, None, None, None]
        """
        if entry.get("pg") is None:
            return None
        try:
            values = [float(entry.get(name) or 0) for name in _FIELDS]
        except (TypeError, ValueError, OverflowError):  # a hand-edited entry: no usable data, not an exception
            return None
        if not all(0 <= v < math.inf for v in values):  # NaN too: a draw from it would never end
            return None
        n, pages, got, sec, t, cp, fl, err, xp, bl = values
        # the parts of the pages never exceed them (a written entry's do not): a posterior's shapes stay positive
        return cls(n, pages, min(got, pages), sec, t, cp, min(fl, n), min(err, pages), min(xp, pages), bl)


def page_equivalents(pages_done: int, offered: int, collected: int) -> float:
    """Results collected, in pages: ``pages_done x collected / offered`` (capped at ``pages_done``).

    >>> page_equivalents(10, 100, 90), page_equivalents(0, 0, 0), page_equivalents(2, 0, 5)
    (9.0, 0.0, 2.0)
    """
    if pages_done <= 0:
        return 0.0
    if offered <= 0:  # pages without a count line that still gave results: count them whole
        return float(pages_done) if collected > 0 else 0.0
    return pages_done * min(1.0, collected / offered)


def share_bound(sums: Sums, z: float = 1.0) -> float:
    """A lower bound of the pair's served share that its evidence makes sure of: the posterior mean (Jeffreys'
    prior) less ``z`` standard deviations, ``pages`` being the evidence's weight. Few pages bound it low.

    >>> round(share_bound(Sums(n=5, pages=50, got=47.5)), 3), round(share_bound(Sums(n=1, pages=1, got=1)), 3)
    (0.909, 0.5)
    """
    p = (sums.got + 0.5) / (sums.pages + 1.0)
    return max(0.0, p - z * math.sqrt(p * (1.0 - p) / (sums.pages + 2.0)))


def changed(old: Sums, attempted: float, got: float) -> bool:
    """True if a run's yield is too far from what the pair's sums predict to be the same pair: a change point.

    The run's collected page-equivalents ``got`` of ``attempted`` pages are compared with the binomial
    prediction of the sums' share; more than ``CHANGE_Z`` standard deviations off, over at least
    ``CHANGE_PAGES`` pages, means the site now treats the node differently (the paper's Figure 4 pairs that turn
    bad, or good). One failed page alone never is: it is one page of evidence.

    >>> good = Sums(n=3, pages=27, got=25, sec=3)
    >>> changed(good, 9, 8.0), changed(good, 1, 0.0), changed(good, 8, 1.0)
    (False, False, True)
    """
    if attempted < CHANGE_PAGES or old.pages <= 0:
        return False
    share = min(0.98, max(0.02, (old.got + 0.5) / (old.pages + 1.0)))
    sd = math.sqrt(attempted * share * (1 - share))
    return abs(got - attempted * share) > CHANGE_Z * sd


def run_seconds(seconds: float, node_seconds: float | None, failed: bool, fail_cost: float) -> float:
    """The time a run is charged in the sums' ``sec``, the denominator of its pace.

    ``node_seconds`` (``Report.node_seconds``): the seconds its pages held the node's page slots, over the node's
    slots. That is what the run cost the scarce resource, the nodes' capacity, and it does not depend on what
    else the node was crawling. A run's wall time does: its pages wait for slots behind every other subtask's, so
    on a busy node every pair looks about as fast as the node's mix, and a node slow on a site (0.2 s a page)
    looked 0.86 of the fastest one there (0.1 s) instead of half (the simulator, paper profile). Measured on the
    simulator's paper profile, 4 seeds: dynamic / oracle 0.94 with wall time, 0.97 with node time.

    A node that did not measure it (an older version) is charged the run's ``seconds`` and, for a ``failed`` run,
    ``fail_cost`` more: the time its task loses to the recall (1.5 x ``SCHEDEXT_TICK_INTERVAL``). Node time has no
    such term: a recall holds no page slot.

    >>> run_seconds(2.0, 0.25, True, 0.75), run_seconds(2.0, None, True, 0.75), run_seconds(2.0, None, False, 0.75)
    (0.25, 2.75, 2.0)
    """
    if node_seconds is not None:
        return max(0.0, node_seconds)
    return max(0.0, seconds) + (fail_cost if failed else 0.0)


def update_sums(old: Sums | None, *, pages_done: int, failed_pages: int, offered: int, collected: int,
                seconds: float, alpha: float, now: float = 0.0, failed: bool = False, fail_cost: float = 0.0,
                error_pages: int = 0, node_seconds: float | None = None) -> Sums:
    """The sums after one more run (the finish script's Lua does exactly this): older runs weigh ``1 - alpha``
    less, unless the run is a change point (:func:`changed`), which starts the sums afresh from it.

    ``failed_pages``: the pages attempted that gave nothing (``Report.charged - pages``). The run's time is
    :func:`run_seconds`: its node time (``node_seconds``) when the node measured it, else its seconds plus
    ``fail_cost`` for a failed run.

    ``error_pages``: of ``failed_pages``, those that gave nothing without being blocked (``Report.charged - pages -
    blocked``). If the run crawled no page, all but the first are left out of the served share (``Sums.err``; see
    the comment above :class:`Sums`); if moreover every page failed from errors and the run failed (a blank run),
    its pages and seconds are left out of the pace (``Sums.xp``, not in ``sec``) and its time kept (``Sums.bl``)."""
    attempted = pages_done + failed_pages
    got = page_equivalents(pages_done, offered, collected)
    o = old or Sums()
    change = changed(o, attempted, got)
    shift = change and abs(got / attempted - (o.got + 0.5) / (o.pages + 1.0)) >= CHANGE_SHIFT
    keep = 0.0 if change else 1.0 - alpha
    blank = failed and pages_done <= 0 and error_pages >= failed_pages > 0
    return Sums(n=keep * o.n + 1.0, pages=keep * o.pages + attempted, got=keep * o.got + got,
                sec=keep * o.sec + (0.0 if blank else run_seconds(seconds, node_seconds, failed, fail_cost)), t=now,
                cp=now if shift else o.cp, fl=keep * o.fl + (1.0 if failed else 0.0),
                err=keep * o.err + (max(0, min(error_pages, failed_pages) - 1) if pages_done <= 0 else 0),
                xp=keep * o.xp + (attempted if blank else 0), bl=now if blank else o.bl)


@dataclass(frozen=True)
class Posterior:
    """Beta posterior of the served share and Gamma posterior of the pace of one pair (see the module doc)."""

    a: float  # Beta alpha: collected page-equivalents (plus prior)
    b: float  # Beta beta: pages attempted and not collected (plus prior)
    shape: float  # Gamma shape: pages attempted (plus prior)
    rate: float  # Gamma rate: seconds (plus prior)
    runs: float = 0.0  # weighted runs behind it, after the time discount

    @classmethod
    def prior(cls, theta0: float, rho0: float, weight: float = PRIOR_WEIGHT) -> Posterior:
        theta0 = min(0.999, max(0.001, theta0))
        return cls(weight * theta0, weight * (1 - theta0), weight, weight / max(rho0, 1e-6))

    @classmethod
    def of(cls, sums: Sums | None, *, now: float, half_life: float, theta0: float, rho0: float,
           weight: float = PRIOR_WEIGHT, pace: Sums | None = None) -> Posterior:
        """The posterior of a pair from its sums, discounted by the time since its last run.

        ``pace``: sums to take the pace from instead (the (product, site, node) sums when they exist), so
        that the served share comes from every run of the node on the site and the pace from this product's.
        """
        if sums is None:
            return cls.prior(theta0, rho0, weight)
        return cls(*params(sums, now=now, half_life=half_life, theta0=theta0, rho0=rho0, weight=weight, pace=pace))

    @property
    def share(self) -> float:
        return self.a / (self.a + self.b)

    @property
    def pace(self) -> float:
        return self.shape / self.rate

    @property
    def mean(self) -> float:
        """Expected page-equivalents of results per second."""
        return self.share * self.pace

    def sample(self, rng: random.Random) -> float:
        """One Thompson draw of the rate."""
        return rng.betavariate(self.a, self.b) * rng.gammavariate(self.shape, 1.0 / self.rate)


def params(sums: Sums, *, now: float, half_life: float, theta0: float, rho0: float, weight: float = PRIOR_WEIGHT,
           pace: Sums | None = None) -> tuple[float, float, float, float, float]:
    """(a, b, shape, rate, runs) of :meth:`Posterior.of` (see there), as a tuple: ranking and drawing for every
    node of a site do not need the object."""
    theta0 = min(0.999, max(0.001, theta0))
    age = now - sums.t
    d = 1.0 if half_life <= 0 or age <= 0 else 2.0 ** (-age / half_life)  # discount(age, half_life), inline
    got, pages = d * sums.got, d * (sums.pages - sums.err)
    src = sums if pace is None or pace.pages <= 0 else pace
    dp = d if src is sums else discount(now - src.t, half_life)
    return (weight * theta0 + got, weight * (1 - theta0) + (pages - got if pages > got else 0.0),
            weight + dp * (src.pages - src.xp), weight / (rho0 if rho0 > 1e-6 else 1e-6) + dp * src.sec, d * sums.n)


def expected_rate(sums: Sums, *, now: float, half_life: float, theta0: float, rho0: float,
                  weight: float = PRIOR_WEIGHT, pace: Sums | None = None) -> float:
    """``Posterior.of(sums, ...).mean`` without building the posterior (the same float).

    >>> s, g = Sums(n=2, pages=20, got=15, sec=4, t=0), Sums(n=1, pages=5, got=5, sec=2, t=3)
    >>> all(expected_rate(s, now=9, half_life=30, theta0=0.6, rho0=2, pace=p)
    ...     == Posterior.of(s, now=9, half_life=30, theta0=0.6, rho0=2, pace=p).mean for p in (None, g))
    True
    """
    a, b, shape, rate, _ = params(sums, now=now, half_life=half_life, theta0=theta0, rho0=rho0, weight=weight,
                                  pace=pace)
    return a / (a + b) * (shape / rate)


def prior_terms(theta0: float, rho0: float, weight: float = PRIOR_WEIGHT) -> tuple[float, float, float]:
    """The prior's pseudo-evidence ``(w theta0, w (1 - theta0), w / rho0)``, ``theta0`` clamped to [0.001, 0.999]
    and ``rho0`` floored at 1e-6, as :func:`params` makes it inline: the batch rates start from them."""
    theta0 = min(0.999, max(0.001, theta0))
    return weight * theta0, weight * (1 - theta0), weight / (rho0 if rho0 > 1e-6 else 1e-6)


def expected_rates(sums: Mapping[str, Sums], *, now: float, half_life: float, theta0: float, rho0: float,
                   weight: float = PRIOR_WEIGHT) -> dict[str, float]:
    """``{node: expected_rate(s, ...)}`` for every pair of a site at once: the same floats (the same operations in
    the same order as :func:`params`, inlined), about three times faster, for ranking a site's nodes.

    >>> s = {"a": Sums(n=2, pages=20, got=15, sec=4, t=0), "b": Sums(n=1, pages=3, got=4, sec=0, t=12)}
    >>> all(expected_rates(s, now=now, half_life=h, theta0=0.6, rho0=2)[k]
    ...     == expected_rate(v, now=now, half_life=h, theta0=0.6, rho0=2)
    ...     for k, v in s.items() for now in (0, 9, 40) for h in (0, 30, math.inf))
    True
    """
    wa, wb, wr = prior_terms(theta0, rho0, weight)
    out = {}
    for key, s in sums.items():
        age = now - s.t
        d = 1.0 if half_life <= 0 or age <= 0 else 2.0 ** (-age / half_life)
        got, pages, shown = d * s.got, d * (s.pages - s.xp), d * (s.pages - s.err)
        a = wa + got
        out[key] = a / (a + (wb + (shown - got if shown > got else 0.0))) * ((weight + pages) / (wr + d * s.sec))
    return out


class RateTable:
    """The undiscounted expected rates of one site's nodes (:func:`expected_rates` with half-life 0, as a ranking
    uses them), kept as columns: a site's prior moves whenever its best pair's figures do, and then every node's
    rate moves with it. Re-rating a site that a thousand nodes ran is then a few vector operations instead of a
    Python loop over the nodes (the same floats: the same operations in the same order, element by element), and
    ranking them an array sort. Rows are put as the nodes' sums change; ``of`` is the sums mapping the rows hold.

    >>> t = RateTable(); s = {"a": Sums(n=2, pages=20, got=15, sec=4, t=0), "b": Sums(n=1, pages=3, got=4, sec=0)}
    >>> for i, (k, v) in enumerate(s.items()): t.put(k, v, i)
    >>> rates = t.rates(theta0=0.6, rho0=2)
    >>> dict(zip(t.ids, rates.tolist())) == expected_rates(s, now=9, half_life=0, theta0=0.6, rho0=2)
    True
    >>> [nid for _, _, nid in t.ranked(rates)]  # best first (ties by node index)
    ['b', 'a']
    """

    __slots__ = ("ids", "row", "of", "_got", "_fail", "_pages", "_sec", "_index", "_n", "weight", "_shares",
                 "_prior")

    def __init__(self, weight: float = PRIOR_WEIGHT) -> None:
        self.ids: list[str] = []  # row -> node id
        self.row: dict[str, int] = {}  # node id -> row
        self.of: Any = None  # the sums mapping the rows were put from (its owner checks before reusing them)
        self.weight = weight
        self._n = 0
        self._got, self._fail, self._pages, self._sec = (np.zeros(64) for _ in range(4))
        self._index = np.zeros(64, dtype=np.int64)  # the node's index among the live nodes: ties go to the lower
        self._shares: list[float] | None = None  # every row's expected share under ``_prior``, kept as rows are put
        self._prior: tuple[float, float] | None = None

    def put(self, nid: str, s: Sums, index: int) -> None:
        """``nid``'s row from its sums (the terms of :func:`expected_rates` that do not depend on the prior)."""
        i = self.row.get(nid)
        if i is None:
            i = self.row[nid] = self._n
            self.ids.append(nid)
            self._n += 1
            if self._n > len(self._got):
                grown = 2 * len(self._got)
                self._got, self._fail, self._pages, self._sec = (
                    np.resize(a, grown) for a in (self._got, self._fail, self._pages, self._sec))
                self._index = np.resize(self._index, grown)
        got, shown = s.got, s.pages - s.err
        fail = shown - got if shown > got else 0.0
        self._got[i] = got
        self._fail[i] = fail
        self._pages[i] = self.weight + (s.pages - s.xp)
        self._sec[i] = s.sec
        self._index[i] = index
        if self._shares is not None and self._prior is not None:  # the kept shares follow the row
            wa, wb, _ = prior_terms(*self._prior, self.weight)
            a = wa + got
            if i < len(self._shares):
                self._shares[i] = a / (a + (wb + fail))
            else:
                self._shares.append(a / (a + (wb + fail)))

    def shares(self, *, theta0: float, rho0: float) -> Any:
        """Every row's expected served share ``a / (a + b)`` under the prior (a numpy array, in row order)."""
        n = self._n
        wa, wb, _ = prior_terms(theta0, rho0, self.weight)
        a = wa + self._got[:n]
        shares = a / (a + (wb + self._fail[:n]))
        self._shares, self._prior = shares.tolist(), (theta0, rho0)
        return shares

    def rates(self, *, theta0: float, rho0: float) -> Any:
        """Every row's expected rate under the prior ``(theta0, rho0)`` (a numpy array, in row order)."""
        n = self._n
        wr = prior_terms(theta0, rho0, self.weight)[2]
        return self.shares(theta0=theta0, rho0=rho0) * (self._pages[:n] / (wr + self._sec[:n]))

    def paced(self, *, theta0: float, rho0: float) -> Callable[[str, Sums, Sums], float]:
        """``rate(nid, s, pace)``: ``expected_rate(s, pace=pace)`` at half-life 0 for ``nid``, whose row holds ``s``:
        its share from the row (kept per prior), its pace from ``pace`` (a product's runs). Made once per prior and
        class, called per node of the table.

        >>> t = RateTable(); s, p = Sums(n=2, pages=20, got=15, sec=4), Sums(n=1, pages=5, got=5, sec=2)
        >>> t.put("a", s, 0)
        >>> t.paced(theta0=0.6, rho0=2)("a", s, p) == expected_rate(s, now=9, half_life=0, theta0=0.6, rho0=2, pace=p)
        True
        """
        if self._shares is None or self._prior != (theta0, rho0):
            self.shares(theta0=theta0, rho0=rho0)
        shares, row, weight, wr = self._shares, self.row, self.weight, prior_terms(theta0, rho0, self.weight)[2]
        assert shares is not None

        def rate(nid: str, s: Sums, pace: Sums) -> float:
            src = s if pace.pages <= 0 else pace
            return shares[row[nid]] * ((weight + (src.pages - src.xp)) / (wr + src.sec))

        return rate

    def ranked(self, rates: Any) -> list[tuple[float, int, str]]:
        """The rows as a ranking's ``by_rate``: ``(-rate, node index, id)``, best first, ties by node index."""
        n = self._n
        minus, index = -rates, self._index[:n]
        order = np.lexsort((index, minus))
        ids = self.ids
        return list(zip(minus[order].tolist(), index[order].tolist(), [ids[i] for i in order.tolist()], strict=True))


def draw_rate(rng: random.Random, sums: Sums, *, now: float, half_life: float, theta0: float, rho0: float,
              pace: Sums | None = None) -> float:
    """``Posterior.of(sums, ...).sample(rng)`` without building the posterior (the same draw)."""
    a, b, shape, rate, _ = params(sums, now=now, half_life=half_life, theta0=theta0, rho0=rho0, pace=pace)
    return rng.betavariate(a, b) * rng.gammavariate(shape, 1.0 / rate)


def discount(age: float, half_life: float) -> float:
    """Weight of evidence ``age`` seconds old: 1 now, 1/2 after ``half_life``.

    >>> discount(0, 60), discount(60, 60), discount(-5, 60)
    (1.0, 0.5, 1.0)
    """
    if half_life <= 0 or age <= 0:
        return 1.0
    return math.pow(2.0, -age / half_life)


class SiteSums(dict[str, Sums]):
    """A site's sums, node -> :class:`Sums`, that knows what changed since the mapping it replaced.

    The estimates replace a site's mapping when runs change it (copy on write: :meth:`successor`, then
    :meth:`put`), which is how a reader knows to look again; ``base`` (the mapping replaced) and ``changed`` (the
    nodes put since) let a reader that saw ``base`` look at the changed nodes only (:func:`changed_since`), so that
    what a tick costs follows the runs that reported, not every node that ever ran the site. One step of history
    is kept: a mapping drops its own ``base`` when it is replaced.
    """

    __slots__ = ("base", "changed")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.base: SiteSums | None = None
        self.changed: set[str] = set()

    def successor(self) -> SiteSums:
        """A copy to put the next runs' sums into, whose ``base`` is this mapping."""
        new = SiteSums(self)
        new.base, self.base = self, None
        return new

    def put(self, node: str, sums: Sums | None) -> None:
        """``node``'s sums now (None: gone)."""
        if sums is None:
            self.pop(node, None)
        else:
            self[node] = sums
        self.changed.add(node)


def changed_since(sums: Mapping[str, Sums], seen: Mapping[str, Sums] | None) -> set[str] | None:
    """The nodes whose sums differ between ``seen`` and ``sums`` (removed ones included), when ``sums`` tells
    (``seen`` is its base, or itself); None when only a scan of both would.

    >>> a = SiteSums({"n1": Sums(n=1.0)}); b = a.successor(); b.put("n2", Sums(n=2.0))
    >>> changed_since(b, a), changed_since(b, b), changed_since(b, {}), changed_since({}, a)
    ({'n2'}, set(), None, None)
    """
    if seen is sums:
        return set()
    if isinstance(sums, SiteSums) and seen is not None and sums.base is seen:
        return sums.changed
    return None


class SiteMax:
    """The largest ``key(node, sums)`` over a site's sums (None keys left out), kept as the mapping is replaced:
    from the nodes that changed when the mapping tells them (:func:`changed_since`), else by a scan. A heap whose
    rows of sums replaced since are dropped when they reach the top, so a value costs O(log n) per change instead of
    O(n) per mapping: a site that a thousand nodes ran is not scanned every tick because a few of them reported.

    >>> m = SiteMax(lambda nid, s: s.n)
    >>> a = SiteSums({"n1": Sums(n=1.0), "n2": Sums(n=5.0)}); m.value(a)
    5.0
    >>> b = a.successor(); b.put("n2", Sums(n=2.0)); m.value(b)  # the best fell: the next best surfaces
    2.0
    >>> c = b.successor(); c.put("n2", None); m.value(c), m.value({})
    (1.0, None)
    """

    __slots__ = ("key", "_of", "_heap", "_seq")

    def __init__(self, key: Any) -> None:
        self.key = key
        self._of: Mapping[str, Sums] | None = None
        self._heap: list[tuple[float, int, str, Sums]] = []
        self._seq = 0

    def _row(self, nid: str, s: Sums) -> tuple[float, int, str, Sums] | None:
        k = self.key(nid, s)
        if k is None:
            return None
        self._seq += 1
        return (-k, self._seq, nid, s)

    def value(self, sums: Mapping[str, Sums]) -> float | None:
        changed = changed_since(sums, self._of)
        heap = self._heap
        if changed is None or len(heap) > 2 * len(sums) + 64:  # unknown changes, or mostly stale rows: rebuild
            heap = self._heap = [row for nid, s in sums.items() if (row := self._row(nid, s)) is not None]
            heapq.heapify(heap)
        else:
            for nid in changed:
                s = sums.get(nid)
                if s is not None and (row := self._row(nid, s)) is not None:
                    heapq.heappush(heap, row)
        self._of = sums
        while heap and sums.get(heap[0][2]) is not heap[0][3]:
            heapq.heappop(heap)
        return -heap[0][0] if heap else None
