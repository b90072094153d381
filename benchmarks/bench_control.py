"""Milliseconds per control tick at 200 nodes / 100,000 waiting and 1,000 nodes / 1,000,000 waiting subtasks,
every node holding estimates for every site (the worst case for allocation); Redis bytes per waiting subtask.
Measured for the default allocation (:class:`BanditAllocation`) and the paper's :class:`DynamicAllocation`,
interleaved tick by tick over the same state.

Run: ``.venv/bin/python benchmarks/bench_control.py [--sizes 200:100000,1000:1000000] [--profile]`` (or
``make bench``); docs/benchmarks.md explains it. ``--profile`` prints where one working tick at the largest size
spends its time (cProfile).

Against a private ``redis-server`` on a free loopback port (stopped at the end), each size under its own key
prefix:

1. The state is filled as the control's split would leave it, by a Lua bulk loader run inside Redis (a second
   or two per million, instead of minutes of Python): subtask records (the JSON of
   :class:`scheduler_ext.models.Subtask`, a realistic payload; the loader's output is checked to decode) in
   ``subtasks`` and their ids in ``waiting`` (FIFO scores), in product order: for each product, one subtask
   per site (the sites of ``product_crawl/data``). Redis ``used_memory`` before and after, divided by the
   count, is the memory per waiting subtask. Task records are written for the first 100,000 only and
   measured per record.
2. The nodes register through :meth:`Store.heartbeat` (types 0 and 1, prefetch 1), and every (site, node)
   pair gets run-control estimates of similar value in ``est:site:<site>``, the paper's moving estimates and the
   bandit's sums as the finish script writes them (so that either allocation knows every node, finds every
   node's rate above its floor and fills every free slot).
3. Two :class:`scheduler_ext.control.Control` are built directly over the same state (no splitter, the dynamic
   modification and recall), one per allocation, each in a process of its own (as a deployment runs its
   control: one process's memory, and so its garbage collector's work, holds one control's state), and tick in
   turn, one at a time. *Working ticks*: before each tick every node
   takes what it was given (:meth:`Store.take`), so each tick finds every slot free and must fill it
   (``allocated`` = nodes: a freed slot gets work within one tick). *Idle ticks*: nothing changed since the last
   tick.

The last line printed is one JSON object; it is also written to benchmarks/results/bench_control.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import pstats
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from product_crawl import services  # noqa: E402
from scheduler_ext.connection import redis_from_settings  # noqa: E402
from scheduler_ext.control import Control  # noqa: E402
from scheduler_ext.keys import Keys  # noqa: E402
from scheduler_ext.models import Subtask, Task  # noqa: E402
from scheduler_ext.store import Store  # noqa: E402
from scheduler_ext.strategies import Allocation  # noqa: E402
from scheduler_ext.strategies.allocation import DynamicAllocation  # noqa: E402
from scheduler_ext.strategies.bandit import BanditAllocation  # noqa: E402
from scheduler_ext.strategies.modification import RelativeModification  # noqa: E402
from scheduler_ext.strategies.recall import DynamicRecall  # noqa: E402

SIZES = ((200, 100_000), (1_000, 1_000_000))  # (nodes, waiting subtasks)
ALLOCATIONS = {"bandit": BanditAllocation, "dynamic": DynamicAllocation}  # the default first
TARGETS_MS = {(200, 100_000): 50.0, (1_000, 1_000_000): 250.0}  # the targets for the median working tick
WORK_TICKS = 8  # measured working ticks per size (after WARM_TICKS)
WARM_TICKS = 1  # the first tick takes the leader lease and loads every site's estimates; not measured
IDLE_TICKS = 10
TASK_RECORDS = 100_000
RESULTS = ROOT / "benchmarks" / "results" / "bench_control.json"
PROFILE_SORT = "tottime"

# Writes subtasks [ARGV[1], ARGV[2]) from a JSON template: @ID@, @TASK@, @P@ (product number), @SITE@, @TYPE@,
# @ENGINE@ are replaced per subtask. ARGV[3]: template; ARGV[4]: since; ARGV[5..]: "site type" per site.
# KEYS: subtasks, waiting.
BULK_LOAD = """
local first, last, template = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local sites, types = {}, {}
for i = 5, #ARGV do
  local site, t = string.match(ARGV[i], '^(%S+) (%d)$')
  table.insert(sites, site); table.insert(types, t)
