"""``scrapy demo``: the whole system on one machine, on embedded defaults, in about two minutes.

Services (embedded Redis and MongoDB unless REDIS_URL / MONGO_URI are set), the simulated web with the ``paper``
profile, four crawl nodes (``scrapy crawl search`` bound to 127.0.0.2-127.0.0.5, both node types) and the control
(``scrapy crawl control``); the four dairy products of the paper's Table 2 injected for the profile's five sites
(Baidu for every site, plus Weibo search for weibo.com); a live progress line; at the end a summary (items in
MongoDB, completion per site and node, moved / modified / recalled per node), also written as JSON; then
everything it started is stopped. Its state lives under the ``{demo}`` prefix and the ``product_crawl_demo``
database, cleared at the start.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from scrapy.commands import ScrapyCommand

from product_crawl.cluster import PROJECT_DIR, LocalCluster, paper_nodes
from product_crawl.commands._base import write_error, write_line
from product_crawl.commands.status import render, table
from product_crawl.dashboard.server import DashboardProcess
from product_crawl.services import DEFAULT_MONGO_URI, ServiceError, Services, mask_url, real, tcp_port

PRODUCTS: list[dict[str, Any]] = [{"name": "光明高钙牛奶"}, {"name": "特仑苏", "brand": "蒙牛"}, {"name": "蒙牛早餐奶"},
                                  {"name": "雀巢中老年奶粉"}]
PREFIX = "{demo}"  # the demo's Redis key prefix (and, product_crawl_demo, its database)
SITES = ["12315.com", "315tousu.org", "t.163.com", "cca.org.cn", "weibo.com"]
# Shorter intervals than production so that two minutes show every mechanism (documented in docs/settings.md).
DEMO_SETTINGS = {"SCHEDEXT_HEARTBEAT_INTERVAL": 2, "SCHEDEXT_RECALL_THRESHOLD": 20, "SCHEDEXT_TICK_INTERVAL": 0.5,
                 "SCHEDEXT_PATIENCE": 10, "LOG_LEVEL": "INFO"}
MIN_DURATION, MAX_DURATION = 10.0, 86400.0
"""Bounds of ``--duration``, in seconds: long enough to see a tick, at most a day."""


def demo_tasks() -> list[dict[str, Any]]:
    tasks = [{**p, "sites": SITES, "engines": ["baidu"]} for p in PRODUCTS]
    return tasks + [{**p, "type": 1, "sites": ["weibo.com"], "engines": ["weibo"]} for p in PRODUCTS]


def summarize(cluster: LocalCluster, elapsed: float) -> dict[str, Any]:
    status = cluster.status()
    return {"v": 1, "elapsed": round(elapsed, 1), "items": cluster.items(),
            "items_by_product": cluster.items_by("product"), "items_by_node": cluster.items_by("node_id"),
            "status": status}


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def short_desc(self) -> str:
        return "Run the demo cluster (services, simulated web, 4 nodes, control) and print a summary"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--duration", type=real, default=100.0,
                            help=f"seconds of crawling, {MIN_DURATION:.0f} .. {MAX_DURATION:.0f} (default 100)")
        parser.add_argument("--out", default="var/demo", help="folder for summary.json and logs (default var/demo)")
        parser.add_argument("--dashboard-port", type=tcp_port, default=6802,
                            help="port of the live dashboard on 127.0.0.1 (default 6802; 0 picks a free one)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        # Checked before any service starts; NaN fails every comparison, so it is refused by name.
        if not (math.isfinite(opts.duration) and MIN_DURATION <= opts.duration <= MAX_DURATION):
            write_error(f"--duration: expected {MIN_DURATION:.0f} .. {MAX_DURATION:.0f} seconds, got {opts.duration:g}")
            self.exitcode = 2
            return
        services = Services(self.settings)
        try:
            services.claim(PREFIX, "scrapy demo")
            states = services.start()
        except ServiceError as exc:
            write_error(str(exc))
            self.exitcode = 1
            return
        started_here = any(s.detail == "started" for s in states)
        for s in states:
            write_line(f"{s.name:8} {mask_url(s.url)}  ({s.detail})")
        out = Path(opts.out)
        try:
            self._run(services, out, opts.duration, opts.dashboard_port)
        finally:
            if started_here:
                stopped = services.stop_unless_used()
                write_line("leaving the services the demo started running: another command uses them"
                           if stopped is None else "stopping the services the demo started: " + ", ".join(stopped))

    def _start_dashboard(self, cluster: LocalCluster, out: Path, port: int) -> None:
        """``scrapy dashboard`` on the demo's prefix and database, stopped with the cluster's processes."""
        env = dict(os.environ, REDIS_URL=cluster.redis_url, MONGO_URI=cluster.mongo_uri, PYTHONUNBUFFERED="1")
        args = ["--port", str(port), "-s", "SCHEDEXT_HISTORY_INTERVAL=2"]
        for name in ("SCHEDEXT_PREFIX", "MONGO_DATABASE", "SCHEDEXT_RECALL_THRESHOLD"):
            args += ["-s", f"{name}={cluster.settings[name]}"]
        (out / "logs").mkdir(parents=True, exist_ok=True)
        dashboard = DashboardProcess(args, cwd=PROJECT_DIR, env=env, log=out / "logs" / "dashboard.log")
        try:
            url = dashboard.start()
        except RuntimeError as exc:
            write_error(f"{exc} (try --dashboard-port 0); the demo goes on without it")
            return
        assert dashboard.proc is not None
        cluster.procs["dashboard"] = dashboard.proc
        write_line(f"dashboard {url}  (live: open it in a browser)")

    def _run(self, services: Services, out: Path, duration: float, dashboard_port: int) -> None:
        cluster = LocalCluster(redis_url=services.redis_url, mongo_uri=services.mongo_uri or DEFAULT_MONGO_URI,
                               mongo_db="product_crawl_demo", prefix=PREFIX, log_dir=out / "logs",
                               settings=dict(DEMO_SETTINGS))
        with cluster:
            cluster.reset()
            self._start_dashboard(cluster, out, dashboard_port)
            url = cluster.start_simweb("paper", seed=0)
            write_line(f"simweb   {url}  (profile paper)")
            for node in paper_nodes(4):
                cluster.start_node(node)
                write_line(f"node     {node.id} on {node.address}")
            cluster.start_control()
            write_line(f"control  scrapy crawl control (logs in {out / 'logs'})")
            write_line(f"injected {cluster.inject(demo_tasks())} virtual tasks (4 products x 5 sites, Baidu and "
                       "Weibo)")
            write_line("watch it from another terminal: .venv/bin/scrapy status --watch -s 'SCHEDEXT_PREFIX={demo}'")
            start = time.monotonic()
            while time.monotonic() - start < duration:
                time.sleep(3)
                elapsed = time.monotonic() - start
                st = cluster.status()
                q, c = st["queues"], st["cluster"]
                done = sum(p["done"] for p in st["products"].values())
                tasks = sum(p["tasks"] for p in st["products"].values())
                recalled = sum(n["counts"]["recalled"] for n in st["nodes"])
                sys.stdout.write(f"\r{elapsed:5.0f}s  items {cluster.items():6}  reports {c.get('reports', 0):4}  "
                                 f"tasks done {done}/{tasks}  waiting {q['waiting']:3}  leased {q['leased']}  "
                                 f"recalled {recalled}  dead {q['dead']}   ")
                sys.stdout.flush()
                if tasks and done == tasks:
                    break
                dead = [n for n in cluster.procs if not cluster.alive(n)]
                if dead:
                    write_line(f"\nprocess(es) exited early: {', '.join(dead)}; see {out / 'logs'}")
                    break
            write_line("")
            summary = summarize(cluster, time.monotonic() - start)
        self._report(summary, out)

    def _report(self, summary: dict[str, Any], out: Path) -> None:
        write_line("")
        write_line(f"items in MongoDB: {summary['items']} after {summary['elapsed']:.0f} s")
        write_line("")
        for line in table(["product", "items"], [[p, str(n)] for p, n in summary["items_by_product"].items()]):
            write_line(line)
        write_line("")
        for line in render(summary["status"]):
            write_line(line)
        out.mkdir(parents=True, exist_ok=True)
        path = out / "summary.json"
        path.write_text(json.dumps(summary, ensure_ascii=False, indent=2, sort_keys=True), encoding="utf-8")
        write_line("")
        write_line(f"summary written to {path.resolve()}")
