"""The fault run: a real cluster (3 nodes, 2 controls, the simulated web) on its own Redis (AOF) and MongoDB
(nx-27017), through every fault of the services, one after the other while work is in flight:

1. kill -9 of a node holding a lease (it is started again later, under the same id);
2. SIGSTOP of a node holding a lease for longer than the lease TTL and node timeout, then SIGCONT (its finish is
   refused as stale: counted);
3. kill -9 of the leading control (the standby takes over; the killed one is started again);
4. kill -9 of Redis and a restart from its append-only file;
5. MongoDB stopped for 20 s, then started again on the same data.

On a profile where every node is served every result, the end state must be exactly the truth: every task done,
unique items equal to the engine totals of every query (the simulated web's corpus size), no duplicate, nothing
dead-lettered. Short intervals come from settings (tests/conftest.py FAST_SETTINGS), never from sleeping out a
production interval; the one real wait is the 20 s MongoDB outage the issue asks for.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest
import redis as redis_lib
from conftest import FAST_SETTINGS

from product_crawl import services
from product_crawl.cluster import LocalCluster, NodeSpec
from product_crawl.simweb.corpus import corpus_size
from product_crawl.tasks import keywords_for

NODES = [NodeSpec("node1", "127.0.0.2"), NodeSpec("node2", "127.0.0.3"), NodeSpec("node3", "127.0.0.4")]
SITES = ["a.example", "b.example", "c.example"]  # not named in the profile: every node is served every result
PROFILE = {"name": "faults", "description": "every node is served every result, pages a little slow",
           "corpus": {"min": 40, "max": 60},
           "default": {"share": 1.0, "latency": {"mean": 0.15, "spread": 0.0}, "error_rate": 0.0,
                       "block_rate": 0.0}}
MONGO_OUTAGE = 20.0  # seconds, as the issue asks
SETTINGS = {**FAST_SETTINGS, "SCHEDEXT_BACKOFF_MAX": 2, "SCHEDEXT_RECALL_MAX": 8, "PC_MONGO_TIMEOUT": 5,
            "SCHEDEXT_ALLOCATION": "scheduler_ext.strategies.allocation.SharedAllocation"}
LEASE_TTL = float(SETTINGS["SCHEDEXT_RECALL_THRESHOLD"])  # lease TTL and node timeout default to the recall age


class Services:
    """A Redis (AOF) and an nx-27017 of this test's own, which it may kill and start again on the same data."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.redis_port, self.mongo_port = services.free_port(), services.free_port()
        self.redis_proc = self.start_redis()
        self.mongo_proc: Any = self.start_mongo()

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def mongo_uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.mongo_port}"

    def start_redis(self) -> Any:
        return services.start_redis_server(self.redis_port, self.root / "redis")

    def start_mongo(self) -> Any:
        return services.start_mongo_server(self.mongo_port, self.root / "mongodb")

    def kill_redis(self) -> None:
        os.kill(self.redis_proc.pid, signal.SIGKILL)
        self.redis_proc.wait()

    def stop_mongo(self) -> None:
        services.stop_pid(self.mongo_proc.pid)
        self.mongo_proc = None

    def stop(self) -> None:
        services.stop_pid(self.redis_proc.pid)
        if self.mongo_proc is not None:
            services.stop_pid(self.mongo_proc.pid)


@pytest.fixture
def faulty(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[LocalCluster, Services]]:
    svc = Services(tmp_path / "services")
    profile = tmp_path / "faults.json"
    profile.write_text(json.dumps(PROFILE))
    cluster = LocalCluster(redis_url=svc.redis_url, mongo_uri=svc.mongo_uri, mongo_db="faults", prefix="{faults}",
                           log_dir=tmp_path / "logs", settings=dict(SETTINGS))
    cluster.start_simweb(profile)
    try:
        yield cluster, svc
    finally:
        cluster.stop()
        svc.stop()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for log in sorted((tmp_path / "logs").glob("*.log")):
                print(f"----- {log.name} (tail) -----")
                print("\n".join(log.read_text(errors="replace").splitlines()[-30:]))


def quietly(fn: Any, default: Any = None) -> Any:
    """``fn()``, or ``default`` while Redis or MongoDB is down (the test's own reads must survive too)."""
    try:
        return fn()
    except (redis_lib.RedisError, pymongo.errors.PyMongoError):
        return default


def lease_holder(cluster: LocalCluster, among: list[str]) -> str | None:
    leases = quietly(lambda: cluster.redis.hvals(cluster.store.keys.lease_info), [])
    nodes = [json.loads(raw).get("node") for raw in leases]
    return next((n for n in nodes if n in among), None)


