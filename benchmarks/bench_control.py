"""Milliseconds per control tick at 10,000 and 100,000 waiting subtasks and 200 nodes; Redis bytes a subtask.

Run: ``.venv/bin/python benchmarks/bench_control.py [--profile]`` (or ``make bench``); docs/benchmarks.md
explains it. ``--profile`` also prints where one working tick at the large size spends its time (cProfile).

Against a private ``redis-server`` on a free loopback port (stopped at the end), both sizes side by side under
two key prefixes, their ticks alternated (so that a change of load on the machine hits both alike); for each:

1. The state is filled directly with pipelines, as the control's split would leave it: subtask records (JSON
   of :class:`scheduler_ext.models.Subtask`, a realistic payload) in ``subtasks`` and their ids in
   ``waiting`` (FIFO scores), in product order: for each product, one subtask per site (the sites of
   ``product_crawl/data``). Redis ``used_memory`` before and after the fill, divided by the count, is the
   memory per waiting subtask (the task records a real split also writes are measured separately).
2. 200 nodes register through :meth:`Store.heartbeat` (types 0 and 1, prefetch 1), and every (site, node)
   pair gets an aggregate hash with run-control estimates of similar value (so that
   :class:`DynamicAllocation` knows every node, finds every node's rate above its floor and fills every free
   slot). The (product, site, node) aggregates do not exist, as for products no node has crawled yet.
3. :class:`scheduler_ext.control.Control` is built directly (no splitter, the default dynamic strategies).
   *Working ticks*: before each tick every node takes what it was given (:meth:`Store.take`), so each tick
   finds 200 free slots and allocates 200 subtasks. *Idle ticks*: nothing changed since the last tick (every
   crawl queue full, no reports, no recalls).

The tick should cost in proportion to the work changed, not to the queue size: ``size_ratio`` is the median
working tick at 100,000 over the one at 10,000 (near 1 if so).

The last line printed is one JSON object; it is also written to benchmarks/results/bench_control.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from product_crawl import services  # noqa: E402
from scheduler_ext.connection import redis_from_settings  # noqa: E402
from scheduler_ext.control import Control, EstimateCache  # noqa: E402
from scheduler_ext.keys import Keys  # noqa: E402
from scheduler_ext.models import Subtask, Task  # noqa: E402
from scheduler_ext.store import Store  # noqa: E402
from scheduler_ext.strategies.allocation import DynamicAllocation  # noqa: E402
from scheduler_ext.strategies.modification import DynamicModification  # noqa: E402
from scheduler_ext.strategies.recall import DynamicRecall  # noqa: E402

NODES = 200
SIZES = (10_000, 100_000)
WORK_TICKS = 8  # measured working ticks per size (after WARM_TICKS); each is about a second on 2 cores
WARM_TICKS = 1  # the first tick takes the leader lease, loads the estimates of a whole window; not measured
IDLE_TICKS = 10
RESULTS = ROOT / "benchmarks" / "results" / "bench_control.json"


def sites() -> list[tuple[str, int]]:
    out = []
    for node_type in (0, 1):
        path = ROOT / "product_crawl" / "data" / f"sites_type{node_type}.txt"
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                out.append((line, node_type))
    return out


def subtask_at(i: int, site_list: list[tuple[str, int]], now: float) -> Subtask:
    """Waiting subtask number ``i``: product ``i // len(sites)``, one site each, as a split leaves them."""
    product = f"光明高钙牛奶{i // len(site_list)}"
    site, node_type = site_list[i % len(site_list)]
    words = ["光明", "高钙", f"牛奶{i // len(site_list)}"]
    payload = {"engine": "weibo" if node_type else "baidu", "keywords": words,
               "keywords_joined": "&".join(words), "product": product}
    return Subtask(id=str(2 * i + 2), task=str(2 * i + 1), site=site, group=product, type=node_type,
                   priority=float(2 * i + 1), first_page=0, page_limit=5, time_limit=30.0, since=now,
                   payload=payload)


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def fill_waiting(store: Store, n: int, site_list: list[tuple[str, int]]) -> tuple[float, int, int]:
    """Fill ``n`` waiting subtasks; (seconds, bytes for subtasks + waiting, bytes for their task records)."""
    k, client = store.keys, store.redis
    now = store.now()
    before = used_memory(client)
    t0 = time.perf_counter()
    for start in range(0, n, 5_000):
        with client.pipeline(transaction=False) as pipe:
            mapping, scores = {}, {}
            for i in range(start, min(n, start + 5_000)):
                st = subtask_at(i, site_list, now)
                mapping[st.id] = st.to_json()
                scores[st.id] = st.priority
            pipe.hset(k.subtasks, mapping=mapping)
            pipe.zadd(k.waiting, scores)
            pipe.execute()
    seconds = time.perf_counter() - t0
    after = used_memory(client)
    # The task records a real split writes beside each first subtask (not part of the per-subtask figure).
    for start in range(0, n, 5_000):
        tasks = {}
        for i in range(start, min(n, start + 5_000)):
            st = subtask_at(i, site_list, now)
            tasks[st.task] = Task(id=st.task, site=st.site, group=st.group, type=st.type,
                                  priority=st.priority, payload=st.payload, page_limit=5,
                                  time_limit=30.0).to_json()
        client.hset(k.tasks, mapping=tasks)
    with_tasks = used_memory(client)
    client.set(k.seq, 2 * n + 2)
    return seconds, after - before, with_tasks - after


