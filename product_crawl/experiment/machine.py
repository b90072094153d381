"""The machine a real run's nodes share, measured: what a page and an item cost the cheapest crawler here, now.

A real experiment's nodes, its simulated web and its MongoDB share one machine, so the best possible of a real run
(:mod:`scheduler_ext.sim.bound`) has a machine row: ``cores`` and the CPU seconds (all processes together) a page
served and an item stored cost. Those costs belong to the machine and its moment: the same code on this 2-core
machine cost 6.5 to 8.5 ms of CPU a page of ten items within one day, and another machine differs more. So the
experiment measures them before its configurations (``scrapy experiment --machine measure``, the default), as
``benchmarks/bench_machine.py`` does in rounds:

* the cheapest crawler is plain Scrapy (:class:`~product_crawl.spiders.plain_search.PlainSearchSpider`: every
  result page a start request, no scheduling, no Redis, the node's ``CONCURRENT_ITEMS``) parsing with the project's
  engine and storing through the same ``MongoPipeline`` into a private ``nx-27017``, against a simulated web of its
  own; it runs as ``processes`` processes at once (the run's nodes), each from its own loopback address, because
  a page costs more CPU when several crawlers, the web and the storage take turns on the cores than when one
  crawler has the machine to itself;
* two profiles of that web, every page served after the same latency with all 10 results (``share`` 1.0) and with 2
  (0.2), give two equations ``cpu = pages x page_cpu + items x item_cpu`` over a window of ``seconds`` while the
  crawlers go as fast as they can (start-up excluded), solved for the cost of a page (request, response, parse:
  crawler and web) and of an item (pipeline, storage: crawler and MongoDB). CPU is user + system time of every
  process of the three kinds and their children, read from ``/proc``. The latency is the run's own: the least mean
  latency of any (node, site) pair of its profile at any time (:func:`bound_latency`; 50 ms where nothing says
  otherwise), since a page costs a crawler more CPU the longer its answer takes (its pages in flight come back one
  at a time instead of several a turn: plain Scrapy 6.25 ms a page of 10 at 50 ms, 6.6 to 6.9 at 0.1 s, 7.3 to 7.4
  at 0.15 s, the same hour) and no page of the run is served sooner than that.

Also kept: a crawler process's own costs (one Python process: one core at most), the node model of the bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from product_crawl.services import tied_to_parent

ROOT = Path(__file__).resolve().parents[2]
SCRAPY = str(Path(sys.executable).parent / "scrapy")
#: The cheapest crawler's workload: 8 products x the paper profile's 5 sites, Baidu engine.
PRODUCTS = ("光明高钙牛奶", "特仑苏", "蒙牛早餐奶", "雀巢中老年奶粉",
            "伊利纯牛奶", "三元酸奶", "君乐宝奶粉", "飞鹤奶粉")
SITES = ("12315.com", "315tousu.org", "t.163.com", "cca.org.cn", "weibo.com")
#: Result pages per query: 40 queries x 400 pages, more than plain Scrapy crawls in a window on this machine.
PAGES = 400
#: The window opens once the crawlers have been answered this many pages each (their start-up done).
WARMUP_PAGES = 200


#: Crawler processes measured at most: past the cores, more processes only take turns on them (and each costs its
#: memory); a run of 40 nodes is measured with 8.
MAX_PROCESSES = 8


def machine_processes(nodes: int) -> int:
    """The crawler processes that measure the machine of a run with ``nodes`` nodes.

    >>> machine_processes(4), machine_processes(40)
    (4, 8)
    """
    return max(1, min(nodes, MAX_PROCESSES))


#: The latency of the measuring web's pages where the run's profile names none: the machine flat out.
FAST_LATENCY = 0.05
#: Pages a crawler process keeps in flight (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN: one host serves every page).
IN_FLIGHT = 8


def bound_latency(profile: Any, addresses: Sequence[str], sites: Sequence[str]) -> float:
    """The least mean latency of any (node at ``addresses``, site of ``sites``) pair of ``profile`` (a
    :class:`~product_crawl.simweb.profile.Profile`) that serves results, at the start or after any of its phases:
    the quickest answer any page of the run can get, at which the machine is measured.

    >>> from product_crawl.simweb.profile import load_profile
    >>> bound_latency(load_profile("paper"), ["127.0.0.2", "127.0.0.3"], ["12315.com", "weibo.com"])
    0.1
    """
    from product_crawl.simweb.profile import phase_times

    times = [0.0, *phase_times(profile)]
    return min((b.latency.mean for a in addresses for s in sites for t in times
                if (b := profile.behaviour(a, s, t)).share > 0 and b.error_rate + b.block_rate < 1),
               default=FAST_LATENCY)


#: The processes whose CPU a page and an item cost the machine: the crawlers, the simulated web, MongoDB.
MACHINE_PARTS = ("node", "web", "mongo")


class MachineError(RuntimeError):
    """The cheapest crawler could not be run or measured."""


@dataclass(frozen=True)
class Costs:
    """CPU seconds a page and an item cost: the machine's (crawler, web and storage) and a crawler process's own."""

    page_cpu: float
    item_cpu: float
    node_page_cpu: float
    node_item_cpu: float


def fastest(measured: Sequence[Sequence[dict[str, float]]]) -> Costs:
    """The machine at its fastest over several measurements (before and after a run's configurations), so that the
    bound made with it stays a bound: of each profile's windows (``measured``: each measurement's windows, pages of
    10 results first, pages of 2 second), the one whose pages cost the least CPU, the two solved together.

    Not each cost at its own lowest: a measurement splits a page's CPU between the page and its items by the
    difference of its two windows, a noisy split that errs one way in one measurement and the other way in the
    next, so the lowest of each describes a machine that never was (2026-12-04: a page of 10 results cost 8.9 and
    8.5 ms of CPU in the two measurements, 6.5 by the lowest page cost and the lowest item cost; docs/experiment.md).

    >>> def window(cpu): return {"pages": 100, "items": 1000 if cpu > 0.6 else 200, "node_cpu": cpu, "web_cpu": 0,
    ...                          "mongo_cpu": 0}
    >>> costs = fastest([[window(0.9), window(0.4)], [window(0.85), window(0.55)]])
    >>> costs.page_cpu, costs.item_cpu
    (0.002875, 0.0005625)
    """
    def per_page(window: dict[str, float]) -> float:
        return sum(window[f"{part}_cpu"] for part in MACHINE_PARTS) / window["pages"]

    full = min((windows[0] for windows in measured), key=per_page)
    try:
        return costs_of(full, min((windows[1] for windows in measured), key=per_page))
    except MachineError:  # moments too far apart to be solved together: the cheaper full window's own measurement
        return costs_of(*next(windows for windows in measured if windows[0] is full))


def workload() -> list[tuple[str, list[str], str]]:
    """(product, search words, site) of every query."""
    from product_crawl.tasks import parse_virtual_task

    return [(p, parse_virtual_task({"name": p}).words(), s) for p in PRODUCTS for s in SITES]


def page_entries(base_url: str, pages: int = PAGES) -> list[dict[str, Any]]:
    """Every page of every query, page-major (what a user would feed a crawler), with the product in meta."""
    from product_crawl.engines.baidu import BaiduEngine

    engine = BaiduEngine(base_url)
    queries = workload()
    return [{"url": engine.page_url(words, site, page), "meta": {"product": product, "page": page}}
            for page in range(pages) for product, words, site in queries]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (``/proc/<pid>/stat`` fields 14 and 15; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    """The cheapest crawler (``scrapy crawl plain_search``) crawling ``entries`` (written to ``pages``) from
    ``address``, with the node's ``CONCURRENT_ITEMS``."""
    from scheduler_ext.addon import NODE_CONCURRENT_ITEMS

    pages.write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")
    return subprocess.Popen(
        [SCRAPY, "crawl", "plain_search", "-s",
         f"PC_ENGINE_BASE_URLS={json.dumps({'baidu': web_url, 'weibo': web_url})}",
         "-s", f"PC_PLAIN_PAGES={pages}", "-s", f"DOWNLOAD_BIND_ADDRESS={address}",
         "-s", f"CONCURRENT_ITEMS={NODE_CONCURRENT_ITEMS}"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=tied_to_parent())


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop crawl processes as a user would (SIGINT: Scrapy closes the spider), killing any still up after 20 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def web_counters(web_url: str) -> dict[str, Any]:
    """The simulated web's counters (``/_counters``)."""
    with urllib.request.urlopen(f"{web_url}/_counters", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def served(web_url: str, counters: dict[str, Any] | None = None) -> int:
    """Search requests the web has answered so far, from every address (from ``counters`` if given)."""
    counters = web_counters(web_url) if counters is None else counters
    return sum(int(c.get("requests", 0)) for c in counters.get("by_address", {}).values())


def profile(share: float, latency: float = FAST_LATENCY) -> dict[str, Any]:
    """A simulated web serving every page after ``latency`` seconds with ``share`` of its 10 results, no errors, no
    captchas."""
    return {"name": f"machine-{share}", "corpus": {"min": 5000, "max": 8000},
            "default": {"share": share, "latency": {"mean": latency, "spread": 0.0}, "error_rate": 0.0,
                        "block_rate": 0.0}}


def crawl(share: float, seconds: float, tmp: Path, n: int, mongo_uri: str, mongo_pid: int,
          processes: int, latency: float = FAST_LATENCY) -> dict[str, float]:
    """One window of ``processes`` plain crawlers on :func:`profile` (``share``, ``latency``): pages, items,
    seconds and the CPU seconds of the crawlers (``node_cpu``), the web and nx-27017 in it."""
    import pymongo

    from product_crawl.simweb import SimWebProcess

    path = tmp / f"{n}.json"
    path.write_text(json.dumps(profile(share, latency)), encoding="utf-8")
    database = f"machine_{n}_{os.getpid()}"
    env = plain_env(mongo_uri, database)
    mongo: Any = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        with SimWebProcess(path, seed=1) as web, open(tmp / f"{n}.log", "wb") as log:
            assert web.proc is not None
            entries = page_entries(web.url)
            try:
                for i in range(processes):  # each its own address and every processes-th page
                    nodes.append(plain_crawler(web.url, entries[i::processes], tmp / f"{n}-{i}-pages.json",
                                               f"127.0.0.{2 + i}", env, log))
                # the start-up, then the warm-up pages at IN_FLIGHT a latency
                deadline = time.monotonic() + 120 + 2 * WARMUP_PAGES * latency / IN_FLIGHT
                while served(web.url) < WARMUP_PAGES * processes:  # past the start-up
                    if time.monotonic() > deadline or any(node.poll() is not None for node in nodes):
                        raise MachineError(f"plain Scrapy did not start; see {tmp / f'{n}.log'}")
                    time.sleep(0.05)
                groups = {"node": [p for node in nodes for p in tree(node.pid)], "web": tree(web.proc.pid),
                          "mongo": tree(mongo_pid)}

                def cpu() -> dict[str, float]:
                    return {k: sum(cpu_seconds(p) for p in v) for k, v in groups.items()}

                items0 = mongo[database]["items"].estimated_document_count()
                c0, t0, cpu0 = served(web.url), time.monotonic(), cpu()
                time.sleep(seconds)
                c1, t1, cpu1 = served(web.url), time.monotonic(), cpu()
                items1 = mongo[database]["items"].estimated_document_count()
            finally:
                stop(nodes)
        mongo.drop_database(database)
    finally:
        mongo.close()
    return {"pages": c1 - c0, "items": items1 - items0, "seconds": t1 - t0, "latency": latency,
            **{f"{k}_cpu": cpu1[k] - cpu0[k] for k in cpu0}}


def solve(a: dict[str, float], b: dict[str, float], parts: tuple[str, ...]) -> tuple[float, float]:
    """(CPU seconds a page, CPU seconds an item) of ``parts`` from two windows with different items per page.

    >>> solve({"pages": 100, "items": 1000, "x_cpu": 1.5}, {"pages": 100, "items": 200, "x_cpu": 0.7}, ("x",))
    (0.005, 0.001)
    """
    ca, cb = sum(a[f"{p}_cpu"] for p in parts), sum(b[f"{p}_cpu"] for p in parts)
    det = a["pages"] * b["items"] - b["pages"] * a["items"]
    if not det:
        raise MachineError(f"the two windows had the same items a page ({a['pages']} pages / {a['items']} items "
                           f"and {b['pages']} / {b['items']}): the costs of a page and an item cannot be told apart")
    page = (ca * b["items"] - cb * a["items"]) / det
    item = (a["pages"] * cb - b["pages"] * ca) / det
    return round(page, 6), round(item, 7)


def measure(seconds: float = 10.0, processes: int = 4, tmp: Path | None = None, latency: float = FAST_LATENCY
            ) -> tuple[Costs, list[dict[str, float]]]:
    """The costs of the cheapest crawler on this machine now (one window of each profile, pages served after
    ``latency`` seconds), and the two windows.

    Starts its own nx-27017 on a free port and a simulated web per window; leaves nothing running."""
    from product_crawl import services

    if seconds <= 0 or processes < 1 or not 0 <= latency <= 60:
        raise MachineError(f"expected seconds > 0, processes >= 1 and a latency of 0 to 60 s, got {seconds}, "
                           f"{processes} and {latency}")
    with tempfile.TemporaryDirectory(prefix="machine-", dir=tmp) as d:
        work = Path(d)
        port = services.free_port()
        mongo = services.start_mongo_server(port, work / "mongo")
        try:
            runs = [crawl(share, seconds, work, n, f"mongodb://127.0.0.1:{port}", mongo.pid, processes, latency)
                    for n, share in enumerate((1.0, 0.2))]
        finally:
            services.stop_pid(mongo.pid)
    return costs_of(runs[0], runs[1]), runs


def costs_of(full: dict[str, float], sparse: dict[str, float]) -> Costs:
    """The costs a window of pages of 10 results and one of pages of 2 give (:func:`solve`), checked."""
    page, item = solve(full, sparse, MACHINE_PARTS)
    node_page, node_item = solve(full, sparse, ("node",))
    if page <= 0 or node_page <= 0:
        raise MachineError(f"measured a page at {page} s of CPU ({node_page} in a crawler): not a cost; the windows "
                           f"were {[full, sparse]}")
    return Costs(page, max(0.0, item), node_page, max(0.0, node_item))
