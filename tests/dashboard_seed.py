"""A small deployment written through the real Lua operations (take, finish, commit) for the dashboard tests.

Three nodes, two sites, one product; one dead-lettered subtask, one dead-lettered malformed report; items in
MongoDB. The figures are chosen so that the expected matrix is plain: node1 on a.example collected 45 of 50 (0.90),
node2 on a.example 10 of 50 (0.20), node1 on b.example 0 of 40 (a failed run, 0.00), node3 never ran.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

from product_crawl.dashboard.server import DashboardProcess
from scheduler_ext.models import Report, Subtask
from scheduler_ext.store import Store

PROJECT = Path(__file__).resolve().parent.parent

PRODUCT = "光明高钙牛奶"
RUNS = [("node1", "a.example", 50, 45, 5, 2.5, True), ("node2", "a.example", 50, 10, 5, 10.0, True),
        ("node1", "b.example", 40, 0, 1, 1.0, False)]
EXPECTED = {("a.example", "node1"): "0.90", ("a.example", "node2"): "0.20", ("b.example", "node1"): "0.00"}
_ids = itertools.count(1)


def subtask(site: str, **over: Any) -> Subtask:
    n = next(_ids)
    fields: dict[str, Any] = dict(id=f"s{n}", task=f"t{n}", site=site, first_page=0, page_limit=5, time_limit=30.0,
                                  group=PRODUCT, payload={"engine": "baidu", "product": PRODUCT})
    fields.update(over)
    return Subtask(**fields)


def run(store: Store, node: str, site: str, offered: int, collected: int, pages: int, seconds: float,
        ok: bool) -> None:
    """One finished run of ``node`` on ``site``: queued, taken (a lease) and finished by the real scripts."""
    st = subtask(site, node=node)
    store.redis.lpush(store.keys.crawl(node), st.to_json())
    taken = store.take(node, 60, 10)
    assert taken is not None
    _, token, started = taken
    report = Report(subtask=st, node=node, outcome="done" if ok else "failed", reason="" if ok else "blocked: 403",
                    offered=offered, collected=collected, pages=pages, started=started, ended=started + seconds)
    assert store.finish(st.id, token, report.to_json(), node=node, site=site, group=PRODUCT, offered=offered,
                        collected=collected, pages=pages, seconds=seconds, ok=ok, alpha=0.3, runs_maxlen=1000)


def seed(store: Store, collection: Any = None) -> dict[str, Any]:
    """Write the deployment; returns the dead-letter ids ``{"subtask": ..., "report": ...}``."""
    k = store.keys
    for node in ("node1", "node2", "node3"):
        store.heartbeat(node, {"type": [0, 1], "host": "test", "pid": 1, "address": "127.0.0.9", "capacity": 1,
                               "prefetch": 1, "subtasks": []}, 60, [])
    for args in RUNS:
        run(store, *args)
    store.redis.hset(k.progress, mapping={f"{PRODUCT}|tasks": 3, f"{PRODUCT}|done": 1})
    store.redis.hset(k.tasks, "t100", json.dumps({
        "v": 1, "id": "t100", "site": "a.example", "group": PRODUCT, "type": 0, "priority": 100.0,
        "payload": {"engine": "baidu"}, "next_page": 10, "total_pages": 12, "reported": 120, "subtasks": 2,
        "collected": 55, "done": False, "last_node": "node1", "page_limit": 8, "time_limit": 12.5}))
    dead = subtask("b.example", attempt=5, node="node1")
    store.redis.hset(k.dead, dead.id, json.dumps({
        "v": 1, "id": dead.id, "kind": "subtask", "reason": "recalled 5 times: blocked: 403", "attempts": 5,
        "last_node": "node1", "at": store.now(), "subtask": json.loads(dead.to_json())}))
    store.redis.hset(k.dead, "r1", json.dumps({"v": 1, "id": "r1", "kind": "report", "reason": "not a report",
                                                "attempts": 0, "last_node": None, "at": store.now(), "raw": "{oops"}))
    if collection is not None:
        now = time.time()
        collection.insert_many([{
            "_id": f"f{i}:{PRODUCT}", "product": PRODUCT, "keywords": "光明&高钙牛奶", "site": site,
            "engine": "baidu", "title": f"{PRODUCT} 质量问题 {i}" if i % 2 else f"{PRODUCT} 评测 {i}",
            "url": f"http://{site}/item/{i}", "snippet": "=HYPERLINK(\"x\")" if i == 0 else f"snippet {i}",
            "date": None, "rank": i + 1, "page": 0, "task_id": "t1", "subtask_id": "s1", "node_id": "node1",
            "crawled_at": now + i, "fingerprint": f"f{i}"}
            for i, site in enumerate(["a.example"] * 6 + ["b.example"] * 2)])
    return {"subtask": dead.id, "report": "r1"}


# --- a dashboard subprocess on the session's services ------------------------------------------------------------
TOKEN = "op-token-for-tests-0123456789"


def start_dashboard(env: dict[str, str], prefix: str, mongo_db: str, log: Path, **settings: str) -> DashboardProcess:
    """``scrapy dashboard --port 0`` for this test's prefix and database; started (its URL in ``.url``)."""
    args = ["--port", "0", "-s", f"SCHEDEXT_PREFIX={prefix}", "-s", f"MONGO_DATABASE={mongo_db}",
            "-s", "SCHEDEXT_HISTORY_INTERVAL=0.5", "-s", "PC_DASHBOARD_REFRESH=0.5"]
    for name, value in settings.items():
        args += ["-s", f"{name}={value}"]
    proc = DashboardProcess(args, cwd=PROJECT, env=env, log=log)
    proc.start()
    return proc
