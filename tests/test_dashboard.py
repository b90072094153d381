"""Tests of the dashboard's server and API (product_crawl.dashboard, ``scrapy dashboard``) and of the history it
samples (scheduler_ext.history): a real ``scrapy dashboard`` process on a seeded Redis and MongoDB, over HTTP."""

from __future__ import annotations

import base64
import csv
import io
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest
import redis as redis_lib
from conftest import run_scrapy
from dashboard_seed import PRODUCT, TOKEN, seed, start_dashboard

from product_crawl.dashboard.auth import Auth, CredentialsError, Refused
from product_crawl.dashboard.data import EXPORT_BATCH
from scheduler_ext.history import History
from scheduler_ext.keys import Keys
from scheduler_ext.status import collect_status
from scheduler_ext.store import Store


def call(url: str, method: str = "GET", headers: dict[str, str] | None = None,
         body: Any = None) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def store(redis: redis_lib.Redis, prefix: str) -> Store:
    return Store(redis, Keys(prefix))


@pytest.fixture
def items(mongo_uri: str, mongo_db: str) -> Iterator[Any]:
    client: pymongo.MongoClient = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    yield client[mongo_db]["items"]
    client.close()


@pytest.fixture
def seeded(store: Store, items: Any) -> dict[str, str]:
    return seed(store, items)


