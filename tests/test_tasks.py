"""Tests of product_crawl.tasks (virtual tasks, keywords, sites, splitting, chunking) and ``scrapy split``."""

from __future__ import annotations

import doctest
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from product_crawl import tasks
from product_crawl.tasks import (
    VirtualTask,
    chunk_pages,
    join_keywords,
    keywords_for,
    load_sites,
    parse_site_list,
    parse_virtual_task,
    split,
    split_keyword_args,
    splitter,
    validate_site,
)
from scheduler_ext.exceptions import InvalidInput

PROJECT = Path(__file__).resolve().parent.parent

TABLE_1 = {
    "12315.com", "12365hn.com", "12365ts.net", "21315.com.cn", "315.e0570.com", "315chn.com", "315cx.com.cn",
    "315ok.com", "315online.com", "315rx.com", "cca.org.cn", "ccn.com.cn", "cfqn12315.com", "cfqn315.com",
    "cgcr.com.cn", "china12315.com.cn", "china315.com", "chinatt315.org.cn", "cjwq.cn", "cq315.org",
    "js315ccn.com", "nettiger.cn", "nfqs.com.cn", "qs315.org", "sczl315.com", "sd315.org.cn", "sdq365.com.cn",
    "shzj.gov.cn", "sp.chinadaily.com.cn", "szs12365.com",
}
EXPERIMENT_SITES = {"315tousu.org", "315zj.com", "hd315.gov.cn", "t.163.com"}


def test_doctests() -> None:
    result = doctest.testmod(tasks, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


# --- keywords -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "brand", "joined"),
    [
        ("光明高钙牛奶", None, "光明&高钙&牛奶"),
        ("特仑苏", "蒙牛", "蒙牛&特仑苏"),
        ("蒙牛早餐奶", None, "蒙牛&早餐奶"),
        ("雀巢中老年奶粉", None, "雀巢&中老年&奶粉"),
    ],
)
def test_keywords_table_2(name: str, brand: str | None, joined: str) -> None:
    assert join_keywords(keywords_for(name, brand)) == joined


def test_keywords_table_2_through_virtual_task() -> None:
    vt = parse_virtual_task({"name": "特仑苏", "brand": "蒙牛"})
    assert split(vt, None)[0]["payload"]["keywords_joined"] == "蒙牛&特仑苏"


def test_keywords_drop_whitespace_and_punctuation() -> None:
    assert keywords_for(" 伊利 金典，纯牛奶！ ") == ["伊利", "金典", "纯牛奶"]


def test_keywords_brand_kept_in_place_when_present() -> None:
    assert keywords_for("蒙牛早餐奶", brand="蒙牛") == ["蒙牛", "早餐奶"]
    assert keywords_for("早餐奶", brand="蒙牛") == ["蒙牛", "早餐奶"]


def test_keywords_repeated_word_once() -> None:
    assert keywords_for("牛奶牛奶") == ["牛奶"]


def test_explicit_keywords_override_segmentation_brand_first() -> None:
    vt = parse_virtual_task({"name": "特仑苏纯牛奶", "brand": "蒙牛", "keywords": ["特仑苏", "投诉"]})
    assert vt.words() == ["蒙牛", "特仑苏", "投诉"]


def test_dictionary_does_not_leak_into_global_jieba() -> None:
    import jieba

    keywords_for("蒙牛早餐奶")  # builds our tokenizer
    assert "早餐奶" not in jieba.lcut("蒙牛早餐奶")


def test_split_keyword_args() -> None:
    assert split_keyword_args(["光明&高钙", " 牛奶  纯 ", "&"]) == ["光明", "高钙", "牛奶", "纯"]


# --- schema ---------------------------------------------------------------------------------------


def test_minimal_task_defaults() -> None:
    vt = parse_virtual_task('{"name": "光明高钙牛奶"}')
    assert vt == VirtualTask(name="光明高钙牛奶")
    assert vt.type == 0 and vt.priority is None
    assert vt.effective_engines == ("baidu",)
    assert set(vt.effective_sites) == TABLE_1 | EXPERIMENT_SITES


def test_type_1_defaults() -> None:
    vt = parse_virtual_task({"name": "光明高钙牛奶", "type": 1})
    assert vt.effective_engines == ("weibo",)
    assert vt.effective_sites == ("weibo.com",)


