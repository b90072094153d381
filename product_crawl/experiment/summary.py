"""From raw runs to the experiment's metrics: the content of ``summary.json`` (schema in docs/experiment.md).

Pure functions of the records :func:`~product_crawl.experiment.runner.run_configuration` returns, so the metrics
can be recomputed and tested without running a cluster.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from product_crawl.experiment.runner import (
    ABLATIONS,
    CLUSTER_SETTINGS,
    CONFIGURATIONS,
    WINDOW,
    Options,
    expected_completion,
)
from product_crawl.simweb.profile import Profile, phase_times

SUMMARY_VERSION = 1
GOAL_VS_SHARED = 1.5  # dynamic must collect at least this many times shared's unique items
GOAL_VS_SCRAPY_REDIS = 1.5  # ... and this many times what scrapy-redis itself collects (issue 9)
GOAL_VS_ORACLE = 0.95  # ... and at least this share of what the oracle collects
GOAL_SUITED = 0.8  # ... and each node must spend at least this share of its late pages on sites it suits
GOAL_VS_BEST = 0.8  # ... and at least this share of the best possible (the computed upper bound)
MAX_PER_QUERY = 10_000  # queries up to which summary.json lists the result count of each (more: only the total)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def windowed(samples: Sequence[dict[str, Any]], pair: str, window: float = WINDOW) -> list[list[float]]:
    """[[t, collected / offered over the last ``window`` seconds], ...] of one ``node|site`` pair; a time at
    which the pair was offered nothing in its window has no point.

    >>> s = [{"t": 0, "pairs": {}}, {"t": 5, "pairs": {"n|a": [10, 9, 1, 1, 0.9]}},
    ...      {"t": 10, "pairs": {"n|a": [30, 11, 3, 3, 0.5]}}, {"t": 30, "pairs": {"n|a": [30, 11, 3, 3, 0.5]}}]
    >>> windowed(s, "n|a", 5)
    [[5, 0.9], [10, 0.1]]
    """
    out: list[list[float]] = []
    i = -1  # index of the base: the last sample at least ``window`` seconds older (none: the counts start at zero)
    for s in samples:
        while i + 1 < len(samples) and samples[i + 1]["t"] <= s["t"] - window:
            i += 1
        start = samples[i]["pairs"].get(pair, [0, 0]) if i >= 0 else [0, 0]
        now = s["pairs"].get(pair, [0, 0])
        offered, collected = now[0] - start[0], now[1] - start[1]
        if offered > 0:
            out.append([s["t"], round(collected / offered, 4)])
    return out


def _at(samples: Sequence[dict[str, Any]], t: float) -> dict[str, Any]:
    """The last sample taken at or before ``t`` (the first one if none)."""
    best = samples[0]
    for s in samples:
        if s["t"] <= t:
            best = s
    return best


class Suited:
    """:func:`~product_crawl.experiment.runner.suited_sites` for many nodes and times: the truth changes only at
    the profile's phases, so the best completion of each site is computed once per phase, and each node's suited
    sites once per phase (not once per node and sample: quadratic in the nodes)."""

    def __init__(self, profile: Profile, sites: Sequence[str], floor: float = 0.5) -> None:
        self.profile, self.sites, self.floor = profile, list(sites), floor
        self.changes = phase_times(profile)
        self._best: dict[int, dict[str, float]] = {}
        self._sites: dict[tuple[str, int], list[str]] = {}

    def __call__(self, address: str, elapsed: float) -> list[str]:
        phase = bisect.bisect_right(self.changes, elapsed)
        key = (address, phase)
        if key not in self._sites:
            at = self.changes[phase - 1] if phase else 0.0
            best = self._best.get(phase)
            if best is None:
                best = self._best[phase] = {s: max((expected_completion(self.profile, a, s, at)
                                                    for a in self.profile.nodes), default=0.0) for s in self.sites}
            self._sites[key] = [s for s in self.sites if best[s] > 0 and
                                expected_completion(self.profile, address, s, at) >= self.floor * best[s]]
        return self._sites[key]


def summarize_run(raw: dict[str, Any], opts: Options, corpus_total: int, suited: Suited | None = None
                  ) -> dict[str, Any]:
    """The ``runs.<configuration>`` entry of the summary from one raw run record."""
    samples = raw["samples"]
    final = samples[-1]
    node_ids = [n.id for n in opts.nodes]
    address = {n.id: n.address for n in opts.nodes}
    pairs = {(p.split("|", 1)[0], p.split("|", 1)[1]) for s in samples for p in s["pairs"]}
    counts = {n["id"]: n["counts"] for n in raw["status"].get("nodes", [])}
    web = raw.get("web", {}).get("by_address", {})
    # Late pages: those crawled in the second half of the run, after the estimates had time to settle; each
    # interval's pages are judged by what the node suited during that interval (phases change the truth).
    late_samples = [s for s in samples if s["t"] >= opts.duration / 2]
    suited = suited or Suited(opts.profile, opts.sites)
    late: dict[str, dict[str, int]] = {n: {} for n in node_ids}
    late_suited = dict.fromkeys(node_ids, 0)
    prev = _at(samples, opts.duration / 2)
    for cur in late_samples:  # the pairs that crawled in each interval (a pair's pages only grow)
        for key, v in cur["pairs"].items():
            pages = v[3] - prev["pairs"].get(key, [0, 0, 0, 0])[3]
            nid, site = key.split("|", 1)
            if pages and nid in late:
                late[nid][site] = late[nid].get(site, 0) + pages
                late_suited[nid] += pages if site in suited(address[nid], cur["t"]) else 0
        prev = cur
    nodes: dict[str, Any] = {}
    for nid in node_ids:
        per_site = {site: final["pairs"].get(f"{nid}|{site}", [0, 0, 0, 0, None]) for site in opts.sites}
        late_total = sum(late[nid].values())
        c = counts.get(nid, {})
        served = web.get(address[nid], {})
        nodes[nid] = {
            "address": address[nid],
            "label": opts.profile.label(address[nid]),
            "items": int(raw["items_by_node"].get(nid, 0)),
            **{k: int(c.get(k, 0)) for k in ("moved_out", "moved_in", "modified", "recalled", "dead")},
            "runs": sum(v[2] for v in per_site.values()),
            "pages": sum(v[3] for v in per_site.values()),
            "offered": sum(v[0] for v in per_site.values()),
            "collected": sum(v[1] for v in per_site.values()),
            "requests": int(served.get("requests", 0)),
            "errors": int(served.get("error", 0)),
            "blocked": int(served.get("blocked", 0)),
            "suited_sites": suited(address[nid], opts.duration),
            "late_pages": {s: late[nid][s] for s in opts.sites if late[nid].get(s)},
            "suited_share": None if not late_total else round(late_suited[nid] / late_total, 4),
        }
    offered = sum(n["offered"] for n in nodes.values())
    collected = sum(n["collected"] for n in nodes.values())
    unique = int(final["items"])
    return {
        "description": CONFIGURATIONS[raw["name"]][0],
        "settings": raw["settings"],
        "unique_items": unique,
        "completion": round(unique / corpus_total, 6) if corpus_total else None,
        "served_share": round(collected / offered, 4) if offered else None,
        "items_per_second": round(unique / opts.duration, 3),
        "tasks": {"total": final["tasks"], "done": final["tasks_done"]},
        "exhausted": bool(final["tasks"]) and final["tasks_done"] >= final["tasks"],
        # when the last task was done: on an exhausted corpus the unique items only say how well it was served,
        # this says how fast
        "exhausted_at": next((float(x["t"]) for x in samples if x.get("tasks") and x["tasks_done"] >= x["tasks"]),
                             None),
        "nodes": nodes,
        "items_over_time": [[s["t"], s["items"]] for s in samples],
        "completion_over_time": {n: {site: windowed(samples, f"{n}|{site}") for site in opts.sites
                                     if (n, site) in pairs} for n in node_ids},
        "estimate_over_time": {n: {site: [[s["t"], s["pairs"][f"{n}|{site}"][4]] for s in samples
                                          if s["pairs"].get(f"{n}|{site}", [None] * 5)[4] is not None]
                                   for site in opts.sites if (n, site) in pairs} for n in node_ids},
        "final_completion": {n: {site: {"offered": v[0], "collected": v[1], "runs": v[2], "pages": v[3],
                                        "estimate": v[4], "pace": v[5]}
                                 for site in opts.sites if (v := final["pairs"].get(f"{n}|{site}"))}
                             for n in node_ids},
    }


def gains(runs: dict[str, dict[str, Any]], node_ids: Sequence[str]) -> dict[str, Any]:
    """Per-node efficiency gains (Figure 5), each relative to the node's items without what is measured.

    ``over_shared``: items(dynamic) / items(shared) - 1. ``strategies.<s>``: items(dynamic) /
    items(dynamic with strategy s at its baseline) - 1, so the gain is attributed to s. Missing runs: absent.
    """
    def rel(a: str, b: str) -> dict[str, float | None]:
        return {n: (None if not runs[b]["nodes"][n]["items"] else
                    round(runs[a]["nodes"][n]["items"] / runs[b]["nodes"][n]["items"] - 1, 4)) for n in node_ids}

    out: dict[str, Any] = {}
    if "dynamic" in runs and "shared" in runs:
        out["over_shared"] = rel("dynamic", "shared")
    strategies = {s: rel("dynamic", c) for s, c in ABLATIONS.items() if "dynamic" in runs and c in runs}
    if strategies:
        out["strategies"] = strategies
    return out


def quantiles(values: Sequence[float]) -> dict[str, float] | None:
    """min, 10th percentile, median, 90th percentile and max of ``values`` (nearest rank).

    >>> quantiles([3, 1, 2, 5, 4])
    {'min': 1, 'p10': 1, 'median': 3, 'p90': 5, 'max': 5, 'n': 5}
    """
    v = sorted(values)
    if not v:
        return None
    at = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {"min": v[0], "p10": at(0.1), "median": at(0.5), "p90": at(0.9), "max": v[-1], "n": len(v)}


def first_use(raw: dict[str, Any], node: str, site: str, since: float) -> float | None:
    """When a run first used the pair ``node|site`` at or after ``since``: a simulated run's first run start
    (``first_use``); a real run's first sample in which the pair has finished more runs than at ``since`` (so up to
    a sample interval and a run late: an upper bound). None if it never did."""
    key = f"{node}|{site}"
    if "first_use" in raw:
        return next((t for t in raw["first_use"].get(key, []) if t >= since), None)
    before = 0
    for sample in raw.get("samples", []):
        runs = sample.get("pairs", {}).get(key, [0, 0, 0])[2]
        if sample["t"] <= since:
            before = runs
        elif runs > before:
            return float(sample["t"])
    return None


def last_runs(raw: dict[str, Any]) -> dict[str, float]:
    """Site -> when any node last ran it: a simulated run's last run start (``first_use``), a real run's last sample
    in which one of the site's pairs had finished a run more than in the sample before."""
    last: dict[str, float] = {}
    if "first_use" in raw:
        for key, starts in raw["first_use"].items():
            if starts:
                site = key.split("|", 1)[1]
                last[site] = max(last.get(site, 0.0), max(starts))
        return last
    before: dict[str, int] = {}
    for sample in raw.get("samples", []):
        for key, counts in sample.get("pairs", {}).items():
            if counts[2] > before.get(key, 0):
                site = key.split("|", 1)[1]
                last[site] = max(last.get(site, 0.0), float(sample["t"]))
            before[key] = counts[2]
    return last


