"""Tests of product_crawl.engines: the paper's Table 3 URLs, the registry, and the parsers on hand-written
pages that follow the engines' real markup (tests/pages/). test_simweb.py runs the same parsers on the
simulated web."""

from __future__ import annotations

import json
import random
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from scrapy.http import HtmlResponse
from scrapy.settings import Settings

from product_crawl.engines import (
    MAX_PAGE,
    Engine,
    Result,
    ResultPage,
    engine_base_urls,
    get_engine,
    normalize_date,
    redirect_target,
)
from product_crawl.engines.baidu import BaiduEngine, fit_query
from product_crawl.engines.weibo import WeiboEngine
from scheduler_ext.exceptions import ConfigurationError

PAGES = Path(__file__).parent / "pages"
WORDS = ["光明", "高钙", "牛奶"]


def page(name: str, url: str) -> HtmlResponse:
    return HtmlResponse(url=url, body=(PAGES / name).read_bytes(), encoding="utf-8")


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query, keep_blank_values=True)


# --- URLs (Table 3) -----------------------------------------------------------------------------------------


def test_baidu_url_is_table_3_with_site_first():
    url = get_engine("baidu").page_url(WORDS, "cca.org.cn", 0)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("http", "www.baidu.com", "/s")
    # site: goes first, so that Baidu's query limit can never cut it off.
    assert query(url) == {"wd": ["site:cca.org.cn 光明 高钙 牛奶"], "pn": ["0"], "cl": ["0"], "ie": ["utf-8"]}
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
    with pytest.raises(ValueError, match=r"unknown engine 'google'.*baidu, sweibo, weibo"):
        get_engine("google")
    allowed = {"PC_ALLOWED_ENGINES": ["no_such_module.Engine", "product_crawl.engines.Result"]}
    with pytest.raises(ValueError, match="no_such_module"):
        get_engine("no_such_module.Engine", allowed)
    with pytest.raises(ValueError, match="not an Engine subclass"):
        get_engine("product_crawl.engines.Result", allowed)


@pytest.mark.parametrize(("value", "message"), [
    ("[1]", "PC_ENGINE_BASE_URLS: expected a JSON object mapping engine names to http(s) URLs"),
    ('{"baidu": 5}', "PC_ENGINE_BASE_URLS['baidu']: expected an http(s) URL with a host"),
    ('{"baidu": "ftp://127.0.0.1"}', "PC_ENGINE_BASE_URLS['baidu']: expected an http(s) URL"),
    ('{"baidu": "http://h:99999"}', "PC_ENGINE_BASE_URLS['baidu']: expected an http(s) URL"),
    ("[[[", "PC_ENGINE_BASE_URLS: expected a JSON object"),
    ("[" * 100_000 + "]" * 100_000, "PC_ENGINE_BASE_URLS: expected a JSON object"),  # past the recursion limit
    ([["baidu", "http://x"]], "PC_ENGINE_BASE_URLS: expected a JSON object"),
])
def test_bad_engine_base_urls_name_the_setting(value: object, message: str) -> None:
    settings = Settings({"PC_ENGINE_BASE_URLS": value})
    with pytest.raises(ConfigurationError, match="^" + re.escape(message)) as info:
        get_engine("baidu", settings)
    assert len(str(info.value)) < 400  # a 200,000-character value is shown cut short
    assert engine_base_urls(Settings({"PC_ENGINE_BASE_URLS": ""}))["baidu"] == "http://www.baidu.com"


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


def test_a_page_number_past_max_page_or_in_other_digits_reads_as_malformed() -> None:
    """A URL's page number is bounded (MAX_PAGE) and read in ASCII digits: ``pn=99999999999999999999999`` made
    every rank on the page about 1e23. Such a number, like ``pn=١٠``, is read as a malformed one (``pn=abc``)."""
    cases = [(BaiduEngine("http://www.baidu.com"), "baidu_2021.html", "http://www.baidu.com/s?wd=x&pn={}"),
             (WeiboEngine("http://weibo.yunyun.com"), "weibo.html", "http://weibo.yunyun.com/Weibo.php?q=x&p={}"),
             (get_engine("sweibo"), "sweibo_2015_saved.html", "https://s.weibo.com/weibo?q=x&page={}")]
    for engine, name, url in cases:
        malformed = [r.rank for r in engine.parse(page(name, url.format("abc"))).results]
        assert malformed and max(malformed) < 100, name
        for number in ("99999999999999999999999", str(MAX_PAGE * 20 + 1), "١٠", "１０"):
            assert [r.rank for r in engine.parse(page(name, url.format(number))).results] == malformed, (name, number)
    last = [r.rank for r in BaiduEngine("http://www.baidu.com").parse(
        page("baidu_2021.html", f"http://www.baidu.com/s?wd=x&pn={MAX_PAGE * 10}")).results]
    assert last[0] == MAX_PAGE * 10 + 1  # the last page read as such


