"""The CPU a page and an item cost on this machine, for the cheapest crawler: the machine model of the best possible.

Run: ``.venv/bin/python benchmarks/bench_machine.py [--seconds 20] [--rounds 3] [--processes 4]``; writes
benchmarks/results/bench_machine.json, which :mod:`scheduler_ext.sim.bound` reads (``MACHINE``).

The cheapest crawler is plain Scrapy (``bench_node.PlainSearchSpider``: every result page a start request, no
scheduling, no Redis, with the node's ``CONCURRENT_ITEMS``, cheaper a page than Scrapy's default) parsing the
pages with the project's engine and storing the items through the same ``MongoPipeline`` into a private
``nx-27017``, against the same simulated web. It runs as ``--processes`` processes at once (default 4, the nodes of
the ``paper`` profile, each bound to its own loopback address, each given its share of the pages), because the
bound charges the pages of that many nodes sharing the machine: a page costs more CPU when four crawlers, the web
and the storage take turns on two cores than when one crawler has the machine to itself (measured 2026-12-02: 7.8
to 8.2 ms against 6.8 ms of CPU a page of 9.2 items). A crawl of the simulated web cannot do without any of the
three kinds of process, so the CPU a page costs is the sum of their CPU (user + system, every thread and child
process), measured over a window of ``--seconds`` while the crawlers go as fast as they can:

* ``fast`` profile: every page served in 50 ms, all 10 results (10 items a page);
* ``sparse`` profile: the same, 20 % of the results served (2 items a page).

Two profiles give two equations, ``cpu = pages x page_cpu + items x item_cpu``, solved for the cost of a page
(request, response, parse: node and web) and of an item (pipeline, storage: node and MongoDB). Each round runs both
profiles; the figures kept are the *lowest* per round (the cheapest this machine did: a loaded machine makes CPU
time dearer, never cheaper), so that a bound built on them stays an upper bound. Also reported: a crawler
process's own CPU a page and an item, which bound one node's pages per second (one Python process: one core at
most).

Re-run it whenever the parser, the pipeline or the storage change: they are the cheapest crawler's too, and a
stale figure makes the bound wrong in either direction.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_node import SCRAPY, _cpu_seconds, page_entries, stop  # noqa: E402

from product_crawl import services  # noqa: E402
from product_crawl.simweb import SimWebProcess  # noqa: E402
from scheduler_ext.addon import NODE_CONCURRENT_ITEMS  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bench_machine.json"
BENCH_NODE = ROOT / "benchmarks" / "bench_node.py"


def profile(share: float) -> dict[str, Any]:
    return {"name": f"bench-machine-{share}", "corpus": {"min": 3000, "max": 6000},
            "default": {"share": share, "latency": {"mean": 0.05, "spread": 0.0}, "error_rate": 0.0,
                        "block_rate": 0.0}}


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (nx-27017 may run its work in a child)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # the process ended meanwhile
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def plain_env(mongo_uri: str, database: str) -> dict[str, str]:
    """The environment of a plain Scrapy crawler storing into ``database``."""
    return {**os.environ, "SCRAPY_SETTINGS_MODULE": "product_crawl.settings", "MONGO_URI": mongo_uri,
            "MONGO_DATABASE": database, "PC_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}


def plain_crawler(web_url: str, entries: list[dict[str, Any]], pages: Path, address: str, env: dict[str, str],
                  log: Any) -> subprocess.Popen[bytes]:
    """The cheapest crawler (``bench_node.PlainSearchSpider``) crawling ``entries`` (written to ``pages``) from
    ``address``, with the node's ``CONCURRENT_ITEMS``."""
    pages.write_text(json.dumps(entries, ensure_ascii=False))
    return subprocess.Popen(
        [SCRAPY, "runspider", str(BENCH_NODE), "-s",
         f"PC_ENGINE_BASE_URLS={json.dumps({'baidu': web_url, 'weibo': web_url})}",
         "-s", f"BENCH_PAGES={pages}", "-s", f"DOWNLOAD_BIND_ADDRESS={address}",
         "-s", f"CONCURRENT_ITEMS={NODE_CONCURRENT_ITEMS}"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def cpu(pids: list[int]) -> float:
    return sum(_cpu_seconds(p) for p in pids)


def web_counters(web_url: str) -> dict[str, Any]:
    """The simulated web's counters (``/_counters``)."""
    with urllib.request.urlopen(f"{web_url}/_counters", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def served(web_url: str, counters: dict[str, Any] | None = None) -> int:
    """Search requests the web has answered so far, from every address (from ``counters`` if given)."""
    counters = web_counters(web_url) if counters is None else counters
    return sum(int(c.get("requests", 0)) for c in counters.get("by_address", {}).values())


def run(share: float, seconds: float, tmp: Path, n: int, mongo_uri: str, mongo_pid: int,
        processes: int) -> dict[str, float]:
    import pymongo

    path = tmp / f"{n}.json"
    path.write_text(json.dumps(profile(share)))
    database = f"bench_machine_{n}"
    env = plain_env(mongo_uri, database)
    mongo: Any = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    nodes: list[subprocess.Popen[bytes]] = []
    with SimWebProcess(path, seed=1) as web, open(tmp / f"{n}.log", "wb") as log:
        assert web.proc is not None
        entries = page_entries(web.url)
        try:
            for i in range(processes):  # each its own address and every processes-th page
                nodes.append(plain_crawler(web.url, entries[i::processes], tmp / f"{n}-{i}-pages.json",
                                           f"127.0.0.{2 + i}", env, log))
            deadline = time.monotonic() + 120
            while served(web.url) < 200 * processes:  # past the start-up
                if time.monotonic() > deadline or any(node.poll() is not None for node in nodes):
                    raise RuntimeError(f"plain Scrapy did not start; see {tmp}/{n}.log")
                time.sleep(0.05)
            groups = {"node": [p for node in nodes for p in tree(node.pid)], "web": tree(web.proc.pid),
                      "mongo": tree(mongo_pid)}
            items0 = mongo[database]["items"].estimated_document_count()
            c0, t0, cpu0 = served(web.url), time.monotonic(), {k: cpu(v) for k, v in groups.items()}
            time.sleep(seconds)
            c1, t1, cpu1 = served(web.url), time.monotonic(), {k: cpu(v) for k, v in groups.items()}
            items1 = mongo[database]["items"].estimated_document_count()
        finally:
            stop(nodes)
    mongo.drop_database(database)
    mongo.close()
    used = {k: cpu1[k] - cpu0[k] for k in cpu0}
    return {"pages": c1 - c0, "items": items1 - items0, "seconds": t1 - t0, **{f"{k}_cpu": v for k, v in used.items()}}


def solve(a: dict[str, float], b: dict[str, float], parts: tuple[str, ...]) -> tuple[float, float]:
    """(CPU seconds a page, CPU seconds an item) of ``parts`` from two runs with different items per page."""
    ca, cb = sum(a[f"{p}_cpu"] for p in parts), sum(b[f"{p}_cpu"] for p in parts)
    det = a["pages"] * b["items"] - b["pages"] * a["items"]
    page = (ca * b["items"] - cb * a["items"]) / det
    item = (a["pages"] * cb - b["pages"] * ca) / det
    return page, item


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4, help="plain Scrapy processes at once (the run's nodes)")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-machine-") as d:
        tmp = Path(d)
        port = services.free_port()
        mongo_proc = services.start_mongo_server(port, tmp / "mongo")
        try:
            n = 0
            for r in range(args.rounds):
                runs = []
                for share in (1.0, 0.2):
                    n += 1
                    runs.append(run(share, args.seconds, tmp, n, f"mongodb://127.0.0.1:{port}", mongo_proc.pid,
                                    args.processes))
                page, item = solve(runs[0], runs[1], ("node", "web", "mongo"))
                node_page, node_item = solve(runs[0], runs[1], ("node",))
                one = {"page_cpu": page, "item_cpu": item, "node_page_cpu": node_page, "node_item_cpu": node_item,
                       "runs": runs}
                rounds.append(one)
                print(f"round {r + 1}: page {1000 * page:.2f} ms, item {1000 * item:.3f} ms, a crawler process "
                      f"{1000 * node_page:.2f} ms a page, {1000 * node_item:.3f} ms an item; " + "; ".join(
                          f"{x['pages'] / x['seconds']:.0f} pages/s, {x['items'] / max(1, x['pages']):.1f} items/page,"
                          f" cpu node {x['node_cpu']:.1f} web {x['web_cpu']:.1f} mongo {x['mongo_cpu']:.1f} s"
                          for x in runs), flush=True)
        finally:
            services.stop_pid(mongo_proc.pid)
    # The cheapest round (lowest cost of a full page of 10 items), and the lowest node-alone figure.
    best = min(rounds, key=lambda x: x["page_cpu"] + 10 * x["item_cpu"])
    out = {"seconds": args.seconds, "rounds": args.rounds, "processes": args.processes, "cores": os.cpu_count(),
           "page_cpu": round(best["page_cpu"], 5), "item_cpu": round(max(0.0, best["item_cpu"]), 6),
           "node_page_cpu": round(best["node_page_cpu"], 5), "node_item_cpu": round(max(0.0, best["node_item_cpu"]), 6),
           "per_round": [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in x.items()} for x in rounds]}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "per_round"}))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
