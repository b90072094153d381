"""Tests of ``scrapy inject`` (product_crawl/commands/inject.py) against the session's real Redis."""

from __future__ import annotations

import doctest
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_lib

from product_crawl.commands import inject
from product_crawl.tasks import parse_virtual_task, splitter
from scheduler_ext.exceptions import InvalidInput

PROJECT = Path(__file__).resolve().parent.parent


def run_inject(args: list[str], redis_url: str, prefix: str, input: str | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "scrapy", "inject", *args, "-s", f"SCHEDEXT_PREFIX={prefix}"],
        cwd=PROJECT, env=env, text=True, encoding="utf-8", capture_output=True, timeout=timeout, input=input,
    )


def _pop(client: redis_lib.Redis, key: str, right: bool = True) -> str:
    """Pop one entry, from the right as the control does unless told otherwise; fail if there is none."""
    value = client.rpop(key) if right else client.lpop(key)
    assert isinstance(value, str), f"{key} is empty"
    return value


def test_doctests() -> None:
    result = doctest.testmod(inject)
    assert result.attempted > 0
    assert result.failed == 0


def test_parse_lines_numbers_lines_past_comments_and_blanks() -> None:
    text = ('# header\n\n光明高钙牛奶\n  # indented comment\n{"name": "x", "type": 5}\n\n'
            '{"name": "蒙牛早餐奶"}\n')
    tasks, errors = inject.parse_lines(text, "f.txt")
    assert [t.name for t in tasks] == ["光明高钙牛奶", "蒙牛早餐奶"]
    assert errors == ["f.txt line 5: type: expected 0 (meta search) or 1 (Weibo search), got 5"]


def test_parse_lines_refuses_json_that_is_not_an_object() -> None:
    text = '[{"name": "特仑苏"}]\n"光明高钙牛奶"\n[进口] 雀巢奶粉\n"光明" 高钙牛奶\n'
    tasks, errors = inject.parse_lines(text, "f.txt")
    # Not JSON: names that happen to start with a bracket or a quote.
    assert [t.name for t in tasks] == ["[进口] 雀巢奶粉", '"光明" 高钙牛奶']
    assert errors == ["f.txt line 1: expected a JSON object or a plain product name, got a JSON array",
                      "f.txt line 2: expected a JSON object or a plain product name, got a JSON string"]


def test_a_field_given_twice_is_a_bad_line(tmp_path: Path, redis_url: str, prefix: str,
                                           redis: redis_lib.Redis) -> None:
    """json keeps the last of a field given twice: ``{"name": "a", "name": "b"}`` was product b. It is a bad line
    naming the field (and, pushed raw, a virtual task the splitter refuses)."""
    text = '{"name": "a", "name": "b"}\n{"name": "x", "sites": ["a.com"], "sites": []}\n{"name": "ok"}\n'
    tasks, errors = inject.parse_lines(text, "f.txt")
    assert [t.name for t in tasks] == ["ok"]
    assert errors == ["f.txt line 1: field 'name' given twice; expected each field once",
                      "f.txt line 2: field 'sites' given twice; expected each field once"]
    with pytest.raises(InvalidInput, match="^field 'name' given twice"):
        splitter('{"name": "a", "name": "b"}')
    path = tmp_path / "tasks.txt"
    path.write_text(text, encoding="utf-8")
    proc = run_inject([str(path)], redis_url, prefix)
    assert proc.returncode == 2 and "line 1: field 'name' given twice" in proc.stderr, proc.stderr
    assert "nothing injected" in proc.stderr and redis.llen(f"{prefix}:virtual") == 0


