"""``scrapy services start|stop|status`` as a person runs it, against real servers on free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROJECT, run_scrapy
from scrapy.settings import Settings

from product_crawl import services


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, PC_SERVICES_DIR=str(tmp_path / "var"))
    env.pop("REDIS_URL", None)
    env.pop("MONGO_URI", None)
    return env


def _embedded(rport: int, mport: int) -> list[str]:
    return ["-s", f"PC_EMBEDDED_REDIS_URL=redis://127.0.0.1:{rport}/0",
            "-s", f"PC_EMBEDDED_MONGO_URI=mongodb://127.0.0.1:{mport}"]


def test_explicit_url_that_does_not_answer_fails_naming_it(tmp_path: Path) -> None:
    port = services.free_port()
    env = dict(_env(tmp_path), REDIS_URL=f"redis://127.0.0.1:{port}/0")
    result = run_scrapy(["services", "start"], env)
    assert result.returncode == 1
    assert f"redis://127.0.0.1:{port}/0" in result.stderr
    assert not services.redis_answers(f"redis://127.0.0.1:{port}/0")  # never starts another one silently


def test_start_twice_status_stop(tmp_path: Path) -> None:
    rport, mport = services.free_port(), services.free_port()
    env, opts = _env(tmp_path), _embedded(rport, mport)
    try:
        first = run_scrapy(["services", "start", *opts], env)
        assert first.returncode == 0, first.stderr
        assert first.stdout.count("started") == 2
        second = run_scrapy(["services", "start", *opts], env)
        assert second.returncode == 0 and second.stdout.count("already answering") == 2
        status = run_scrapy(["services", "status", *opts], env)
        assert status.returncode == 0
        assert f"redis://:***@127.0.0.1:{rport}/0" in status.stdout and f"mongodb://127.0.0.1:{mport}" in status.stdout
        assert status.stdout.count(" answering") == 2
        # The embedded Redis has a password: generated once, readable by its owner only, never in argv or output.
        password_file = tmp_path / "var" / "redis" / "password"
        password = password_file.read_text().strip()
        assert password_file.stat().st_mode & 0o777 == 0o600 and len(password) >= 24
        assert password not in first.stdout + second.stdout + status.stdout
        pid = int((tmp_path / "var" / "redis" / "redis.pid").read_text())
        assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert not services.redis_answers(f"redis://127.0.0.1:{rport}/0")  # refused without it
        # Every command finds it through the settings; without it, a clear refusal.
        url = f"redis://127.0.0.1:{rport}/0"
        assert run_scrapy(["status", "-s", f"REDIS_URL={url}"], env).returncode == 0
        refused = run_scrapy(["status"], dict(env, REDIS_URL=url))
        assert refused.returncode == 1 and f"Redis at {url} does not answer" in refused.stderr
        assert "authenticat" in refused.stderr.lower()  # NOAUTH, or HELLO refused before AUTH
        redis_dir = tmp_path / "var" / "redis"  # AOF on, data in the project folder (a file in 6.2, a folder in 7+)
        assert (redis_dir / "appendonly.aof").exists() or (redis_dir / "appendonlydir").is_dir()
    finally:
        stop = run_scrapy(["services", "stop", *opts], env)
    assert stop.returncode == 0 and "redis" in stop.stdout and "mongodb" in stop.stdout
    assert not services.redis_answers(f"redis://127.0.0.1:{rport}/0")
    assert not services.mongo_answers(f"mongodb://127.0.0.1:{mport}")
    after = run_scrapy(["services", "status", *opts], env)
    assert after.returncode == 1 and after.stdout.count("NOT answering") == 2


def test_port_held_by_something_else_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_scrapy(["services", "start", *_embedded(port, services.free_port())], _env(tmp_path),
                            timeout=60)
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "not a redis server" in result.stderr


def test_a_started_redis_rewrites_an_append_only_file_that_outgrew_its_data(tmp_path: Path) -> None:
    # Redis rewrites by itself only when the file doubles within one run of the server; a server started and
    # stopped for every experiment kept every write it ever took (600 MB, slower to load than a start may wait).
    import time

    import redis

    port = services.free_port()
    proc = services.start_redis_server(port, tmp_path / "redis")
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        for i in range(200):  # about 10 MB of writes that leave one small key behind
            client.set("k", "x" * 50_000 + str(i))
        aof = tmp_path / "redis" / "appendonly.aof"
        client.execute_command("CONFIG SET appendfsync always")  # the file's size now, not in a second
        client.set("k", "small")
        grown = aof.stat().st_size
        assert grown > 8_000_000
        assert not services.compact_aof(url, above=100 * grown)  # under the threshold: left alone
        assert services.compact_aof(url, above=1_000_000)
        deadline = time.monotonic() + 30
        while client.info("persistence")["aof_rewrite_in_progress"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert aof.stat().st_size < grown // 10 and client.get("k") == b"small"
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


def _holder(base: Path, prefix: str) -> subprocess.Popen[str]:
    """Another process that holds ``prefix``'s claim in ``base``, as a running demo or experiment does."""
    code = ("import sys, time; from scrapy.settings import Settings; from product_crawl.services import Services; "
            f"Services(Settings({{'PC_SERVICES_DIR': {str(base)!r}}})).claim({prefix!r}, 'scrapy experiment'); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize(("command", "prefix"), [
    (["experiment", "--profile", "paper", "--strategies", "dynamic", "--duration", "30"], "{exp}"),
    (["demo", "--duration", "30"], "{demo}"),
])
def test_a_second_cluster_on_one_prefix_is_refused_before_it_starts_anything(
        tmp_path: Path, command: list[str], prefix: str) -> None:
    # Two experiments (or demos) at once reset and read each other's keys and database; the first one's end stopped
    # the services under the second, which ended in a Redis traceback.
    rport, mport = services.free_port(), services.free_port()
    holder = _holder(tmp_path / "var", prefix)
    try:
        refused = run_scrapy([*command, *_embedded(rport, mport)], _env(tmp_path), timeout=60)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"scrapy experiment (pid {holder.pid}) is running on the Redis key prefix {prefix!r}" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert not services.redis_answers(f"redis://127.0.0.1:{rport}/0")  # nothing was started
        assert not services.mongo_answers(f"mongodb://127.0.0.1:{mport}")
        other = services.Services(Settings({"PC_SERVICES_DIR": str(tmp_path / "var")}))
        other.claim(prefix + "2", "scrapy experiment")  # another prefix is free
        with pytest.raises(services.ServiceError, match="wait for it to end"):
            other.claim(prefix, "scrapy experiment")
    finally:
        holder.kill()  # kill -9: the kernel drops its lock with it
        holder.wait(10)
    services.Services(Settings({"PC_SERVICES_DIR": str(tmp_path / "var")})).claim(prefix, "scrapy experiment")


def test_services_a_command_started_keep_running_while_another_command_uses_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("MONGO_URI", raising=False)
    rport, mport = services.free_port(), services.free_port()
    settings = Settings({"PC_SERVICES_DIR": str(tmp_path / "var"),
                         "PC_EMBEDDED_REDIS_URL": f"redis://127.0.0.1:{rport}/0",
                         "PC_EMBEDDED_MONGO_URI": f"mongodb://127.0.0.1:{mport}"})
    first, second = services.Services(settings), services.Services(settings)
    try:
        assert [s.detail for s in first.start()] == ["started", "started"]
        assert [s.detail for s in second.start()] == ["already answering", "already answering"]
        assert first.stop_unless_used() is None  # the second still uses them
        assert services.redis_answers(first.redis_url) and services.mongo_answers(first.mongo_uri)
        second.close()  # the second command ended
        stopped = first.stop_unless_used()
        assert stopped is not None and len(stopped) == 2
        assert not services.redis_answers(first.redis_url) and not services.mongo_answers(first.mongo_uri)
    finally:
        first.close()
        first.stop()
