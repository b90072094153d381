"""Weibo search (node type 1) through the search front end of the paper's Table 3.

URL: ``<base>/Weibo.php?p=<page+1>&q=site:<site> <words joined by &>&<extra word>&wbts=1``, where the whole
``site:weibo.com 光明&高钙&牛奶&投诉`` is the value of ``q`` (its ``&`` are percent-encoded) and
``wbts=1`` is a separate parameter. The extra word comes from ``PC_WEIBO_EXTRA_WORD`` (default ``投诉``,
"complaint").

Markup (modelled on s.weibo.com): a count line ``找到1,230条结果`` in ``.search_num``; one
``div.card-wrap`` per post (``data-rank`` = 1-based rank in the whole list) with the author in ``a.name``,
the text in ``p.txt`` and the permalink and date in ``p.from a``; the next page is ``.m-page a.next``
(text ``下一页``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from scrapy.http import Response, TextResponse
from scrapy.settings import BaseSettings

from product_crawl.engines import (
    DEFAULT_WEIBO_EXTRA_WORD,
    Engine,
    Result,
    ResultPage,
    clean_text,
    encode_param,
    normalize_date,
    parse_count,
)

_COUNT = re.compile(r"找到\s*([\d,，]+)\s*条结果")


class WeiboEngine(Engine):
    """Weibo search: words joined by ``&`` plus an extra word, one ``site:`` restriction, pages from 1."""

    name = "weibo"
    node_type = 1
    page_size = 10
    default_base_url = "http://weibo.yunyun.com"

    def __init__(self, base_url: str, extra_word: str = DEFAULT_WEIBO_EXTRA_WORD, **options: Any) -> None:
        super().__init__(base_url, **options)
        self.extra_word = extra_word

    @classmethod
    def options_from_settings(cls, settings: BaseSettings) -> dict[str, Any]:
        return {"extra_word": settings.get("PC_WEIBO_EXTRA_WORD", DEFAULT_WEIBO_EXTRA_WORD) or ""}

    def page_url(self, words: Sequence[str], site: str, page: int) -> str:
        if page < 0:
            raise ValueError(f"page must be >= 0, got {page}")
        terms = "&".join([*words, self.extra_word] if self.extra_word else list(words))
        query = f"site:{site} {terms}" if site else terms
        return f"{self.base_url}/Weibo.php?p={page + 1}&{encode_param('q', query)}&wbts=1"

    def parse(self, response: TextResponse) -> ResultPage:
        offset = _offset(response.url, self.page_size)
        results = []
        for index, card in enumerate(response.css("div.card-wrap")):
            link = card.css("p.from a")
            if not link:
                continue
            rank_attr = card.attrib.get("data-rank", "")
            results.append(
                Result(
                    title=clean_text(card.css("a.name ::text").getall()),
                    url=response.urljoin(link[0].attrib.get("href", "")),
                    snippet=clean_text(card.css("p.txt ::text").getall()),
                    date=normalize_date(clean_text(link[0].xpath(".//text()").getall())),
                    rank=int(rank_attr) if rank_attr.isdigit() else offset + index + 1,
                )
            )
        reported = parse_count(clean_text(response.css(".search_num ::text").getall()), _COUNT)
        if reported is None:
            reported = parse_count(clean_text(response.xpath("//body//text()").getall()), _COUNT)
        has_next = bool(
            response.xpath("//*[contains(@class, 'm-page')]//a[contains(normalize-space(.), '下一页')]")
        )
        return ResultPage(results=results, reported=reported, has_next=has_next)

    def is_blocked(self, response: Response) -> bool:
        parts = urlsplit(response.url)
        if parts.hostname == "passport.weibo.com" or "verify" in parts.path or "visitor" in parts.path:
            return True
        if not isinstance(response, TextResponse):
            return False
        title = response.xpath("normalize-space(//title)").get() or ""
        return "Sina Visitor System" in title or "验证码" in title


def _offset(url: str, page_size: int) -> int:
    """Offset of the first result on the page named by the URL's ``p`` (1-based; 0 when absent)."""
    values = parse_qs(urlsplit(url).query).get("p")
    try:
        return max(0, int(values[0]) - 1) * page_size if values else 0
    except ValueError:
        return 0