def test_canonical_json_round_trip() -> None:
    vt = parse_virtual_task({
        "v": 1, "name": " 特仑苏 ", "brand": "蒙牛", "keywords": ["特仑苏", "投诉"], "type": 0,
        "sites": ["cca.org.cn", "weibo.com", "cca.org.cn"], "engines": ["baidu"], "priority": 2.5,
    })
    text = vt.to_json()
    assert "特仑苏" in text  # ensure_ascii=False
    data = json.loads(text)
    assert data == {"v": 1, "name": "特仑苏", "brand": "蒙牛", "keywords": ["特仑苏", "投诉"], "type": 0,
                    "sites": ["cca.org.cn", "weibo.com"], "engines": ["baidu"], "priority": 2.5}
    assert parse_virtual_task(text) == vt
    assert parse_virtual_task(text.encode("utf-8")) == vt
    assert parse_virtual_task(text).to_json() == text


def test_whitespace_brand_is_no_brand() -> None:
    assert parse_virtual_task({"name": "牛奶", "brand": "  "}).brand is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "name: expected a non-empty string of at most 200 characters"),
        ({"name": ""}, "name: expected a non-empty string of at most 200 characters"),
        ({"name": "   "}, "name: expected a non-empty string of at most 200 characters"),
        ({"name": 42}, "name: expected a non-empty string of at most 200 characters"),
        ({"name": "奶" * 201}, "name: expected a non-empty string of at most 200 characters"),
        ({"name": "牛\n奶"}, "name: expected printable characters"),
        ({"name": "!!!"}, "name: expected at least one letter or digit"),
        ({"name": "x", "colour": "red"}, "unknown field 'colour'"),
        ({"name": "x", "a": 1, "b": 2}, "unknown fields 'a', 'b'"),
        ({"name": "x", "v": 2}, "v: expected schema version 1, got 2"),
        ({"name": "x", "v": "1"}, "v: expected schema version 1"),
        ({"name": "x", "brand": 7}, "brand: expected a string"),
        ({"name": "x", "brand": "蒙 牛"}, "brand: expected one word"),
        ({"name": "x", "keywords": []}, "keywords: expected a non-empty list"),
        ({"name": "x", "keywords": "光明&高钙"}, "keywords: expected a non-empty list"),
        ({"name": "x", "keywords": ["光明", ""]}, "keywords[1]: expected a non-empty word"),
        ({"name": "x", "keywords": ["光明", 3]}, "keywords[1]: expected a non-empty word"),
        ({"name": "x", "keywords": ["光明&高钙"]}, "keywords[0]: expected a non-empty word"),
        ({"name": "x", "keywords": ["a"] * 21}, "keywords: expected a non-empty list of at most 20"),
        ({"name": "x", "type": 2}, "type: expected 0 (meta search) or 1 (Weibo search), got 2"),
        ({"name": "x", "type": "0"}, "type: expected 0 (meta search) or 1 (Weibo search), got '0'"),
        ({"name": "x", "type": True}, "type: expected 0 (meta search) or 1 (Weibo search), got True"),
        ({"name": "x", "sites": []}, "sites: expected a non-empty list of domains"),
        ({"name": "x", "sites": "cca.org.cn"}, "sites: expected a non-empty list of domains"),
        ({"name": "x", "sites": ["cca.org.cn", "http://12315.com"]}, "sites[1]: expected a bare domain"),
        ({"name": "x", "engines": []}, "engines: expected a non-empty list"),
        ({"name": "x", "engines": ["bai du"]}, "engines[0]: expected an engine name"),
        ({"name": "x", "priority": "high"}, "priority: expected a finite number"),
        ({"name": "x", "priority": True}, "priority: expected a finite number"),
        ({"name": "x", "priority": math.nan}, "priority: expected a finite number"),
    ],
)
def test_parse_refuses_bad_fields(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_virtual_task(data)
    assert message in str(info.value)


def test_parse_refuses_bad_site_naming_it() -> None:
    with pytest.raises(InvalidInput, match=r"sites\[0\]: .*'cca.org.cn:80'"):
        parse_virtual_task({"name": "x", "sites": ["cca.org.cn:80"]})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("光明高钙牛奶", "not JSON: "),
        ('{"name": "x"', "not JSON: "),
        ("[1, 2]", "expected a JSON object, got an array"),
        ('"光明"', "expected a JSON object, got a string"),
        (b"\xff\xfe{", "not UTF-8 text"),
        (pickle.dumps({"name": "x"}), "looks like a pickle"),
        ('{"name": "x", "priority": NaN}', "priority: expected a finite number"),
    ],
)
def test_parse_refuses_bad_raw(raw: str | bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_virtual_task(raw)
    assert message in str(info.value)


def test_invalid_input_chains_the_cause() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_virtual_task("{oops")
    assert isinstance(info.value.__cause__, json.JSONDecodeError)
    assert isinstance(info.value, ValueError)


# --- sites ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("site", ["cca.org.cn", "12315.com", "315.e0570.com", "sp.chinadaily.com.cn",
                                  "t.163.com", "a-b.example.org"])