end
local n = #sites
for i = first, last - 1 do
  local s = (i % n) + 1
  local product = tostring(math.floor(i / n))
  local id, task = tostring(2 * i + 2), tostring(2 * i + 1)
  local engine = types[s] == '1' and 'weibo' or 'baidu'
  local raw = string.gsub(template, '@(%u+)@', {ID = id, TASK = task, P = product, SITE = sites[s],
                                                TYPE = types[s], ENGINE = engine})
  redis.call('HSET', KEYS[1], id, raw)
  redis.call('ZADD', KEYS[2], 2 * i + 1, id)
end
return last - first
"""


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


def template(now: float) -> str:
    """The JSON of a subtask with @-markers where the bulk loader puts each subtask's own values."""
    st = Subtask(id="@ID@", task="@TASK@", site="@SITE@", group="光明高钙牛奶@P@", type=0, priority=1.0,
                 first_page=0, page_limit=5, time_limit=30.0, since=now,
                 payload={"engine": "@ENGINE@", "keywords": ["光明", "高钙", "牛奶@P@"],
                          "keywords_joined": "光明&高钙&牛奶@P@", "product": "光明高钙牛奶@P@"})
    return st.to_json().replace('"type":0', '"type":@TYPE@').replace('"priority":1.0', '"priority":@TASK@')


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def fill_waiting(store: Store, n: int, site_list: list[tuple[str, int]]) -> tuple[float, int, int]:
    """Fill ``n`` waiting subtasks; (seconds, bytes for subtasks + waiting, bytes per task record)."""
    k, client = store.keys, store.redis
    now = store.now()
    loader = client.register_script(BULK_LOAD)
    args_sites = [f"{site} {t}" for site, t in site_list]
    before = used_memory(client)
    t0 = time.perf_counter()
    for start in range(0, n, 50_000):
        loader(keys=[k.subtasks, k.waiting], args=[start, min(n, start + 50_000), template(now), now, *args_sites])
    seconds = time.perf_counter() - t0
    after = used_memory(client)
    for i in (0, 1, n // 2, n - 1):  # the loader writes exactly what a split would
        got = Subtask.from_json(client.hget(k.subtasks, str(2 * i + 2)))
        want = subtask_at(i, site_list, got.since)
        assert got == want, (got, want)
    records = min(n, TASK_RECORDS)
    for start in range(0, records, 10_000):
        tasks = {}
        for i in range(start, min(records, start + 10_000)):
            st = subtask_at(i, site_list, now)
            tasks[st.task] = Task(id=st.task, site=st.site, group=st.group, type=st.type,
                                  priority=st.priority, payload=st.payload, page_limit=5,
                                  time_limit=30.0).to_json()
        client.hset(k.tasks, mapping=tasks)
    with_tasks = used_memory(client)
    client.set(k.seq, 2 * n + 2)
    return seconds, after - before, (with_tasks - after) // records


def register_nodes(store: Store, count: int, site_list: list[tuple[str, int]]) -> list[str]:
    nodes = [f"node{i:04d}" for i in range(count)]
    for i, nid in enumerate(nodes):
        info = {"type": [0, 1], "prefetch": 1, "capacity": 1, "host": "bench", "pid": 10_000 + i,
                "address": f"127.0.{i // 250}.{i % 250 + 2}", "subtasks": []}
        store.heartbeat(nid, info, 600.0, [])
    # Estimates for every (site, node): similar rates, so every free node is above the allocation's floor.
    rng = random.Random(7)
    now = store.now()
    with store.redis.pipeline(transaction=False) as pipe:
        for site, _ in site_list:
            mapping = {}
            for nid in nodes:
                c, spp, pages = rng.uniform(0.85, 0.95), rng.uniform(0.45, 0.55), 20.0
                mapping[nid] = json.dumps({"c": c, "spp": spp, "runs": 5, "last": now, "n": 4.0, "pg": pages,
                                           "got": c * pages, "sec": spp * pages})
            pipe.hset(store.keys.est_site(site), mapping=mapping)
        pipe.execute()
    return nodes


def make_control(store: Store, allocation: Allocation) -> Control:
    return Control(store, splitter=None, allocation=allocation, modification=RelativeModification(),
                   recall=DynamicRecall(), control_id="bench-control")


def take_all(store: Store, nodes: list[str]) -> int:
    """Every node takes what its crawl queue holds (as a node's refill does), freeing its slot."""
    k, taken, left = store.keys, 0, list(nodes)
    while left:  # one pipelined round per queued subtask a node holds: setting up a tick must not outlast it
        with store.redis.pipeline(transaction=False) as pipe:
            for nid in left:
                store._take(keys=[k.crawl(nid), k.leases, k.lease_info, k.subtasks, k.failed, k.queued, k.seq,
                                  k.counters], args=[nid, 8, 600.0, 600.0], client=pipe)
            got = pipe.execute()
        left = [nid for nid, res in zip(left, got, strict=True) if res]
        taken += len(left)
    return taken


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
class Measured:
    """One allocation's control over a deployment, and what its ticks measured (in the control's process)."""

    control: Control
    work_ms: list[float] = field(default_factory=list)
    idle_ms: list[float] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=lambda: {"read": 0.0, "allocate": 0.0, "apply": 0.0})
    timed: bool = False

    def tick(self, kind: str) -> str:
        """One tick: ``work`` (measured), ``warm`` (not measured), ``idle`` (measured; must allocate nothing),
        ``fill`` (not measured) or ``profile`` (returns a cProfile of it)."""
        if kind == "work" and not self.timed:  # from the first measured working tick on
            _time_phase(self.control, "read", self.phases)
            _time_phase(self.control.allocation, "allocate", self.phases)
            _time_phase(self.control, "apply", self.phases)
            self.timed = True
        prof = cProfile.Profile() if kind == "profile" else None
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        r = self.control.tick()
        if prof is not None:
            prof.disable()
        ms = (time.perf_counter() - t0) * 1000
        if kind == "work":
            self.work_ms.append(ms)
            self.allocated.append(r.allocated)
        elif kind == "idle":
            self.idle_ms.append(ms)
            assert r.allocated == 0, "an idle tick allocated"
        if prof is None:
            return ""
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(PROFILE_SORT).print_stats(30)
        return buf.getvalue()

    def summary(self) -> dict[str, Any]:
        return {"tick_ms_median": round(statistics.median(self.work_ms), 1),
                "tick_ms_max": round(max(self.work_ms), 1),
                "allocated_per_tick": statistics.median(self.allocated),
                "read_ms_mean": round(self.phases["read"] * 1000 / WORK_TICKS, 1),
                "allocate_ms_mean": round(self.phases["allocate"] * 1000 / WORK_TICKS, 1),
                "apply_ms_mean": round(self.phases["apply"] * 1000 / WORK_TICKS, 1),
                "idle_tick_ms_median": round(statistics.median(self.idle_ms), 2),
                "estimate_reads_after_warm_up": self.control.estimates.reads}


