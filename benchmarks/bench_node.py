"""Pages per second of one crawl node: plain Scrapy, scrapy-redis and ours, on the same result pages.

Run: ``.venv/bin/python benchmarks/bench_node.py [--seconds 30] [--rounds 2]`` (or ``make bench``);
docs/benchmarks.md explains it.

Three sides, each one process bound to 127.0.0.2, each with default Scrapy concurrency and no tuning:

a. **plain Scrapy**: ``scrapy crawl plain_search`` (product_crawl/spiders/plain_search.py), a ``scrapy.Spider``
   whose start requests are every result page of the workload, parsed by the same engine into the same items;
b. **scrapy-redis**: one ``scrapy crawl redis_search`` node (``RedisSpider``, scrapy-redis's scheduler, queue and
   dupefilter, JSON serializer), its start-URL list fed the same page URLs;
c. **ours**: one ``scrapy crawl search`` node and one ``scrapy crawl control``, both at default settings, given the
   workload's products as virtual tasks (so the control splits, allocates and modifies as in production).

All three store through the same ``MongoPipeline`` into a private ``nx-27017``. The workload: 8 products x the 5
sites of the paper's profile, Baidu engine. Two profiles of the simulated web: ``fast`` (every page served in
50 ms, all results, no errors) and ``paper`` (the paper profile's shares and latencies for 127.0.0.2, errors and
captchas off so that all three sides do the same work). Per profile, the sides take turns (a, b, c, a, b, c, ...),
each on a fresh simulated web, Redis prefix and database; a side's rate is the pages the web answered to 127.0.0.2
in a window of ``--seconds`` that opens at its first request (start-up excluded, ramp-up included), averaged over
the rounds. Peak RSS is ``VmHWM`` of the node process (the control's is reported apart).

The last line printed is one JSON object; it is also written to benchmarks/results/bench_node.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from product_crawl import services  # noqa: E402
from product_crawl.experiment.machine import PRODUCTS, SCRAPY, SITES, cpu_seconds, page_entries, stop  # noqa: E402
from product_crawl.simweb import SimWebProcess  # noqa: E402
from product_crawl.tasks import parse_virtual_task  # noqa: E402

ADDRESS = "127.0.0.2"
PAGES = 120  # result pages per query fed to (a) and (b): more than any side crawls in the window
SIDES = ("plain", "scrapy_redis", "ours")
RESULTS = ROOT / "benchmarks" / "results" / "bench_node.json"


def fast_profile() -> dict[str, Any]:
    return {"name": "bench-fast", "corpus": {"min": 3000, "max": 6000},
            "default": {"share": 1.0, "latency": {"mean": 0.05, "spread": 0.0}, "error_rate": 0.0, "block_rate": 0.0}}


def paper_profile() -> dict[str, Any]:
    """The paper profile with errors and captchas off: its shares and latencies, per node and site."""
    raw = json.loads((ROOT / "product_crawl" / "simweb" / "profiles" / "paper.json").read_text())

    def clean(rule: dict[str, Any]) -> None:
        for key in ("error_rate", "block_rate"):
            if key in rule:
                rule[key] = 0.0
        for phase in rule.get("phases", []):
            clean(phase)
        for site_rule in rule.get("sites", {}).values():
            clean(site_rule)

    clean(raw["default"])
    for node in raw["nodes"].values():
        clean(node)
    raw["name"] = "bench-paper"
    return dict(raw)


# --- running one side --------------------------------------------------------------------------------------


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _served(web_url: str) -> int:
    with urllib.request.urlopen(f"{web_url}/_counters", timeout=5) as r:
        counters = json.loads(r.read())
    return int(counters.get("by_address", {}).get(ADDRESS, {}).get("requests", 0))


def run_side(side: str, profile: Path, seconds: float, *, redis_url: str, mongo_uri: str, tmp: Path,
             n: int) -> dict[str, Any]:
    import redis

    prefix, database = f"{{bench-node-{n}}}", f"bench_node_{n}"
    env = {**os.environ, "SCRAPY_SETTINGS_MODULE": "product_crawl.settings", "REDIS_URL": redis_url,
           "MONGO_URI": mongo_uri, "MONGO_DATABASE": database, "PC_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    procs: list[subprocess.Popen[bytes]] = []
    logs = []

    def spawn(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(tmp / f"{n}-{name}.log", "wb")  # noqa: SIM115 (closed below)
        logs.append(log)
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        with SimWebProcess(profile, seed=1) as web:
            common = ["-s", f"PC_ENGINE_BASE_URLS={json.dumps({'baidu': web.url, 'weibo': web.url})}"]
            if side == "plain":
                pages = tmp / f"{n}-pages.json"
                pages.write_text(json.dumps(page_entries(web.url, PAGES), ensure_ascii=False))
                node = spawn("node", [SCRAPY, "crawl", "plain_search", *common, "-s", f"PC_PLAIN_PAGES={pages}",
                                      "-s", f"DOWNLOAD_BIND_ADDRESS={ADDRESS}"])
            elif side == "scrapy_redis":
                key = f"{prefix}:start_urls"
                entries = page_entries(web.url, PAGES)
                for i in range(0, len(entries), 1000):
                    client.rpush(key, *[json.dumps(e, ensure_ascii=False) for e in entries[i:i + 1000]])
                node = spawn("node", [SCRAPY, "crawl", "redis_search", *common, "-s", f"REDIS_START_URLS_KEY={key}",
                                      "-s", f"SCHEDULER_QUEUE_KEY={prefix}:requests",
                                      "-s", f"SCHEDULER_DUPEFILTER_KEY={prefix}:dupefilter",
                                      "-s", f"DOWNLOAD_BIND_ADDRESS={ADDRESS}", "-s", "SCHEDEXT_NODE_ID=node1"])
            else:
                from scheduler_ext.keys import Keys

                for product in PRODUCTS:
                    vt = parse_virtual_task({"name": product, "type": 0, "sites": list(SITES), "engines": ["baidu"]})
                    client.lpush(Keys(prefix).virtual, vt.to_json())
                ours = [*common, "-s", f"SCHEDEXT_PREFIX={prefix}"]
                node = spawn("node", [SCRAPY, "crawl", "search", *ours, "-s", "SCHEDEXT_NODE_ID=node1",
                                      "-s", f"SCHEDEXT_BIND_ADDRESS={ADDRESS}", "-s", "SCHEDEXT_NODE_TYPE=0"])
                spawn("control", [SCRAPY, "crawl", "control", *ours])
            deadline = time.monotonic() + 120
            while _served(web.url) == 0:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"{side} did not start; see {tmp}/{n}-*.log")
                time.sleep(0.05)
            t0, c0, cpu0 = time.monotonic(), _served(web.url), [cpu_seconds(p.pid) for p in procs]
            time.sleep(seconds)
            c1, t1, cpu1 = _served(web.url), time.monotonic(), [cpu_seconds(p.pid) for p in procs]
            rss = _status_kb(node.pid, "VmHWM")
            control_rss = _status_kb(procs[1].pid, "VmHWM") if len(procs) > 1 else 0
    finally:
        stop(procs)
        for log in logs:
            log.close()
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    import pymongo

    mongo: Any = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    items = int(mongo[database]["items"].estimated_document_count())
    mongo.drop_database(database)
    mongo.close()
    cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    return {"pages_per_s": (c1 - c0) / (t1 - t0), "peak_rss_mb": rss / 1024, "control_rss_mb": control_rss / 1024,
            "items": items, "node_cpu_ms_per_page": 1000 * cpu[0] / max(1, c1 - c0),
            "node_cpu_share": cpu[0] / (t1 - t0), "control_cpu_share": sum(cpu[1:]) / (t1 - t0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per run (default 30)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side per profile (default 2)")
    parser.add_argument("--profiles", default="fast,paper", help="fast, paper or both (default)")
    args = parser.parse_args()
    out: dict[str, Any] = {"seconds": args.seconds, "rounds": args.rounds, "address": ADDRESS,
                           "queries": len(PRODUCTS) * len(SITES)}
    with tempfile.TemporaryDirectory(prefix="bench-node-") as d:
        tmp = Path(d)
        redis_port, mongo_port = services.free_port(), services.free_port()
        redis_proc = services.start_redis_server(redis_port, tmp / "redis")
        mongo_proc = services.start_mongo_server(mongo_port, tmp / "mongo")
        urls = {"redis_url": f"redis://127.0.0.1:{redis_port}/0", "mongo_uri": f"mongodb://127.0.0.1:{mongo_port}"}
        n = 0
        try:
            for name in args.profiles.split(","):
                profile = tmp / f"{name}.json"
                profile.write_text(json.dumps({"fast": fast_profile, "paper": paper_profile}[name]()))
                runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
                for r in range(args.rounds):
                    for side in SIDES:
                        n += 1
                        res = run_side(side, profile, args.seconds, tmp=tmp, n=n, **urls)
                        runs[side].append(res)
                        print(f"{name} round {r + 1} {side:>12}: {res['pages_per_s']:6.1f} pages/s, "
                              f"{res['items']} items, peak RSS {res['peak_rss_mb']:.0f} MB", flush=True)
                summary = {side: {"pages_per_s": round(sum(x["pages_per_s"] for x in v) / len(v), 1),
                                  "runs": [round(x["pages_per_s"], 1) for x in v],
                                  "node_cpu_ms_per_page": round(sum(x["node_cpu_ms_per_page"] for x in v) / len(v), 2),
                                  "node_cpu_share": round(sum(x["node_cpu_share"] for x in v) / len(v), 2),
                                  "peak_rss_mb": round(max(x["peak_rss_mb"] for x in v), 1)}
                           for side, v in runs.items()}
                summary["ours"]["control_rss_mb"] = round(max(x["control_rss_mb"] for x in runs["ours"]), 1)
                summary["ours"]["control_cpu_share"] = round(
                    sum(x["control_cpu_share"] for x in runs["ours"]) / len(runs["ours"]), 3)
                plain = summary["plain"]["pages_per_s"] or 1.0
                summary["ratio_ours_plain"] = round(summary["ours"]["pages_per_s"] / plain, 2)
                summary["ratio_scrapy_redis_plain"] = round(summary["scrapy_redis"]["pages_per_s"] / plain, 2)
                summary["ratio_ours_scrapy_redis"] = round(
                    summary["ours"]["pages_per_s"] / (summary["scrapy_redis"]["pages_per_s"] or 1.0), 2)
                out[name] = summary
                RESULTS.parent.mkdir(parents=True, exist_ok=True)
                RESULTS.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")  # what is done so far
                print(f"{name}: ours / plain Scrapy {summary['ratio_ours_plain']:.2f}x (goal >= 0.9), "
                      f"ours / scrapy-redis {summary['ratio_ours_scrapy_redis']:.2f}x (goal > 1)", flush=True)
        finally:
            services.stop_pid(redis_proc.pid)
            services.stop_pid(mongo_proc.pid)
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # finally blocks stop the servers
    main()
