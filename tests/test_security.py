"""Secure by default: Redis never chooses code, nodes fetch only from the engines' hosts and refuse oversized input,
least-privilege Redis users suffice, secrets stay out of output."""

from __future__ import annotations

import doctest
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
from conftest import FAST_PROFILE, FAST_SETTINGS, run_scrapy
from scrapy import Request
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler
from test_node import subtask

from product_crawl import services
from product_crawl.cluster import LocalCluster, NodeSpec
from product_crawl.deploy import plan
from product_crawl.engines import get_engine
from product_crawl.guard import EngineHostMiddleware, ItemRefused, RequestRefused, check_fields
from product_crawl.pipelines import MongoPipeline
from product_crawl.services import (
    free_port,
    generate_password,
    mask_url,
    start_redis_server,
    stop_pid,
    with_password,
)
from product_crawl.tasks import parse_virtual_task, split
from scheduler_ext.connection import describe, redis_from_settings
from scheduler_ext.exceptions import InvalidInput
from scheduler_ext.models import Report

# --- Redis never chooses code ---------------------------------------------------------------------------------


def test_engine_dotted_path_is_refused_unless_allowed_and_nothing_is_imported() -> None:
    sys.modules.pop("this", None)
    with pytest.raises(ValueError, match="'this.Engine' is not allowed: list its dotted path in PC_ALLOWED_ENGINES"):
        get_engine("this.Engine")
    assert "this" not in sys.modules  # refused before any import: an import runs module code
    vt = parse_virtual_task({"name": "光明牛奶", "engines": ["product_crawl.engines.baidu.BaiduEngine"]})
    with pytest.raises(InvalidInput, match="engines: .*PC_ALLOWED_ENGINES"):
        split(vt)
    allowed = {"PC_ALLOWED_ENGINES": ["product_crawl.engines.baidu.BaiduEngine"]}
    assert {s["payload"]["engine"] for s in split(vt, allowed)} == {"product_crawl.engines.baidu.BaiduEngine"}


# --- what a node fetches and stores ---------------------------------------------------------------------------


def test_engine_host_middleware_sends_only_to_the_engines_hosts() -> None:
    crawler = get_crawler(settings_dict={"PC_ENGINE_BASE_URLS": {"baidu": "http://127.0.0.1:8123"}})
    mw = EngineHostMiddleware.from_crawler(crawler)
    assert mw.process_request(Request("http://127.0.0.1:8123/s?wd=x")) is None
    assert mw.process_request(Request("http://weibo.yunyun.com/q?k=x")) is None  # the default weibo host
    for url in ("http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:6379/", "https://127.0.0.1:8123/s",
                "http://127.0.0.1.evil.example:8123/", "file:///etc/passwd", "data:,x", "ftp://127.0.0.1:8123/",
                "s3://bucket/key"):
        with pytest.raises(RequestRefused, match="is not on an engine's host"):
            mw.process_request(Request(url, dont_filter=True))