def test_validate_site_accepts_domains(site: str) -> None:
    assert validate_site(site) == site


@pytest.mark.parametrize("site", ["", "localhost", "http://cca.org.cn", "cca.org.cn/", "cca.org.cn/path",
                                  "cca.org.cn:8080", "CCA.org.cn", "cca..org.cn", ".cca.org.cn",
                                  "cca.org.cn.", "-cca.org.cn", "cca-.org.cn", "cca org.cn",
                                  "user@cca.org.cn", "光明.cn", 42, None])
def test_validate_site_refuses(site: Any) -> None:
    with pytest.raises(InvalidInput, match="expected a bare domain") as info:
        validate_site(site)
    assert repr(site) in str(info.value)


def test_site_lists() -> None:
    type0 = load_sites(0)
    assert set(type0) == TABLE_1 | EXPERIMENT_SITES
    assert len(type0) == len(TABLE_1) + len(EXPERIMENT_SITES)
    assert "weibo.com" not in type0
    assert load_sites(1) == ("weibo.com",)


def test_parse_site_list_names_the_bad_line() -> None:
    with pytest.raises(InvalidInput, match=r"^mine line 3: expected a bare domain .*'https://x.cn'"):
        parse_site_list("# c\ncca.org.cn\nhttps://x.cn\n", "mine")
    with pytest.raises(InvalidInput, match=r"^mine line 2: 'cca.org.cn' is listed twice"):
        parse_site_list("cca.org.cn\ncca.org.cn  # again\n", "mine")


def test_any_valid_site_for_any_type() -> None:
    vt = parse_virtual_task({"name": "光明高钙牛奶", "sites": ["weibo.com", "12315.com"]})
    assert [spec["site"] for spec in split(vt)] == ["weibo.com", "12315.com"]


# --- splitting ------------------------------------------------------------------------------------


def test_split_spec() -> None:
    vt = parse_virtual_task({"name": "光明高钙牛奶", "sites": ["cca.org.cn", "12315.com"], "priority": 3})
    assert split(vt) == [
        {"group": "光明高钙牛奶", "site": site, "type": 0, "priority": 3,
         "payload": {"product": "光明高钙牛奶", "brand": None, "keywords": ["光明", "高钙", "牛奶"],
                     "keywords_joined": "光明&高钙&牛奶", "engine": "baidu"}}
        for site in ("cca.org.cn", "12315.com")
    ]


def test_split_every_site_and_engine() -> None:
    vt = parse_virtual_task({"name": "蒙牛早餐奶", "sites": ["a.cn", "b.cn"],
                             "engines": ["baidu", "product_crawl.engines.baidu.BaiduEngine"]})
    allowed = {"PC_ALLOWED_ENGINES": ["product_crawl.engines.baidu.BaiduEngine"]}
    pairs = [(spec["site"], spec["payload"]["engine"]) for spec in split(vt, allowed)]
    assert pairs == [("a.cn", "baidu"), ("a.cn", "product_crawl.engines.baidu.BaiduEngine"),
                     ("b.cn", "baidu"), ("b.cn", "product_crawl.engines.baidu.BaiduEngine")]


