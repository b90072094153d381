"""Scheduling quality at scale, on the cluster simulator: bandit vs the paper's strategies vs a FIFO queue vs the best
possible, on generated families of profiles (scheduler_ext/sim/families.py), with the distribution of the ratios.

    python benchmarks/bench_quality.py [--nodes 12] [--sites 8] [--products 16] [--duration 300] [--seeds 5]
                                       [--seed-start 0] [--families all] [--scale] [--scale-delay 0]
                                       [--out benchmarks/results/bench_quality.json]

For every family and seed (``--seeds`` of them from ``--seed-start``: a second set of worlds to check a result found
on the first): one generated world, each configuration of scheduler_ext.sim.configs simulated on it (same tasks, same
seed), and the bound (scheduler_ext.sim.bound). Reported per family: quantiles over seeds of items / best possible,
bandit / paper, bandit / fifo, subtasks dead-lettered a world, and for the families where pairs turn good, the delay
from a pair turning good to its first run (only pairs that the best schedule uses once they are good: ``turned_good``
of scheduler_ext.sim.bound.best_possible), over all such pairs and over those at least
:data:`scheduler_ext.sim.bound.CLEARLY` times as good as the node's best other site then (the bound picks one pair
among near-ties; a node busy on a site as good loses nothing by finding the new pair later). A pair never used waited
as long as its site had work: until the last run any node started there (a site whose work ends soon after leaves
little to find the pair for); if no node ran its site after the pair turned good, the site's work was over and the
pair is left out and counted (``good_pairs_after_their_sites_work``). ``scrapy experiment`` reports the same for its
runs (summary.json ``good_pairs``, where a pair never used counts as the rest of the run).

``--scale`` also times runs of 1,000 nodes x 200 sites x 10,000 products (``--scale-duration`` simulated seconds,
default 600; ``86400`` runs the day itself), one per configuration of ``--scale-configs`` (default bandit,fifo): the
CPU time (what the wall time is on a quiet machine; the wall time is reported too), how much of it the allocation
strategy took (the control's own decision code) and how much the rest (the simulator, and decide's other steps),
the subtasks decided per simulated second, and the time of a simulated day extrapolated from the second half of
the run (past the start-up: the steady state's pace) and from the whole run. ``--families none --scale`` runs
those alone; ``--scale-delay 2`` gives the nodes a 2 s ``DOWNLOAD_DELAY`` (a polite pace for a search engine: a
node then starts a page every 2 s) instead of the loopback pace; ``--scale-wake`` sets the control's wake (0.1 s).
Each run's ``pace`` lists, sample by sample, the CPU a simulated second cost and the items a second: the cost
grows with the run (docs/experiment.md, "A day at scale"), so the extrapolations hold for the run's length only.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler_ext.defaults import DEFAULTS  # noqa: E402
from scheduler_ext.sim import Simulation, TaskSpec  # noqa: E402
from scheduler_ext.sim.bound import SiteWork, best_possible  # noqa: E402
from scheduler_ext.sim.configs import CONFIGS, PATIENCE, RECALL_AGE  # noqa: E402
from scheduler_ext.sim.engine import NodeModel  # noqa: E402
from scheduler_ext.sim.families import FAMILIES, GeneratedWorld, generate  # noqa: E402


def quantiles(values: list[float]) -> dict[str, float] | None:
    v = sorted(values)
    if not v:
        return None
    at = lambda q: round(v[min(len(v) - 1, int(q * len(v)))], 3)  # noqa: E731
    return {"min": round(v[0], 3), "p10": at(0.1), "median": at(0.5), "p90": at(0.9), "max": round(v[-1], 3),
            "n": len(v)}


def tasks_for(world: GeneratedWorld, products: int, seed: int):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    sizes = {(p, s): rng.randint(3000, 30000) for p in range(products) for s in world.sites}
    return lambda: (TaskSpec(f"p{p}", s, sizes[(p, s)]) for p in range(products) for s in world.sites)


def use_delays(first_use: dict[str, list[float]], needed: list[tuple[str, str, float, bool]]) -> list[float | None]:
    """Seconds from each pair of ``needed`` (node, site, when it turned good, clear) turning good to its first run
    (``first_use``: "node|site" -> run starts). A pair never used waited as long as its site had work: until the last
    run any node started there; if no node ran its site from then on, the site's work was over (or dead-lettered)
    and the pair is None (left out)."""
    last_run: dict[str, float] = {}
    for key, starts in first_use.items():
        site = key.split("|", 1)[1]
        last_run[site] = max(last_run.get(site, 0.0), max(starts, default=0.0))
    delays: list[float | None] = []
    for node, site, when, _ in needed:
        starts = [t for t in first_use.get(f"{node}|{site}", []) if t >= when]
        delays.append(starts[0] - when if starts else None if last_run.get(site, -1.0) < when
                      else last_run[site] - when)
    return delays


def one_world(family: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    world = generate(family, nodes=args.nodes, sites=args.sites, duration=args.duration, seed=seed)
    tasks = tasks_for(world, args.products, seed)
    specs = list(tasks())
    work = {s: SiteWork(0, sum(1 for t in specs if t.site == s), sum(t.results for t in specs if t.site == s))
            for s in world.sites}
    best = best_possible(world, world.nodes, work, args.duration)
    bound = best["items"]
    needed = best["turned_good"]
    clear = [c for _, _, _, c in needed]
    out: dict[str, Any] = {"bound": bound, "items": {}, "delays": {}, "clear": clear, "dead": {},
                           "tasks": len(specs)}
    for name, make in CONFIGS.items():
        allocation, modification, recall = make(seed)
        raw = Simulation(world, world.nodes, tasks(), allocation=allocation, modification=modification,
                         recall=recall, duration=args.duration, seed=seed, sample_interval=30,
                         lanes=args.lanes).run()
        out["items"][name] = raw["samples"][-1]["items"]
        out["dead"][name] = sum(n["counts"].get("dead", 0) for n in raw["status"]["nodes"])
        out["delays"][name] = use_delays(raw["first_use"], needed)
    return out


class _Timed:
    """An allocation strategy with a stopwatch: the CPU time spent in its ``allocate``."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seconds = inner, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def allocate(self, *args: Any) -> Any:
        started = time.process_time()
        try:
            return self.inner.allocate(*args)
        finally:
            self.seconds += time.process_time() - started


