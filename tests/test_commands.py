"""status, deadletter and strategy-setting errors, run as a person runs them: ``scrapy ...`` subprocesses."""

from __future__ import annotations

import json

import redis as redis_lib
from conftest import run_scrapy

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


def test_bad_strategy_path_fails_at_start_naming_the_setting(prefix: str, scrapy_env: dict[str, str]) -> None:
    result = run_scrapy(["crawl", "control", "-s", f"SCHEDEXT_PREFIX={prefix}",
                         "-s", "SCHEDEXT_MODIFICATION=scheduler_ext.strategies.nothing.Here"], scrapy_env, timeout=60)
    assert result.returncode != 0
    assert "SCHEDEXT_MODIFICATION" in result.stderr and "scheduler_ext.strategies.nothing.Here" in result.stderr
