"""Random faults for several minutes against a real cluster; reports what it did and what held.

Run: ``.venv/bin/python benchmarks/chaos.py [--minutes 5] [--seed 1] [--nodes 3] [--controls 2]``.

The cluster (nodes, controls, the simulated web with a profile under which every node is served every result) runs
on a Redis and a MongoDB of its own (product_crawl/faults.py). Every few seconds a wave of virtual tasks is
injected and a fault is drawn at random: kill -9 of a node (started again), SIGSTOP of a node until its work is
recalled, kill -9 of the leader (started again), kill -9 of Redis with a restart from its AOF, MongoDB stopped
for 5 to 20 s. After the last fault the run waits for every task to be done and compares the stored items with
the truth. The last line printed is one JSON object; it is also written to benchmarks/results/chaos.json.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from product_crawl import faults  # noqa: E402
from product_crawl.cluster import LocalCluster, NodeSpec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "chaos.json"
SETTINGS = {"SCHEDEXT_HEARTBEAT_INTERVAL": 0.5, "SCHEDEXT_REFILL_INTERVAL": 0.2, "SCHEDEXT_TICK_INTERVAL": 0.3,
            "SCHEDEXT_STATS_FLUSH_INTERVAL": 1, "SCHEDEXT_LEADER_TTL": 2, "SCHEDEXT_RECALL_THRESHOLD": 4,
            "SCHEDEXT_LEASE_GRACE": 2, "SCHEDEXT_PATIENCE": 1, "SCHEDEXT_BACKOFF_MAX": 2, "SCHEDEXT_RECALL_MAX": 10,
            "PC_MONGO_TIMEOUT": 5, "PC_MONGO_BATCH_DELAY": 0.05, "LOG_LEVEL": "INFO",
            "SCHEDEXT_ALLOCATION": "scheduler_ext.strategies.allocation.SharedAllocation"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long faults are drawn (default 5)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--controls", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    lease_ttl = float(SETTINGS["SCHEDEXT_RECALL_THRESHOLD"])
    nodes = [NodeSpec(f"node{i}", f"127.0.0.{i + 1}") for i in range(1, args.nodes + 1)]
    controls = tuple(f"control-{chr(ord('a') + i)}" for i in range(args.controls))
    specs = {n.id: n for n in nodes}
    done: list[dict[str, Any]] = []
    queries: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp)
        svc = faults.PrivateServices(root / "services")
        profile = root / "profile.json"
        profile.write_text(json.dumps(faults.EVERYONE_SERVED))
        cluster = LocalCluster(redis_url=svc.redis_url, mongo_uri=svc.mongo_uri, mongo_db="chaos",
                               prefix="{chaos}", log_dir=root / "logs", settings=dict(SETTINGS))
        try:
            cluster.start_simweb(profile)
            for node in nodes:
                cluster.start_node(node)
            for name in controls:
                cluster.start_control(name)
            menu = {
                "kill -9 node": lambda: faults.kill_node(cluster, specs, lease_ttl),
                "SIGSTOP node": lambda: faults.stop_node(cluster, lease_ttl),
                "kill -9 leader": lambda: faults.kill_leader(cluster, controls),
                "kill -9 redis": lambda: faults.kill_redis(cluster, svc, rng.uniform(1, 5)),
                "MongoDB down": lambda: faults.stop_mongo(svc, rng.uniform(5, 20)),
            }
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.minutes * 60:
                queries.extend(faults.quietly(lambda: faults.inject_wave(cluster, len(queries)), []))
                time.sleep(rng.uniform(1, 4))
                name = rng.choice(sorted(menu))
                started = time.monotonic() - t0
                what = menu[name]()
                done.append({"at_s": round(started, 1), "fault": name, "what": what})
                print(f"{started:7.1f} s  {what}", flush=True)
            finished = cluster.wait_for(lambda: faults.all_done(cluster), 600, 1)
            result = faults.outcome(cluster, queries)
            result["finished_within_10_min_of_the_last_fault"] = finished
        finally:
            cluster.stop()
            svc.stop()
    out = {"seed": args.seed, "minutes": args.minutes, "nodes": args.nodes, "controls": args.controls,
           "faults": done, "queries": len(queries), **result}
    print(f"{len(done)} faults over {args.minutes:g} min, {len(queries)} queries: "
          f"{result['unique_items']} unique items stored of {result['expected_items']} expected, "
          f"{result['duplicates']} duplicates, {len(result['dead_letters'])} dead letters, "
          f"{result['recalled']} recalls, {result['stale_finishes']} stale finishes: "
          f"{'HELD' if result['held'] else 'DID NOT HOLD'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
