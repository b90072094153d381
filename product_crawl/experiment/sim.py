"""``scrapy experiment --sim``: the same configurations on the cluster simulator instead of real processes.

The simulator (:mod:`scheduler_ext.sim`) is told the truth through :class:`ProfileWorld`, a view of the
simulated web's profile (a built-in one, a file, or a world of :mod:`scheduler_ext.sim.families` written as a profile
by :func:`generated_profile`); each configuration's strategies are built from the same settings as for a real run (so
the same ``from_crawler`` code reads them), and the run's raw record has the shape of a real run's, so
:func:`~product_crawl.experiment.summary.summarize` and the report are computed by the same code.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import multiprocessing
import os
import queue as queue_module
import time
import traceback
from collections.abc import Iterator
from typing import Any

from scrapy.settings import Settings

from product_crawl.experiment.machine import machine_processes
from product_crawl.experiment.runner import (
    CLUSTER_SETTINGS,
    CONFIGURATIONS,
    ExperimentError,
    Options,
    Progress,
    corpus_totals,
)
from product_crawl.oracle import OracleAllocation
from product_crawl.services import die_with
from product_crawl.simweb.profile import Profile, Rule, parse_profile, phase_times
from scheduler_ext.config import Config
from scheduler_ext.sim import Behaviour, NodeModel, SimNode, Simulation, TaskSpec
from scheduler_ext.sim import bound as bound_module
from scheduler_ext.sim.bound import SiteWork
from scheduler_ext.sim.families import FAMILIES, generate
from scheduler_ext.strategies import load_strategy
from scheduler_ext.strategies.allocation import DynamicAllocation

ORACLE = "product_crawl.oracle.OracleAllocation"
#: The families a generated profile can be drawn from: all but ``churn`` (a profile has no joining or leaving nodes).
PROFILE_FAMILIES = tuple(f for f in FAMILIES if f != "churn")
GENERATED_CORPUS = {"min": 3000, "max": 30000}  # results per query, as benchmarks/bench_quality.py draws them


def generated_profile(family: str, *, nodes: int, sites: int, duration: float, seed: int) -> Profile:
    """A world of :func:`scheduler_ext.sim.families.generate` as a simulated-web profile: node ``i`` (``n<i>``) at
    loopback address 127.0.0.(2 + i) onwards, sites ``s<j>.example``, each (node, site) pair with its behaviour
    and its changes as phases (their times rounded to the second, so that a world has few distinct phases)."""
    world = generate(family, nodes=nodes, sites=sites, duration=duration, seed=seed)

    def fields(b: Behaviour) -> dict[str, Any]:
        return {"share": round(b.share, 4), "latency": {"mean": round(b.latency, 4), "spread": round(b.spread, 4)},
                "error_rate": round(b.error_rate, 4), "block_rate": round(b.block_rate, 4)}

    base = int(ipaddress.IPv4Address("127.0.0.2"))
    raw_nodes: dict[str, Any] = {}
    for i, node in enumerate(world.nodes):
        per_site = {}
        for site in world.sites:
            (_, first), *later = world.pairs.get((node.id, site)) or [(0.0, world.default)]
            per_site[site] = {**fields(first), "phases": [{"after": float(round(t)), **fields(b)} for t, b in later]}
        raw_nodes[str(ipaddress.IPv4Address(base + i))] = {"label": node.id, "sites": per_site}
    raw = {"name": f"generated:{family}", "description": f"scheduler_ext.sim.families {family!r}, seed {seed}",
           "corpus": GENERATED_CORPUS, "default": fields(world.default), "nodes": raw_nodes}
    return parse_profile(raw, f"generated profile {family!r} (seed {seed}, {nodes} nodes x {sites} sites)")


class ProfileWorld:
    """The simulated web's profile as the simulator's :class:`~scheduler_ext.sim.World` (node id -> address).

    Each (node, site) pair's behaviour is resolved once per phase of its own rules (default, node, node and site)
    and found by bisection, so a large generated profile costs what its pairs change, not every phase of the
    world."""

    def __init__(self, profile: Profile, addresses: dict[str, str]) -> None:
        self.profile, self.addresses = profile, addresses
        self._steps: dict[tuple[str, str], tuple[list[float], list[Behaviour]]] = {}
        self._changes = phase_times(profile)

    def behaviour(self, node: str, site: str, t: float) -> Behaviour:
        steps = self._steps.get((node, site))
        if steps is None:
            steps = self._steps[(node, site)] = self._resolve(self.addresses.get(node, node), site)
        times, behaviours = steps
        return behaviours[max(0, bisect.bisect_right(times, t) - 1)]

    def _resolve(self, address: str, site: str) -> tuple[list[float], list[Behaviour]]:
        p = self.profile
        entry = p.nodes.get(address)
        rules: list[Rule] = [p.default]
        if entry is not None:
            rules += [entry.rule, *([entry.sites[site.lower()]] if site.lower() in entry.sites else [])]
        times = sorted({0.0, *(ph.after for r in rules for ph in r.phases)})
        out = []
        for t in times:
            b = p.behaviour(address, site, t)
            out.append(Behaviour(b.share, b.latency.mean, b.latency.spread, b.error_rate, b.block_rate))
        return times, out

    def changes(self) -> list[float]:
        return list(self._changes)


_WORLDS: dict[int, tuple[Options, ProfileWorld]] = {}


def profile_world(opts: Options) -> ProfileWorld:
    """The :class:`ProfileWorld` of ``opts``, made once per experiment (a large profile resolves its pairs as
    asked: the runs and the bound of one experiment share what was resolved)."""
    hit = _WORLDS.get(id(opts))
    if hit is None or hit[0] is not opts:
        _WORLDS.clear()
        hit = _WORLDS[id(opts)] = (opts, ProfileWorld(opts.profile, {n.id: n.address for n in opts.nodes}))
    return hit[1]


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


def task_specs(opts: Options, totals: dict[str, dict[str, int]] | None = None) -> Iterator[TaskSpec]:
    """The products on every site, in the order the splitter makes them, with the web's result counts
    (``totals``, if the caller has them: :func:`corpus_totals`)."""
    totals = totals or corpus_totals(opts.profile, opts.sites, opts.seed, opts.products)
    for product in opts.products:
        for site in opts.sites:
            yield TaskSpec(product["name"], site, totals[product["name"]][site])


def simulate_configuration(name: str, opts: Options, *, model: NodeModel | None = None, seed: int | None = None,
                           progress: Progress | None = None, label: str = "",
                           totals: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """Run configuration ``name`` on the simulator; the raw record of a run (as ``run_configuration`` returns).

    ``seed`` (default ``opts.seed``) seeds the simulation's draws and the bandit's; ``totals``: the queries'
    result counts if the caller has them (:func:`corpus_totals`)."""
    seed = opts.seed if seed is None else seed
    settings = {**CLUSTER_SETTINGS, **CONFIGURATIONS[name][1], **opts.overrides}
    # The bandit's draws follow the run's seed, so that a simulated run is reproducible.
    allocation, modification, recall, config = build_strategies({"SCHEDEXT_BANDIT_SEED": seed, **settings},
                                                                opts.profile)
    nodes = [SimNode(n.id, tuple(int(t) for t in str(n.types).split(",")), prefetch=config.prefetch,
                     address=n.address) for n in opts.nodes]
    sim = Simulation(profile_world(opts), nodes, task_specs(opts, totals), allocation=allocation,
                     modification=modification, recall=recall, duration=opts.duration, tick=config.tick_interval,
                     wake=config.tick_wake, batch=config.tick_batch, page_limit=config.page_limit,
                     time_limit=config.time_limit, lanes=config.task_lanes, idle_lanes=config.task_lanes_idle,
                     alpha=config.estimate_alpha, recall_age=config.recall_age,
                     model=(model or NodeModel()).with_settings(Settings(settings)),
                     sample_interval=opts.sample_interval, heartbeat=config.heartbeat_interval,
                     seed=seed, pair_samples=len(nodes) * len(opts.sites) <= 10_000,
                     on_sample=None if progress is None else functools.partial(_progress, progress, label or name,
                                                                               opts, time.monotonic()))
    started = time.monotonic()
    raw = sim.run()
    if progress is not None:
        progress.done(f"[{label or name}] simulated {opts.duration:.0f} s in {time.monotonic() - started:.1f} s: "
                      f"{raw['samples'][-1]['items']} unique items")
    return {"name": name, "settings": settings, **raw, "truth_corpus": [], "simulated": True}


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def simulate_all(opts: Options, totals: dict[str, dict[str, int]] | None = None, *, jobs: int = 1,
                 progress: Progress | None = None, processes: set[int] | None = None
                 ) -> dict[str, list[dict[str, Any]]]:
    """Every configuration of ``opts``, ``opts.repeat`` seeds each: configuration -> its runs' raw records, in seed
    order.

    ``jobs`` > 1 runs up to that many at once, each in a process of its own (forked, so nothing is pickled but the
    record it sends back). A run depends on its configuration and seed only, so the records are the ones a run at a
    time gives; on this 2-core machine the three seeds of four configurations take half the wall time. A run that
    fails stops the others and raises :class:`ExperimentError` naming it. ``processes``, if given, collects the ids
    of the processes the runs ran in."""
    runs = [(name, opts.seed + k, f"{name} {i}/{len(opts.configurations)} seed {opts.seed + k}")
            for i, name in enumerate(opts.configurations, 1) for k in range(opts.repeat)]
    records: dict[tuple[str, int], dict[str, Any]] = {}
    if jobs <= 1 or len(runs) <= 1:
        for name, seed, label in runs:
            records[(name, seed)] = simulate_configuration(name, opts, seed=seed, progress=progress or Progress(),
                                                           label=label, totals=totals)
            if processes is not None:
                processes.add(os.getpid())
    else:
        _run_forked(runs, opts, totals, min(jobs, len(runs)), progress or Progress(), records, processes)
    return {name: [records[(name, opts.seed + k)] for k in range(opts.repeat)] for name in opts.configurations}


class _Relay(Progress):
    """A forked run's progress: its lines go to the parent, which shows them."""

    def __init__(self, channel: Any, index: int) -> None:
        super().__init__()
        self.channel, self.index = channel, index

    def update(self, text: str) -> None:
        self.channel.put(("line", self.index, text))

    def done(self, text: str) -> None:
        self.channel.put(("done", self.index, text))


