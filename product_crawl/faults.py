"""Faults of the services, applied to a :class:`~product_crawl.cluster.LocalCluster` on services of its own.

Used by the fault suite (tests/test_faults.py) and the chaos run (benchmarks/chaos.py). :class:`PrivateServices`
starts a Redis (append-only file, ``everysec``) and an nx-27017 on free loopback ports and data directories of
their own, so that they can be killed and started again on the same data without touching anyone else's. Every
fault returns a line saying what it did; :func:`outcome` compares the end state with the truth (the simulated
web's engine totals of every query).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymongo
import redis

from product_crawl import services
from product_crawl.cluster import LocalCluster
from product_crawl.simweb.corpus import corpus_size
from product_crawl.tasks import keywords_for
from scheduler_ext.store import lease_node

EVERYONE_SERVED = {"name": "faults", "description": "every node is served every result, pages a little slow",
                   "corpus": {"min": 40, "max": 60},
                   "default": {"share": 1.0, "latency": {"mean": 0.15, "spread": 0.0}, "error_rate": 0.0,
                               "block_rate": 0.0}}
"""A simulated-web profile under which the truth is simple: every query yields its whole corpus, on any node."""

SITES = ("a.example", "b.example", "c.example")  # not named in the profile: served in full to every node


class PrivateServices:
    """A Redis (AOF) and an nx-27017 of their own, which may be killed and started again on the same data."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.redis_port, self.mongo_port = services.free_port(), services.free_port()
        self.redis_proc: Any = self.start_redis()
        self.mongo_proc: Any = self.start_mongo()

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def mongo_uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.mongo_port}"

    def start_redis(self) -> Any:
        self.redis_proc = services.start_redis_server(self.redis_port, self.root / "redis")
        return self.redis_proc

    def start_mongo(self) -> Any:
        self.mongo_proc = services.start_mongo_server(self.mongo_port, self.root / "mongodb")
        return self.mongo_proc

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


def quietly(fn: Callable[[], Any], default: Any = None) -> Any:
    """``fn()``, or ``default`` while Redis or MongoDB is down (an observer's reads must survive the faults too)."""
    try:
        return fn()
    except (redis.RedisError, pymongo.errors.PyMongoError):
        return default


def lease_holder(cluster: LocalCluster) -> str | None:
    """A live node that holds a lease now, if any."""
    leases = quietly(lambda: cluster.redis.hvals(cluster.store.keys.lease_info), [])
    holders = [lease_node(raw) for raw in leases]
    return next((n for n in holders if isinstance(n, str) and cluster.alive(n)), None)


def all_done(cluster: LocalCluster) -> bool:
    products = quietly(lambda: cluster.status()["products"], {})
    return bool(products) and all(p["tasks"] and p["done"] == p["tasks"] for p in products.values())


def counter(cluster: LocalCluster, node: str, name: str) -> int:
    return int(quietly(lambda: cluster.redis.hget(cluster.store.keys.node_counters(node), name), 0) or 0)


def inject_wave(cluster: LocalCluster, wave: int, products: int = 2) -> list[tuple[str, str]]:
    """A wave of work: ``products`` products on every site. Returns its (product, site) queries."""
    names = [f"光明高钙牛奶{wave}x{i}" for i in range(products)]
    cluster.inject([{"name": n, "sites": list(SITES)} for n in names])
    return [(n, s) for n in names for s in SITES]


# --- the faults: each returns what it did -----------------------------------------------------------------------
def kill_node(cluster: LocalCluster, specs: dict[str, Any], lease_ttl: float) -> str:
    """kill -9 a node with work in hand, wait for its work to be recalled, start it again under the same id."""
    victim = lease_holder(cluster)
    if victim is None:
        return "kill -9 node: no node held a lease (skipped)"
    before = counter(cluster, victim, "recalled")
    cluster.kill(victim)
    recalled = cluster.wait_for(lambda: counter(cluster, victim, "recalled") > before, lease_ttl + 30, 0.2)
    cluster.start_node(specs[victim])
    return f"kill -9 {victim} (its work recalled: {recalled}); started again"


def stop_node(cluster: LocalCluster, lease_ttl: float) -> str:
    """SIGSTOP a node with work in hand until its work is recalled, then SIGCONT (its finish is then stale)."""
    victim = lease_holder(cluster)
    if victim is None:
        return "SIGSTOP node: no node held a lease (skipped)"
    before = counter(cluster, victim, "recalled")
    cluster.procs[victim].send_signal(signal.SIGSTOP)
    recalled = cluster.wait_for(lambda: counter(cluster, victim, "recalled") > before, lease_ttl + 30, 0.2)
    time.sleep(1)
    cluster.procs[victim].send_signal(signal.SIGCONT)
    return f"SIGSTOP {victim} until its work was recalled ({recalled}), then SIGCONT"


def kill_leader(cluster: LocalCluster, controls: tuple[str, ...]) -> str:
    """kill -9 the leading control, wait for a standby to lead, start the killed one again."""
    leader = quietly(lambda: cluster.redis.get(cluster.store.keys.leader))
    if leader not in controls or not cluster.alive(leader):
        return f"kill -9 leader: no live leader ({leader!r}; skipped)"
    cluster.kill(leader)
    took_over = cluster.wait_for(
        lambda: quietly(lambda: cluster.redis.get(cluster.store.keys.leader)) not in (None, leader), 30, 0.2)
    cluster.start_control(leader)
    return f"kill -9 leader {leader} (a standby took over: {took_over}); started again"


def kill_redis(cluster: LocalCluster, svc: PrivateServices, down: float = 2.0) -> str:
    """kill -9 Redis, keep it down ``down`` seconds, start it again from its append-only file."""
    svc.kill_redis()
    time.sleep(down)
    svc.start_redis()
    back = cluster.wait_for(lambda: quietly(lambda: cluster.redis.get(cluster.store.keys.leader)) is not None,
                            30, 0.2)
    return f"kill -9 redis, {down:.0f} s down, restarted from its AOF (a leader again: {back})"


def stop_mongo(svc: PrivateServices, down: float) -> str:
    """Stop MongoDB for ``down`` seconds, then start it again on the same data."""
    svc.stop_mongo()
    time.sleep(down)
    svc.start_mongo()
    return f"MongoDB stopped for {down:.0f} s, started again"


# --- the verdict -----------------------------------------------------------------------------------------------
def outcome(cluster: LocalCluster, queries: list[tuple[str, str]]) -> dict[str, Any]:
    """The end state against the truth: expected and stored unique items, duplicates, dead letters, counts."""
    expected = sum(corpus_size(keywords_for(name), site, 0, 40, 60) for name, site in queries)
    docs = list(cluster.mongo[cluster.mongo_db]["items"].find({}, {"fingerprint": 1, "product": 1}))
    unique = len({(d["fingerprint"], d["product"]) for d in docs})
    status = cluster.status()
    dead = [json.loads(v) for v in cluster.redis.hvals(cluster.store.keys.dead)]
    return {"expected_items": expected, "stored_items": len(docs), "unique_items": unique,
            "duplicates": len(docs) - unique, "dead_letters": [d.get("reason") for d in dead],
            "all_done": all_done(cluster),
            "recalled": sum(n["counts"]["recalled"] for n in status["nodes"]),
            "stale_finishes": sum(n["counts"]["stale_finish"] for n in status["nodes"]),
            "held": unique == expected == len(docs) and not dead and all_done(cluster)}
