"""Weibo search (node type 1): the real s.weibo.com (``sweibo``) and the paper's Weibo.php front end (``weibo``).

Both read every layout s.weibo.com has used (docs/engines.md):

- 2013-2017: the results ship as escaped HTML inside ``STK.pageletM.view({"pid": ..., "html": "..."})``
  scripts (decoded here), or rendered: one ``div[action-type=feed_list_item][mid]`` (``WB_feed_type``, or
  ``dl.feed_list`` before 2014) per post, the author in ``a.W_texta``/``a.name_txt`` or ``nick-name``, the text
  in ``p.comment_txt``/``WB_text``, the permalink and date in ``div.feed_from a`` (``date`` in ms, ``title``
  as ``2015-03-12 10:00``), the pager ``div.W_pages`` with ``a.page.next``;
- 2018-: one ``div.card-wrap[mid]`` per post, the author in ``a.name``, the text in
  ``p.txt[node-type=feed_list_content]`` (the full text of a long post in ``feed_list_content_full``, which
  replaces the visible part), the permalink and date in ``p.from a`` (``div.from`` later), the pager
  ``div.m-page`` with ``a.next``.

The expand/collapse controls ("展开全文", "收起全文") and a forwarded post's own text are left out.

``sweibo``: ``<base>/weibo?q=<words and extra word joined by spaces>&page=<page+1>``, 20 posts a page, at most
50 pages. s.weibo.com has needed a logged-in session since about 2020: ``PC_WEIBO_COOKIES`` (the ``Cookie``
header's value) or ``PC_WEIBO_COOKIES_FILE`` (a file holding it, or a Netscape ``cookies.txt``); without one
the visitor system or the login page answers, which counts as a block. The cookies are sent, never logged.

``weibo`` (Table 3): ``<base>/Weibo.php?p=<page+1>&q=site:<site> <words joined by &>&<extra word>&wbts=1``;
the whole ``site:weibo.com 光明&高钙&牛奶&投诉`` is the value of ``q``. 10 posts a page; the simulated web serves
it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from lxml import etree
from parsel import Selector
from scrapy.http import Response, TextResponse
from scrapy.settings import BaseSettings

from product_crawl.engines import (
    DEFAULT_WEIBO_EXTRA_WORD,
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

_COUNT = re.compile(r"找到\s*约?\s*([\d,，]+)\s*条(?:相关)?(?:结果|微博)")
_NO_RESULTS = ("抱歉，未找到", "未找到相关结果", "没有找到相关", "抱歉，没有找到")
_CHINA = timezone(timedelta(hours=8))
_VIEW = re.compile(r"\.view\(\s*(?=\{)")

# One post: the 2018- card-wrap, the 2014-2017 feed item, the 2013 dl.feed_list.
_POST = (f"(@action-type='feed_list_item' or {has_class('card-wrap', 'WB_feed_type', 'feed_list')}"
         " or (self::dl and @mid))")
_POSTS = f"//*[{_POST}][not(ancestor::*[{_POST}])]"
# A forwarded post inside a post: its text and date are not the post's.
_FORWARD = (f"ancestor::*[{has_class('card-comment', 'WB_expand', 'comment', 'WB_feed_expand')}"
            " or @node-type='feed_list_forwardContent']")
_TEXTS = (
    f".//*[@node-type='feed_list_content_full'][not({_FORWARD})]",
    f".//*[@node-type='feed_list_content'][not({_FORWARD})]",
    f".//*[{has_class('txt', 'comment_txt', 'WB_text')}][not({_FORWARD})]",
)
# Text of a post without its controls: "展开全文" / "收起全文" links (action-type fl_unfold / fl_fold, or
# class WB_text_opt) and the icon-font glyphs after them.
# The 2013 layout starts the text with the author's link ("昵称：..."), which is the title, not the text.
_POST_TEXT = (
    ".//text()[not(ancestor::a[starts-with(@action-type, 'fl_') or contains(@class, 'WB_text_opt')"
    " or starts-with(normalize-space(.), '展开') or starts-with(normalize-space(.), '收起') or @nick-name])]"
    f"[not(ancestor::i[{has_class('wbicon')}])][not(ancestor::script or ancestor::style)]"
)
_AUTHORS = (
    f".//a[{has_class('name', 'name_txt', 'W_texta')}][not({_FORWARD})]",
    f".//*[{has_class('WB_info')}][not({_FORWARD})]//a",
    f".//a[@usercard][not({_FORWARD})]",
)
_DATE_LINKS = (
    f".//*[{has_class('from', 'feed_from', 'WB_from')}][not({_FORWARD})]//a[@href]",
    f".//a[@node-type='feed_list_item_date'][not({_FORWARD})]",
    f".//a[{has_class('date', 'W_textb')}][not({_FORWARD})]",
)
_PAGER = f"//*[{has_class('m-page', 'W_pages', 'search_page')} or @node-type='feed_list_page']"
_NEXT = f".//a[{has_class('next')} or contains(normalize-space(.), '下一页')]"
_NONE_NOTICE = f"//*[{has_class('card-no-result', 'pl_noresult', 'search_noresult')}]"
_OLD_TEXT = f".//*[{has_class('comment_txt', 'WB_text')}][not({_FORWARD})]"
_NICK_NAME = f"(.//@nick-name[not({_FORWARD})])[1]"
_BLOCK_HOSTS = ("passport.weibo.com", "login.sina.com.cn", "passport.sina.cn", "login.weibo.cn",
                "security.weibo.com")
_BLOCK_PATHS = ("visitor", "verify", "login.php", "newlogin", "signin", "login", "sorry")
_BLOCK_TITLES = ("Sina Visitor System", "验证码", "访问受限", "404错误", "新浪通行证", "新鲜事",
                 "登录", "帐号异常", "账号异常", "网络繁忙", "系统繁忙")
_BLOCK_TEXTS = ("访问受限", "帐号异常", "账号异常", "网络繁忙", "系统繁忙", "请输入验证码", "行为有些异常",
                "Sina Visitor System", "pl_common_sassfilter", "请先登录", "登录后查看", "安全检测规则",
                "页面地址有误", "页面不存在", "过于频繁", "频次过高")


class WeiboParser(Engine):
    """What both Weibo engines share: the page parser, block detection and the extra word.

    Subclasses set ``page_param``, the URL parameter that numbers result pages from 1.
    """

    page_param: ClassVar[str] = "page"

    def __init__(self, base_url: str, extra_word: str = DEFAULT_WEIBO_EXTRA_WORD, **options: Any) -> None:
        super().__init__(base_url, **options)
        self.extra_word = extra_word

    @classmethod
    def options_from_settings(cls, settings: BaseSettings) -> dict[str, Any]:
        return {"extra_word": settings.get("PC_WEIBO_EXTRA_WORD", DEFAULT_WEIBO_EXTRA_WORD) or ""}

    def terms(self, words: Sequence[str]) -> list[str]:
        return [*words, self.extra_word] if self.extra_word else list(words)

    def parse(self, response: TextResponse) -> ResultPage:
        offset = _offset(response.url, ((self.page_param, self.page_size), *_PAGINATIONS))
        fragments = _fragments(response)
        results: list[Result] = []
        skipped: list[str] = []
        seen: set[str] = set()
        for post in _posts(fragments):
            result = _parse_post(post, response, offset, len(results), self.page_size)
            if isinstance(result, str):
                skipped.append(result)
                continue
            # A page saved from a browser holds the rendered posts and, still, the pagelet scripts they came from.
            key = post.get("mid") or result.url
            if key in seen:
                continue
            seen.add(key)
            results.append(result)
        text = _text(fragments)
        pagers = [p for f in fragments for p in compiled(_PAGER)(f)]
        has_next = any(compiled(_NEXT)(p) for p in pagers)
        said_none = _says_none(fragments, text)
        problem = check_page(results, has_next, said_none, bool(pagers), response.url)
        return ResultPage(results=results, reported=parse_count(text, _COUNT), has_next=has_next,
                          problem=problem, skipped=tuple(skipped))

    def block_reason(self, response: Response) -> str | None:
        for url in (response.url, redirect_target(response)):
            parts = urlsplit(url)
            host = parts.hostname or ""
            first = parts.path.strip("/").split("/", 1)[0].lower()
            if host in _BLOCK_HOSTS or (first in _BLOCK_PATHS and not host.startswith("s.weibo")):
                return f"login wall or visitor system at {url}"
        if not isinstance(response, TextResponse):
            return None
        fragments = _fragments(response)
        if _posts(fragments):  # a page that shows posts serves results, whatever its title says
            return None
        title = without_query(html_title(response), response.url)
        for marker in _BLOCK_TITLES:
            if marker in title:
                return f"block page (title {html_title(response)!r})"
        if any(compiled(_PAGER)(f) for f in fragments):
            return None
        text = without_query(_text(fragments), response.url)
        if _says_none(fragments, text):  # a normal "no results" page, whatever else it offers (a login link)
            return None
        text += " " + " ".join(re.findall(r'"pid"\s*:\s*"([^"]+)"', response.text))  # the pagelets' names
        for marker in _BLOCK_TEXTS:
            if marker in text:
                return f"block page ({marker!r} and no posts)"
        return None


#: How each Weibo front end numbers its pages: s.weibo.com's ``page=`` (20 posts), Weibo.php's ``p=`` (10).
_PAGINATIONS = (("page", 20), ("p", 10))


class SWeiboEngine(WeiboParser):
    """s.weibo.com: words and the extra word joined by spaces, ``page=`` from 1, 20 posts a page."""

    name = "sweibo"
    node_type = 1
    page_size = 20
    default_base_url = "https://s.weibo.com"
    page_param = "page"
    max_pages: ClassVar[int] = 50  # s.weibo.com links at most 50 pages of a search

    def __init__(self, base_url: str, extra_word: str = DEFAULT_WEIBO_EXTRA_WORD, cookies: str = "",
                 **options: Any) -> None:
        super().__init__(base_url, extra_word, **options)
        if any(ch in cookies for ch in "\r\n\0"):
            raise ValueError("PC_WEIBO_COOKIES: expected the value of one Cookie header (name=value; ...), "
                             "got a value with a line break")
        self._cookies = cookies.strip()

    @classmethod
    def options_from_settings(cls, settings: BaseSettings) -> dict[str, Any]:
        cookies = settings.get("PC_WEIBO_COOKIES") or ""
        path = settings.get("PC_WEIBO_COOKIES_FILE") or ""
        if path and not cookies:
            cookies = read_cookie_file(path)
        return {**super().options_from_settings(settings), "cookies": cookies}

    def page_url(self, words: Sequence[str], site: str, page: int) -> str:
        # s.weibo.com searches Weibo only: the site (weibo.com for every type-1 task) needs no operator.
        if page < 0:
            raise ValueError(f"page must be >= 0, got {page}")
        return f"{self.base_url}/weibo?{encode_param('q', ' '.join(self.terms(words)))}&page={page + 1}"

    def request_headers(self) -> dict[str, str]:
        return {"Cookie": self._cookies} if self._cookies else {}

    def pages_for(self, reported: int) -> int:
        return min(self.max_pages, super().pages_for(reported))


class WeiboEngine(WeiboParser):
    """The paper's Weibo.php front end: words joined by ``&`` plus an extra word, one ``site:``, ``p=``."""

    name = "weibo"
    node_type = 1
    page_size = 10
    default_base_url = "http://weibo.yunyun.com"
    page_param = "p"

    def page_url(self, words: Sequence[str], site: str, page: int) -> str:
        if page < 0:
            raise ValueError(f"page must be >= 0, got {page}")
        terms = "&".join(self.terms(words))
        query = f"site:{site} {terms}" if site else terms
        return f"{self.base_url}/Weibo.php?p={page + 1}&{encode_param('q', query)}&wbts=1"


