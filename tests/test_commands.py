"""status, deadletter and strategy-setting errors, run as a person runs them: ``scrapy ...`` subprocesses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import redis as redis_lib
from conftest import run_scrapy

from product_crawl.services import check_mongo_uri
from scheduler_ext.connection import check_redis_url, redis_from_settings
from scheduler_ext.exceptions import ConfigurationError
from scheduler_ext.keys import Keys
from scheduler_ext.models import Subtask


def _dead_subtask(redis: redis_lib.Redis, keys: Keys, sid: str) -> None:
    st = Subtask(id=sid, task="t1", site="a.com", group="p", first_page=5, page_limit=3, time_limit=20, attempt=4,
                 avoid=["n1"])
    entry = {"v": 1, "id": sid, "kind": "subtask", "reason": "failed on n1: blocked", "attempts": 5,
             "last_node": "n1", "subtask": json.loads(st.to_json()), "at": 1.0}
    redis.hset(keys.dead, sid, json.dumps(entry))


def test_status_json_reflects_queues_and_nodes(redis: redis_lib.Redis, prefix: str, scrapy_env: dict[str, str]
                                               ) -> None:
    keys = Keys(prefix)
    redis.zadd(keys.waiting, {"1": 1, "2": 2, "3": 3})
    redis.lpush(keys.crawl("n1"), "{}")
    redis.hset(keys.nodes, "n1", json.dumps({"type": [0, 1], "address": "127.0.0.2", "subtasks": ["9"]}))
    redis.zadd(keys.node_seen, {"n1": float(redis.time()[0])})
    redis.hset(keys.node_counters("n1"), mapping={"moved_out": 2, "recalled": 1})
    _dead_subtask(redis, keys, "42")
    result = run_scrapy(["status", "--json", "-s", f"SCHEDEXT_PREFIX={prefix}"], scrapy_env)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["v"] == 1 and status["prefix"] == prefix
    assert status["queues"]["waiting"] == 3 and status["queues"]["crawl"] == {"n1": 1}
    assert status["queues"]["dead"] == 1
    [node] = status["nodes"]
    assert node["id"] == "n1" and node["alive"] and node["address"] == "127.0.0.2" and node["subtasks"] == ["9"]
    assert node["counts"]["moved_out"] == 2 and node["counts"]["recalled"] == 1
    human = run_scrapy(["status", "-s", f"SCHEDEXT_PREFIX={prefix}"], scrapy_env)
    assert human.returncode == 0 and "waiting 3" in human.stdout and "127.0.0.2" in human.stdout


def test_deadletter_list_requeue_drop_and_unknown_id(redis: redis_lib.Redis, prefix: str,
                                                     scrapy_env: dict[str, str]) -> None:
    keys = Keys(prefix)
    _dead_subtask(redis, keys, "42")
    _dead_subtask(redis, keys, "43")
    opts = ["-s", f"SCHEDEXT_PREFIX={prefix}"]
    listed = run_scrapy(["deadletter", "list", *opts], scrapy_env)
    assert listed.returncode == 0 and "42" in listed.stdout and "blocked" in listed.stdout
    assert "2 dead-letter entries" in listed.stdout

    requeued = run_scrapy(["deadletter", "requeue", "42", *opts], scrapy_env)
    assert requeued.returncode == 0, requeued.stderr
    assert redis.zscore(keys.waiting, "42") is not None and not redis.hexists(keys.dead, "42")
    back = Subtask.from_json(redis.hget(keys.subtasks, "42"))
    assert back.attempt == 0 and back.avoid == [] and back.first_page == 5

    dropped = run_scrapy(["deadletter", "drop", "43", *opts], scrapy_env)
    assert dropped.returncode == 0 and not redis.hlen(keys.dead)

    unknown = run_scrapy(["deadletter", "requeue", "nope", *opts], scrapy_env)
    assert unknown.returncode == 1 and "'nope'" in unknown.stderr
    assert redis.zcard(keys.waiting) == 1


def test_tools_set_aside_a_key_of_another_type_and_do_their_work(redis: redis_lib.Redis, prefix: str,
                                                                  scrapy_env: dict[str, str]) -> None:
    """``status``, ``deadletter`` and ``inject`` ended with redis-py's WRONGTYPE traceback while a key they read was
    set by hand to another type (until a control tick or a node met it). Each now sets every such key of the
    deployment aside (kept, counted, a warning naming it) and does its work."""
    keys = Keys(prefix)
    opts = ["-s", f"SCHEDEXT_PREFIX={prefix}"]
    _dead_subtask(redis, keys, "42")
    redis.set(keys.waiting, "x")
    redis.hset(keys.node_counters("n1"), "moved_out", 1)
    redis.set(keys.est_site("a.com"), "x")
    status = run_scrapy(["status", "--json", *opts], scrapy_env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["queues"]["dead"] == 1
    assert f"{keys.waiting} was a string where a zset belongs" in status.stderr
    [aside] = redis.keys(f"{keys.prefix}:garbage:waiting:*")
    assert redis.type(aside) == "string" and redis.get(aside) == "x"
    redis.set(keys.dead, "x")  # its entry is gone with it; the list is empty, not a traceback
    listed = run_scrapy(["deadletter", "list", *opts], scrapy_env)
    assert listed.returncode == 0 and "0 dead-letter entries" in listed.stdout, listed.stderr
    redis.hset(keys.virtual, "x", "x")
    injected = run_scrapy(["inject", "--product", "牛奶", *opts], scrapy_env)
    assert injected.returncode == 0, injected.stderr
    assert redis.llen(keys.virtual) == 1 and redis.hget(keys.counters, "garbage_keys") == "4"


def test_bad_strategy_path_fails_at_start_naming_the_setting(prefix: str, scrapy_env: dict[str, str]) -> None:
    result = run_scrapy(["crawl", "control", "-s", f"SCHEDEXT_PREFIX={prefix}",
                         "-s", "SCHEDEXT_MODIFICATION=scheduler_ext.strategies.nothing.Here"], scrapy_env, timeout=60)
    assert result.returncode != 0
    assert "SCHEDEXT_MODIFICATION" in result.stderr and "scheduler_ext.strategies.nothing.Here" in result.stderr


# --- malformed settings and options: one line naming the input, never a traceback -----------------------------------

URL_EXPECTED = "REDIS_URL: expected redis://HOST:PORT/DB (or rediss://HOST:PORT/DB, unix:///PATH), got "


@pytest.mark.parametrize("command", [["status"], ["deadletter", "list"], ["inject", "--product", "x"],
                                     ["dashboard", "--port", "0"], ["services", "status"]])
def test_malformed_redis_url_is_named_by_every_command(command: list[str], tmp_path: Path) -> None:
    env = dict(os.environ, REDIS_URL="notaurl", PC_SERVICES_DIR=str(tmp_path / "var"))
    result = run_scrapy(command, env, timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"{URL_EXPECTED}'notaurl'" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_redis_url_port_out_of_range_is_named_without_the_password(tmp_path: Path) -> None:
    env = dict(os.environ, REDIS_URL="redis://:s3cret@h:99999999/0", PC_SERVICES_DIR=str(tmp_path / "var"))
    result = run_scrapy(["status"], env, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{URL_EXPECTED}'redis://:***@h:99999999/0' (Port out of range" in result.stderr
    assert "s3cret" not in result.stderr


@pytest.mark.parametrize(("url", "problem"), [
    ("notaurl", ""), ("redis:/h", ""), ("redis://h:abc/0", "Port could not be cast"), ("redis://h/x", "database"),
    ("redis://h/²", "database '²'"), ("redis://h/١", "database '١'"),
    ("redis://h/0?db=x", "Invalid value for 'db'"), ("redis://[::1/0", "Invalid IPv6"), ("unix://", "socket path"),
])
def test_check_redis_url_names_the_setting(url: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match="^REDIS_URL: expected redis://") as info:
        check_redis_url(url)
    assert problem in str(info.value)


def test_check_redis_url_accepts_what_redis_py_accepts() -> None:
    for url in ("redis://127.0.0.1:6379/0", "redis://h", "rediss://:pw@h:6380/2", "unix:///tmp/redis.sock",
                "redis://u:p@h:1/?db=3"):
        check_redis_url(url)


MONGO_EXPECTED = ("MONGO_URI: expected mongodb://[USER:PASSWORD@]HOST[:PORT][,HOST...][/DATABASE][?OPTIONS] "
                  "(or mongodb+srv://HOST), got ")


@pytest.mark.parametrize(("action", "uri", "shown"), [
    ("status", "notaurl", "'notaurl'"), ("start", "notaurl", "'notaurl'"),
    ("status", "mongodb://pc:s3cret@h:99999/", "'mongodb://pc:***@h:99999/' (Port must be an integer"),
])
def test_malformed_mongo_uri_is_named_by_services(action: str, uri: str, shown: str, redis_url: str,
                                                  tmp_path: Path) -> None:
    """It was only a MongoDB "NOT answering" (pymongo takes notaurl for a host name), as REDIS_URL once was."""
    env = dict(os.environ, REDIS_URL=redis_url, PC_SERVICES_DIR=str(tmp_path / "var"))
    result = run_scrapy(["services", action, "-s", f"MONGO_URI={uri}"], env, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{MONGO_EXPECTED}{shown}" in result.stderr and "s3cret" not in result.stdout + result.stderr
    assert not result.stdout  # named before anything is looked at or started


@pytest.mark.parametrize(("uri", "problem"), [
    ("notaurl", ""), ("localhost:27017", ""), ("MONGODB://h", ""), ("mongodb://", "at least one hostname"),
    ("mongodb://h:abc", "Port contains non-digit"), ("mongodb://[::1", "IPv6"), ("mongodb://h/a b", "database"),
])
def test_check_mongo_uri_names_the_setting(uri: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^MONGO_URI: expected mongodb://") as info:
        check_mongo_uri(uri)
    assert problem in str(info.value)


def test_check_mongo_uri_accepts_what_mongo_client_accepts() -> None:
    for uri in ("mongodb://127.0.0.1:27017", "mongodb://pc:pw@m1.example,m2.example/db?replicaSet=rs0&tls=true",
                "mongodb://[::1]:27017/", "mongodb+srv://cluster0.example.net/?retryWrites=true",
                "mongodb://h/?someFutureOption=1"):  # MongoClient warns about an option it does not know, and goes on
        check_mongo_uri(uri)


def test_redis_params_that_is_not_a_dict_is_named() -> None:
    for value in ("[1]", "{", "[" * 100_000):
        with pytest.raises(ConfigurationError, match="^REDIS_PARAMS: expected a dict"):
            redis_from_settings({"REDIS_PARAMS": value})


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "1e308", "2s"])
def test_status_watch_must_be_seconds(value: str, scrapy_env: dict[str, str]) -> None:
    # --watch=0 used to run once and exit 0; the others to crash in time.sleep.
    result = run_scrapy(["status", f"--watch={value}"], dict(scrapy_env, REDIS_URL="redis://127.0.0.1:1/0"))
    assert result.returncode == 2, result.stderr
    assert (f"argument --watch: expected a number of seconds > 0 and <= 86400, got {value!r}"
            in result.stderr), result.stderr  # refused before connecting: this Redis URL does not answer


@pytest.mark.parametrize(("command", "value"), [
    (["split", "牛奶"], "[1]"), (["split", "牛奶"], '{"baidu": 5}'), (["split", "牛奶"], "[" * 100_000),
    (["parse_page", "tests/pages/baidu_2017.html"], "[[["),
    (["parse_page", "tests/pages/baidu_2017.html"], '{"baidu": "ftp://x"}'),
])
def test_bad_engine_base_urls_are_named_by_split_and_parse_page(command: list[str], value: str) -> None:
    result = run_scrapy([*command, "-s", f"PC_ENGINE_BASE_URLS={value}"], timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "error: PC_ENGINE_BASE_URLS" in result.stderr and "expected" in result.stderr, result.stderr
    assert len(result.stderr) < 1000  # a 100,000-character value is shown cut short
