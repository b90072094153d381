"""The CPU a page and an item cost on this machine, for the cheapest crawler: the machine model of the best possible.

Run: ``.venv/bin/python benchmarks/bench_machine.py [--seconds 20] [--rounds 3] [--processes 4]``; writes
benchmarks/results/bench_machine.json, which :mod:`scheduler_ext.sim.bound` reads (``MACHINE``).

The cheapest crawler is plain Scrapy (``scrapy crawl plain_search``: every result page a start request, no
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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from product_crawl.experiment import machine  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bench_machine.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4, help="plain Scrapy processes at once (the run's nodes)")
    args = parser.parse_args()
    rounds = []
    for r in range(args.rounds):
        costs, runs = machine.measure(args.seconds, args.processes)
        rounds.append({"page_cpu": costs.page_cpu, "item_cpu": costs.item_cpu, "node_page_cpu": costs.node_page_cpu,
                       "node_item_cpu": costs.node_item_cpu, "runs": runs})
        print(f"round {r + 1}: page {1000 * costs.page_cpu:.2f} ms, item {1000 * costs.item_cpu:.3f} ms, a crawler "
              f"process {1000 * costs.node_page_cpu:.2f} ms a page, {1000 * costs.node_item_cpu:.3f} ms an item; "
              + "; ".join(f"{x['pages'] / x['seconds']:.0f} pages/s, {x['items'] / max(1, x['pages']):.1f} items/page,"
                          f" cpu node {x['node_cpu']:.1f} web {x['web_cpu']:.1f} mongo {x['mongo_cpu']:.1f} s"
                          for x in runs), flush=True)
    # The cheapest round (lowest cost of a full page of 10 items), and the lowest node-alone figure.
    best = min(rounds, key=lambda x: x["page_cpu"] + 10 * x["item_cpu"])
    out = {"seconds": args.seconds, "rounds": args.rounds, "processes": args.processes, "cores": os.cpu_count(),
           "page_cpu": round(best["page_cpu"], 5), "item_cpu": round(best["item_cpu"], 6),
           "node_page_cpu": round(best["node_page_cpu"], 5), "node_item_cpu": round(best["node_item_cpu"], 6),
           "per_round": [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in x.items()} for x in rounds]}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "per_round"}))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