def test_a_block_id_or_data_rank_in_other_digits_is_no_rank() -> None:
    """``str.isdigit`` takes ``²``, which ``int`` refuses: a block id or data-rank of it failed the whole page."""
    body = (PAGES / "baidu_2021.html").read_text(encoding="utf-8").replace('id="11"', 'id="²"', 1)
    response = HtmlResponse(url="http://www.baidu.com/s?wd=x&pn=10", body=body.encode(), encoding="utf-8")
    assert [r.rank for r in BaiduEngine("http://www.baidu.com").parse(response).results][:2] == [11, 12]
    body = (PAGES / "weibo.html").read_text(encoding="utf-8").replace('data-rank="11"', 'data-rank="²"', 1)
    response = HtmlResponse(url="http://weibo.yunyun.com/Weibo.php?p=2&q=x", body=body.encode(), encoding="utf-8")
    assert [r.rank for r in WeiboEngine("http://weibo.yunyun.com").parse(response).results] == [11, 12]


@pytest.mark.parametrize("millis", ["²", "1" * 30, "-5"])
def test_a_post_date_past_any_clock_falls_back_to_the_link_title(millis: str) -> None:
    """A post's ``date`` attribute of ``²`` (``isdigit`` takes it, ``int`` does not) or of 10^30 ms (past any
    date ``datetime`` holds) failed the whole page; the date now comes from the link's title or text."""
    spec = json.loads((PAGES / "sweibo_2015_saved.json").read_text(encoding="utf-8"))
    body = (PAGES / "sweibo_2015_saved.html").read_text(encoding="utf-8")
    body = body.replace('date="1426126920000"', f'date="{millis}"', 1)
    results = get_engine("sweibo").parse(HtmlResponse(url=spec["url"], body=body.encode(), encoding="utf-8")).results
    expected = [r["date"] for r in spec["results"]] if "results" in spec else None
    assert len(results) >= 2 and all(r.date is None or len(r.date) == 10 for r in results)
    if expected:
        assert [r.date for r in results] == expected


@pytest.mark.parametrize(("count", "reported"), [("1,020", 1020), (",,", None), ("١٢", None),
                                                 ("9" * 40, None), ("1,000,000,000,000", 10**12)])
def test_a_count_line_past_any_engine_or_without_digits_is_no_count(count: str, reported: int | None) -> None:
    """The count line's number: ``,,`` alone failed the whole page (``int('')``); 10^40 results made every pair
    that crawled the query look as if it collected nothing offered; other scripts' digits are no count either."""
    body = (PAGES / "baidu_2021.html").read_text(encoding="utf-8")
    body = body.replace("找到相关结果数约1,020个", f"找到相关结果数约{count}个")
    response = HtmlResponse(url="http://www.baidu.com/s?wd=x&pn=10", body=body.encode(), encoding="utf-8")
    page = BaiduEngine("http://www.baidu.com").parse(response)
    assert page.reported == reported and len(page.results) >= 2


@pytest.mark.parametrize("href", ["http://[abc/x", "http://[id]/x", "//[::1"])
def test_a_link_whose_host_is_no_address_is_skipped_not_the_page(href: str) -> None:
    """A result link with a bracketed host that is no IPv6 address (``urlsplit`` raises) failed the whole page, and
    with it every other result there (found by mutating the real layouts, below)."""
    body = (PAGES / "baidu_2021.html").read_text(encoding="utf-8")
    first = re.search(r'<a[^>]* href="([^"]+)"', body)
    assert first is not None
    response = HtmlResponse(url="http://www.baidu.com/s?wd=x&pn=10", encoding="utf-8",
                            body=body.replace(first[1], href, 1).encode())
    before = BaiduEngine("http://www.baidu.com").parse(
        HtmlResponse(url="http://www.baidu.com/s?wd=x&pn=10", body=body.encode(), encoding="utf-8")).results
    after = BaiduEngine("http://www.baidu.com").parse(response).results
    assert len(after) >= len(before) - 1 >= 1 and all("[" not in r.url for r in after)


