"""Shared fixtures: real services for the whole session, clean state for every test.

Redis and the MongoDB-protocol server (nx-27017) are started once per session on free ports, the same way
``scrapy services start`` starts them (product_crawl.services). Each test gets its own Redis key prefix and its
own MongoDB database, flushed before and after.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest
import redis as redis_lib

from product_crawl import services
from product_crawl.deploy.plan import acl_rules
from scheduler_ext.keys import Keys
from scheduler_ext.store import Store

PROJECT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def redis_url(services_dir: Path) -> Iterator[str]:
    port = services.free_port()
    proc = services.start_redis_server(port, services_dir / "redis")
    yield f"redis://127.0.0.1:{port}/0"
    services.stop_pid(proc.pid)


@pytest.fixture(scope="session")
def mongo_uri(services_dir: Path) -> Iterator[str]:
    port = services.free_port()
    proc = services.start_mongo_server(port, services_dir / "mongodb")
    yield f"mongodb://127.0.0.1:{port}"
    services.stop_pid(proc.pid)


@pytest.fixture
def redis(redis_url: str) -> Iterator[redis_lib.Redis]:
    client = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def prefix(redis: redis_lib.Redis) -> Iterator[str]:
    """A key prefix of this test's own (a hash tag, like the production default), empty before and after."""
    value = "{t" + uuid.uuid4().hex[:10] + "}"
    store = Store(redis, Keys(value))
    store.purge()
    yield value
    store.purge()


@pytest.fixture
def acl_users(redis: redis_lib.Redis, prefix: str) -> Iterator[dict[str, str]]:
    """A node, a control and a viewer user confined to this test's prefix, with the rules docs/deploy.md gives
    (``product_crawl.deploy.plan.acl_rules``); ``{role: "user:password"}``."""
    users = {role: f"pc-{role}-{uuid.uuid4().hex[:8]}" for role in ("node", "control", "viewer")}
    passwords = {role: uuid.uuid4().hex for role in users}
    for role, user in users.items():
        redis.execute_command("ACL", "SETUSER", user, "on", f">{passwords[role]}", *acl_rules(role, prefix).split())
    yield {role: f"{user}:{passwords[role]}" for role, user in users.items()}
    for user in users.values():
        redis.execute_command("ACL", "DELUSER", user)


@pytest.fixture
def mongo_db(mongo_uri: str) -> Iterator[str]:
    """The name of a MongoDB database of this test's own, dropped before and after."""
    name = "t" + uuid.uuid4().hex[:12]
    client: pymongo.MongoClient = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    client.drop_database(name)
    yield name
    client.drop_database(name)
    client.close()


@pytest.fixture
def scrapy_env(redis_url: str, mongo_uri: str, tmp_path: Path) -> dict[str, str]:
    """Environment for running ``scrapy`` subprocesses against the session's services."""
    env = dict(os.environ)
    env.update(REDIS_URL=redis_url, MONGO_URI=mongo_uri, PC_SERVICES_DIR=str(tmp_path / "var"),
               PYTHONUNBUFFERED="1")
    return env


def run_scrapy(args: list[str], env: dict[str, str] | None = None, timeout: float = 120,
               input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``scrapy ARGS`` in the project folder and capture its output."""
    return subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=PROJECT, env=env, text=True,
                          capture_output=True, timeout=timeout, input=input)


FAST_PROFILE = Path(__file__).resolve().parent / "profiles" / "fast.json"

# Short intervals for process tests: settings, never sleeps, make the mechanisms fast.
FAST_SETTINGS = {"SCHEDEXT_HEARTBEAT_INTERVAL": 0.5, "SCHEDEXT_REFILL_INTERVAL": 0.2, "SCHEDEXT_TICK_INTERVAL": 0.3,
                 "SCHEDEXT_STATS_FLUSH_INTERVAL": 1, "SCHEDEXT_LEADER_TTL": 2, "SCHEDEXT_RECALL_THRESHOLD": 4,
                 "SCHEDEXT_LEASE_GRACE": 2, "SCHEDEXT_PATIENCE": 1, "SCHEDEXT_RETRY_BACKOFF": 0.5,
                 "PC_MONGO_BATCH_DELAY": 0.05, "LOG_LEVEL": "INFO"}


@pytest.fixture
def cluster(redis_url: str, mongo_uri: str, prefix: str, mongo_db: str, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[Any]:
    """A LocalCluster on the session's services with this test's prefix and database; stopped afterwards.

    If the test failed, the tail of every process log is printed to help the reader.
    """
    from product_crawl.cluster import LocalCluster

    c = LocalCluster(redis_url=redis_url, mongo_uri=mongo_uri, mongo_db=mongo_db, prefix=prefix,
                     log_dir=tmp_path / "logs", settings=dict(FAST_SETTINGS))
    yield c
    c.stop()
    print_logs_if_failed(request, tmp_path / "logs")


def print_logs_if_failed(request: pytest.FixtureRequest, log_dir: Path) -> None:
    """If the test failed, print the tail of every process log in ``log_dir`` to help the reader."""
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for log in sorted(log_dir.glob("*.log")):
            print(f"----- {log.name} (tail) -----")
            print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