def register_nodes(store: Store, site_list: list[tuple[str, int]]) -> list[str]:
    nodes = [f"node{i:03d}" for i in range(NODES)]
    for i, nid in enumerate(nodes):
        info = {"type": [0, 1], "prefetch": 1, "capacity": 1, "host": "bench", "pid": 10_000 + i,
                "address": f"127.0.{i // 250}.{i % 250 + 2}", "subtasks": []}
        store.heartbeat(nid, info, 60.0, [])
    # Estimates for every (site, node): similar rates, so every free node is above the allocation's floor.
    rng = random.Random(7)
    now = store.now()
    with store.redis.pipeline(transaction=False) as pipe:
        for site, _ in site_list:
            for nid in nodes:
                pipe.hset(store.keys.agg_site_node(site, nid), mapping={
                    "runs": 5, "offered": 500, "collected": 450, "pages": 25, "seconds": 12.5,
                    "last_run": f"{now:.3f}"})
                pipe.hset(store.keys.est_site(site), nid, json.dumps({
                    "c": rng.uniform(0.85, 0.95), "spp": rng.uniform(0.45, 0.55), "runs": 5, "last": now}))
                pipe.sadd(store.keys.agg_index, f"{site}|{nid}")
        pipe.execute()
    return nodes


def make_control(store: Store) -> Control:
    return Control(store, splitter=None, allocation=DynamicAllocation(), modification=DynamicModification(),
                   recall=DynamicRecall(), control_id="bench-control")


def take_all(store: Store, nodes: list[str]) -> int:
    """Every node takes what its crawl queue holds (as a node's refill does), freeing its slot."""
    taken = 0
    for nid in nodes:
        while store.take(nid, 60.0, 10.0) is not None:
            taken += 1
    return taken


_PHASES: list[dict[str, float] | None] = [None]
_prefetch = EstimateCache.prefetch


def _timed_prefetch(self: EstimateCache, *args: Any, **kwargs: Any) -> None:
    t0 = time.perf_counter()
    try:
        _prefetch(self, *args, **kwargs)
    finally:
        if _PHASES[0] is not None:
            _PHASES[0]["prefetch"] += time.perf_counter() - t0


EstimateCache.prefetch = _timed_prefetch  # type: ignore[method-assign]


def _time_phase(obj: Any, name: str, totals: dict[str, float]) -> None:
    """Wrap ``obj.name`` (on the instance only) to add its wall time to ``totals[name]``."""
    inner = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - t0

    setattr(obj, name, timed)


@dataclass
class Deployment:
    """One size under test: its own key prefix, nodes and control, all in the one Redis."""

    n: int
    store: Store
    nodes: list[str]
    control: Control
    fill_s: float
    bytes_waiting: int
    bytes_tasks: int
    work_ms: list[float] = field(default_factory=list)
    idle_ms: list[float] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=lambda: {"prefetch": 0.0, "allocate": 0.0})


def setup(client: redis.Redis, n: int, site_list: list[tuple[str, int]]) -> Deployment:
    store = Store(client, Keys(f"{{bench-ctl-{n}}}"))
    fill_s, bytes_waiting, bytes_tasks = fill_waiting(store, n, site_list)
    nodes = register_nodes(store, site_list)
    return Deployment(n, store, nodes, make_control(store), fill_s, bytes_waiting, bytes_tasks)


def working_tick(d: Deployment, measured: bool) -> None:
    take_all(d.store, d.nodes)
    t0 = time.perf_counter()
    r = d.control.tick()
    ms = (time.perf_counter() - t0) * 1000
    if measured:
        d.work_ms.append(ms)
        d.allocated.append(r.allocated)


def idle_tick(d: Deployment) -> None:
    """Every crawl queue is full (the last tick filled them): nothing to allocate, nothing reported."""
    t0 = time.perf_counter()
    r = d.control.tick()
    d.idle_ms.append((time.perf_counter() - t0) * 1000)
    assert r.allocated == 0, "an idle tick allocated"


def profile_tick(d: Deployment) -> str:
    take_all(d.store, d.nodes)
    prof = cProfile.Profile()
    prof.enable()
    d.control.tick()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    return buf.getvalue()