@pytest.mark.parametrize("engine", ["baidu", "weibo", "sweibo"])
def test_a_redirect_to_no_url_is_no_verification_page(engine: str) -> None:
    for location in (b"http://[abc/x", b"http://[id]/"):
        response = HtmlResponse(url="http://www.baidu.com/s?wd=x", status=302, headers={"Location": location},
                                body=b"")
        assert redirect_target(response) == "" and get_engine(engine).block_reason(response) is None


@pytest.mark.parametrize("expected", sorted(PAGES.glob("*.json")), ids=lambda p: p.stem)
def test_every_real_layout_survives_hostile_mutations(expected: Path) -> None:
    """Each real layout, cut, spliced, sprinkled with random bytes and with its numbers replaced by hostile ones
    (``²``, ``١٢``, 10^29, ``nan``, ``,``, nothing): the engine reads what it can and never raises (an exception fails
    the page and every result on it)."""
    spec = json.loads(expected.read_text(encoding="utf-8"))
    html = expected.with_suffix(".html").read_bytes()
    engine = get_engine(spec["engine"])
    rng = random.Random(expected.stem)
    hostile = [b"\xc2\xb2", "١٢".encode(), b"", b"-1", b"9" * 29, b"nan", b",", b"1,,", b"0", b"1_0"]
    for _ in range(25):
        body = bytearray(html)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(body) or 1)
            op = rng.random()
            if op < 0.2:
                del body[i:i + rng.randint(1, 400)]
            elif op < 0.4:
                body[i:i] = body[rng.randrange(len(body) or 1):][:rng.randint(1, 400)]
            elif op < 0.6:
                body[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 20)))
            elif op < 0.7:
                del body[i:]
            else:
                numbers = list(re.finditer(rb"\d+", bytes(body)))
                if numbers:
                    m = rng.choice(numbers)
                    body[m.start():m.end()] = rng.choice(hostile)
        engine.parse(HtmlResponse(url=spec["url"], status=spec.get("status", 200), headers=spec.get("headers"),
                                  body=bytes(body)))


def test_normalize_date():
    assert normalize_date("2013-5-12\xa0-\xa0") == "2013-05-12"
    assert normalize_date("2013年5月2日 ") == "2013-05-02"
    assert normalize_date("  ") is None
    assert normalize_date(None) is None


# --- fixtures after every real layout (tests/pages/*.json: the page, its URL and what it must parse to) ------


def fixture_response(spec: dict[str, Any], html: Path) -> HtmlResponse:
    # No encoding given: the page's own <meta charset> must be honoured (some fixtures are GBK).
    return HtmlResponse(url=spec["url"], status=spec.get("status", 200), headers=spec.get("headers"),
                        body=html.read_bytes())


@pytest.mark.parametrize("expected", sorted(PAGES.glob("*.json")), ids=lambda p: p.stem)
def test_engine_reads_real_layout(expected: Path) -> None:
    spec = json.loads(expected.read_text(encoding="utf-8"))
    engine = get_engine(spec["engine"])
    response = fixture_response(spec, expected.with_suffix(".html"))
    reason = engine.block_reason(response)
    if spec["blocked"]:
        assert reason is not None and spec["blocked"] in reason, reason
        return
    assert reason is None
    page = engine.parse(response)
    if spec["problem"]:
        assert spec["problem"] in page.problem
    else:
        assert page.problem == ""
    assert (page.reported, page.has_next) == (spec["reported"], spec["has_next"])
    got = [{"rank": r.rank, "title": r.title, "url": r.url, "date": r.date, "kind": r.kind,
            **({"snippet": r.snippet} if "snippet" in want else {})}
           for r, want in zip(page.results, spec["results"], strict=False)]
    assert got == spec["results"]
    assert len(page.results) == len(spec["results"])