def test_bad_third_line_injects_nothing(tmp_path: Path, redis_url: str, prefix: str,
                                        redis: redis_lib.Redis) -> None:
    path = tmp_path / "tasks.jsonl"
    lines = ["光明高钙牛奶", '{"name": "特仑苏", "brand": "蒙牛"}', '{"name": ""}', "蒙牛早餐奶"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_inject([str(path)], redis_url, prefix)
    assert proc.returncode != 0
    assert "line 3: name: expected a non-empty string of at most 200 characters" in proc.stderr
    assert "nothing injected" in proc.stderr
    assert redis.llen(f"{prefix}:virtual") == 0
    assert redis.keys(f"{prefix}:*") == []


def test_every_bad_line_is_reported(tmp_path: Path, redis_url: str, prefix: str,
                                    redis: redis_lib.Redis) -> None:
    path = tmp_path / "tasks.txt"
    path.write_text('{"name": "x", "colour": 1}\nok name\n{not json\n', encoding="utf-8")
    proc = run_inject([str(path)], redis_url, prefix)
    assert proc.returncode == 2
    assert "line 1: unknown field 'colour'" in proc.stderr
    assert "line 3: not JSON: " in proc.stderr
    assert redis.llen(f"{prefix}:virtual") == 0


def test_not_utf8_file_is_refused(tmp_path: Path, redis_url: str, prefix: str,
                                  redis: redis_lib.Redis) -> None:
    path = tmp_path / "tasks.bin"
    path.write_bytes(b"\x80\x04\x95\xff\x00pickle")
    proc = run_inject([str(path)], redis_url, prefix)
    assert proc.returncode == 2
    assert str(path) in proc.stderr
    assert redis.llen(f"{prefix}:virtual") == 0


def test_good_file_injects_in_order(tmp_path: Path, redis_url: str, prefix: str,
                                    redis: redis_lib.Redis) -> None:
    lines = [
        '{"name": "光明高钙牛奶", "sites": ["cca.org.cn"]}',
        "# a comment",
        "",
        '{"v": 1, "name": "特仑苏", "brand": "蒙牛", "priority": 1}',
        "蒙牛早餐奶",
        '{"name": "雀巢中老年奶粉", "type": 1}',
    ]
    path = tmp_path / "tasks.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_inject([str(path)], redis_url, prefix)
    assert proc.returncode == 0, proc.stderr
    key = f"{prefix}:virtual"
    assert proc.stdout.strip() == f"injected 4 virtual tasks into {key}"
    assert redis.llen(key) == 4
    popped = [_pop(redis, key) for _ in range(4)]
    names = [json.loads(raw)["name"] for raw in popped]
    assert names == ["光明高钙牛奶", "特仑苏", "蒙牛早餐奶", "雀巢中老年奶粉"]
    # What is stored is the canonical JSON, and the control's splitter accepts it.
    assert popped[0] == parse_virtual_task(lines[0]).to_json()
    assert json.loads(popped[1]) == {"v": 1, "name": "特仑苏", "brand": "蒙牛", "type": 0, "priority": 1}
    assert [s["payload"]["keywords_joined"] for s in splitter(popped[1])][0] == "蒙牛&特仑苏"


def test_products_and_stdin(redis_url: str, prefix: str, redis: redis_lib.Redis) -> None:
    proc = run_inject(["-", "--product", "蒙牛早餐奶", "--product", "雀巢中老年奶粉"], redis_url, prefix,
                      input="光明高钙牛奶\n")
    assert proc.returncode == 0, proc.stderr
    key = f"{prefix}:virtual"
    names = [json.loads(_pop(redis, key))["name"] for _ in range(3)]
    assert names == ["光明高钙牛奶", "蒙牛早餐奶", "雀巢中老年奶粉"]


def test_bad_product_argument(redis_url: str, prefix: str, redis: redis_lib.Redis) -> None:
    proc = run_inject(["--product", "牛奶", "--product", "  "], redis_url, prefix)
    assert proc.returncode == 2
    assert "--product #2: name: expected a non-empty string" in proc.stderr
    assert redis.llen(f"{prefix}:virtual") == 0


def test_ten_thousand_names_in_one_call(tmp_path: Path, redis_url: str, prefix: str,
                                        redis: redis_lib.Redis) -> None:
    path = tmp_path / "names.txt"
    path.write_text("".join(f"光明高钙牛奶 {i}\n" for i in range(10_000)), encoding="utf-8")
    started = time.monotonic()
    proc = run_inject([str(path)], redis_url, prefix)
    elapsed = time.monotonic() - started
    print(f"scrapy inject: 10,000 names in {elapsed:.2f} s (process start included)")
    assert proc.returncode == 0, proc.stderr
    key = f"{prefix}:virtual"
    assert proc.stdout.strip() == f"injected 10000 virtual tasks into {key}"
    assert redis.llen(key) == 10_000
    assert json.loads(_pop(redis, key))["name"] == "光明高钙牛奶 0"
    assert json.loads(_pop(redis, key, right=False))["name"] == "光明高钙牛奶 9999"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_redis_names_the_url(redis_url: str, prefix: str, redis: redis_lib.Redis) -> None:
    port = _closed_port()
    proc = run_inject(["--product", "光明高钙牛奶"], f"redis://127.0.0.1:{port}/0", prefix)
    assert proc.returncode == 1
    assert f"redis://127.0.0.1:{port}/0" in proc.stderr
    assert "nothing injected" in proc.stderr


@pytest.mark.parametrize("args", [["a.txt", "b.txt"], ["/no/such/file.txt"]])
def test_usage_errors(args: list[str], redis_url: str, prefix: str) -> None:
    proc = run_inject(args, redis_url, prefix)
    assert proc.returncode == 2
    assert proc.stderr.strip()
