"""Tests of product_crawl.engines: the paper's Table 3 URLs, the registry, and the parsers on hand-written
pages that follow the engines' real markup (tests/pages/). test_simweb.py runs the same parsers on the
simulated web."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from scrapy.http import HtmlResponse
from scrapy.settings import Settings

from product_crawl.engines import Engine, Result, ResultPage, get_engine, normalize_date
from product_crawl.engines.baidu import BaiduEngine
from product_crawl.engines.weibo import WeiboEngine

PAGES = Path(__file__).parent / "pages"
WORDS = ["光明", "高钙", "牛奶"]


def page(name: str, url: str) -> HtmlResponse:
    return HtmlResponse(url=url, body=(PAGES / name).read_bytes(), encoding="utf-8")


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query, keep_blank_values=True)


# --- URLs (Table 3) -----------------------------------------------------------------------------------------


def test_baidu_url_is_table_3():
    url = get_engine("baidu").page_url(WORDS, "cca.org.cn", 0)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("http", "www.baidu.com", "/s")
    assert query(url) == {"wd": ["光明 高钙 牛奶 site:cca.org.cn"], "pn": ["0"], "cl": ["0"], "ie": ["utf-8"]}
    assert [k for k, _ in (p.split("=", 1) for p in parts.query.split("&"))] == ["wd", "pn", "cl", "ie"]


def test_baidu_pn_is_the_result_offset():
    engine = get_engine("baidu")
    assert query(engine.page_url(WORDS, "315tousu.org", 3))["pn"] == ["30"]
    with pytest.raises(ValueError, match="page"):
        engine.page_url(WORDS, "315tousu.org", -1)


def test_weibo_url_is_table_3():
    url = get_engine("weibo").page_url(WORDS, "weibo.com", 0)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("http", "weibo.yunyun.com", "/Weibo.php")
    # The & inside q are part of its value; wbts is a parameter of its own.
    assert query(url) == {"p": ["1"], "q": ["site:weibo.com 光明&高钙&牛奶&投诉"], "wbts": ["1"]}
    assert "%26" in parts.query
    assert query(get_engine("weibo").page_url(WORDS, "weibo.com", 4))["p"] == ["5"]


def test_engine_settings_base_url_and_extra_word():
    settings = Settings(
        {
            "PC_ENGINE_BASE_URLS": {"baidu": "http://127.0.0.1:8080/", "weibo": "http://127.0.0.1:9090"},
            "PC_WEIBO_EXTRA_WORD": "质量",
        }
    )
    assert (
        get_engine("baidu", settings).page_url(WORDS, "cca.org.cn", 1).startswith("http://127.0.0.1:8080/s?")
    )
    weibo = get_engine("weibo", settings)
    url = weibo.page_url(WORDS, "weibo.com", 0)
    assert url.startswith("http://127.0.0.1:9090/Weibo.php?")
    assert query(url)["q"] == ["site:weibo.com 光明&高钙&牛奶&质量"]
    # A dict is accepted too, and missing names keep their defaults.
    assert (
        get_engine("weibo", {"PC_ENGINE_BASE_URLS": {"baidu": "http://x"}}).base_url
        == "http://weibo.yunyun.com"
    )


def test_engine_types_and_page_arithmetic():
    baidu, weibo = get_engine("baidu"), get_engine("weibo")
    assert (baidu.name, baidu.node_type, baidu.page_size) == ("baidu", 0, 10)
    assert (weibo.name, weibo.node_type, weibo.page_size) == ("weibo", 1, 10)
    assert [baidu.offered(25, p) for p in range(4)] == [10, 10, 5, 0]
    assert [baidu.pages_for(n) for n in (0, 1, 10, 11, 1230)] == [0, 1, 1, 2, 123]


def test_get_engine_unknown_names_the_engine():
    with pytest.raises(ValueError, match=r"unknown engine 'google'.*baidu, weibo"):
        get_engine("google")
    allowed = {"PC_ALLOWED_ENGINES": ["no_such_module.Engine", "product_crawl.engines.Result"]}
    with pytest.raises(ValueError, match="no_such_module"):
        get_engine("no_such_module.Engine", allowed)
    with pytest.raises(ValueError, match="not an Engine subclass"):
        get_engine("product_crawl.engines.Result", allowed)


class _LocalEngine(BaiduEngine):
    """An engine plugged in by dotted path."""

    name = "local"
    default_base_url = "http://search.local"


def test_get_engine_by_dotted_path():
    allowed = {"PC_ALLOWED_ENGINES": [f"{__name__}._LocalEngine"]}
    engine = get_engine(f"{__name__}._LocalEngine", allowed)
    assert isinstance(engine, _LocalEngine) and isinstance(engine, Engine)
    assert engine.page_url(["a"], "b.com", 0).startswith("http://search.local/s?")
    configured = get_engine(
        f"{__name__}._LocalEngine", {**allowed, "PC_ENGINE_BASE_URLS": {"local": "http://127.0.0.1:1"}}
    )
    assert configured.base_url == "http://127.0.0.1:1"


# --- Baidu parser -------------------------------------------------------------------------------------------

OLD_URL = "http://www.baidu.com/s?wd=%E5%85%89%E6%98%8E+site%3Acca.org.cn&pn=10&cl=0&ie=utf-8"


def test_baidu_parses_older_layout():
    result = BaiduEngine("http://www.baidu.com").parse(page("baidu_old.html", OLD_URL))
    assert result.reported == 1230
    assert result.has_next is True
    assert [r.rank for r in result.results] == [11, 12, 13]
    first = result.results[0]
    assert first == Result(
        title="光明高钙牛奶喝出异物 消费者投诉_中国消费者协会",
        url="http://www.baidu.com/link?url=aAbBcC111",
        snippet="本人购买的光明高钙牛奶喝出黑色异物， 要求厂家给出说法...",
        date="2013-05-12",
        rank=11,
    )
    assert result.results[1].date is None
    assert result.results[2].date == "2012-11-03"


def test_baidu_parses_newer_layout():
    url = "http://www.baidu.com/s?wd=%E8%92%99%E7%89%9B+site%3A12315.com&pn=0&cl=0&ie=utf-8"
    result = BaiduEngine("http://www.baidu.com").parse(page("baidu_new.html", url))
    assert result.reported == 85
    assert result.has_next is True
    assert [(r.rank, r.url, r.date) for r in result.results] == [
        (1, "http://www.12315.com/ts/2013/0512/8801.html", "2013-05-12"),
        (2, "http://www.12315.com/ts/2013/0402/7710.html", None),
    ]
    assert result.results[0].title == "投诉蒙牛特仑苏变质 - 中国质量投诉网"
    assert result.results[0].snippet == "购买的特仑苏纯牛奶开封后发现结块，要求退货。"


def test_baidu_last_page_has_no_next():
    url = "http://www.baidu.com/s?wd=x&pn=20&cl=0&ie=utf-8"
    result = BaiduEngine("http://www.baidu.com").parse(page("baidu_last.html", url))
    assert (result.reported, result.has_next, len(result.results)) == (22, False, 2)
    assert result.results[0].date == "3天前"  # relative dates are kept as shown


def test_baidu_no_results_page():
    url = "http://www.baidu.com/s?wd=x&pn=0&cl=0&ie=utf-8"
    assert BaiduEngine("http://www.baidu.com").parse(page("baidu_none.html", url)) == ResultPage(
        [], None, False
    )


def test_baidu_block_page_is_detected():
    engine = BaiduEngine("http://www.baidu.com")
    assert engine.is_blocked(page("baidu_block.html", "http://www.baidu.com/s?wd=x"))
    redirected = HtmlResponse(
        url="https://wappass.baidu.com/static/captcha/tuxing.html?ak=1", body=b"<html></html>"
    )
    assert engine.is_blocked(redirected)
    assert not engine.is_blocked(page("baidu_old.html", OLD_URL))
    assert not engine.is_blocked(page("baidu_none.html", OLD_URL))


# --- Weibo parser -------------------------------------------------------------------------------------------


def test_weibo_parses_results():
    url = "http://weibo.yunyun.com/Weibo.php?p=2&q=site%3Aweibo.com+x&wbts=1"
    engine = WeiboEngine("http://weibo.yunyun.com")
    result = engine.parse(page("weibo.html", url))
    assert (result.reported, result.has_next) == (1230, True)
    assert result.results == [
        Result(
            "牛奶爱好者",
            "https://weibo.com/1001/zAbCd1",
            "刚买的光明高钙牛奶喝出怪味，#投诉#",
            "2013-05-12",
            11,
        ),
        Result("消费者小王", "https://weibo.com/1002/zAbCd2", "投诉光明，客服不理人。", "2013-05-03", 12),
    ]
    assert engine.is_blocked(page("weibo_block.html", url))
    assert not engine.is_blocked(page("weibo.html", url))


def test_normalize_date():
    assert normalize_date("2013-5-12\xa0-\xa0") == "2013-05-12"
    assert normalize_date("2013年5月2日 ") == "2013-05-02"
    assert normalize_date("  ") is None
    assert normalize_date(None) is None
