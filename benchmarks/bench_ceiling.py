"""What the cheapest crawler collects when it is told the best possible's own schedule: how reachable the bound is.

Run: ``.venv/bin/python benchmarks/bench_ceiling.py [--duration 90] [--profile paper] [--seed 0]``; writes
benchmarks/results/bench_ceiling.json.

The best possible of an experiment (``scheduler_ext/sim/bound.py``) assigns, phase by phase, each node to one site;
it charges no per-request time but the profile's latency, and on the ``paper`` profile its machine row no longer
binds: it is each node's 8 page slots at its best site's latency. This benchmark runs that schedule with no
scheduling at all: one plain Scrapy process per node (``scrapy crawl plain_search``: every page a start request,
the project's parser, ``MongoPipeline`` into a private nx-27017), bound to the node's loopback address, crawling
every result page of the experiment's products on the site the bound assigned it (page-major), against the same
simulated web, for ``--duration`` seconds from its first page served. Its unique items over the best possible
is the share of the bound that perfect knowledge and no scheduling overhead reach on this machine: what
separates the bound from any real crawl of it (requests in transit, the reactor's and the web's turns on a shared
2-core machine, the results' storage), none of which the bound charges.

It needs the bound's assignment to be the same in every phase (true of ``paper``: the pairs that change at 40 s
are no node's best); otherwise it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from product_crawl import services  # noqa: E402
from product_crawl.engines.baidu import BaiduEngine  # noqa: E402
from product_crawl.experiment import runner, sim  # noqa: E402
from product_crawl.experiment.machine import plain_crawler, plain_env, served, stop, web_counters  # noqa: E402
from product_crawl.simweb import SimWebProcess  # noqa: E402
from product_crawl.tasks import keywords_for  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "bench_ceiling.json"
PAGE_SIZE = 10


def pages_of(site: str, totals: dict[str, dict[str, int]], base_url: str) -> list[dict[str, Any]]:
    """Every result page of every product on ``site``, page-major, with the product in meta (as the nodes store)."""
    engine = BaiduEngine(base_url)
    products = {p["name"]: keywords_for(p["name"], p.get("brand")) for p in runner.PRODUCTS}
    depth = {name: math.ceil(totals[name].get(site, 0) / PAGE_SIZE) for name in products}
    return [{"url": engine.page_url(words, site, page), "meta": {"product": name, "page": page}}
            for page in range(max(depth.values(), default=0)) for name, words in products.items()
            if page < depth[name]]


def in_flight(counters: dict[str, Any], addresses: dict[str, str], plan: dict[str, str]) -> dict[str, Any]:
    """Per node, from the web's counters over the whole crawl: requests, the mean seconds the web held one (its
    latency) and how many of the node's requests it held at once on average (its busy time over the crawl's)."""
    out = {}
    for node in plan:
        a = addresses[node]
        requests = counters["by_address"].get(a, {}).get("requests", 0)
        busy = counters.get("busy_ms", {}).get(a, 0) / 1000
        out[node] = {"requests": requests, "web_latency": round(busy / max(1, requests), 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=90.0)
    parser.add_argument("--profile", default="paper")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    opts = runner.make_options(profile=args.profile, duration=args.duration, strategies="dynamic", seed=args.seed)
    totals = runner.corpus_totals(opts.profile, opts.sites, opts.seed)
    bound = sim.best_possible(opts, totals, assignments=True)
    plans = bound["assignments"]
    if any(plan != plans[0] for plan in plans):
        raise SystemExit(f"the best possible changes its assignment between phases ({plans}): not a static plan")
    plan = plans[0]
    addresses = {n.id: n.address for n in opts.nodes}
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as d:
        tmp = Path(d)
        port = services.free_port()
        mongo_proc = services.start_mongo_server(port, tmp / "mongo")
        uri = f"mongodb://127.0.0.1:{port}"
        env = plain_env(uri, "bench_ceiling")
        procs: list[subprocess.Popen[bytes]] = []
        import pymongo

        mongo: Any = pymongo.MongoClient(uri, serverSelectionTimeoutMS=5000)
        try:
            with SimWebProcess(opts.profile_spec, seed=args.seed) as web, open(tmp / "crawl.log", "wb") as log:
                for node, site in sorted(plan.items()):
                    procs.append(plain_crawler(web.url, pages_of(site, totals, web.url), tmp / f"{node}.json",
                                               addresses[node], env, log))
                deadline = time.monotonic() + 120
                while served(web.url) == 0:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                        raise RuntimeError(f"plain Scrapy did not start; see {tmp}/crawl.log")
                    time.sleep(0.02)
                items = mongo["bench_ceiling"]["items"]
                c0, i0, t0 = served(web.url), items.estimated_document_count(), time.monotonic()
                time.sleep(args.duration)
                counters, i1, t1 = web_counters(web.url), items.estimated_document_count(), time.monotonic()
                c1 = served(web.url, counters)
        finally:
            stop(procs)
            mongo.close()
            services.stop_pid(mongo_proc.pid)
    seconds = t1 - t0
    collected = round((i1 - i0) * args.duration / seconds)
    out = {"profile": args.profile, "seed": args.seed, "duration": args.duration, "plan": plan,
           "best_possible": bound["items"], "unique_items": collected, "pages_per_s": round((c1 - c0) / seconds, 1),
           "vs_best": round(collected / bound["items"], 3), "web": in_flight(counters, addresses, plan)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"plain Scrapy on the best possible's plan {plan}: {collected} unique items in {args.duration:.0f} s, "
          f"{out['pages_per_s']} pages/s; best possible {bound['items']}: {out['vs_best']:.2f} of it; per node "
          + ", ".join(f"{n} {w['requests']} requests at {1000 * w['web_latency']:.0f} ms"
                      for n, w in out["web"].items()))
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