def test_every_fixture_page_has_its_expectations() -> None:
    assert {p.stem for p in PAGES.glob("*.html")} - {p.stem for p in PAGES.glob("*.json")} <= {
        "baidu_old", "baidu_new", "baidu_last", "weibo"}  # checked field by field above


def test_baidu_skips_ads_hidden_blocks_and_empty_widgets_and_says_why() -> None:
    spec = json.loads((PAGES / "baidu_2015_gbk.json").read_text(encoding="utf-8"))
    page = get_engine("baidu").parse(fixture_response(spec, PAGES / "baidu_2015_gbk.html"))
    assert [s.split(":")[0] for s in page.skipped] == ['ad <div id="3001">', "hidden <div id=\"24\" srcid=\"1599\">",
                                                       'ad <div id="5001">']
    spec = json.loads((PAGES / "baidu_2017.json").read_text(encoding="utf-8"))
    page = get_engine("baidu").parse(fixture_response(spec, PAGES / "baidu_2017.html"))
    assert any("data-tuiguang" in s for s in page.skipped)
    assert any("calculator_html" in s and "no title" in s for s in page.skipped)


def test_block_markers_never_come_from_the_query() -> None:
    # A product named like a block notice still gets its result and no-result pages read as such.
    html = (PAGES / "baidu_2021.html").read_text(encoding="utf-8").replace("<title>site:315tousu.org 光明 牛奶",
                                                                         "<title>site:315tousu.org 验证码 牛奶")
    url = "https://www.baidu.com/s?wd=site%3A315tousu.org+%E9%AA%8C%E8%AF%81%E7%A0%81+%E7%89%9B%E5%A5%B6&pn=10"
    assert get_engine("baidu").block_reason(HtmlResponse(url=url, body=html, encoding="utf-8")) is None


# --- queries -------------------------------------------------------------------------------------------------


def test_baidu_query_fits_the_limit_with_site_first() -> None:
    words = ["雀巢", "中老年", "高钙", "低脂", "无糖", "营养", "配方", "奶粉", "罐装", "进口", "原装", "正品", "特价"]
    query = fit_query(words, "cca.org.cn")
    assert query.startswith("site:cca.org.cn ") and sum(1 if ord(c) < 128 else 2 for c in query) <= 76
    assert query.split()[1:] == words[: len(query.split()) - 1]  # whole words, in order, the last ones dropped
    wd = parse_qs(urlsplit(get_engine("baidu").page_url(words, "cca.org.cn", 0)).query)["wd"][0]
    assert wd == query


def test_sweibo_url_page_offsets_and_arithmetic() -> None:
    engine = get_engine("sweibo")
    url = engine.page_url(WORDS, "weibo.com", 0)
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", "s.weibo.com", "/weibo")
    assert query(url) == {"q": ["光明 高钙 牛奶 投诉"], "page": ["1"]}
    assert query(engine.page_url(WORDS, "weibo.com", 9))["page"] == ["10"]
    assert (engine.node_type, engine.page_size) == (1, 20)
    assert [engine.offered(45, p) for p in range(4)] == [20, 20, 5, 0]
    assert engine.pages_for(100_000) == 50  # s.weibo.com links 50 pages at most