def test_split_defaults_per_type() -> None:
    specs0 = split(parse_virtual_task({"name": "雀巢中老年奶粉", "brand": "雀巢"}))
    assert len(specs0) == len(TABLE_1) + len(EXPERIMENT_SITES)
    assert {s["payload"]["engine"] for s in specs0} == {"baidu"}
    assert all(s["priority"] is None and s["type"] == 0 and s["group"] == "雀巢中老年奶粉" for s in specs0)
    assert specs0[0]["payload"]["brand"] == "雀巢"
    specs1 = split(parse_virtual_task({"name": "雀巢中老年奶粉", "type": 1}))
    assert [(s["site"], s["type"], s["payload"]["engine"]) for s in specs1] == [("weibo.com", 1, "weibo")]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "x", "engines": ["google"]}, "engines: unknown engine 'google'"),
        ({"name": "x", "engines": ["no.such.Engine"]}, "engines: engine 'no.such.Engine' is not allowed"),
        ({"name": "x", "engines": ["weibo"]}, "'weibo' serves node type 1, but the task's type is 0"),
        ({"name": "x", "type": 1, "engines": ["baidu"]}, "engines: 'baidu' serves node type 0"),
    ],
)
def test_split_refuses_bad_engines(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        split(parse_virtual_task(data))
    assert message in str(info.value)


def test_splitter_accepts_raw_lpush_json() -> None:
    specs = splitter('{"name": "光明高钙牛奶", "sites": ["cca.org.cn"]}')
    assert [(s["site"], s["payload"]["keywords_joined"]) for s in specs] == [("cca.org.cn", "光明&高钙&牛奶")]
    assert splitter(VirtualTask("光明高钙牛奶", sites=("cca.org.cn",)).to_json().encode()) == specs


@pytest.mark.parametrize("raw", [pickle.dumps({"name": "x"}), "光明高钙牛奶", "[]", '{"name": ""}',
                                 '{"name": "x", "type": 3}', '{"name": "x", "engines": ["google"]}'])
def test_splitter_raises_invalid_input_for_malformed_entries(raw: str | bytes) -> None:
    with pytest.raises(InvalidInput):
        splitter(raw)  # type: ignore[arg-type]


# --- chunking -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "limit", "chunks"),
    [(0, 5, []), (1, 5, [(0, 1)]), (5, 5, [(0, 5)]), (12, 5, [(0, 5), (5, 5), (10, 2)]),
     (3, 1, [(0, 1), (1, 1), (2, 1)])],
)
def test_chunk_pages(total: int, limit: int, chunks: list[tuple[int, int]]) -> None:
    assert chunk_pages(total, limit) == chunks
    assert sum(count for _, count in chunks) == total


@pytest.mark.parametrize(("total", "limit", "name"), [(-1, 5, "total_pages"), (5, 0, "page_limit"),
                                                      (5, 2.5, "page_limit"), (True, 5, "total_pages")])
def test_chunk_pages_refuses(total: Any, limit: Any, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}: "):
        chunk_pages(total, limit)


# --- scrapy split ---------------------------------------------------------------------------------


def run_split(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy", "split", *args], cwd=PROJECT, text=True,
                          encoding="utf-8", capture_output=True, timeout=120)


def test_split_command_baidu() -> None:
    proc = run_split("光明高钙牛奶", "--site", "cca.org.cn", "--engine", "baidu")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    task = json.loads(lines[0])
    got = (task["keywords"], task["site"], task["engine"], task["type"])
    assert got == ("光明&高钙&牛奶", "cca.org.cn", "baidu", 0)
    url = urlsplit(task["url"])
    query = parse_qs(url.query)
    assert (url.hostname, url.path) == ("www.baidu.com", "/s")
    assert query["wd"] == ["site:cca.org.cn 光明 高钙 牛奶"]
    assert query["pn"] == ["0"]


def test_split_command_weibo() -> None:
    proc = run_split("光明高钙牛奶", "--type", "1", "--site", "weibo.com", "--engine", "weibo")
    assert proc.returncode == 0, proc.stderr
    task = json.loads(proc.stdout)
    got = (task["keywords"], task["site"], task["engine"], task["type"])
    assert got == ("光明&高钙&牛奶", "weibo.com", "weibo", 1)
    query = parse_qs(urlsplit(task["url"]).query)
    assert query["q"] == ["site:weibo.com 光明&高钙&牛奶&投诉"]


def test_split_command_defaults_brand_and_keywords() -> None:
    proc = run_split("特仑苏", "--brand", "蒙牛")
    assert proc.returncode == 0, proc.stderr
    tasks_out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {t["site"] for t in tasks_out} == TABLE_1 | EXPERIMENT_SITES
    assert {t["keywords"] for t in tasks_out} == {"蒙牛&特仑苏"}
    proc = run_split("x", "--keywords", "光明&高钙", "--keywords", "牛奶", "--site", "cca.org.cn")
    assert json.loads(proc.stdout)["keywords"] == "光明&高钙&牛奶"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["光明高钙牛奶", "--site", "http://cca.org.cn"], "sites[0]: expected a bare domain"),
        (["光明高钙牛奶", "--type", "2"], "type: expected 0 (meta search) or 1 (Weibo search)"),
        (["光明高钙牛奶", "--type", "x"], "--type: expected 0 or 1"),
        (["光明高钙牛奶", "--engine", "google"], "unknown engine 'google'"),
        (["光明高钙牛奶", "--engine", "weibo"], "'weibo' serves node type 1"),
        (["!!!"], "name: expected at least one letter or digit"),
        ([], "expected one product NAME"),
    ],
)
def test_split_command_bad_input(args: list[str], message: str) -> None:
    proc = run_split(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""
