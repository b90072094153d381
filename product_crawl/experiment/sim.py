"""``scrapy experiment --sim``: the same configurations on the cluster simulator instead of real processes.

The simulator (:mod:`scheduler_ext.sim`) is told the truth through :class:`ProfileWorld`, a view of the
simulated web's profile; each configuration's strategies are built from the same settings as for a real run (so
the same ``from_crawler`` code reads them), and the run's raw record has the shape of a real run's, so
:func:`~product_crawl.experiment.summary.summarize` and the report are computed by the same code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from product_crawl.experiment.runner import (
    CLUSTER_SETTINGS,
    CONFIGURATIONS,
    PRODUCTS,
    Options,
    Progress,
    corpus_totals,
    phase_times,
)
from product_crawl.oracle import OracleAllocation
from product_crawl.simweb.profile import Profile
from scheduler_ext.config import Config
from scheduler_ext.sim import Behaviour, NodeModel, SimNode, Simulation, TaskSpec
from scheduler_ext.sim import bound as bound_module
from scheduler_ext.sim.bound import SiteWork
from scheduler_ext.strategies import load_strategy
from scheduler_ext.strategies.allocation import DynamicAllocation

ORACLE = "product_crawl.oracle.OracleAllocation"


class ProfileWorld:
    """The simulated web's profile as the simulator's :class:`~scheduler_ext.sim.World` (node id -> address)."""

    def __init__(self, profile: Profile, addresses: dict[str, str]) -> None:
        self.profile, self.addresses = profile, addresses
        self._cache: dict[tuple[str, str, int], Behaviour] = {}
        self._changes = phase_times(profile)

    def behaviour(self, node: str, site: str, t: float) -> Behaviour:
        phase = sum(1 for c in self._changes if c <= t)
        key = (node, site, phase)
        b = self._cache.get(key)
        if b is None:
            p = self.profile.behaviour(self.addresses.get(node, node), site, t)
            b = self._cache[key] = Behaviour(p.share, p.latency.mean, p.latency.spread, p.error_rate, p.block_rate)
        return b

    def changes(self) -> list[float]:
        return list(self._changes)


def build_strategies(settings: dict[str, Any], profile: Profile) -> tuple[Any, Any, Any, Config]:
    """(allocation, modification, recall, config) of a configuration, built as the control builds them."""
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(settings_dict=settings)
    config = Config.from_settings(crawler.settings)
    if settings.get("SCHEDEXT_ALLOCATION") == ORACLE:
        # The oracle reads the truth over HTTP in a real run; here it is given the profile, with time 0 as start.
        base = DynamicAllocation.from_crawler(crawler)
        allocation: Any = OracleAllocation(profile, 0.0, explore_runs=base.explore_runs, stale_after=base.stale_after,
                                           slow_factor=base.slow_factor, rate_floor=base.rate_floor,
                                           patience=base.patience, explore_timeout=base.explore_timeout)
    else:
        allocation = load_strategy(crawler, "SCHEDEXT_ALLOCATION")
    return (allocation, load_strategy(crawler, "SCHEDEXT_MODIFICATION"), load_strategy(crawler, "SCHEDEXT_RECALL"),
            config)


def task_specs(opts: Options) -> Iterator[TaskSpec]:
    """The paper's products on every site, in the order the splitter makes them, with the web's result counts."""
    totals = corpus_totals(opts.profile, opts.sites, opts.seed)
    for product in PRODUCTS:
        for site in opts.sites:
            yield TaskSpec(product["name"], site, totals[product["name"]][site])


def simulate_configuration(name: str, opts: Options, *, model: NodeModel | None = None, seed: int | None = None,
                           progress: Progress | None = None, label: str = "") -> dict[str, Any]:
    """Run configuration ``name`` on the simulator; the raw record of a run (as ``run_configuration`` returns).

    ``seed`` (default ``opts.seed``) seeds the simulation's draws and the bandit's."""
    seed = opts.seed if seed is None else seed
    settings = {**CLUSTER_SETTINGS, **CONFIGURATIONS[name][1], **opts.overrides}
    # The bandit's draws follow the run's seed, so that a simulated run is reproducible.
    allocation, modification, recall, config = build_strategies({"SCHEDEXT_BANDIT_SEED": seed, **settings},
                                                                opts.profile)
    nodes = [SimNode(n.id, tuple(int(t) for t in str(n.types).split(",")), prefetch=config.prefetch,
                     address=n.address) for n in opts.nodes]
    world = ProfileWorld(opts.profile, {n.id: n.address for n in opts.nodes})
    sim = Simulation(world, nodes, task_specs(opts), allocation=allocation, modification=modification,
                     recall=recall, duration=opts.duration, tick=config.tick_interval,
                     page_limit=config.page_limit, time_limit=config.time_limit, alpha=config.estimate_alpha,
                     recall_age=config.recall_age, model=model, sample_interval=opts.sample_interval,
                     seed=seed, pair_samples=len(nodes) * len(opts.sites) <= 10_000)
    started = time.monotonic()
    raw = sim.run()
    if progress is not None:
        progress.done(f"[{label or name}] simulated {opts.duration:.0f} s in {time.monotonic() - started:.1f} s: "
                      f"{raw['samples'][-1]['items']} unique items")
    return {"name": name, "settings": settings, **raw, "truth_corpus": [], "simulated": True}


def best_possible(opts: Options, totals: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The best possible unique items of a run of ``opts`` (:func:`scheduler_ext.sim.bound.best_possible`): the
    profile's true rates over time, the experiment's nodes and tasks, every node and the web and MongoDB on this
    machine (:data:`~scheduler_ext.sim.bound.MACHINE`: the CPU the cheapest crawler needs here, measured). A
    simulated run of the experiment gets the same bound as a real one, so that their ratios compare."""
    world = ProfileWorld(opts.profile, {n.id: n.address for n in opts.nodes})
    nodes = [SimNode(n.id, tuple(int(t) for t in str(n.types).split(",")), address=n.address) for n in opts.nodes]
    work = {site: SiteWork(0, sum(1 for p in totals if site in totals[p]),
                           sum(totals[p].get(site, 0) for p in totals)) for site in opts.sites}
    model, machine = bound_module.MACHINE_NODE, bound_module.MACHINE
    bound = bound_module.best_possible(world, nodes, work, opts.duration, model, machine)
    bound.pop("assignments")
    return {**bound, "model": {"concurrency": model.concurrency, "node_page_cpu": model.page_cpu,
                               "node_item_cpu": model.item_cpu, "cores": machine.cores,
                               "machine_page_cpu": machine.page_cpu, "machine_item_cpu": machine.item_cpu,
                               "source": "benchmarks/results/bench_machine.json"}}