def serve(conn: Connection, url: str, prefix: str, name: str) -> None:
    """A control's process: build the control, then tick as told (``conn``) until told to stop."""
    store = Store(redis_from_settings({"REDIS_URL": url}), Keys(prefix))
    m = Measured(make_control(store, ALLOCATIONS[name]()))
    while (kind := conn.recv()) != "stop":
        conn.send(m.summary() if kind == "summary" else m.tick(kind))
    store.redis.close()


class ControlProcess:
    """The parent's handle on one control's process."""

    def __init__(self, url: str, prefix: str, name: str) -> None:
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.get_context("spawn").Process(target=serve, args=(child, url, prefix, name),
                                                                 daemon=True)
        self.proc.start()

    def __call__(self, kind: str) -> Any:
        self.conn.send(kind)
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send("stop")
        self.proc.join(30)


@dataclass
class Deployment:
    """One size under test: its own key prefix, nodes, and a control process per allocation."""

    nodes_n: int
    n: int
    store: Store
    nodes: list[str]
    fill_s: float
    bytes_waiting: int
    bytes_task: int
    controls: dict[str, ControlProcess]


def setup(client: redis.Redis, url: str, nodes_n: int, n: int, site_list: list[tuple[str, int]]) -> Deployment:
    store = Store(client, Keys(f"{{bench-ctl-{nodes_n}-{n}}}"))
    fill_s, bytes_waiting, bytes_task = fill_waiting(store, n, site_list)
    nodes = register_nodes(store, nodes_n, site_list)
    controls = {name: ControlProcess(url, store.keys.prefix, name) for name in ALLOCATIONS}
    return Deployment(nodes_n, n, store, nodes, fill_s, bytes_waiting, bytes_task, controls)


