"""Baidu web search (node type 0): URLs as in the paper's Table 3, parser for Baidu's result markup.

URL: ``<base>/s?wd=<words joined by spaces> site:<site>&pn=<10 x page>&cl=0&ie=utf-8``; ``pn`` is the offset
of the first result. The parser understands both the older layout (``div.nums`` saying
``百度为您找到相关结果约1,230个``, ``div.c-abstract`` with ``span.newTimeFactor_before_abs`` dates)
and the newer one (``找到相关结果数约1,230个``, ``h3.c-title``, ``mu`` attributes, ``span.c-color-gray2``
dates).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import parse_qs, urlsplit

from parsel import Selector
from scrapy.http import Response, TextResponse

from product_crawl.engines import (
    Engine,
    Result,
    ResultPage,
    clean_text,
    encode_param,
    normalize_date,
    parse_count,
)

# Old: "百度为您找到相关结果约1,230个"; new: "找到相关结果数约1,230个"; both with or without 约.
_COUNT = re.compile(r"找到相关结果数?\s*约?\s*([\d,，]+)\s*个")
_DATE_CLASSES = ("newTimeFactor_before_abs", "c-color-gray2")
_DATE_XPATH = " or ".join(
    f"contains(concat(' ', normalize-space(@class), ' '), ' {c} ')" for c in _DATE_CLASSES
)


class BaiduEngine(Engine):
    """Baidu web search restricted to one site (``site:`` operator)."""

    name = "baidu"
    node_type = 0
    page_size = 10
    default_base_url = "http://www.baidu.com"

    def page_url(self, words: Sequence[str], site: str, page: int) -> str:
        if page < 0:
            raise ValueError(f"page must be >= 0, got {page}")
        query = " ".join(words)
        if site:
            query = f"{query} site:{site}" if query else f"site:{site}"
        return f"{self.base_url}/s?{encode_param('wd', query)}&pn={self.page_size * page}&cl=0&ie=utf-8"

    def parse(self, response: TextResponse) -> ResultPage:
        offset = _offset(response.url)
        results = []
        for index, block in enumerate(response.css("div.result.c-container, div.result-op.c-container")):
            result = _parse_result(block, response, offset + index + 1)
            if result is not None:
                results.append(result)
        return ResultPage(results=results, reported=_reported(response), has_next=_has_next(response))

    def is_blocked(self, response: Response) -> bool:
        parts = urlsplit(response.url)
        if parts.hostname == "wappass.baidu.com" or "verify" in parts.path:
            return True
        if not isinstance(response, TextResponse):
            return False
        title = response.xpath("normalize-space(//title)").get() or ""
        if "百度安全验证" in title:
            return True
        # The verification page loads its captcha from wappass; result pages never reference it.
        return "wappass.baidu.com" in response.text


def _offset(url: str) -> int:
    """The ``pn`` of a result-page URL (0 when absent or malformed)."""
    values = parse_qs(urlsplit(url).query).get("pn")
    try:
        return max(0, int(values[0])) if values else 0
    except ValueError:
        return 0


def _reported(response: TextResponse) -> int | None:
    texts = response.css("div.nums ::text, span.nums_text ::text, [class*=hint_] ::text").getall()
    count = parse_count(clean_text(texts), _COUNT)
    if count is None:  # layouts change; the sentence is the stable part
        count = parse_count(clean_text(response.xpath("//body//text()").getall()), _COUNT)
    return count


def _has_next(response: TextResponse) -> bool:
    return bool(response.xpath("//div[@id='page']//a[contains(normalize-space(.), '下一页')]"))


def _parse_result(block: Selector, response: TextResponse, fallback_rank: int) -> Result | None:
    link = block.css("h3 a")
    if not link:
        return None
    title = clean_text(link[0].xpath(".//text()").getall())
    # Baidu's href is a redirect (baidu.com/link?url=...); the target is in ``mu`` when given.
    url = block.attrib.get("mu") or link[0].attrib.get("href", "")
    url = response.urljoin(url) if url else ""
    abstract = block.css(".c-abstract, [class*=content-right]")
    snippet = ""
    date_text: str | None = None
    if abstract:
        date_text = abstract[0].xpath(f".//span[{_DATE_XPATH}]//text()").get()
        snippet = clean_text(abstract[0].xpath(f".//text()[not(ancestor::span[{_DATE_XPATH}])]").getall())
    if date_text is None:
        date_text = block.xpath(f".//span[{_DATE_XPATH}]//text()").get()
    rank_attr = block.attrib.get("id", "")
    rank = int(rank_attr) if rank_attr.isdigit() else fallback_rank  # Baidu numbers results across pages
    return Result(title=title, url=url, snippet=snippet, date=normalize_date(date_text), rank=rank)