def all_done(cluster: LocalCluster) -> bool:
    products = quietly(lambda: cluster.status()["products"], {})
    return bool(products) and all(p["tasks"] and p["done"] == p["tasks"] for p in products.values())


def inject(cluster: LocalCluster, wave: int) -> list[tuple[str, str]]:
    """A wave of work: two products on every site. Returns the (product, site) queries."""
    names = [f"光明高钙牛奶{wave}", f"特仑苏纯牛奶{wave}"]
    quietly(lambda: cluster.inject([{"name": n, "sites": SITES} for n in names]))
    return [(n, s) for n in names for s in SITES]


def test_every_fault_of_the_services_ends_with_exactly_the_truth(faulty: tuple[LocalCluster, Services]) -> None:
    cluster, svc = faulty
    keys = cluster.store.keys
    for node in NODES:
        cluster.start_node(node)
    for name in ("control-a", "control-b"):
        cluster.start_control(name)
    queries: list[tuple[str, str]] = []
    log: list[str] = []

    def wave() -> None:
        queries.extend(inject(cluster, len(queries)))
        assert cluster.wait_for(lambda: lease_holder(cluster, [n.id for n in NODES]) is not None, 60, 0.1)

    # 1. kill -9 a node with work in hand; start it again (same id) once its lease was recalled.
    wave()
    victim = lease_holder(cluster, [n.id for n in NODES if cluster.alive(n.id)])
    assert victim is not None
    cluster.kill(victim)
    log.append(f"kill -9 {victim}")
    assert cluster.wait_for(lambda: int(quietly(lambda: cluster.redis.hget(keys.node_counters(victim), "recalled"),
                                                0) or 0) >= 1, LEASE_TTL + 20, 0.2)
    cluster.start_node(next(n for n in NODES if n.id == victim))

    # 2. SIGSTOP a node with work in hand past the lease TTL and node timeout, then SIGCONT.
    wave()
    stopped = lease_holder(cluster, [n.id for n in NODES if cluster.alive(n.id)])
    assert stopped is not None
    cluster.procs[stopped].send_signal(signal.SIGSTOP)
    log.append(f"SIGSTOP {stopped}")
    assert cluster.wait_for(lambda: int(quietly(lambda: cluster.redis.hget(keys.node_counters(stopped), "recalled"),
                                                0) or 0) >= 1, LEASE_TTL + 20, 0.2)
    time.sleep(1)
    cluster.procs[stopped].send_signal(signal.SIGCONT)

    # 3. kill -9 the leader: the standby takes over; start the killed control again.
    wave()
    leader = quietly(lambda: cluster.redis.get(keys.leader))
    assert leader in ("control-a", "control-b")
    cluster.kill(leader)
    log.append(f"kill -9 leader {leader}")
    standby = "control-b" if leader == "control-a" else "control-a"
    assert cluster.wait_for(lambda: quietly(lambda: cluster.redis.get(keys.leader)) == standby, 20, 0.2)
    cluster.start_control(leader)

    # 4. kill -9 Redis with work in flight, start it again from its AOF.
    wave()
    svc.kill_redis()
    log.append("kill -9 redis")
    time.sleep(2)
    svc.redis_proc = svc.start_redis()
    assert cluster.wait_for(lambda: quietly(lambda: cluster.redis.get(keys.leader)) is not None, 30, 0.2)

    # 5. MongoDB down for 20 s with work in flight.
    wave()
    svc.stop_mongo()
    log.append("MongoDB stopped")
    time.sleep(MONGO_OUTAGE)
    svc.mongo_proc = svc.start_mongo()
    log.append("MongoDB started")

    # The end: every task done, every item of every query stored once, nothing dead-lettered.
    assert cluster.wait_for(lambda: all_done(cluster), 240, 1), (log, quietly(cluster.status))
    expected = sum(corpus_size(keywords_for(name), site, 0, 40, 60) for name, site in queries)
    coll = cluster.mongo[cluster.mongo_db]["items"]
    docs = list(coll.find({}, {"fingerprint": 1, "product": 1}))
    assert len({(d["fingerprint"], d["product"]) for d in docs}) == len(docs), "a duplicate item"
    assert len(docs) == expected, (len(docs), expected, log)
    assert not cluster.redis.hlen(keys.dead), [json.loads(v)["reason"] for v in cluster.redis.hvals(keys.dead)]
    status = cluster.status()
    stale = sum(n["counts"]["stale_finish"] for n in status["nodes"])
    recalled = sum(n["counts"]["recalled"] for n in status["nodes"])
    assert recalled >= 2, status["nodes"]  # the killed node's and the stopped node's work at least
    print(f"faults: {log}; {len(docs)} items (expected {expected}); {recalled} recalls, {stale} stale finishes")