def _forked_run(channel: Any, index: int, name: str, seed: int, label: str, opts: Options,
                totals: dict[str, dict[str, int]] | None, parent: int) -> None:
    """One run in a forked process: its record (or the error that stopped it) goes to the parent."""
    die_with(parent)  # a run whose command was killed stops too, instead of simulating to its end
    try:
        raw = simulate_configuration(name, opts, seed=seed, progress=_Relay(channel, index), label=label,
                                     totals=totals)
        channel.put(("record", index, (raw, os.getpid())))
    except BaseException:  # noqa: BLE001 - whatever stops the run is reported, with its traceback
        channel.put(("error", index, traceback.format_exc()))


def _run_forked(runs: list[tuple[str, int, str]], opts: Options, totals: dict[str, dict[str, int]] | None,
                jobs: int, progress: Progress, records: dict[tuple[str, int], dict[str, Any]],
                processes: set[int] | None) -> None:
    """:func:`simulate_all`'s runs, ``jobs`` processes at a time. The parent reads what the runs send before it
    joins them (a large record fills the pipe), and a run whose process died without a word is an error too."""
    ctx = multiprocessing.get_context("fork")
    channel = ctx.Queue()
    alive: dict[int, Any] = {}
    lines: dict[int, str] = {}
    todo = list(enumerate(runs))
    try:
        while todo or alive:
            while todo and len(alive) < jobs:
                index, (name, seed, label) = todo.pop(0)
                alive[index] = ctx.Process(target=_forked_run, args=(channel, index, name, seed, label, opts, totals,
                                                 os.getpid()),
                                           name=f"sim {label}", daemon=True)
                alive[index].start()
            for index, proc in alive.items():  # a run sends its record before it ends: exit code 0 or killed
                if proc.exitcode not in (None, 0):
                    raise ExperimentError(f"simulated run {runs[index][2]}: its process ended with exit code "
                                          f"{proc.exitcode} (killed? out of memory?) before it sent its record; "
                                          f"fewer runs at once hold less memory (--jobs)")
            try:
                kind, index, value = channel.get(timeout=0.5)
            except queue_module.Empty:
                continue
            if kind == "line":  # the line shown is the oldest running run's
                lines[index] = value
                if index == min(lines):
                    others = len(lines) - 1
                    progress.update(value + (f"  (+{others} running)" if others else ""))
            elif kind == "done":
                lines.pop(index, None)
                progress.done(value)
            elif kind == "error":
                raise ExperimentError(f"simulated run {runs[index][2]} failed:\n{value}")
            else:
                raw, pid = value
                name, seed, _ = runs[index]
                records[(name, seed)] = raw
                if processes is not None:
                    processes.add(pid)
                alive.pop(index).join()
    finally:
        for proc in alive.values():  # a run holds nothing to save, and a handler it inherited may catch SIGTERM
            proc.kill()
        for proc in alive.values():
            proc.join()
        channel.close()


