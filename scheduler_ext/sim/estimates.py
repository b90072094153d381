"""The estimate hashes of the finish script, in memory: the same updates as ``lua/finish.lua``.

``est:site:<site>`` becomes ``sites[site][node]`` and ``est:gs:<product>|<site>`` becomes ``groups[(product,
site)][node]``; each entry holds the paper's moving estimates (``c``, ``spp``, ``runs``, ``last``) and the bandit's
sums (:func:`scheduler_ext.strategies.posterior.update_sums`). tests/test_sim.py checks the two agree with the Lua on
a real Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from ..strategies import Estimate
from ..strategies.posterior import GROUP_NODES, SiteSums, Sums, update_sums

_NO_SUMS: Mapping[str, Sums] = MappingProxyType({})  # a site nobody ran


@dataclass(frozen=True)
class Entry:
    c: float | None = None
    spp: float | None = None
    runs: int = 0
    last: float = 0.0
    sums: Sums | None = None


def _ewma(old: float | None, x: float, alpha: float) -> float:
    return x if old is None else old + alpha * (x - old)


def updated(e: Entry | None, *, offered: int, collected: int, pages: int, seconds: float, ok: bool, alpha: float,
            now: float, with_completion: bool, attempted: int | None = None, fail_cost: float = 0.0,
            blocked: int = 0, node_seconds: float | None = None) -> Entry:
    """The entry after one finished run, as ``finish.lua`` computes it (``attempted``: ``Report.charged``, by
    default the pages plus the one that failed the run, as ``Store.finish``; ``fail_cost``: see
    :func:`~scheduler_ext.strategies.posterior.update_sums`)."""
    e = e or Entry()
    c = e.c
    if with_completion:
        if offered > 0:
            c = _ewma(c, collected / offered, alpha)
        elif not ok:
            c = _ewma(c, 0.0, alpha)
    spp = _ewma(e.spp, seconds / pages, alpha) if ok and pages > 0 else e.spp
    failed = (0 if ok else 1) if attempted is None else attempted - pages
    sums = update_sums(e.sums, pages_done=pages, failed_pages=failed, offered=offered, collected=collected,
                       seconds=seconds, alpha=alpha, now=now, failed=not ok, fail_cost=fail_cost,
                       error_pages=failed - blocked, node_seconds=node_seconds)
    return replace(e, c=c, spp=spp, runs=e.runs + 1, last=now, sums=sums)


class MemoryEstimates:
    """The Estimates protocol (and the bandit's sums) over in-memory estimate entries."""

    def __init__(self, alpha: float = 0.3, fail_cost: float = 0.0) -> None:
        self.alpha = alpha
        self.fail_cost = fail_cost  # seconds a failed run costs its task beyond its own (the recall: 1.5 ticks)
        self.sites: dict[str, dict[str, Entry]] = {}
        self.groups: dict[tuple[str, str], dict[str, Entry]] = {}
        self._site_sums: dict[str, SiteSums] = {}
        self._group_sums: dict[tuple[str, str], dict[str, Sums]] = {}
        self._copied: set[str] = set()  # sites whose sums are a new mapping since the last read()

    def finish(self, *, site: str, group: str, node: str, offered: int, collected: int, pages: int,
               seconds: float, ok: bool, now: float, attempted: int | None = None, blocked: int = 0,
               node_seconds: float | None = None) -> None:
        def update(entries: dict[str, Entry], with_completion: bool) -> Sums:
            e = entries[node] = updated(entries.get(node), offered=offered, collected=collected, pages=pages,
                                        seconds=seconds, ok=ok, alpha=self.alpha, now=now,
                                        with_completion=with_completion, attempted=attempted,
                                        fail_cost=self.fail_cost, blocked=blocked, node_seconds=node_seconds)
            assert e.sums is not None  # updated() always sets them
            return e.sums

        # Copy on write, as the control's cache does at each tick's refresh: a site's sums are a new mapping once
        # a run finished there since the last read, which is how allocation knows to re-rank the site's nodes
        # (the nodes that changed only: SiteSums).
        if site in self._copied:
            site_sums = self._site_sums[site]
        else:
            old = self._site_sums.get(site)
            site_sums = self._site_sums[site] = SiteSums() if old is None else old.successor()
            self._copied.add(site)
        site_sums.put(node, update(self.sites.setdefault(site, {}), True))
        entries, sums = self.groups.setdefault((group, site), {}), self._group_sums.setdefault((group, site), {})
        sums[node] = update(entries, False)
        if len(entries) > GROUP_NODES:  # the product's figures of the node that ran it least recently go
            oldest = min((e.last, n) for n, e in entries.items() if n != node)[1]
            del entries[oldest]
            sums.pop(oldest, None)

    def forget_group(self, group: str, site: str) -> None:
        """Drop the (product, site) figures (the simulator: the product's task on the site is done)."""
        self.groups.pop((group, site), None)
        self._group_sums.pop((group, site), None)

    def read(self) -> None:
        """A control reads the estimates (a tick starts): later runs copy the sums they change again."""
        self._copied.clear()

    # --- the Estimates protocol -------------------------------------------------------------------------------------
    def completion(self, site: str, node: str) -> Estimate | None:
        e = self.sites.get(site, {}).get(node)
        return None if e is None or e.c is None else Estimate(e.c, e.runs, e.last)

    def seconds_per_page(self, group: str, site: str, node: str) -> Estimate | None:
        g = self.groups.get((group, site), {}).get(node)
        if g is not None and g.spp is not None:
            return Estimate(g.spp, g.runs, g.last)
        e = self.sites.get(site, {}).get(node)
        return None if e is None or e.spp is None else Estimate(e.spp, e.runs, e.last)

    def site_sums(self, site: str) -> Mapping[str, Sums]:
        return self._site_sums.get(site, _NO_SUMS)

    def group_sums(self, group: str, site: str) -> dict[str, Sums]:
        return self._group_sums.get((group, site), {})
