"""Where a configuration loses items on the generated families: a diagnostic beside bench_quality.py (not timed,
not in the hot path; it wraps the simulator's event handlers).

    python benchmarks/diag_quality.py [--families captcha,drift] [--seeds 5] [--configs bandit,paper]

Per family and configuration, summed over seeds (the worlds of bench_quality.py, its default sizes):

* ``items``, and the bound;
* ``idle``: node-seconds with no subtask held, as a share of the live node-seconds;
* ``bad``: subtask-seconds on pairs whose true rate is below 0.6 of the site's best node's (``good`` the rest),
  as a share of all subtask-seconds; ``captcha_nodes``: subtask-seconds on nodes blocked on most pages;
* ``runs``, ``failed`` runs, ``recalled``, ``dead`` (subtasks dead-lettered: their task stops), tasks done;
* ``pages/run``: mean page limit of the subtasks run; ``explored``: the bandit's explorations;
* ``wait``: mean seconds a subtask waited in ``waiting`` before its allocation (task time lost).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_quality import tasks_for  # noqa: E402

from scheduler_ext.sim import Simulation  # noqa: E402
from scheduler_ext.sim.bound import SiteWork, best_possible  # noqa: E402
from scheduler_ext.sim.configs import CONFIGS  # noqa: E402
from scheduler_ext.sim.engine import NodeModel  # noqa: E402
from scheduler_ext.sim.families import generate  # noqa: E402
from scheduler_ext.sim.world import PAGE_SIZE  # noqa: E402

MODEL = NodeModel()


def true_rate(b: Any) -> float:
    """Results a second of a pair alone on a node (bound.py's r[n,s], the simulator's default node model)."""
    cpu = b.served * (MODEL.page_cpu + PAGE_SIZE * b.share * MODEL.item_cpu)
    pace = min(MODEL.concurrency / max(b.latency, 1e-3), 1 / max(cpu, 1e-6))
    return pace * b.served * b.share * PAGE_SIZE


class Diag(Simulation):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.d: dict[str, float] = defaultdict(float)
        self.waits: list[float] = []
        self.pages: list[int] = []
        self.task_of: dict[str, str] = {}
        self.queued_at: dict[str, float] = {}
        self.qwaits: list[float] = []
        self.captcha = {n for n in self.nodes
                        if all(self.world.behaviour(n, s, 0).block_rate >= 0.5 for s in self.world.sites)}

    def _tick(self) -> None:
        for n in self.nodes.values():
            if self.live(n.id):
                self.d["live"] += self.tick
                if not self.running[n.id] and not self.queues[n.id]:
                    self.d["idle"] += self.tick
                    if n.id not in self.captcha:
                        self.d["idle_ok"] += self.tick
                if n.id not in self.captcha:
                    self.d["live_ok"] += self.tick
        super()._tick()

    def _assign_kind(self, st: Any, nid: str) -> None:
        q = true_rate(self.world.behaviour(nid, st.site, self.now)) / max(
            true_rate(self.world.behaviour(n, st.site, self.now)) for n in self.nodes if self.live(n))
        kind = "captcha" if nid in self.captcha else "good" if q >= 0.6 else "bad"
        aged = self.now - st.since >= getattr(self.allocation, "patience", 1e9)
        if getattr(self.allocation, "_exploring", {}).get((st.site, nid)) == self.now:
            sums = self.estimates.site_sums(st.site)
            s = sums.get(nid)
            cp = max((x.cp for x in sums.values()), default=0.0)
            why = "untried" if s is None else "after_cp" if s.t < cp else "drawn"
            self.d[f"explore_{why}_{kind}"] += 1
        self.d[f"to_{kind}_{'retry' if st.attempt else 'fresh'}_{'aged' if aged else 'young'}"] += 1

    def _apply(self, decision: Any) -> None:
        if decision.dead and decision.subject in self.task_of:
            state = self.tasks.get(self.task_of[decision.subject])
            if state is not None:
                site = state.task.site
                ngood = sum(1 for n in self.nodes if n not in self.captcha
                            and self.world.behaviour(n, site, self.now).share > 0.8)
                self.d[f"dead_site_good{min(ngood, 3)}"] += 1
                self.d["dead_results"] += max(0, state.results - PAGE_SIZE * len(state.collected_pages))
        super()._apply(decision)

    def _queue(self, nid: str, st: Any) -> None:
        self.waits.append(self.now - st.since)
        self.queued_at[st.id] = self.now
        self._assign_kind(st, nid)
        super()._queue(nid, st)

    def _crawl(self, run: Any) -> Any:
        report, ended = super()._crawl(run)
        st, t = run.st, run.started
        self.task_of[st.id] = st.task
        self.qwaits.append(t - self.queued_at.pop(st.id, t))
        self.d["cpu"] += report.pages * MODEL.page_cpu + report.collected * MODEL.item_cpu
        rates = {n: true_rate(self.world.behaviour(n, st.site, t)) for n in self.nodes if self.live(n)}
        q = rates[run.node] / max(max(rates.values()), 1e-9)
        dur = ended - t
        self.d["held"] += dur
        self.d["good" if q >= 0.6 else "bad"] += dur
        if run.node in self.captcha:
            self.d["captcha_nodes"] += dur
        self.d["runs"] += 1
        self.d["failed"] += report.outcome == "failed"
        if report.outcome == "failed":
            kind = "captcha" if run.node in self.captcha else "good" if q >= 0.6 else "bad"
            self.d[f"fail_a{min(st.attempt, 4)}_{kind}"] += 1
            self.d[f"fail_{kind}_pages"] += st.page_limit
        self.pages.append(st.page_limit)
        return report, ended


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--families", default="captcha,drift")
    p.add_argument("--configs", default="bandit,paper")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--nodes", type=int, default=12)
    p.add_argument("--sites", type=int, default=8)
    p.add_argument("--products", type=int, default=16)
    p.add_argument("--duration", type=float, default=300.0)
    args = p.parse_args()
    for family in args.families.split(","):
        for name in args.configs.split(","):
            tot: dict[str, float] = defaultdict(float)
            items, bound, waits, pages, per_seed, qw = 0, 0.0, [], [], [], []
            for seed in range(args.seeds):
                world = generate(family, nodes=args.nodes, sites=args.sites, duration=args.duration, seed=seed)
                tasks = tasks_for(world, args.products, seed)
                specs = list(tasks())
                work = {s: SiteWork(0, sum(1 for t in specs if t.site == s),
                                    sum(t.results for t in specs if t.site == s)) for s in world.sites}
                bound += best_possible(world, world.nodes, work, args.duration)["items"]
                allocation, modification, recall = CONFIGS[name](seed)
                sim = Diag(world, world.nodes, tasks(), allocation=allocation, modification=modification,
                           recall=recall, duration=args.duration, seed=seed, sample_interval=30)
                raw = sim.run()
                got = raw["samples"][-1]["items"]
                items += got
                per_seed.append(got)
                for k, v in sim.d.items():
                    tot[k] += v
                for c in sim.counts.values():
                    tot["recalled"] += c.get("recalled", 0)
                    tot["dead"] += c.get("dead", 0)
                tot["tasks_done"] += sim.tasks_done
                tot["explored"] += getattr(allocation, "explored", 0)
                waits += sim.waits
                qw += sim.qwaits
                pages += sim.pages
            held = max(tot["held"], 1e-9)
            kinds = {k: int(v) for k, v in sorted(tot.items())
                     if k.startswith(("fail_", "to_", "dead_site", "explore_"))}
            print("   failed runs by attempt and pair, assignments by pair, deaths by good nodes of the site:", kinds)
            print(f"{family:8s} {name:7s} items {items:8d} ({items / bound:.2f} of bound) seeds {per_seed}\n"
                  f"   idle {tot['idle'] / tot['live']:.3f} (non-captcha {tot['idle_ok'] / tot['live_ok']:.3f})"
                  f"  dead_results {tot['dead_results']:.0f}  bad {tot['bad'] / held:.3f}  "
                  f"captcha_nodes {tot['captcha_nodes'] / held:.3f}  held/live {held / tot['live']:.2f}  "
                  f"runs {tot['runs']:.0f} failed {tot['failed']:.0f} recalled {tot['recalled']:.0f} "
                  f"dead {tot['dead']:.0f} tasks_done {tot['tasks_done']:.0f}  pages/run {sum(pages) / len(pages):.2f}"
                  f"  explored {tot['explored']:.0f}  wait {sum(waits) / len(waits):.2f}s"
                  f"  node-queue wait mean {sum(qw) / len(qw):.2f}s p90 {sorted(qw)[int(0.9 * len(qw))]:.2f}s"
                  f"  cpu use {tot['cpu'] / tot['live']:.2f}", flush=True)


if __name__ == "__main__":
    main()