def good_pairs(raws: dict[str, dict[str, Any]], pairs: list[tuple[str, str, float, bool]],
               duration: float) -> dict[str, Any]:
    """The pairs that turn good and the best schedule then crawls (``turned_good`` of
    :func:`scheduler_ext.sim.bound.best_possible`: node, site, when, clearly better for its node) and, per
    configuration, the seconds from each one's turning good to its first use (None: not in the run), with their
    quantiles over all pairs and over the clearly better ones. A pair never used waited as long as its site had work
    in that run: until the last run any node ran there (the run's end if that was the end); a pair that turned good
    after its site's last run (the configuration had done the site's work, or given it up) is left out of the
    quantiles and counted (``after_their_sites_work``), as ``benchmarks/bench_quality.py`` counts it. Reported, not
    a goal: the best schedule picks one pair among near-ties, and on a profile with few tasks a site (the paper's
    four products) it picks pairs even the oracle never uses."""
    delays: dict[str, list[float | None]] = {}
    stats: dict[str, Any] = {}
    for name, raw in raws.items():
        if not raw.get("first_use") and not any("pairs" in x for x in raw.get("samples", [])[:1]):
            continue  # nothing kept per pair: scrapy-redis (no control), or a simulation too large to keep pairs
        found = [first_use(raw, node, site, since) for node, site, since, _ in pairs]
        delays[name] = [None if t is None else round(t - p[2], 2) for t, p in zip(found, pairs, strict=True)]
        last = last_runs(raw)
        waited: list[tuple[float, bool]] = []  # (delay, clear), the pairs whose site still had work
        for d, (_, site, since, clear) in zip(delays[name], pairs, strict=True):
            if d is not None:
                waited.append((d, clear))
            elif last.get(site, -1.0) >= since:
                waited.append((round(min(duration, last[site]) - since, 2), clear))
        stats[name] = {"all": quantiles([d for d, _ in waited]), "clear": quantiles([d for d, c in waited if c]),
                       "never": sum(d is None for d in delays[name]),
                       "after_their_sites_work": len(pairs) - len(waited)}
    return {"pairs": [list(p) for p in pairs], "delays": delays, "stats": stats}