def test_sweibo_session_cookies_from_setting_or_file_are_sent_never_shown(tmp_path: Path) -> None:
    secret = "SUB=_2A25secret; SUBP=0033WrSX"
    engine = get_engine("sweibo", {"PC_WEIBO_COOKIES": secret})
    assert engine.request_headers() == {"Cookie": secret}
    assert "secret" not in repr(engine)
    assert get_engine("sweibo").request_headers() == {}
    header_file = tmp_path / "cookie.txt"
    header_file.write_text(f"Cookie: {secret}\n", encoding="utf-8")
    assert get_engine("sweibo", {"PC_WEIBO_COOKIES_FILE": str(header_file)}).request_headers() == {"Cookie": secret}
    jar = tmp_path / "cookies.txt"
    jar.write_text("# Netscape HTTP Cookie File\n.weibo.com\tTRUE\t/\tTRUE\t0\tSUB\t_2A25secret\n"
                   ".example.com\tTRUE\t/\tFALSE\t0\tOTHER\tx\n", encoding="utf-8")
    assert get_engine("sweibo", {"PC_WEIBO_COOKIES_FILE": str(jar)}).request_headers() == {"Cookie": "SUB=_2A25secret"}
    bad = tmp_path / "bad.txt"
    bad.write_text("secret-without-equals\n", encoding="utf-8")
    with pytest.raises(ValueError, match="PC_WEIBO_COOKIES_FILE") as error:
        get_engine("sweibo", {"PC_WEIBO_COOKIES_FILE": str(bad)})
    assert "secret-without" not in str(error.value)
    with pytest.raises(ValueError, match="cannot read"):
        get_engine("sweibo", {"PC_WEIBO_COOKIES_FILE": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="line break"):
        get_engine("sweibo", {"PC_WEIBO_COOKIES": "SUB=x\r\nX-Injected: 1"})


def test_normalize_date_takes_only_dates() -> None:
    assert [normalize_date(t) for t in ("int./n.", "n.", "中国质量投诉网", "12315", "2015-13-45")] == [None] * 5
    assert normalize_date("www.cca.org.cn/zxsd/2014/1103.html 2014-11-3 ") == "2014-11-03"
    assert normalize_date("回答时间：2014年5月3日") == "2014-05-03"
    assert [normalize_date(t) for t in ("5分钟前", "今天 10:05", "3月12日 10:22", "半小时前", "刚刚")] == [
        "5分钟前", "今天 10:05", "3月12日 10:22", "半小时前", "刚刚"]


# --- a node on pages like these (real Scrapy process, Redis, MongoDB, an HTTP server on loopback) -----------


class _SavedBaidu(BaseHTTPRequestHandler):
    """Serves saved pages by ``pn``: a page of results, a suspicious page, another page of results."""

    pages = {"0": "baidu_2017.html", "10": "baidu_suspicious.html", "20": "baidu_2021.html"}

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        pn = parse_qs(urlsplit(self.path).query).get("pn", ["0"])[0]
        body = (PAGES / self.pages.get(pn, "baidu_none.html")).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_suspicious_page_fails_the_page_instead_of_ending_the_task(cluster: Any) -> None:
    from scheduler_ext.models import Report, Subtask

    server = ThreadingHTTPServer(("127.0.0.1", 0), _SavedBaidu)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        cluster.settings["PC_ENGINE_BASE_URLS"] = {"baidu": f"http://127.0.0.1:{server.server_address[1]}"}
        st = Subtask(id="s1", task="t1", group="蒙牛特仑苏", site="12315.com", first_page=0, page_limit=3,
                     time_limit=30, payload={"engine": "baidu", "keywords": ["蒙牛", "特仑苏"],
                                             "keywords_joined": "蒙牛&特仑苏", "product": "蒙牛特仑苏"})
        cluster.redis.lpush(cluster.store.keys.crawl("node1"), st.to_json())
        from product_crawl.cluster import NodeSpec

        assert cluster.start_node(NodeSpec("node1", "127.0.0.2"), SCHEDEXT_IDLE_CLOSE=1).wait(60) == 0
    finally:
        server.shutdown()
        server.server_close()
    # Not "done, end of results at page 1": failed with the reason, so the control recalls pages 1-2.
    assert not cluster.redis.llen(cluster.store.keys.sleeping)
    [raw] = cluster.redis.lrange(cluster.store.keys.failed, 0, -1)
    report = Report.from_json(raw)
    assert report.outcome == "failed" and "suspicious page" in report.reason and not report.exhausted
    assert report.next_page == 1 and report.reported in (85, 1020)
    assert cluster.items() == report.collected >= 4  # page 0's four results are stored


def test_parse_page_command_shows_a_saved_page_parse_and_verdict(tmp_path: Path) -> None:
    from conftest import run_scrapy

    url = "http://www.baidu.com/s?wd=site%3Acca.org.cn+%E5%85%89%E6%98%8E&pn=20&ie=utf-8"
    out = run_scrapy(["parse-page", str(PAGES / "baidu_2015_gbk.html"), "--engine", "baidu", "--url", url])
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    # The page declares GBK; w3lib decodes it as its superset GB18030.
    assert (shown["verdict"], shown["encoding"], shown["reported"]) == ("more pages", "gb18030", 2460)
    assert [r["rank"] for r in shown["results"]] == [21, 22, 23, 24]
    assert shown["results"][2]["kind"] == "card" and len(shown["skipped"]) == 3
    blocked = run_scrapy(["parse_page", str(PAGES / "sweibo_limited.html"), "--engine", "sweibo"])
    assert blocked.returncode == 0 and json.loads(blocked.stdout)["verdict"] == "blocked"
    failed = run_scrapy(["parse_page", str(PAGES / "sweibo_suspicious.html"), "--engine", "sweibo"])
    assert json.loads(failed.stdout)["verdict"] == "failed"
    missing = run_scrapy(["parse_page", str(tmp_path / "nothing.html")])
    assert missing.returncode == 2 and "nothing.html" in missing.stderr and "cannot read" in missing.stderr


class _NoLimitEngine(Engine):
    """A type-0 engine without a query limit."""

    name = "nolimit"
    default_base_url = "http://search.local"


def test_split_records_the_words_each_engine_searches() -> None:
    from product_crawl.tasks import parse_virtual_task, split

    words = ["雀巢", "中老年", "高钙", "低脂", "无糖", "营养", "配方", "奶粉", "罐装", "进口", "原装", "正品", "特价"]
    specs = split(parse_virtual_task({"name": "雀巢中老年奶粉", "keywords": words, "sites": ["cca.org.cn"],
                                      "engines": ["baidu", f"{__name__}._NoLimitEngine"]}),
                  {"PC_ALLOWED_ENGINES": [f"{__name__}._NoLimitEngine"]})
    assert [s["payload"]["engine"] for s in specs] == ["baidu", f"{__name__}._NoLimitEngine"]
    baidu, other = (s["payload"] for s in specs)
    assert baidu["keywords"] == fit_query(words, "cca.org.cn").split()[1:] and len(baidu["keywords"]) < len(words)
    assert baidu["keywords_joined"] == "&".join(baidu["keywords"])
    url = get_engine("baidu").page_url(baidu["keywords"], "cca.org.cn", 0)
    assert query(url)["wd"] == [fit_query(words, "cca.org.cn")]
    assert other["keywords"] == words  # no limit known: every word


@pytest.mark.parametrize("expected", sorted(PAGES.glob("*weibo*.json")), ids=lambda p: p.stem)
def test_both_weibo_engines_read_every_weibo_page_alike(expected: Path) -> None:
    spec = json.loads(expected.read_text(encoding="utf-8"))
    response = fixture_response(spec, expected.with_suffix(".html"))
    sweibo, weibo = get_engine("sweibo"), get_engine("weibo")
    assert sweibo.block_reason(response) == weibo.block_reason(response)
    assert sweibo.parse(response) == weibo.parse(response)


def test_search_spider_sends_the_engine_session_cookie_with_every_page(redis_url: str) -> None:
    from scrapy.utils.test import get_crawler

    from product_crawl.spiders.search import SearchSpider
    from scheduler_ext.models import Subtask

    # The test's own Redis: the spider checks its credentials, and whatever answers on 6379 (the demo's embedded
    # Redis, with its password) must not decide this test.
    crawler = get_crawler(SearchSpider, {"PC_WEIBO_COOKIES": "SUB=abc; SUBP=def", "SCHEDEXT_NODE_ID": "n1",
                                         "REDIS_URL": redis_url})
    spider = SearchSpider.from_crawler(crawler)
    st = Subtask(id="s", task="t", site="weibo.com", first_page=0, page_limit=2, time_limit=10,
                 payload={"engine": "sweibo", "keywords": ["光明"]})
    requests = list(spider.subtask_requests(st))
    assert [query(r.url)["page"] for r in requests] == [["1"], ["2"]]
    assert all(r.headers.get("Cookie") == b"SUB=abc; SUBP=def" for r in requests)
    assert "SUB=abc" not in repr(requests[0])
    baidu = Subtask(id="b", task="t", site="cca.org.cn", first_page=0, page_limit=1, time_limit=10,
                    payload={"engine": "baidu", "keywords": ["光明"]})
    assert [r.headers.get("Cookie") for r in spider.subtask_requests(baidu)] == [None]