def read_cookie_file(path: str) -> str:
    """The ``Cookie`` header value in the file at ``path``: one ``name=value; ...`` line (``Cookie:`` prefix
    allowed), or a Netscape ``cookies.txt`` (its weibo.com and sina.com.cn cookies). Raises ValueError naming
    the file, never quoting it (it holds a session)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # missing, unreadable or not text
        raise ValueError(f"PC_WEIBO_COOKIES_FILE {path!r}: cannot read it ({type(exc).__name__})") from exc
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("# ")
             and not line.startswith("#Netscape") and not line.startswith("# Netscape")]
    jar = [line.split("\t") for line in lines if line.count("\t") >= 6]
    if jar:
        pairs = [f"{f[5]}={f[6]}" for f in jar
                 if f[0].removeprefix("#HttpOnly_").lstrip(".").endswith(("weibo.com", "sina.com.cn"))]
        cookies = "; ".join(pairs)
    else:
        cookies = lines[0].removeprefix("Cookie:").strip() if len(lines) == 1 else ""
    if not cookies or "=" not in cookies:
        raise ValueError(f"PC_WEIBO_COOKIES_FILE {path!r}: expected one line 'name=value; ...' or a Netscape "
                         "cookies.txt with weibo.com cookies")
    return cookies


def _offset(url: str, paginations: Sequence[tuple[str, int]]) -> int:
    """The offset of the first post on the page at ``url``: for the first ``(param, page size)`` whose
    ``param=N`` (pages from 1, at most :data:`MAX_PAGE` + 1) is in the URL's query or in an old
    ``/weibo/<q>&page=N`` path, ``(N-1) x page size``; 0 when none is. Each engine tries its own numbering first,
    then the other's (s.weibo.com's ``page=`` always counts 20 posts a page), so either engine reads a page of the
    other."""
    for param, size in paginations:
        m = re.search(rf"[?&]{param}=(\d+)", url)
        page = page_number(m[1], MAX_PAGE + 1) if m else None  # past MAX_PAGE (or not ASCII): as malformed
        if page is not None:
            return (max(1, page) - 1) * size
    return 0


def _fragments(response: TextResponse) -> list[etree._Element]:
    """The page itself and the HTML of every pagelet script on it (``STK.pageletM.view({... "html": ...})``,
    ``FM.view``): old layouts ship their results only there. Each as the root lxml node of its document, read
    with :func:`~product_crawl.engines.compiled` XPaths."""
    fragments = [response.selector.root]
    decoder = json.JSONDecoder(strict=False)  # pagelets may hold raw tabs and newlines inside strings
    for script in strings(response, "//script/text()"):
        for m in _VIEW.finditer(script):
            try:
                value, _ = decoder.raw_decode(script, m.end())
            except ValueError:  # a view() call whose argument is not a JSON literal: not a pagelet
                continue
            if isinstance(value, dict) and isinstance(value.get("html"), str) and value["html"].strip():
                fragments.append(Selector(text=value["html"]).root)
    return fragments


def _text(fragments: list[etree._Element]) -> str:
    """The visible text of the page and its pagelets (no scripts or styles)."""
    return " ".join(clean_text(strings(f, "//text()[not(ancestor::script or ancestor::style)]")) for f in fragments)


def _says_none(fragments: list[etree._Element], text: str) -> bool:
    """True if the page says the search has no (more) results."""
    return any(compiled(_NONE_NOTICE)(f) for f in fragments) \
        or any(s in text for s in _NO_RESULTS)


def _posts(fragments: list[etree._Element]) -> list[etree._Element]:
    """The posts of the page and its pagelets. A candidate is a post if it holds post text: a
    ``feed_list_content`` element or an old text class, or a plain ``p.txt`` when it is a feed item with a
    ``mid`` (topic and user cards hold a ``p`` of their own)."""
    posts = []
    for fragment in fragments:
        for post in compiled(_POSTS)(fragment):
            if any(compiled(xpath)(post) for xpath in _TEXTS[:2]) or compiled(_OLD_TEXT)(post) \
                    or (post.get("mid") and compiled(_TEXTS[2])(post)):
                posts.append(post)
    return posts


def _first(post: etree._Element, xpaths: Sequence[str]) -> etree._Element | None:
    for xpath in xpaths:
        found = compiled(xpath)(post)
        if found:
            return found[0]
    return None


def _parse_post(post: etree._Element, response: TextResponse, offset: int, index: int,
                page_size: int) -> Result | str:
    text_element = _first(post, _TEXTS)
    snippet = clean_text(strings(text_element, _POST_TEXT)) if text_element is not None else ""
    snippet = snippet.lstrip("：:").strip()
    author = next(iter(strings(post, _NICK_NAME)), "")
    if not author:
        element = _first(post, _AUTHORS)
        author = clean_text(strings(element, ".//text()")) if element is not None else ""
    link = _first(post, _DATE_LINKS)
    mid = post.get("mid", "")
    href = link.get("href") if link is not None else None
    if href and href.startswith("/") and not href.startswith("//") \
            and (urlsplit(response.url).hostname or "").endswith("weibo.com"):
        href = "https://weibo.com" + href  # permalinks live on weibo.com, not on the search host
    url = usable_url(response, [href,
                                f"https://m.weibo.cn/detail/{mid}" if mid.isdigit() else None])
    if not url:
        return f"post mid={mid or '?'} by {author or '?'}: no permalink"
    date = _date(link) if link is not None else None
    number = whole_number(post.get("data-rank", ""))
    # data-rank (the Weibo.php front end) is a rank in the whole list only when it falls on this page.
    rank = number if number is not None and offset < number <= offset + page_size else offset + index + 1
    return Result(title=author, url=url, snippet=snippet, date=date, rank=rank)


def _date(link: etree._Element) -> str | None:
    """The date of a post's date link: its ``date`` attribute (ms since the epoch, shown in China's time), its
    ``title`` ("2015-03-12 10:00"), else its text ("今天 10:05", "3月12日 10:00", "2019年01月03日 10:00")."""
    millis = whole_number(link.get("date", ""))
    if millis is not None and millis >= 0:
        try:
            return datetime.fromtimestamp(millis / 1000, _CHINA).strftime("%Y-%m-%d")
        except (OverflowError, OSError, ValueError):  # past any date a clock shows ('²' and 1e30 failed the page)
            pass
    return normalize_date(link.get("title")) or normalize_date(clean_text(strings(link, ".//text()")))
