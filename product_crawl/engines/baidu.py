"""Baidu web search (node type 0): URLs after the paper's Table 3, a parser for every layout Baidu has used.

URL: ``<base>/s?wd=site:<site> <words joined by spaces>&pn=<10 x page>&cl=0&ie=utf-8``; ``pn`` is the offset of
the first result. ``site:`` goes first and words are kept only while the query fits Baidu's limit (38 Chinese
characters, 76 bytes as GBK counts them): Baidu silently drops whatever follows the limit, and a dropped
``site:`` would turn a site search into a web-wide one. A page that says the query was cut anyway
("及其后面的字词均被忽略") fails with that reason.

The parser (docs/engines.md lists the layouts, 2012-2025) reads every block of ``#content_left``: organic
results (``div.result``), Baidu's own cards (``div.result-op``, Zhidao, Baike, news) and ads, which it leaves
out (``data-tuiguang``, ``ec_``/``EC_`` classes, ids from 3001, a "广告"/"推广链接" label, hidden blocks).
Titles come from the ``h3`` with or without a link (else ``data-tools``); the URL is the first usable
http(s) link among ``mu``, the title link, ``data-tools`` and the block's other links; the date is looked
for everywhere Baidu has put one and kept only if it reads as a date.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lxml import etree
from parsel.csstranslator import HTMLTranslator
from scrapy.http import Response, TextResponse

from product_crawl.engines import (
    MAX_PAGE,
    Engine,
    Result,
    ResultPage,
    check_page,
    clean_text,
    compiled,
    encode_param,
    has_class,
    html_title,
    normalize_date,
    page_number,
    parse_count,
    redirect_target,
    strings,
    usable_url,
    without_query,
)
from product_crawl.services import whole_number

#: Baidu's query limit: 38 Chinese characters, i.e. 76 bytes where a Chinese character takes two.
QUERY_LIMIT_BYTES = 76

# "百度为您找到相关结果约1,230个" (2012-2020), "找到相关结果数约1,230个" (2020-), "找到相关网页约1,230篇" (older).
# "百度为您找到以下结果" (2025) has no number: the count is unknown.
_COUNT = re.compile(r"找到相关(?:结果|网页)数?\s*约?\s*([\d,，]+)\s*[个篇]")
_NO_RESULTS = ("抱歉没有找到", "抱歉，没有找到", "没有找到与", "没有找到该URL", "未找到相关结果")
_TRUNCATED_WORDS = "及其后面的字词均被忽略"
_TRUNCATED = re.compile(rf"[^。<>]{{0,120}}{_TRUNCATED_WORDS}[^。<>]{{0,40}}")
_BAIDU_OWN = re.compile(r"^(?:(?:https?:)?//(?:www\.|m\.)?baidu\.com)?/s\?|cache\.baiducontent\.com|^/?#")
# Text of verification pages (checked only on a page without results): the captcha host, its slider, the
# "network is weak" notice it shows, the old vcode page.
_BLOCK_TEXTS = ("wappass.baidu.com", "/static/captcha", "网络不给力", "请输入验证码", "请完成下方验证", "拖动下方滑块",
                "滑动滑块", "异常的访问", "访问出错", "安全验证", "访问受限", "过于频繁", "异常流量")
_AD_LABELS = ("广告", "推广链接", "商业推广", "品牌广告", "推广")

# Blocks of #content_left: results and cards carry these classes; ads carry data-tuiguang, EC_/ec_ classes
# or a numeric id (3001 top, 4001 right, 5001 bottom).
_BLOCK = (
    f"({has_class('result', 'result-op', 'c-container')} or @data-tuiguang"
    " or contains(concat(' ', @class), ' EC_') or contains(concat(' ', @class), ' ec_')"
    " or contains(concat(' ', @class), ' ec-') or number(@id) = number(@id))"
)
# Results were tables until about 2014 (table.result[id]), divs since.
_TOP_BLOCKS = f".//*[self::div or self::table][{_BLOCK}][not(ancestor::*[self::div or self::table][{_BLOCK}])]"
_HIDDEN = "ancestor-or-self::*[contains(translate(@style, ' ', ''), 'display:none')]"
_DATE_SPANS = has_class("newTimeFactor_before_abs", "c-color-gray2")
# Where Baidu has put a result's date, most specific first. Each candidate must read as a date.
_DATE_XPATHS = (
    f".//span[{_DATE_SPANS}]",  # in the abstract (2013-2018; 2020-)
    ".//*[contains(@class, 'time') or contains(@class, 'date')]",  # hashed or named time spans
    f".//span[{has_class('g')}]",  # the green URL line, "www.site.com/... 2015-3-12" (-2016)
    f".//*[{has_class('c-showurl')}]/..",  # the URL line of later layouts
    f".//*[{has_class('f13')}]",  # Zhidao answers: "回答时间：2014年5月3日" (p.f13)
    f".//span[{has_class('c-color-gray', 'm')}]",  # generic grey text: often a date, sometimes a label
    ".//span[contains(@class, 'color-gray') or contains(@class, 'text-minor')]",  # the same, 2023- class names
)
_ABSTRACTS = (
    f".//*[{has_class('c-abstract')}]",
    ".//*[contains(@class, 'content-right_')]",
    ".//*[contains(@class, 'abstract') or contains(@class, 'summary')]",
    f".//*[{has_class('c-span-last', 'c-span18')}]",
)
_AD_LABEL = ".//*[self::span or self::a or self::div or self::font][" + " or ".join(
    f"normalize-space(text()) = '{label}'" for label in _AD_LABELS) + "]"
_PAGER = "//*[@id='page' or contains(@class, 'page-inner')]"
_NEXT = (f"{_PAGER}//a[contains(normalize-space(.), '下一页')]"
         f" | //a[{has_class('n')}][contains(normalize-space(.), '下一页')]")
# The count line and the "no results" notice, as CSS says them (translated once, evaluated as compiled XPath).
_COUNT_TEXTS = HTMLTranslator().css_to_xpath(".nums ::text, .nums_text ::text, [class*=hint_] ::text")
_NONE_NOTICE = HTMLTranslator().css_to_xpath("div.content_none, div.nors")
_LEAD_DATE = re.compile(r"^\s*(\S{6,12}日|\d{4}-\d{1,2}-\d{1,2}|\d+\s*\S{1,2}前)\s*-\s*")


class BaiduEngine(Engine):
    """Baidu web search restricted to one site (``site:`` operator)."""

    name = "baidu"
    node_type = 0
    page_size = 10
    default_base_url = "http://www.baidu.com"

    def page_url(self, words: Sequence[str], site: str, page: int) -> str:
        if page < 0:
            raise ValueError(f"page must be >= 0, got {page}")
        query = fit_query(words, site)
        return f"{self.base_url}/s?{encode_param('wd', query)}&pn={self.page_size * page}&cl=0&ie=utf-8"

    def query_words(self, words: Sequence[str], site: str) -> list[str]:
        query = fit_query(words, site).split()
        return query[1:] if site else query

    def parse(self, response: TextResponse) -> ResultPage:
        offset = _offset(response.url, self.page_size)
        root = response.selector.root  # the blocks are read as lxml nodes (engines.compiled)
        area = (compiled("//div[@id='content_left']")(root) or compiled("//body")(root) or [root])[0]
        results: list[Result] = []
        skipped: list[str] = []
        for block in compiled(_TOP_BLOCKS)(area):
            kind, why = _classify(block, offset, self.page_size)
            if why:
                skipped.append(f"{kind} {_describe(block)}: {why}")
                continue
            result = _parse_result(block, response, kind, offset, len(results), self.page_size)
            if isinstance(result, str):
                skipped.append(f"{kind} {_describe(block)}: {result}")
            else:
                results.append(result)
        has_next = bool(compiled(_NEXT)(root))
        has_pager = bool(compiled(_PAGER)(root))
        text = clean_text(strings(response, "//body//text()[not(ancestor::script or ancestor::style)]"))
        said_none = bool(compiled(_NONE_NOTICE)(root)) or any(s in text for s in _NO_RESULTS)
        problem = check_page(results, has_next, said_none, has_pager, response.url)
        # The notice stands above the results; a result's own text may quote anything. Reading the text outside
        # the result blocks is the dearest step of a parse, so it is read only when the page says it somewhere.
        truncated = _TRUNCATED_WORDS in text and _TRUNCATED.search(clean_text(strings(
            response, f"//body//text()[not(ancestor::script or ancestor::style)][not(ancestor::*[{_BLOCK}][.//h3])]")))
        if truncated:
            problem = f"query truncated by Baidu (limit: 38 Chinese characters): {truncated[0].strip()}"
        return ResultPage(results=results, reported=_reported(response, text), has_next=has_next,
                          problem=problem, skipped=tuple(skipped))

    def block_reason(self, response: Response) -> str | None:
        for url in (response.url, redirect_target(response)):
            parts = urlsplit(url)
            if parts.hostname in ("wappass.baidu.com", "verify.baidu.com") or "verify" in parts.path \
                    or "/vcode" in parts.path or parts.path == "/search/error.html":
                return f"verification page at {url}"
        if not isinstance(response, TextResponse):
            return None
        title = html_title(response)
        # A result page's title is "<query>_百度搜索": the query's own words never count.
        for marker in ("安全验证", "验证码", "访问出错", "访问受限"):
            if marker in without_query(title, response.url):
                return f"verification page (title {title!r})"
        root = response.selector.root
        if compiled("//div[@id='content_left']")(root) or compiled(f"//*[self::div or self::table][{_BLOCK}]")(root):
            return None  # a result page; its scripts may well mention the verification host
        # The home page ("百度一下，你就知道") where results were asked for.
        if "百度一下" in without_query(title, response.url):
            return f"home page instead of results (title {title!r})"
        text = without_query(response.text, response.url)
        for marker in _BLOCK_TEXTS:
            if marker in text:
                return f"verification page ({marker!r} and no results)"
        return None


def fit_query(words: Sequence[str], site: str, limit: int = QUERY_LIMIT_BYTES) -> str:
    """``site:<site>`` then as many of ``words`` as fit in ``limit`` bytes (Chinese characters count two).

    >>> fit_query(["光明", "高钙", "牛奶"], "cca.org.cn")
    'site:cca.org.cn 光明 高钙 牛奶'
    >>> fit_query(["特别长的产品名称" * 4, "牛奶"], "cca.org.cn")  # 16 bytes + 30 characters
    'site:cca.org.cn 特别长的产品名称特别长的产品名称特别长的产品名称特别长的产品'
    """
    query = f"site:{site}" if site else ""
    for word in words:
        longer = f"{query} {word}" if query else word
        if _query_bytes(longer) <= limit:
            query = longer
            continue
        if query == (f"site:{site}" if site else ""):  # not even the first word fits: keep what fits of it
            while word and _query_bytes(f"{query} {word}".strip()) > limit:
                word = word[:-1]
            query = f"{query} {word}".strip()
        break
    return query


def _query_bytes(text: str) -> int:
    return sum(1 if ord(ch) < 128 else 2 for ch in text)


def _offset(url: str, page_size: int) -> int:
    """The ``pn`` of a result-page URL (0 when absent, malformed or past :data:`MAX_PAGE` pages)."""
    values = parse_qs(urlsplit(url).query).get("pn")
    return (page_number(values[0], MAX_PAGE * page_size) if values else None) or 0


def _reported(response: TextResponse, text: str) -> int | None:
    texts = strings(response, _COUNT_TEXTS)
    count = parse_count(clean_text(texts), _COUNT)
    if count is None:  # layouts change; the sentence is the stable part
        count = parse_count(text, _COUNT)
    return count


def _classify(block: etree._Element, offset: int, page_size: int) -> tuple[str, str]:
    """``(kind, why it is left out)``: kind ``organic``, ``card``, ``ad`` or ``hidden``; why is "" to keep it.

    Baidu numbers ads from 3001 and organic results by rank across pages; an id in this page's own rank range
    (past page 300 of a query) is a rank, not an ad."""
    if compiled(_HIDDEN)(block):
        return "hidden", "inside a display:none block"
    classes = (block.get("class") or "").split()
    if compiled("self::*[@data-tuiguang] | .//*[@data-tuiguang]")(block):
        return "ad", "data-tuiguang"
    if any(c.lower().startswith(("ec_", "ec-")) for c in classes):
        return "ad", f"class {block.get('class')!r}"
    block_id = block.get("id", "")
    number = whole_number(block_id)
    if number is not None and number >= 3000 and not _is_rank(number, offset, page_size):
        return "ad", f"id {block_id}"
    if compiled(_AD_LABEL)(block):
        return "ad", "an ad label"
    if "result-op" in classes or "result" not in classes:
        return "card", ""
    return "organic", ""


def _is_rank(block_id: int, offset: int, page_size: int) -> bool:
    """Whether a numeric block id can be a result's rank on the page starting after ``offset``."""
    return offset < block_id <= offset + 2 * page_size