def scale_run(name: str, duration: float, delay: float = 0.0, wake: float = 0.1, tick: float = 1.0,
              batch: int = 500, recall_age: float = RECALL_AGE, patience: float = PATIENCE) -> dict[str, Any]:
    world = generate("specialists", nodes=1000, sites=200, duration=duration, seed=0)
    rng = random.Random(0)
    tasks = (TaskSpec(f"p{p}", s, rng.randint(3000, 30000)) for p in range(10_000) for s in world.sites)
    allocation, modification, recall = CONFIGS[name](0, recall_age=recall_age, patience=patience)
    timed = _Timed(allocation)
    # CPU time of this process (the machine is shared: wall time there measures the neighbours), at each sample
    walls: list[float] = []
    sim = Simulation(world, world.nodes, tasks, allocation=timed, modification=modification, recall=recall,
                     duration=duration, tick=tick, wake=wake, seed=0, pair_samples=False, sample_interval=duration / 20,
                     on_sample=lambda s: walls.append(time.process_time()), model=NodeModel(delay=delay), batch=batch)
    started, started_wall = time.process_time(), time.monotonic()
    raw = sim.run()
    wall = time.process_time() - started
    samples = raw["samples"]
    half = next(i for i, s in enumerate(samples) if s["t"] >= duration / 2)
    late = samples[half:]
    late_wall = walls[-1] - walls[half]  # the second half: past the start-up (prefetch filling, first runs)
    # what a simulated second costs, sample by sample: it grows with the run (docs/experiment.md, "A day at scale")
    pace = [{"t": b["t"], "cpu_per_simulated_second": round((w1 - w0) / max(1e-9, b["t"] - a["t"]), 3),
             "items_per_second": round((b["items"] - a["items"]) / max(1e-9, b["t"] - a["t"]), 1)}
            for a, b, w0, w1 in zip(samples, samples[1:], walls, walls[1:], strict=False)]
    out = {"configuration": name, "nodes": 1000, "sites": 200, "products": 10_000, "download_delay": delay,
           "wake": wake, "tick": tick, "batch": batch, "recall_age": recall_age, "patience": patience, "pace": pace,
           "simulated_seconds": duration,
           "cpu_seconds": round(wall, 1), "wall_seconds": round(time.monotonic() - started_wall, 1),
           "allocation_seconds": round(timed.seconds, 1),
           "other_seconds": round(wall - timed.seconds, 1), "subtasks": raw["allocated"],
           "subtasks_per_simulated_second": round(raw["allocated"] / duration, 1),
           "cpu_microseconds_per_subtask": round(1e6 * wall / max(1, raw["allocated"]), 1),
           "items": samples[-1]["items"],
           "items_per_second_late": None if len(late) < 2 else
           round((late[-1]["items"] - late[0]["items"]) / max(1e-9, late[-1]["t"] - late[0]["t"]), 1),
           "simulated_seconds_per_cpu_second": round(duration / wall, 2),
           "late_simulated_seconds_per_cpu_second": round((late[-1]["t"] - late[0]["t"]) / late_wall, 2)}
    if duration < 86400:  # the day at the second half's pace (the steady state), and at the whole run's
        out["day_extrapolated_minutes"] = round(86400 * late_wall / (late[-1]["t"] - late[0]["t"]) / 60, 1)
        out["day_extrapolated_minutes_whole_run"] = round(86400 * wall / duration / 60, 1)
    print(f"scale {name}: {out}", flush=True)
    return out