@pytest.fixture
def dashboards(scrapy_env: dict[str, str], prefix: str, mongo_db: str, tmp_path: Path) -> Iterator[Any]:
    """Start dashboards on this test's prefix: ``dashboards(token=...)``; all stopped afterwards."""
    started = []

    def start(token: str | None = None, env_extra: dict[str, str] | None = None, **settings: str) -> Any:
        env = dict(scrapy_env, **(env_extra or {}))
        if token:
            env["PC_DASHBOARD_TOKEN"] = token
        proc = start_dashboard(env, prefix, mongo_db, tmp_path / f"dashboard{len(started)}.log", **settings)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def _post(url: str, action: str, entry_id: str, token: str | None = None, csrf: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if csrf:
        headers["X-CSRF-Token"] = csrf
    status, _, body = call(url + f"api/deadletter/{action}", "POST", headers, {"id": entry_id})
    return status, json.loads(body)


def test_api_serves_the_status_snapshot_and_never_a_connection_secret(
        store: Store, seeded: dict[str, str], dashboards: Any, redis_url: str, mongo_uri: str) -> None:
    url = dashboards(TOKEN).url
    status, headers, body = call(url + "api/status")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    snap = json.loads(body)
    direct = collect_status(store)
    assert snap["v"] == 1 and snap["completion"] == direct["completion"] and snap["queues"] == direct["queues"]
    assert snap["completion"]["a.example"]["node1"]["completion"] == pytest.approx(0.9)
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    secrets_ = [redis_url, mongo_uri, redis_url.split("//")[1].split("/")[0], mongo_uri.split("//")[1], TOKEN]
    for path in ("api/status", "api/history", "api/session", f"api/products?product={PRODUCT}", "api/deadletter",
                 "api/items", "", "static/app.js"):
        code, _, text = call(url + urllib.parse.quote(path, safe="/?=&"))
        assert code == 200, path
        for secret in secrets_:
            assert secret.encode() not in text, (path, secret)


def test_requeue_needs_credentials_and_csrf_then_happens_once_with_an_audit_record(
        store: Store, seeded: dict[str, str], dashboards: Any) -> None:
    url, sid, k = dashboards(TOKEN).url, seeded["subtask"], store.keys
    assert _post(url, "requeue", sid)[0] == 401  # no credentials
    assert _post(url, "requeue", sid, token="wrong-token-0123456789", csrf="x")[0] == 401
    code, body = _post(url, "requeue", sid, token=TOKEN)
    assert code == 403 and "CSRF" in body["error"]
    csrf = json.loads(call(url + "api/session", headers={"Authorization": f"Bearer {TOKEN}"})[2])["csrf"]
    assert store.redis.hexists(k.dead, sid) and store.redis.zscore(k.waiting, sid) is None  # nothing happened yet
    code, body = _post(url, "requeue", sid, token=TOKEN, csrf=csrf)
    assert (code, body["to"]) == (200, "waiting")
    assert store.redis.zscore(k.waiting, sid) is not None and not store.redis.hexists(k.dead, sid)
    assert json.loads(store.redis.hget(k.subtasks, sid))["attempt"] == 0
    code, body = _post(url, "requeue", sid, token=TOKEN, csrf=csrf)  # a second click: refused, nothing changes
    assert code == 404 and sid in body["error"]
    audit = [json.loads(r) for r in store.redis.lrange(k.audit, 0, -1)]
    assert len(audit) == 1
    assert audit[0]["action"] == "requeue" and audit[0]["id"] == sid and audit[0]["to"] == "waiting"
    assert audit[0]["actor"] == "dashboard:token@127.0.0.1" and audit[0]["entry"]["kind"] == "subtask"
    code, body = _post(url, "requeue", seeded["report"], token=TOKEN, csrf=csrf)
    assert code == 409 and "drop" in body["error"]  # a malformed report holds nothing to requeue
    assert _post(url, "drop", seeded["report"], token=TOKEN, csrf=csrf)[0] == 200
    assert store.redis.hlen(k.dead) == 0 and store.redis.llen(k.audit) == 2
    assert store.redis.hget(k.counters, "requeued") == "1" and store.redis.hget(k.counters, "dropped") == "1"


def test_read_only_dashboard_refuses_every_action(store: Store, seeded: dict[str, str], dashboards: Any) -> None:
    url = dashboards().url
    session = json.loads(call(url + "api/session")[2])
    assert session["actions"] is False and session["operator"] is None
    failures = json.loads(call(url + "api/deadletter")[2])["failures"]
    assert [(f["node"], f["site"], f["reason"]) for f in failures] == [("node1", "b.example", "blocked: 403")]
    code, body = _post(url, "requeue", seeded["subtask"], token=TOKEN, csrf=session["csrf"])
    assert code == 403 and "read-only" in body["error"]
    assert store.redis.hlen(store.keys.dead) == 2 and store.redis.llen(store.keys.audit) == 0


def test_cross_origin_post_and_foreign_host_are_refused(store: Store, seeded: dict[str, str],
                                                         dashboards: Any) -> None:
    url = dashboards(TOKEN).url
    csrf = json.loads(call(url + "api/session")[2])["csrf"]
    headers = {"Authorization": f"Bearer {TOKEN}", "X-CSRF-Token": csrf, "Origin": "http://evil.example",
               "Content-Type": "application/json"}
    status, _, body = call(url + "api/deadletter/drop", "POST", headers, {"id": seeded["report"]})
    assert status == 403 and b"cross-origin" in body
    status, _, _ = call(url + "api/status", headers={"Host": "evil.example"})  # DNS rebinding to a loopback server
    assert status == 403
    assert store.redis.hlen(store.keys.dead) == 2


def test_a_poll_for_new_samples_reads_only_the_tail(store: Store) -> None:
    hist = History(store, interval=60, maxlen=1000)
    samples = [json.dumps({"v": 1, "t": float(t)}) for t in range(500)]
    store.redis.rpush(store.keys.history, *samples)
    assert [s["t"] for s in hist.read(since=497)] == [498.0, 499.0]
    assert [s["t"] for s in hist.read(since=100)] == [float(t) for t in range(101, 500)]  # reads further back
    assert len(hist.read()) == 500 and len(hist.read(limit=20)) == 20


def test_history_is_sampled_into_redis_and_survives_a_restart(store: Store, seeded: dict[str, str],
                                                              dashboards: Any) -> None:
    first = dashboards()
    hist = History(store, 0.5, 100)
    assert _wait(lambda: len(hist.read()) >= 2)
    first.stop()
    before = hist.read()
    assert before[-1]["completion"]["a.example"]["node2"] == pytest.approx(0.2) and before[-1]["items"] == 8
    samples = json.loads(call(dashboards().url + "api/history")[2])["samples"]
    assert [s["t"] for s in samples[:len(before)]] == [s["t"] for s in before]  # read back after the restart
    assert samples[0]["alive"] == 3 and samples[0]["pages"] == 11


def test_history_takes_one_sample_per_interval_and_keeps_the_newest(store: Store) -> None:
    status = collect_status(store)
    hist = History(store, interval=60, maxlen=3)
    assert hist.record(status) is True
    assert hist.record(status) is False  # the interval's slot is taken, whoever offers the next sample
    for i in range(5):
        store.redis.delete(store.keys.history_slot)
        assert hist.record({**status, "time": 1000.0 + i})
    assert [s["t"] for s in hist.read()] == [1002.0, 1003.0, 1004.0]
    store.redis.rpush(store.keys.history, "not json", json.dumps([1]))
    reader = History(store, interval=60, maxlen=100)
    assert [s["t"] for s in reader.read(since=1002.5)] == [1003.0, 1004.0]  # bad entries skipped, not fatal
    assert [s["t"] for s in reader.read(since=1002.5, limit=1)] == [1004.0]


def test_items_search_and_streamed_export(store: Store, items: Any, dashboards: Any) -> None:
    seed(store, items)
    n = EXPORT_BATCH * 2 + 7  # more than one chunk
    items.insert_many([{"_id": f"x{i}", "product": "特仑苏", "site": "c.example", "title": f"t{i}",
                        "url": f"http://c.example/{i}", "snippet": "", "crawled_at": float(i)} for i in range(n)])
    url = dashboards().url
    found = json.loads(call(url + "api/items?" + urllib.parse.urlencode({"product": PRODUCT, "q": "质量"}))[2])
    assert sorted(i["title"] for i in found["items"]) == [f"{PRODUCT} 质量问题 {i}" for i in (1, 3, 5, 7)]
    status, headers, body = call(url + "api/export?" + urllib.parse.urlencode({"product": "特仑苏"}))
    assert status == 200 and headers["Content-Type"].startswith("application/x-ndjson")
    lines = body.decode().splitlines()
    assert len(lines) == n and {json.loads(line)["product"] for line in lines} == {"特仑苏"}
    status, headers, body = call(url + "api/export?" + urllib.parse.urlencode({"product": PRODUCT, "format": "csv"}))
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert status == 200 and len(rows) == 8
    first = next(r for r in rows if r["title"].endswith(" 0"))
    assert first["snippet"] == "'=HYPERLINK(\"x\")"  # a formula in crawled text is escaped for spreadsheets
    assert first["url"] == "http://a.example/item/0"
    assert call(url + "api/export?product=x&format=xml")[0] == 400


def test_basic_auth_login_then_an_audited_drop(store: Store, seeded: dict[str, str], dashboards: Any) -> None:
    url = dashboards(env_extra={"PC_DASHBOARD_USER": "alice", "PC_DASHBOARD_PASSWORD": "correct horse battery"}).url
    status, headers, _ = call(url + "login")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")  # the browser asks
    good = {"Authorization": "Basic " + base64.b64encode(b"alice:correct horse battery").decode()}
    session = json.loads(call(url + "api/session", headers=good)[2])
    assert session["operator"] == "alice" and session["methods"] == ["basic"]
    bad = {"Authorization": "Basic " + base64.b64encode(b"alice:admin").decode()}
    assert call(url + "api/session", headers=bad)[0] == 401
    status, _, body = call(url + "api/deadletter/drop", "POST", {**good, "X-CSRF-Token": session["csrf"],
                                                                 "Content-Type": "application/json"},
                           {"id": seeded["report"]})
    assert status == 200, body
    assert json.loads(store.redis.lindex(store.keys.audit, 0))["actor"] == "dashboard:alice@127.0.0.1"


def test_mongodb_down_gives_503_without_its_address(store: Store, seeded: dict[str, str], dashboards: Any) -> None:
    from product_crawl.services import free_port

    down = f"mongodb://127.0.0.1:{free_port()}"
    url = dashboards(env_extra={"MONGO_URI": down}).url
    assert call(url + "api/status")[0] == 200  # Redis views do not depend on MongoDB
    for path in ("api/items", f"api/export?product={urllib.parse.quote(PRODUCT)}"):
        status, _, body = call(url + path)
        assert status == 503 and b"MongoDB did not answer" in body and down.split("//")[1].encode() not in body


def test_weak_or_default_credentials_are_refused() -> None:
    for env in ({"PC_DASHBOARD_USER": "admin", "PC_DASHBOARD_PASSWORD": "admin"},
                {"PC_DASHBOARD_TOKEN": "short"}, {"PC_DASHBOARD_USER": "alice"},
                {"PC_DASHBOARD_USER": "alice", "PC_DASHBOARD_PASSWORD": "changeme"}):
        with pytest.raises(CredentialsError, match="PC_DASHBOARD_"):
            Auth.from_settings(env)
    auth = Auth.from_settings({"PC_DASHBOARD_USER": "alice", "PC_DASHBOARD_PASSWORD": "correct horse battery"})
    assert auth.principal(b"Basic " + base64.b64encode(b"alice:correct horse battery")) == "alice"
    with pytest.raises(Refused):
        auth.principal(b"Basic " + base64.b64encode(b"alice:wrong"))
    with pytest.raises(Refused):
        auth.principal(b"Bearer anything-at-all-here")  # token auth is not configured
    assert auth.principal(None) is None


def test_dashboard_command_refuses_default_credentials(scrapy_env: dict[str, str]) -> None:
    env = dict(scrapy_env, PC_DASHBOARD_USER="admin", PC_DASHBOARD_PASSWORD="admin")
    result = run_scrapy(["dashboard", "--port", "0"], env=env, timeout=60)
    assert result.returncode == 2 and "PC_DASHBOARD_" in result.stderr and "admin" in result.stderr
    # a port that cannot be, from the command line or the settings: named before anything opens
    result = run_scrapy(["dashboard", "--port", "70000"], env=scrapy_env, timeout=60)
    assert result.returncode == 2 and "--port: expected a TCP port 0 .. 65535" in result.stderr, result.stderr
    result = run_scrapy(["dashboard", "-s", "PC_DASHBOARD_PORT=-1"], env=scrapy_env, timeout=60)
    assert result.returncode == 2 and "PC_DASHBOARD_PORT: expected a TCP port 0 .. 65535" in result.stderr


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "1e9"])
def test_dashboard_refresh_must_be_seconds(value: str, scrapy_env: dict[str, str]) -> None:
    # It reaches the browser as JSON: NaN made /api/session invalid JSON. Refused before anything opens.
    result = run_scrapy(["dashboard", "--port", "0", "-s", f"PC_DASHBOARD_REFRESH={value}"], env=scrapy_env, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"PC_DASHBOARD_REFRESH: expected a number of seconds > 0 and <= 3600, got {value!r}" in result.stderr


def test_dashboard_that_cannot_listen_names_the_host(scrapy_env: dict[str, str], prefix: str) -> None:
    result = run_scrapy(["dashboard", "--host", "nonsense.invalid", "--port", "0", "-s", f"SCHEDEXT_PREFIX={prefix}"],
                        env=scrapy_env, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "error: cannot listen on host 'nonsense.invalid' port 0 (--host / PC_DASHBOARD_HOST" in result.stderr


def _wait(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())