def _progress(progress: Progress, label: str, opts: Options, started: float, sample: dict[str, Any]) -> None:
    """The status line of a simulated run at each sample: a long one (a day at a thousand nodes) shows where it is,
    and how long the rest takes at the pace so far (a simulated second of a large run mostly costs more as the run
    goes on, so the estimate is mostly low, less so as the run nears its end)."""
    t, elapsed = sample["t"], time.monotonic() - started
    pace = (f"  {span(elapsed)} so far, {span(elapsed * (opts.duration - t) / t)} left at this pace"
            if 0 < t < opts.duration and elapsed >= 10 else "")
    progress.update(f"[{label}] {t:.0f}/{opts.duration:.0f} simulated s  items {sample['items']}  "
                    f"waiting {sample['waiting']}  tasks done {sample['tasks_done']}/{sample['tasks']}{pace}")


def span(seconds: float) -> str:
    """A duration as a person reads it on a status line.

    >>> span(42.4), span(125), span(7384)
    ('42 s', '2 min 5 s', '2 h 3 min')
    """
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def best_possible(opts: Options, totals: dict[str, dict[str, int]], *, assignments: bool = False,
                  machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The best possible unique items of a run of ``opts`` (:func:`scheduler_ext.sim.bound.best_possible`): the
    profile's true rates over time, the experiment's nodes and tasks. A real run's nodes, web and MongoDB share this
    machine: its cores and the CPU the cheapest crawler needs here, ``machine`` if measured before the run
    (:func:`product_crawl.experiment.machine.measure`: ``{"costs": Costs, "windows": [...]}``), else the recorded
    :data:`~scheduler_ext.sim.bound.MACHINE`; a simulated run's nodes have the simulator's own machinery
    (:class:`~scheduler_ext.sim.NodeModel`, each node its CPU), which at a handful of nodes is below the machine's
    bound and at a thousand far above it (a shared 2-core row would then be beaten by the simulation it bounds).
    ``assignments``: keep the best schedule's site of each node, phase by phase (``benchmarks/bench_ceiling.py``
    crawls it)."""
    world = profile_world(opts)
    nodes = [SimNode(n.id, tuple(int(t) for t in str(n.types).split(",")), address=n.address) for n in opts.nodes]
    work = {site: SiteWork(0, sum(1 for p in totals if site in totals[p]),
                           sum(totals[p].get(site, 0) for p in totals)) for site in opts.sites}
    source = "benchmarks/results/bench_machine.json"
    if opts.sim:
        model, shared = NodeModel(), None
    elif machine is None:
        model, shared = bound_module.MACHINE_NODE, bound_module.MACHINE
    else:
        costs = machine["costs"]
        model = NodeModel(page_cpu=costs.node_page_cpu, item_cpu=costs.node_item_cpu)
        shared = bound_module.Machine(cores=float(os.cpu_count() or 1), page_cpu=costs.page_cpu,
                                      item_cpu=costs.item_cpu)
        source = (f"measured before and after the configurations (each profile's cheapest window): plain Scrapy in "
                  f"{machine_processes(len(opts.nodes))} processes, 2 windows of {opts.machine_seconds:g} s each time, "
                  f"pages served in {machine['latency']:g} s (the profile's quickest pair)")
    model = model.with_settings(Settings({**CLUSTER_SETTINGS, **opts.overrides}))  # the nodes' concurrency and delay
    bound = bound_module.best_possible(world, nodes, work, opts.duration, model, shared)
    if not assignments:
        bound.pop("assignments")
    nodes_model = {"concurrency": model.concurrency, "delay": model.delay, "node_page_cpu": model.page_cpu,
                   "node_item_cpu": model.item_cpu}
    if shared is None:
        return {**bound, "model": {**nodes_model, "source": "the simulator's NodeModel, a machine per node"}}
    return {**bound, "model": {**nodes_model, "cores": shared.cores, "machine_page_cpu": shared.page_cpu,
                               "machine_item_cpu": shared.item_cpu, "source": source,
                               **({"windows": machine["windows"], "measured": machine["measured"]} if machine else {})}}