def run_size(client: redis.Redis, url: str, nodes_n: int, n: int, site_list: list[tuple[str, int]],
             profile: bool) -> tuple[dict[str, Any], str]:
    d = setup(client, url, nodes_n, n, site_list)
    try:
        for i in range(WARM_TICKS + WORK_TICKS):
            for control in d.controls.values():  # interleaved: both allocations see the same machine load
                take_all(d.store, d.nodes)  # before each tick: every node takes what it was given
                control("work" if i >= WARM_TICKS else "warm")
        prof_text = ""
        if profile:
            for name, control in d.controls.items():
                take_all(d.store, d.nodes)
                prof_text += f"--- {name}\n{control('profile')}"
        take_all(d.store, d.nodes)
        for control in d.controls.values():  # fill every slot once, then nothing changes
            control("fill")
        for _ in range(IDLE_TICKS):
            for control in d.controls.values():
                control("idle")
        result: dict[str, Any] = {"nodes": nodes_n, "waiting": n, "fill_s": round(d.fill_s, 2),
                                  "redis_bytes_per_waiting_subtask": round(d.bytes_waiting / n, 1),
                                  "redis_bytes_per_task_record": d.bytes_task,
                                  "target_ms": TARGETS_MS.get((nodes_n, n))}
        for name, control in d.controls.items():
            result[name] = control("summary")
    finally:
        for control in d.controls.values():
            control.stop()
    d.store.purge()
    return result, prof_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(f"{a}:{b}" for a, b in SIZES),
                        help="nodes:waiting pairs, comma-separated (default: %(default)s)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one working tick")
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in pair.split(":")) for pair in args.sizes.split(",")]
    site_list = sites()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-control-") as d:
        port = services.free_port()
        proc = services.start_redis_server(port, Path(d) / "redis")
        url = f"redis://127.0.0.1:{port}/0"
        try:
            client = redis_from_settings({"REDIS_URL": url})
            client.config_set("appendonly", "no")  # the fill is not what is measured; AOF rewrites would be
            for i, (nodes_n, n) in enumerate(sizes):
                r, prof = run_size(client, url, nodes_n, n, site_list, args.profile and i == len(sizes) - 1)
                runs.append(r)
                if prof:
                    print(prof)
            client.close()
        finally:
            services.stop_pid(proc.pid)
    print(f"redis-server {url} (private), {len(site_list)} sites, every node with estimates for every site, "
          "the dynamic modification and recall")
    for r in runs:
        target = f" (target <= {r['target_ms']:.0f} ms)" if r["target_ms"] else ""
        print(f"{r['nodes']:>5,} nodes, {r['waiting']:>9,} waiting{target}: fill {r['fill_s']:.1f} s; "
              f"{r['redis_bytes_per_waiting_subtask']:.0f} B per waiting subtask "
              f"(+{r['redis_bytes_per_task_record']} B per task record)")
        for name in ALLOCATIONS:
            a = r[name]
            print(f"   {name:>8}: working tick median {a['tick_ms_median']:.1f} ms, max {a['tick_ms_max']:.1f}, "
                  f"{a['allocated_per_tick']:.0f} allocated per tick; idle tick {a['idle_tick_ms_median']:.2f} ms; "
                  f"read {a['read_ms_mean']:.0f} ms, allocation strategy {a['allocate_ms_mean']:.0f} ms, apply "
                  f"{a['apply_ms_mean']:.0f} ms (means); {a['estimate_reads_after_warm_up']} estimate reads")
    out = {"runs": runs}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
