"""The oracle allocation: dynamic allocation told the truth by the simulated web (experiments only).

:class:`OracleAllocation` is :class:`~scheduler_ext.strategies.allocation.DynamicAllocation` with its one
data-driven step, :meth:`rate`, replaced: instead of the moving estimates the nodes' runs produce, it asks the
simulated web's profile what each node gets from each site *now*. Everything else (exclusion of slow nodes,
late binding with a rate floor, patience) is the dynamic allocation's, so the ``oracle`` configuration of
``scrapy experiment`` is an upper bound on what better estimates alone could buy, not a different algorithm.

Settings: ``SCHEDEXT_ORACLE_URL`` (the simulated web's ``/_truth`` URL; ``LocalCluster.start_simweb`` sets it)
plus every setting :class:`DynamicAllocation` reads. The truth is fetched once, at the first allocation (so the
control may start before the web: ``scrapy experiment`` starts it before the run's clock), and again at most once
a second while the web does not answer, allocating nothing meanwhile (the subtasks wait, none is lost): the
profile is static (phases are a function of elapsed time) and ``started_at`` fixes the phase clock, so nothing
needs to be fetched again. It lives in ``product_crawl`` because only the project knows the simulated web
(scheduler_ext never imports product_crawl).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from product_crawl.simweb.profile import Behaviour, Profile, ProfileError, parse_profile, phase_times
from scheduler_ext.defaults import setting
from scheduler_ext.exceptions import ConfigurationError
from scheduler_ext.models import Subtask
from scheduler_ext.strategies import Estimate, Estimates, NodeView
from scheduler_ext.strategies.allocation import DynamicAllocation

logger = logging.getLogger(__name__)

TRUTH_TIMEOUT = 5.0  # seconds to wait for the truth endpoint (loopback; it answers at once when it runs)


def expected_rate(behaviour: Behaviour) -> tuple[float, float]:
    """(expected results collected per second per offered result, seconds per page) of one behaviour.

    A page is served with probability ``1 - error_rate - block_rate`` and then yields ``share`` of its results;
    it costs the mean latency. Divided by the seconds per page, this ranks nodes as the dynamic allocation's
    ``completion / seconds_per_page`` does, on the same scale.

    >>> from product_crawl.simweb.profile import Latency
    >>> expected_rate(Behaviour(share=0.9, latency=Latency(0.1), error_rate=0.05, block_rate=0.05))
    (8.1, 0.1)
    """
    served = max(0.0, 1.0 - behaviour.error_rate - behaviour.block_rate)
    spp = max(behaviour.latency.mean, 1e-3)
    return round(behaviour.share * served / spp, 9), spp


def fetch_truth(url: str, timeout: float = TRUTH_TIMEOUT) -> tuple[Profile, float]:
    """The profile and start time (Unix seconds) the simulated web at ``url`` (its ``/_truth``) serves.

    Raises :class:`ConfigurationError` naming the URL if it does not answer or answers something else.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = json.loads(response.read().decode("utf-8"))
        raw = dict(data["profile"])
        raw.pop("source", None)  # added by Profile.to_dict, not a profile field
        return parse_profile(raw, f"truth from {url}"), float(data["started_at"])
    # URLError/OSError: nothing answers; ValueError: not JSON (or ProfileError); KeyError/TypeError: wrong shape.
    except (OSError, ValueError, KeyError, TypeError) as exc:
        kind = "an invalid profile" if isinstance(exc, ProfileError) else "no usable truth"
        raise ConfigurationError(f"SCHEDEXT_ORACLE_URL: {url} gave {kind}: {exc}") from exc