def summary(d: Deployment) -> dict[str, Any]:
    # Private attributes, read for the report only: how many estimate hashes the control holds (one tick's).
    cache = {**d.control.estimates._sites, **d.control.estimates._groups}
    cache_mb = (sys.getsizeof(cache) + sum(sys.getsizeof(key) for key in cache)) / 2**20
    return {"waiting": d.n, "fill_s": d.fill_s, "bytes_per_subtask": d.bytes_waiting / d.n,
            "task_bytes_per_subtask": d.bytes_tasks / d.n, "tick_ms": statistics.median(d.work_ms),
            "tick_ms_max": max(d.work_ms), "tick_ms_mean": statistics.mean(d.work_ms),
            "allocated_median": statistics.median(d.allocated),
            "prefetch_ms": d.phases["prefetch"] * 1000 / len(d.work_ms),
            "allocate_ms": d.phases["allocate"] * 1000 / len(d.work_ms),
            "cache_entries": len(cache), "cache_mb": cache_mb}


def run(client: redis.Redis, site_list: list[tuple[str, int]], profile: bool) -> tuple[dict[int, Any], str]:
    """Both sizes side by side, their ticks alternated, so that a load change on the machine hits both."""
    client.flushdb()
    deps = [setup(client, n, site_list) for n in SIZES]
    for i in range(WARM_TICKS + WORK_TICKS):
        for d in deps:
            if i == WARM_TICKS:  # time the allocation phase from here on
                _time_phase(d.control.allocation, "allocate", d.phases)
            if i >= WARM_TICKS:  # the estimate cache is new every tick: time the prefetch of this one
                _PHASES[0] = d.phases
            working_tick(d, measured=i >= WARM_TICKS)
            _PHASES[0] = None
    results = {d.n: summary(d) for d in deps}
    prof_text = profile_tick(deps[-1]) if profile else ""
    for _ in range(IDLE_TICKS):
        for d in deps:
            idle_tick(d)
    for d in deps:
        results[d.n]["idle_ms"] = statistics.median(d.idle_ms)
    client.flushdb()
    return results, prof_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one working tick")
    args = parser.parse_args()
    site_list = sites()
    with tempfile.TemporaryDirectory(prefix="bench-control-") as d:
        port = services.free_port()
        proc = services.start_redis_server(port, Path(d) / "redis")
        url = f"redis://127.0.0.1:{port}/0"
        try:
            client = redis_from_settings({"REDIS_URL": url})
            runs, prof_text = run(client, site_list, args.profile)
            client.close()
        finally:
            services.stop_pid(proc.pid)
    small, large = runs[min(SIZES)], runs[max(SIZES)]
    print(f"redis-server {url} (private), {NODES} nodes, {len(site_list)} sites, default dynamic strategies")
    for r in runs.values():
        print(f"{r['waiting']:>7,} waiting: working tick median {r['tick_ms']:.1f} ms "
              f"(max {r['tick_ms_max']:.1f}, "
              f"{r['allocated_median']:.0f} allocated per tick), idle tick median {r['idle_ms']:.2f} ms; "
              f"fill {r['fill_s']:.1f} s, {r['bytes_per_subtask']:.0f} B/subtask in subtasks+waiting "
              f"(+{r['task_bytes_per_subtask']:.0f} B for its task record)")
        rest = r["tick_ms_mean"] - r["prefetch_ms"] - r["allocate_ms"]
        print(f"        of a working tick: estimate prefetch {r['prefetch_ms']:.0f} ms, allocation strategy "
              f"{r['allocate_ms']:.0f} ms, the rest {rest:.0f} ms "
              f"(means); the estimate cache holds {r['cache_entries']:,} entries (>= {r['cache_mb']:.0f} MB) "
              f"after {WARM_TICKS + WORK_TICKS} working ticks")
    ratio = large["tick_ms"] / small["tick_ms"]
    print(f"size ratio (tick at {max(SIZES):,} / tick at {min(SIZES):,}): {ratio:.2f} "
          "(near 1: O(work), not O(queue))")
    if prof_text:
        print(prof_text)
    out = {"waiting": max(SIZES), "nodes": NODES, "tick_ms_median": round(large["tick_ms"], 2),
           "tick_ms_median_10k": round(small["tick_ms"], 2), "size_ratio": round(ratio, 3),
           "idle_tick_ms_median": round(large["idle_ms"], 3),
           "redis_bytes_per_waiting_subtask": round(large["bytes_per_subtask"], 1),
           "allocated_per_tick": large["allocated_median"],
           "prefetch_ms_mean": round(large["prefetch_ms"], 1),
           "allocate_ms_mean": round(large["allocate_ms"], 1),
           "estimate_cache_entries": large["cache_entries"], "estimate_cache_mb": round(large["cache_mb"], 1),
           "redis_bytes_per_task_record": round(large["task_bytes_per_subtask"], 1)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
