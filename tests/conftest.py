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

import pymongo
import pytest
import redis as redis_lib

from product_crawl import services

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


def _delete_prefix(client: redis_lib.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def redis(redis_url: str) -> Iterator[redis_lib.Redis]:
    client = redis_lib.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def prefix(redis: redis_lib.Redis) -> Iterator[str]:
    """A key prefix of this test's own (a hash tag, like the production default), empty before and after."""
    value = "{t" + uuid.uuid4().hex[:10] + "}"
    _delete_prefix(redis, value)
    yield value
    _delete_prefix(redis, value)


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