class _Truth:
    """The truth at one moment as the figures the dynamic allocation ranks by: a node's completion on a site is
    its expected share of an offered result (served x share), its seconds per page the mean latency (so its rate
    is :func:`expected_rate`'s); no product-specific figures. A site's mapping is made once per phase of the
    profile and set of live nodes (the truth changes only at a phase's start), so the allocation keeps its
    rankings between them: a tick costs what the paper's allocation costs, not the window times the nodes."""

    def __init__(self, profile: Profile, started_at: float) -> None:
        self.profile, self.started_at = profile, started_at
        self.phases = phase_times(profile)
        self._nodes: tuple[tuple[str, str], ...] = ()
        self._key: tuple[int, tuple[tuple[str, str], ...]] = (-1, ())
        self._sites: dict[str, tuple[Any, dict[str, tuple[Estimate, Estimate]]]] = {}

    def at(self, nodes: Sequence[NodeView], now: float) -> _Truth:
        signature = tuple((n.id, n.address or "") for n in nodes)
        if signature != self._nodes:
            self._nodes = signature
        self.elapsed = max(0.0, now - self.started_at)
        key = (bisect.bisect_right(self.phases, self.elapsed), self._nodes)
        if key[0] != self._key[0] or key[1] is not self._key[1]:
            self._key, self._sites = key, {}
        return self

    def site_figures(self, site: str) -> dict[str, tuple[Estimate, Estimate]]:
        kept = self._sites.get(site)
        if kept is None:
            figures = {}
            for nid, address in self._nodes:
                c, spp = expected_rate(self.profile.behaviour(address, site, self.elapsed))
                figures[nid] = (Estimate(c * spp, 1 << 30, math.inf), Estimate(spp, 1 << 30, math.inf))
            kept = self._sites[site] = (self._key, figures)
        return kept[1]

    def group_figures(self, group: str, site: str) -> dict[str, Estimate]:
        return {}


class OracleAllocation(DynamicAllocation):
    """Dynamic allocation whose rates come from the simulated web's profile, so it never explores.

    ``profile`` and ``started_at`` (Unix seconds, the simulated web's phase clock origin) are the truth; the
    keyword arguments are :class:`DynamicAllocation`'s.
    """

    def __init__(self, profile: Profile | None, started_at: float = 0.0, *, truth_url: str = "",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profile, self.started_at, self.truth_url = profile, started_at, truth_url
        self._asked_at = -math.inf
        self._truth: _Truth | None = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> OracleAllocation:
        url = setting(crawler.settings, "SCHEDEXT_ORACLE_URL")
        if not url:
            raise ConfigurationError("SCHEDEXT_ORACLE_URL is not set: the oracle allocation needs the "
                                     "simulated web's /_truth URL")
        base = DynamicAllocation.from_crawler(crawler)
        return cls(None, truth_url=str(url), explore_runs=base.explore_runs, stale_after=base.stale_after,
                   slow_factor=base.slow_factor, rate_floor=base.rate_floor, patience=base.patience,
                   explore_timeout=base.explore_timeout)

    def _has_truth(self) -> bool:
        """Whether the truth is known, fetching it if it is not (at most once a second)."""
        if self.profile is not None:
            return True
        now = time.monotonic()
        if now - self._asked_at < 1.0:
            return False
        self._asked_at = now
        try:
            self.profile, self.started_at = fetch_truth(self.truth_url, timeout=1.0)
        except ConfigurationError as exc:
            logger.warning("oracle allocation: %s; nothing is allocated until the web answers", exc)
            return False
        logger.info("oracle allocation: profile %r from %s, phase clock started at %.3f", self.profile.name,
                    self.truth_url, self.started_at)
        return True

    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                 now: float) -> list[tuple[Subtask, str]]:
        if not self._has_truth():
            return []
        assert self.profile is not None
        if self._truth is None or self._truth.profile is not self.profile:
            self._truth = _Truth(self.profile, self.started_at)
        return self.allocate_ranked(subtasks, nodes, self._truth.at(nodes, now), now)

    def rate(self, subtask: Subtask, node: NodeView, estimates: Estimates, now: float) -> tuple[float, float]:
        """The true (results per second, seconds per page) of ``node`` on ``subtask``'s site at ``now``.

        ``now`` is Redis server time and ``started_at`` the simulated web's wall clock, both Unix seconds on
        the same machine, so their difference is the web's elapsed time.
        """
        assert self.profile is not None, "rate() before the truth was fetched"
        behaviour = self.profile.behaviour(node.address or "", subtask.site, max(0.0, now - self.started_at))
        return expected_rate(behaviour)