def _result(coro: Any) -> Any:
    """The value of a coroutine that never suspends (the pytest reactor already runs an event loop)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")


def test_storage_refuses_an_oversized_field_with_its_name_before_writing() -> None:
    crawler = get_crawler(settings_dict={"PC_ITEM_FIELD_MAXLEN": 100})
    crawler.stats = MemoryStatsCollector(crawler)
    pipeline = MongoPipeline.from_crawler(crawler)
    check_fields({"title": "t" * 100, "url": "http://x.example/", "rank": 10 ** 6}, 100)  # at the limit: kept
    with pytest.raises(ItemRefused, match=r"field 'snippet' has 101 characters, over PC_ITEM_FIELD_MAXLEN \(100\)"):
        _result(pipeline.process_item({"snippet": "s" * 101, "url": "http://x.example/"}))
    assert not pipeline._batch  # nothing queued for MongoDB
    assert crawler.stats.get_value("pc/guard/item_refused") == 1


def _failed_reasons(cluster: LocalCluster) -> dict[str, str]:
    reports = [Report.from_json(r) for r in cluster.redis.lrange(cluster.store.keys.failed, 0, -1)]
    return {r.subtask.id: r.reason or "" for r in reports}


def test_node_refuses_oversized_pages_oversized_items_and_unlisted_engines(cluster: LocalCluster) -> None:
    cluster.start_simweb(FAST_PROFILE)
    crawl = cluster.store.keys.crawl("node1")
    evil = subtask("s2", pages=1)
    evil.payload["engine"] = "os.path.Engine"
    for st in (subtask("s1", pages=1), evil):
        cluster.redis.lpush(crawl, st.to_json())
    proc = cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_IDLE_CLOSE=1, PC_ITEM_FIELD_MAXLEN=5)
    assert proc.wait(60) == 0
    reasons = _failed_reasons(cluster)
    assert "over PC_ITEM_FIELD_MAXLEN (5)" in reasons["s1"]
    assert "'os.path.Engine' is not allowed" in reasons["s2"]
    assert cluster.items() == 0

    cluster.redis.lpush(crawl, subtask("s3", pages=1).to_json())
    proc = cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_IDLE_CLOSE=1, DOWNLOAD_MAXSIZE=1000)
    assert proc.wait(60) == 0
    assert "page larger than DOWNLOAD_MAXSIZE (1000 bytes) refused" in _failed_reasons(cluster)["s3"]
    assert cluster.items() == 0


# --- Redis passwords and ACL users ---------------------------------------------------------------------------


def test_redis_with_a_password_refuses_a_node_without_it(tmp_path: Any, mongo_uri: str, mongo_db: str) -> None:
    port, password = free_port(), generate_password()
    proc = start_redis_server(port, tmp_path / "redis", password=password)
    try:
        assert password.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        url = f"redis://127.0.0.1:{port}/0"
        cluster = LocalCluster(redis_url=url, mongo_uri=mongo_uri, mongo_db=mongo_db, prefix="{nopw}",
                               log_dir=tmp_path / "logs", settings=dict(FAST_SETTINGS))
        try:
            node = cluster.start_node(NodeSpec("node1", "127.0.0.2"))
            control = cluster.start_control("control")
            # Both stop at once with an error naming the server, instead of retrying as if Redis were down.
            for process, name in ((node, "node1"), (control, "control")):  # not `proc`: the finally stops Redis
                assert process.wait(timeout=120) != 0
                log = (tmp_path / "logs" / f"{name}.log").read_text()
                assert "refused the credentials" in log and f"127.0.0.1:{port}" in log, log[-2000:]
                assert password not in log
        finally:
            cluster.stop()
        with redis_lib.Redis.from_url(with_password(url, password)) as admin:
            assert not admin.keys("*")  # the node registered nothing, read nothing
    finally:
        stop_pid(proc.pid)


# --- Redis ACL users ----------------------------------------------------------------------------------------


def test_least_privilege_acl_users_run_a_whole_crawl(redis_url: str, mongo_uri: str, prefix: str, mongo_db: str,
                                                      redis: redis_lib.Redis, acl_users: dict[str, str],
                                                      tmp_path: Any) -> None:
    def url(role: str) -> str:
        return redis_url.replace("redis://", f"redis://{acl_users[role]}@")

    common = dict(mongo_uri=mongo_uri, mongo_db=mongo_db, prefix=prefix, settings=dict(FAST_SETTINGS))
    node = LocalCluster(redis_url=url("node"), log_dir=tmp_path / "node", **common)
    control = LocalCluster(redis_url=url("control"), log_dir=tmp_path / "control", **common)
    try:
        base = node.start_simweb(FAST_PROFILE)
        control.settings.update(node.settings)
        node.start_node(NodeSpec("node1", "127.0.0.2"))
        control.start_control("control-a")
        control.inject([{"name": "光明高钙牛奶", "sites": ["good.example"]}])
        assert node.wait_for(lambda: bool(node.status()["products"]) and all(
            p["done"] == p["tasks"] > 0 for p in node.status()["products"].values()), 90), \
            (tmp_path / "node" / "node1.log").read_text()[-3000:]
        assert node.items() > 0
        # The viewer reads the status; none of them reaches a key outside the prefix.
        viewer = run_scrapy(["status", "--json", "-s", f"SCHEDEXT_PREFIX={prefix}"],
                            {"REDIS_URL": url("viewer"), "PATH": "/usr/bin:/bin"})
        assert viewer.returncode == 0, viewer.stderr
        assert json.loads(viewer.stdout)["nodes"][0]["id"] == "node1"
        assert acl_users["viewer"].split(":")[1] not in viewer.stdout + viewer.stderr
        confined = redis_lib.Redis.from_url(url("node"))
        with pytest.raises(redis_lib.exceptions.NoPermissionError):
            confined.get("{other}:virtual")
        with pytest.raises(redis_lib.exceptions.NoPermissionError):
            confined.flushdb()
        confined.close()
        assert base
    finally:
        node.stop()
        control.stop()


def test_rediss_urls_and_acl_users_reach_redis_py_unchanged() -> None:
    client = redis_from_settings({"REDIS_URL": "rediss://pc-node:s3cret@redis.example:6380/0",
                                  "REDIS_PARAMS": {"ssl_ca_certs": "/etc/pc/ca.pem"}})
    kw = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis_lib.SSLConnection
    assert (kw["username"], kw["password"], kw["port"], kw["ssl_ca_certs"]) == ("pc-node", "s3cret", 6380,
                                                                                "/etc/pc/ca.pem")
    assert "s3cret" not in describe(client)


# --- secrets stay out of output -------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [services, plan])
def test_doctests(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_mongo_and_redis_credentials_are_masked_in_status_output(tmp_path: Any, redis_url: str) -> None:
    secret = "s3cret-" + uuid.uuid4().hex[:6]
    env = {"PATH": "/usr/bin:/bin", "PC_SERVICES_DIR": str(tmp_path / "var"),
           "REDIS_URL": redis_url.replace("redis://", f"redis://:{secret}@"),
           "MONGO_URI": f"mongodb://pc:{secret}@127.0.0.1:1/?authSource=admin"}
    done = run_scrapy(["services", "status"], env)
    assert done.returncode == 1  # neither answers with these credentials
    assert secret not in done.stdout + done.stderr
    assert "mongodb://pc:***@127.0.0.1:1/" in done.stdout
    assert mask_url(env["REDIS_URL"]) in done.stdout