def distribution(repeats: dict[str, list[int]], best: int) -> dict[str, Any]:
    """Per configuration, over the simulated seeds: unique items, and ratios to the best possible and to
    ``shared`` and ``oracle`` of the same seed."""
    out: dict[str, Any] = {}
    for name, items in repeats.items():
        entry: dict[str, Any] = {"unique_items": quantiles(items),
                                 "vs_best": quantiles([round(i / best, 4) for i in items]) if best else None}
        for other in ("shared", "oracle", "paper"):
            if other in repeats and other != name:
                entry[f"vs_{other}"] = quantiles([round(a / b, 4) for a, b in zip(items, repeats[other], strict=False)
                                                  if b])
        out[name] = entry
    return out


def summarize(raws: dict[str, dict[str, Any]], opts: Options, totals: dict[str, dict[str, int]],
              repeats: dict[str, list[int]] | None = None, machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole ``summary.json`` object (``repeats``: unique items per simulated seed, per configuration;
    ``machine``: the machine measured before a real run's configurations, see :func:`.sim.best_possible`)."""
    from product_crawl.experiment.sim import best_possible

    corpus_total = sum(v for per_site in totals.values() for v in per_site.values())
    suited = Suited(opts.profile, opts.sites)
    runs = {name: summarize_run(raw, opts, corpus_total, suited) for name, raw in raws.items()}
    best = best_possible(opts, totals, machine=machine)
    adoption = good_pairs(raws, best.pop("turned_good"), opts.duration)
    for run in runs.values():
        run["vs_best"] = _ratio(run["unique_items"], best["items"])
    items = {name: r["unique_items"] for name, r in runs.items()}
    vs_shared = _ratio(items.get("dynamic"), items.get("shared"))
    vs_oracle = _ratio(items.get("dynamic"), items.get("oracle"))
    vs_scrapy_redis = _ratio(items.get("dynamic"), items.get("scrapy_redis"))
    vs_best = _ratio(items.get("dynamic"), best["items"])
    suited = [n["suited_share"] for n in runs["dynamic"]["nodes"].values()] if "dynamic" in runs else []
    converged = None if not suited or None in suited else all(v >= GOAL_SUITED for v in suited)
    return {
        "v": SUMMARY_VERSION,
        "profile": {"name": opts.profile.name, "source": opts.profile.source, "phases": phase_times(opts.profile)},
        "seed": opts.seed,
        "duration": opts.duration,
        "sample_interval": opts.sample_interval,
        "configurations": list(raws),
        "nodes": {n.id: {"address": n.address, "label": opts.profile.label(n.address)} for n in opts.nodes},
        "sites": opts.sites,
        "products": list(totals),
        "corpus": {"total": corpus_total, "queries": len(totals) * len(opts.sites),
                   "per_query": totals if len(totals) * len(opts.sites) <= MAX_PER_QUERY else None},
        "settings": {**CLUSTER_SETTINGS, **opts.overrides},
        "runs": runs,
        "simulated": opts.sim,
        "best_possible": best,
        "ratios": {"dynamic_vs_shared": vs_shared, "dynamic_vs_scrapy_redis": vs_scrapy_redis,
                   "dynamic_vs_oracle": vs_oracle, "dynamic_vs_best": vs_best,
                   "oracle_vs_best": _ratio(items.get("oracle"), best["items"])},
        "distribution": distribution(repeats, best["items"]) if repeats and opts.repeat > 1 else None,
        "good_pairs": adoption,
        "goals": {
            f"dynamic_vs_shared>={GOAL_VS_SHARED}": None if vs_shared is None else vs_shared >= GOAL_VS_SHARED,
            f"dynamic_vs_scrapy_redis>={GOAL_VS_SCRAPY_REDIS}":
                None if vs_scrapy_redis is None else vs_scrapy_redis >= GOAL_VS_SCRAPY_REDIS,
            f"dynamic_vs_oracle>={GOAL_VS_ORACLE}": None if vs_oracle is None else vs_oracle >= GOAL_VS_ORACLE,
            f"dynamic_suited_share>={GOAL_SUITED}": converged,
            f"dynamic_vs_best>={GOAL_VS_BEST}": None if vs_best is None else vs_best >= GOAL_VS_BEST,
        },
        "gains": gains(runs, [n.id for n in opts.nodes]),
    }
