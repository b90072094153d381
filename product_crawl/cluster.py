"""A whole cluster on one machine: simulated web, crawl nodes and control as real processes.

Used by ``scrapy demo``, ``scrapy experiment`` and the end-to-end tests; an operator runs the same processes by
hand (docs/control.md). Each node is a ``scrapy crawl search`` process bound to its own loopback address; the
control is ``scrapy crawl control``. Settings reach them as ``-s NAME=VALUE`` (dicts as JSON).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymongo
import redis

from product_crawl.services import tied_to_parent
from product_crawl.simweb.server import SimWebProcess
from product_crawl.tasks import parse_virtual_task
from scheduler_ext.config import Config
from scheduler_ext.keys import Keys
from scheduler_ext.status import collect_status
from scheduler_ext.store import Store

PROJECT_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class NodeSpec:
    id: str
    address: str
    types: str = "0,1"


def paper_nodes(n: int = 4) -> list[NodeSpec]:
    """node1..nodeN on 127.0.0.2, 127.0.0.3, ... (the addresses the paper profile describes)."""
    return [NodeSpec(f"node{i}", f"127.0.0.{i + 1}") for i in range(1, n + 1)]


class LocalCluster:
    def __init__(self, *, redis_url: str, mongo_uri: str, mongo_db: str, prefix: str, log_dir: Path,
                 settings: dict[str, Any] | None = None) -> None:
        self.redis_url, self.mongo_uri, self.mongo_db, self.prefix = redis_url, mongo_uri, mongo_db, prefix
        self.log_dir = log_dir
        self.settings: dict[str, Any] = {"SCHEDEXT_PREFIX": prefix, "MONGO_DATABASE": mongo_db,
                                         **(settings or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.simweb: SimWebProcess | None = None
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.store = Store(self.redis, Keys(prefix))
        self.mongo: Any = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=10_000)

    # --- state --------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Delete this cluster's Redis keys (its prefix only) and drop its MongoDB database."""
        self.store.purge()
        self.mongo.drop_database(self.mongo_db)

    def inject(self, tasks: list[dict[str, Any] | str]) -> int:
        """Validate and push virtual tasks (as ``scrapy inject`` does), first one first."""
        parsed = [parse_virtual_task(t if isinstance(t, dict) else {"name": t}) for t in tasks]
        with self.redis.pipeline(transaction=True) as pipe:
            for vt in parsed:
                pipe.lpush(self.store.keys.virtual, vt.to_json())
            pipe.execute()
        return len(parsed)

    def status(self) -> dict[str, Any]:
        return collect_status(self.store, Config.from_settings(self.settings).node_timeout)

    def items(self) -> int:
        return int(self.mongo[self.mongo_db]["items"].count_documents({}))

    def items_by(self, field: str) -> dict[str, int]:
        coll = self.mongo[self.mongo_db]["items"]
        return {str(v): int(coll.count_documents({field: v})) for v in sorted(coll.distinct(field))}

    # --- processes -------------------------------------------------------------------------------------------------
    def start_simweb(self, profile: str | Path = "paper", seed: int = 0) -> str:
        self.simweb = SimWebProcess(profile, seed=seed)
        url = self.simweb.start()
        self.settings["PC_ENGINE_BASE_URLS"] = {"baidu": url, "weibo": url}
        self.settings.setdefault("SCHEDEXT_ORACLE_URL", url + "/_truth")
        return url

    def _argv(self, spider: str, extra: dict[str, Any]) -> list[str]:
        argv = [sys.executable, "-m", "scrapy", "crawl", spider]
        for name, value in {**self.settings, **extra}.items():
            text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            argv += ["-s", f"{name}={text}"]
        return argv

    def _spawn(self, name: str, spider: str, extra: dict[str, Any]) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, REDIS_URL=self.redis_url, MONGO_URI=self.mongo_uri,
                   SCRAPY_SETTINGS_MODULE="product_crawl.settings", PYTHONUNBUFFERED="1")
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(self._argv(spider, extra), cwd=PROJECT_DIR, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=tied_to_parent())
        self.procs[name] = proc
        return proc

    def start_node(self, node: NodeSpec, spider: str = "search", **extra: Any) -> subprocess.Popen[bytes]:
        return self._spawn(node.id, spider, {"SCHEDEXT_NODE_ID": node.id, "SCHEDEXT_BIND_ADDRESS": node.address,
                                             "SCHEDEXT_NODE_TYPE": node.types, **extra})

    def start_control(self, name: str = "control", **extra: Any) -> subprocess.Popen[bytes]:
        return self._spawn(name, "control", {"SCHEDEXT_CONTROL_ID": name, **extra})

    def kill(self, name: str) -> None:
        """kill -9: the process gets no chance to clean up."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def stop_process(self, name: str, timeout: float = 20.0) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop(self) -> None:
        """Stop every process this cluster started (:meth:`stop_processes`) and close the clients."""
        self.stop_processes()
        self.mongo.close()
        self.redis.close()

    def stop_processes(self) -> None:
        """Stop every process this cluster started: nodes first (they return their work), then control, web."""
        for name in sorted(self.procs, key=lambda n: n.startswith("control")):
            if self.procs[name].poll() is None:
                self.procs[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for name in list(self.procs):
            self.stop_process(name, max(0.1, deadline - time.monotonic()))
        if self.simweb is not None:
            self.simweb.stop()
            self.simweb = None

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def wait_for(self, predicate: Any, timeout: float, interval: float = 0.5) -> bool:
        """Poll ``predicate()`` until it is true or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval)
        return bool(predicate())

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