def scale(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [scale_run(name, args.scale_duration, args.scale_delay, args.scale_wake, args.scale_tick, args.scale_batch,
                      args.scale_recall_age, args.scale_patience)
            for name in args.scale_configs.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=12)
    p.add_argument("--sites", type=int, default=8)
    p.add_argument("--products", type=int, default=16)
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--seed-start", type=int, default=0, help="the first seed: worlds --seed-start .. + --seeds - 1")
    p.add_argument("--families", default="all", help="comma-separated, 'all' or 'none'")
    p.add_argument("--lanes", type=int, default=DEFAULTS["SCHEDEXT_TASK_LANES"],
                   help="SCHEDEXT_TASK_LANES of the families' runs (default: the setting's default)")
    p.add_argument("--scale", action="store_true")
    p.add_argument("--scale-duration", type=float, default=600.0)
    p.add_argument("--scale-configs", default="bandit,fifo", help=f"comma-separated, from {', '.join(CONFIGS)}")
    p.add_argument("--scale-delay", type=float, default=0.0,
                   help="the nodes' DOWNLOAD_DELAY in the scale runs (seconds; 0: the loopback pace)")
    p.add_argument("--scale-wake", type=float, default=0.1,
                   help="seconds after a tick before a report wakes the next one in the scale runs "
                        "(SCHEDEXT_TICK_WAKE)")
    p.add_argument("--scale-tick", type=float, default=1.0, help="SCHEDEXT_TICK_INTERVAL of the scale runs (seconds)")
    p.add_argument("--scale-batch", type=int, default=500, help="SCHEDEXT_TICK_BATCH of the scale runs")
    p.add_argument("--scale-recall-age", type=float, default=RECALL_AGE,
                   help="SCHEDEXT_RECALL_THRESHOLD of the scale runs (default: the experiment's)")
    p.add_argument("--scale-patience", type=float, default=PATIENCE,
                   help="SCHEDEXT_PATIENCE of the scale runs (default: the experiment's)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_quality.json"))
    args = p.parse_args()
    families = FAMILIES if args.families == "all" else () if args.families == "none" \
        else tuple(args.families.split(","))
    result: dict[str, Any] = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "families": {}}
    for family in families:
        started = time.monotonic()
        worlds = [one_world(family, args, seed) for seed in range(args.seed_start, args.seed_start + args.seeds)]
        names = list(CONFIGS)
        summary: dict[str, Any] = {
            "vs_best": {n: quantiles([w["items"][n] / w["bound"] for w in worlds]) for n in names},
            "bandit_vs_paper": quantiles([w["items"]["bandit"] / w["items"]["paper"] for w in worlds]),
            "bandit_vs_fifo": quantiles([w["items"]["bandit"] / w["items"]["fifo"] for w in worlds]),
            "paper_vs_fifo": quantiles([w["items"]["paper"] / w["items"]["fifo"] for w in worlds]),
            # subtasks dead-lettered a world (each stops its task and waits for a person: scrapy deadletter list)
            "dead_letters": {n: quantiles([w["dead"][n] for w in worlds]) for n in names},
            "tasks": worlds[0]["tasks"] if worlds else 0,
            "seconds": round(time.monotonic() - started, 1),
        }
        delays = {n: [d for w in worlds for d in w["delays"][n] if d is not None] for n in names}
        if any(delays.values()):
            summary["delay_to_use_good_pair"] = {n: quantiles(d) for n, d in delays.items()}
            summary["delay_to_use_clearly_better_pair"] = {
                n: quantiles([d for w in worlds for d, c in zip(w["delays"][n], w["clear"], strict=True)
                              if c and d is not None]) for n in names}
            summary["good_pairs_after_their_sites_work"] = {
                n: sum(d is None for w in worlds for d in w["delays"][n]) for n in names}
        result["families"][family] = summary
        vb = summary["vs_best"]
        print(f"{family:12s} vs best (median) " + "  ".join(f"{n} {vb[n]['median']:.2f}" for n in names)
              + f"   bandit/paper {summary['bandit_vs_paper']['median']:.2f} "
              f"[{summary['bandit_vs_paper']['min']:.2f}..{summary['bandit_vs_paper']['max']:.2f}]"
              f"   bandit/fifo {summary['bandit_vs_fifo']['median']:.2f}   dead letters a world (median) "
              + " ".join(f"{n} {summary['dead_letters'][n]['median']:g}" for n in names)
              + f" of {summary['tasks']} tasks   ({summary['seconds']} s)", flush=True)
        for key in ("delay_to_use_good_pair", "delay_to_use_clearly_better_pair"):
            q = summary.get(key, {}).get("bandit")
            if q:
                print(f"{'':12s} {key} (bandit): median {q['median']} s, p90 {q['p90']} s, max {q['max']} s, "
                      f"{q['n']} pairs", flush=True)
    if args.scale:
        result["scale"] = scale(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
