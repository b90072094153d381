"""Requests per second through our node scheduler path vs scrapy-redis's scheduler queue, on one Redis.

Run: ``.venv/bin/python benchmarks/bench_scheduler.py`` (or ``make bench``); docs/benchmarks.md explains it.

Three measurements, all against one private ``redis-server`` started on a free loopback port (stopped at the
end):

1. **Ours**, per subtask of ``P`` pages, the full node round trip as
   :class:`scheduler_ext.scheduler.SubtaskScheduler` does it: ``LPUSH`` the subtask JSON into
   ``crawl:<node>`` (as the control does), ``Store.take`` (the lease script), ``Subtask.from_json``, the
   real ``SearchSpider.subtask_requests`` (P ``scrapy.Request`` objects, meta stamped as ``_start`` stamps
   it), each request through the local queue (``enqueue_request`` / ``next_request`` path: a deque), a
   :class:`scheduler_ext.models.Report` as JSON and ``Store.finish`` (the finish script). The rate is pages
   (requests) per second. Building the requests is timed too, which scrapy-redis's figures below do not
   include (its requests are built before the clock starts): a conservative comparison for us.
2. **scrapy-redis**: ``scrapy_redis.queue.PriorityQueue`` built as ``scrapy_redis.scheduler.Scheduler.open``
   builds it (default ``picklecompat`` serializer, key ``<spider>:requests``, a minimal spider for
   ``request.to_dict``); push then pop the same number of requests, same URLs. ``dont_filter=True`` as ours,
   so the scheduler's dupefilter would not be consulted either. Combined per-request rate:
   ``1 / (1/push + 1/pop)``.
3. **Node memory**: a real ``scrapy crawl search`` node for about 15 s against the simulated web (a small
   fast profile), ``nx-27017`` as MongoDB and the same Redis; peak RSS (``VmHWM`` from
   ``/proc/<pid>/status``) and pages crawled (the simulated web's own counters).

The last line printed is one JSON object; it is also written to benchmarks/results/bench_scheduler.json.
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
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy import Request, Spider  # noqa: E402
from scrapy.crawler import Crawler  # noqa: E402
from scrapy.settings import Settings  # noqa: E402
from scrapy.utils.misc import load_object  # noqa: E402
from scrapy_redis import defaults as sr_defaults  # noqa: E402
from scrapy_redis.connection import get_redis_from_settings  # noqa: E402

from product_crawl import services  # noqa: E402
from product_crawl.simweb import SimWebProcess  # noqa: E402
from product_crawl.spiders.search import SearchSpider  # noqa: E402
from scheduler_ext.connection import redis_from_settings  # noqa: E402
from scheduler_ext.keys import Keys  # noqa: E402
from scheduler_ext.models import Report, Subtask  # noqa: E402
from scheduler_ext.store import Store  # noqa: E402
from scheduler_ext.tracker import META_PAGE, META_SID  # noqa: E402

PAGES = 10  # pages per subtask
SUBTASKS = 2_000  # subtasks through our path -> PAGES * SUBTASKS requests (also through scrapy-redis)
NODE = "bench"
ROUNDS = 5  # ours and scrapy-redis alternate, SUBTASKS / ROUNDS subtasks at a time
CRAWL_SECONDS = 15.0  # how long the real node crawls
RESULTS = ROOT / "benchmarks" / "results" / "bench_scheduler.json"

PAYLOAD = {"engine": "baidu", "keywords": ["光明", "高钙", "牛奶"], "keywords_joined": "光明&高钙&牛奶",
           "product": "光明高钙牛奶"}


def subtask_json(i: int, pages: int, time_limit: float = 30.0) -> str:
    """Subtask ``i``: its own task and query (so its page URLs differ from every other subtask's)."""
    payload = {**PAYLOAD, "keywords": ["光明", "高钙", f"牛奶{i}"], "keywords_joined": f"光明&高钙&牛奶{i}"}
    return json.dumps({"v": 1, "id": f"b{i}", "task": f"t{i}", "group": "光明高钙牛奶", "site": "12315.com",
                       "type": 0, "first_page": 0, "page_limit": pages, "time_limit": time_limit,
                       "payload": payload}, ensure_ascii=False)


def search_spider() -> SearchSpider:
    settings = Settings()
    settings.setmodule("product_crawl.settings")
    return SearchSpider.from_crawler(Crawler(SearchSpider, settings))


# --- ours ---------------------------------------------------------------------------------------------------


class Ours:
    """Our node path, one subtask at a time; ``run`` times a batch, ``redis_s`` sums the Redis calls."""

    def __init__(self, redis_url: str, pages: int) -> None:
        self.client = redis_from_settings({"REDIS_URL": redis_url})
        self.store = Store(self.client, Keys("{bench-sched}"))
        self.spider = search_spider()
        self.pages = pages
        self.local: deque[Request] = deque()
        self.crawl_key = self.store.keys.crawl(NODE)
        self.redis_s = 0.0  # time inside LPUSH, take and finish

    def round_trip(self, raw: str) -> int:
        store, pages = self.store, self.pages
        t0 = time.perf_counter()
        self.client.lpush(self.crawl_key, raw)  # what the control's allocation commit does
        taken = store.take(NODE, 60.0, 10.0)
        self.redis_s += time.perf_counter() - t0
        assert taken is not None, "take returned nothing"
        got, token, started = taken
        st = Subtask.from_json(got)
        requests = list(self.spider.subtask_requests(st))
        for r in requests:  # as SubtaskScheduler._start stamps them
            r.meta[META_SID] = st.id
            r.meta.setdefault("download_timeout", st.time_limit)
            r.meta.setdefault("bindaddress", ("127.0.0.2", 0))
            self.local.append(r)  # engine.crawl -> enqueue_request
        while self.local:  # next_request
            self.local.popleft()
        report = Report(subtask=st, node=NODE, outcome="done", reported=1000, offered=10 * pages,
                        collected=9 * pages, pages=pages, next_page=st.first_page + pages, total_pages=100,
                        started=started, ended=started + 1.0)
        report_json = report.to_json()
        t0 = time.perf_counter()
        ok = store.finish(st.id, token, report_json, node=NODE, site=st.site, group=st.group,
                          offered=report.offered, collected=report.collected, pages=report.pages,
                          seconds=report.seconds, ok=True, alpha=0.3, runs_maxlen=100_000)
        self.redis_s += time.perf_counter() - t0
        assert ok, "finish refused"
        return len(requests)

    def run(self, raws: list[str]) -> tuple[int, float]:
        """(requests, seconds) for these subtasks."""
        n = 0
        t0 = time.perf_counter()
        for raw in raws:
            n += self.round_trip(raw)
        return n, time.perf_counter() - t0

    def build_us_per_request(self) -> float:
        """Request building alone (the spider, no Redis), microseconds a request."""
        st = Subtask.from_json(subtask_json(0, self.pages))
        t0 = time.perf_counter()
        for _ in range(200):
            list(self.spider.subtask_requests(st))
        return (time.perf_counter() - t0) / (200 * self.pages) * 1e6


# --- scrapy-redis ------------------------------------------------------------------------------------------


class MinimalSpider(Spider):
    name = "bench"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None


class ScrapyRedis:
    """scrapy-redis's scheduler queue, built as ``scrapy_redis.scheduler.Scheduler`` builds it."""

    def __init__(self, redis_url: str) -> None:
        # As Scheduler.from_crawler connects and Scheduler.open builds the queue: default queue class and
        # key, serializer None -> picklecompat.
        self.server = get_redis_from_settings(Settings({"REDIS_URL": redis_url}))
        self.spider = MinimalSpider()
        self.queue = load_object(sr_defaults.SCHEDULER_QUEUE_CLASS)(
            server=self.server, spider=self.spider,
            key=sr_defaults.SCHEDULER_QUEUE_KEY % {"spider": self.spider.name}, serializer=None)
        self.queue.clear()

    def requests(self, raws: list[str]) -> list[Request]:
        """The same page URLs as ours (distinct: a sorted set merges identical requests)."""
        ours = search_spider()
        return [Request(r.url, callback=self.spider.parse, meta={META_PAGE: r.meta[META_PAGE]},
                        dont_filter=True)
                for raw in raws for r in ours.subtask_requests(Subtask.from_json(raw))]

    def run(self, requests: list[Request]) -> tuple[float, float]:
        """(push seconds, pop seconds) for these requests."""
        t0 = time.perf_counter()
        for r in requests:
            self.queue.push(r)
        push_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        popped = sum(1 for _ in range(len(requests)) if self.queue.pop() is not None)
        pop_s = time.perf_counter() - t0
        assert popped == len(requests), f"popped {popped} of {len(requests)}"
        return push_s, pop_s


def bench_rates(redis_url: str, n_subtasks: int, pages: int, rounds: int) -> dict[str, float]:
    """Both paths in alternating rounds (so that a change of load on the machine hits both alike)."""
    ours, sr = Ours(redis_url, pages), ScrapyRedis(redis_url)
    raws = [subtask_json(i, pages) for i in range(n_subtasks)]
    warm = [subtask_json(-1 - i, pages) for i in range(50)]
    ours.run(warm)  # scripts loaded, connections open
    sr.run(sr.requests(warm))
    ours.redis_s = 0.0
    n = ours_s = push_s = pop_s = 0.0
    size = -(-n_subtasks // rounds)
    for k in range(rounds):
        chunk = raws[k * size:(k + 1) * size]
        requests = sr.requests(chunk)  # built before scrapy-redis's clock starts
        got, seconds = ours.run(chunk)
        n, ours_s = n + got, ours_s + seconds
        a, b = sr.run(requests)
        push_s, pop_s = push_s + a, pop_s + b
    push, pop = n / push_s, n / pop_s
    out = {"requests": n, "rate": n / ours_s, "subtasks_per_s": n_subtasks / ours_s,
           "redis_share": ours.redis_s / ours_s, "build_us_per_request": ours.build_us_per_request(),
           "push": push, "pop": pop, "combined": 1 / (1 / push + 1 / pop)}
    ours.client.close()
    sr.server.close()
    return out


# --- a real node's memory ---------------------------------------------------------------------------------


FAST_PROFILE = {"name": "bench-fast", "corpus": {"min": 2000, "max": 3000},
                "default": {"share": 0.9, "latency": {"mean": 0.005, "spread": 0.0}, "error_rate": 0.0,
                            "block_rate": 0.0}}


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def bench_node_memory(redis_url: str, tmp: Path) -> dict[str, Any]:
    profile = tmp / "profile.json"
    profile.write_text(json.dumps(FAST_PROFILE))
    mongo_port = services.free_port()
    mongo = services.start_mongo_server(mongo_port, tmp / "mongo")
    prefix = "{bench-node}"
    keys = Keys(prefix)
    client = redis_from_settings({"REDIS_URL": redis_url})
    node: subprocess.Popen[bytes] | None = None
    try:
        with SimWebProcess(profile, seed=1) as web:
            # More work than the node can do in CRAWL_SECONDS; each subtask is its own task (own query).
            with client.pipeline(transaction=False) as pipe:
                for i in range(3000):
                    pipe.lpush(keys.crawl(NODE), subtask_json(i, 5))
                pipe.execute()
            env = {**os.environ, "SCRAPY_SETTINGS_MODULE": "product_crawl.settings", "REDIS_URL": redis_url,
                   "MONGO_URI": f"mongodb://127.0.0.1:{mongo_port}", "MONGO_DATABASE": "bench",
                   "PC_LOG_LEVEL": "WARNING"}
            bases = json.dumps({"baidu": web.url, "weibo": web.url})
            argv = [str(Path(sys.executable).parent / "scrapy"), "crawl", "search",
                    "-s", f"SCHEDEXT_PREFIX={prefix}", "-s", f"SCHEDEXT_NODE_ID={NODE}",
                    "-s", "SCHEDEXT_BIND_ADDRESS=127.0.0.2", "-s", f"PC_ENGINE_BASE_URLS={bases}",
                    "-s", "SCHEDEXT_IDLE_CLOSE=3", "-s", "SCHEDEXT_HEARTBEAT_INTERVAL=1"]
            log = open(tmp / "node.log", "wb")  # noqa: SIM115 (closed in finally below)
            try:
                node = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
                t0 = time.monotonic()
                peak_rss = 0
                while time.monotonic() - t0 < CRAWL_SECONDS and node.poll() is None:
                    peak_rss = max(peak_rss, _status_kb(node.pid, "VmRSS") or 0)
                    time.sleep(0.25)
                hwm = _status_kb(node.pid, "VmHWM") or 0
                ran = time.monotonic() - t0
                early_exit = node.poll()
                counters = json.loads(urllib.request.urlopen(f"{web.url}/_counters", timeout=5).read())
                finished = client.llen(keys.sleeping) + client.llen(keys.failed)
                services.stop_pid(node.pid)
                node.wait(10)
            finally:
                log.close()
    finally:
        if node is not None and node.poll() is None:
            services.stop_pid(node.pid)
        client.close()
        services.stop_pid(mongo.pid)
    by_addr = counters.get("by_address", {}).get("127.0.0.2", {})
    if early_exit is not None:
        tail = (tmp / "node.log").read_text(errors="replace")[-2000:]
        print(f"node exited early with code {early_exit}:\n{tail}", file=sys.stderr)
    return {"peak_rss_mb": max(hwm, peak_rss) / 1024, "pages": int(by_addr.get("requests", 0)),
            "results": int(by_addr.get("results", 0)), "subtasks_finished": int(finished), "seconds": ran}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-sched-") as d:
        tmp = Path(d)
        port = services.free_port()
        proc = services.start_redis_server(port, tmp / "redis")
        url = f"redis://127.0.0.1:{port}/0"
        try:
            ours = sr = bench_rates(url, SUBTASKS, PAGES, ROUNDS)
            mem = bench_node_memory(url, tmp)
        finally:
            services.stop_pid(proc.pid)
    n = int(ours["requests"])
    print(f"redis-server {url} (private, AOF everysec), {SUBTASKS} subtasks x {PAGES} pages = {n} requests")
    print(f"ours: {ours['rate']:,.0f} requests/s ({ours['subtasks_per_s']:,.0f} subtasks/s: LPUSH + take + "
          f"{PAGES} Requests + finish; {ours['redis_share']:.0%} of it waiting on Redis; request building "
          f"alone {ours['build_us_per_request']:.1f} us/request)")
    print(f"scrapy-redis PriorityQueue (picklecompat): push {sr['push']:,.0f}/s, pop {sr['pop']:,.0f}/s, "
          f"combined {sr['combined']:,.0f} requests/s")
    ratio = ours["rate"] / sr["combined"]
    print(f"ratio ours / scrapy-redis per request: {ratio:.1f}x (target >= 3x)")
    print(f"node crawl {mem['seconds']:.1f} s: {mem['pages']} pages, {mem['subtasks_finished']} subtasks "
          f"finished, peak RSS {mem['peak_rss_mb']:.1f} MB")
    out = {"ours_requests_per_s": round(ours["rate"], 1), "scrapy_redis_push_per_s": round(sr["push"], 1),
           "scrapy_redis_pop_per_s": round(sr["pop"], 1),
           "scrapy_redis_requests_per_s": round(sr["combined"], 1),
           "ratio": round(ratio, 2), "pages_per_subtask": PAGES, "n_requests": n,
           "node_peak_rss_mb": round(mem["peak_rss_mb"], 1), "node_pages_crawled": mem["pages"],
           "node_crawl_seconds": round(mem["seconds"], 1)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # finally blocks stop the servers
    main()