def _describe(block: etree._Element) -> str:
    attrs = " ".join(f'{k}="{block.attrib[k]}"' for k in ("id", "tpl", "srcid") if k in block.attrib)
    tag = block.tag
    return f"<{tag} {attrs}>" if attrs else f"<{tag}>"


def _json_attr(block: etree._Element, xpath: str) -> dict[str, Any]:
    """The JSON object in the attribute ``xpath`` selects (``data-tools``: the result's title and url;
    ``data-log``: its ``mu``), {} if absent or unreadable."""
    found = strings(block, xpath)
    raw = found[0] if found else ""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON: some layouts use single quotes; nothing we need then
        return {}
    return value if isinstance(value, dict) else {}


def _parse_result(block: etree._Element, response: TextResponse, kind: str, offset: int, index: int,
                  page_size: int) -> Result | str:
    """The block's result, or why it has none (no title, no usable link)."""
    tools = _json_attr(block, "(.//@data-tools)[1]")
    log = _json_attr(block, "@data-log")
    # The first h3 with text: some cards (company information) open with an empty one.
    heading = next((h for h in compiled(".//h3")(block) if clean_text(strings(h, ".//text()"))), None)
    title = ""
    if heading is not None:
        # The link's text, without labels beside it in the h3 ("官方", "保障"); the h3's text if unlinked.
        texts = (clean_text(strings(a, ".//text()")) for a in compiled(".//a")(heading))
        title = next((t for t in texts if t), "") or clean_text(strings(heading, ".//text()"))
    if not title:
        title = clean_text(strings(block, f"(.//*[{has_class('c-title', 't')}])[1]//text()"))
    if not title:
        title = clean_text([str(tools.get("title") or "")])
    if not title:
        return "no title (an empty widget)"
    url = usable_url(response, _links(block, log, heading, tools))
    if not url:
        return f"no usable link ({title!r})"
    snippet, lead_date = _snippet(block)
    date = lead_date
    for xpath in _DATE_XPATHS:
        if date:
            break
        for element in compiled(xpath)(block):
            date = normalize_date(clean_text(strings(element, ".//text()")))
            if date:
                break
    number = whole_number(block.get("id", ""))
    # Baidu numbers results across pages (id 11 is the first of pn=10); other ids are not ranks.
    rank = number if number is not None and _is_rank(number, offset, page_size) else offset + index + 1
    return Result(title=title, url=url, snippet=snippet, date=date, rank=rank, kind=kind)


def _links(block: etree._Element, log: dict[str, Any], heading: etree._Element | None,
           tools: dict[str, Any]) -> Iterator[str]:
    """The block's candidate links, best first, each read only if the ones before it were unusable."""
    yield block.get("mu") or ""
    yield str(log.get("mu") or "")
    if heading is not None:
        yield from strings(heading, ".//a/@href")
    yield str(tools.get("url") or "")
    # The block's other links come last, without Baidu's own search and snapshot links (a "related searches"
    # card links only to searches: it is no result).
    yield from (href for href in strings(block, ".//a/@href") if not _BAIDU_OWN.search(href))


def _snippet(block: etree._Element) -> tuple[str, str | None]:
    """The block's abstract without its date, and the date written at its start ("2015年3月12日 - ...")."""
    for xpath in _ABSTRACTS:
        found = compiled(xpath)(block)
        if not found:
            continue
        text = clean_text(strings(found[0], f".//text()[not(ancestor::span[{_DATE_SPANS}])]"))
        if not text:
            continue
        lead = _LEAD_DATE.match(text)
        if lead and normalize_date(lead[1]):
            return text[lead.end():], normalize_date(lead[1])
        return text, None
    return "", None
