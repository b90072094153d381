"""Search engines: how a (keywords, site, page) subtask becomes a URL, and how a result page becomes results.

An engine is a small stateless object with a fixed contract (see :class:`Engine`): it builds the URL of one
result page and parses the page that comes back. Engines are chosen by name from :data:`ENGINES` or by the
dotted path of an :class:`Engine` subclass, through :func:`get_engine`, which also reads their settings:

``PC_ENGINE_BASE_URLS``
    dict, engine name -> base URL (scheme and host, no trailing path). Missing names fall back to
    :data:`DEFAULT_BASE_URLS` and then to the class's ``default_base_url``. The demo, the tests and the
    experiment point these at the simulated web (:mod:`product_crawl.simweb`).
``PC_WEIBO_EXTRA_WORD``
    str, the word the Weibo engines add to every query (default ``"投诉"``, "complaint"); empty adds nothing.
``PC_WEIBO_COOKIES`` / ``PC_WEIBO_COOKIES_FILE``
    str, the session cookies of a logged-in Weibo account for the ``sweibo`` engine (s.weibo.com): the value
    of a ``Cookie`` header, or the path of a file holding one (or a Netscape ``cookies.txt``). Never logged.
``PC_ALLOWED_ENGINES``
    list of dotted paths of :class:`Engine` subclasses that a virtual task or a subtask may name. Names come from
    Redis, and Redis never chooses code: a dotted path not in this list is refused before anything is imported.

docs/engines.md lists the page layouts each parser reads and what counts as a block page.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlencode, urljoin, urlsplit

from lxml import etree
from scrapy.http import Response, TextResponse
from scrapy.selector import Selector
from scrapy.settings import BaseSettings, Settings
from scrapy.utils.misc import load_object

from product_crawl.services import whole_number
from scheduler_ext.exceptions import ConfigurationError, shortened

__all__ = [
    "DEFAULT_BASE_URLS",
    "DEFAULT_WEIBO_EXTRA_WORD",
    "ENGINES",
    "Engine",
    "PageProblem",
    "Result",
    "ResultPage",
    "engine_base_urls",
    "get_engine",
    "is_http_url",
    "normalize_date",
]

#: Built-in engines, by name. Values are dotted paths so that importing this package does not import them.
ENGINES: dict[str, str] = {
    "baidu": "product_crawl.engines.baidu.BaiduEngine",
    "weibo": "product_crawl.engines.weibo.WeiboEngine",
    "sweibo": "product_crawl.engines.weibo.SWeiboEngine",
}

#: Defaults of ``PC_ENGINE_BASE_URLS`` (the real engines of the paper's Table 3).
DEFAULT_BASE_URLS: dict[str, str] = {
    "baidu": "http://www.baidu.com",
    "weibo": "http://weibo.yunyun.com",
    "sweibo": "https://s.weibo.com",
}

#: Default of ``PC_WEIBO_EXTRA_WORD``.
DEFAULT_WEIBO_EXTRA_WORD = "投诉"


class PageProblem(Exception):
    """Raised if a result page cannot be trusted (:attr:`ResultPage.problem`): the page fails with the reason
    instead of ending the results."""


@dataclass(frozen=True)
class Result:
    """One search result as the engine shows it.

    ``rank`` is the 1-based position in the engine's whole result list (not on the page), so that results
    from different pages, or served partially, can be told apart and counted once.
    ``date`` is ``YYYY-MM-DD`` when the engine shows an absolute date, the relative date as shown otherwise
    (e.g. ``3天前``, ``昨天 10:05``, ``3月12日 10:00``), or None; text that is not a date is never taken for one.
    ``kind`` says what the engine made of it: ``organic`` (a plain web result, a post), or ``card`` (one of
    the engine's own answer boxes: Zhidao, Baike, news, video); ads are never results.
    """

    title: str
    url: str
    snippet: str
    date: str | None
    rank: int
    kind: str = "organic"


@dataclass(frozen=True)
class ResultPage:
    """What one result page says: its results, the engine-reported total (None if not shown or shown without
    a number) and whether the engine links a next page.

    ``problem`` is empty for a page that can be trusted; otherwise it says why the page cannot be (a page
    with no results, no "no results" sentence and no page links; a query the engine truncated), and the
    spider fails the page with it instead of taking the page for the end of the results. ``skipped`` lists
    what the parser saw and left out, and why (ads, hidden blocks, empty widgets): ``scrapy parse_page``
    shows it.
    """

    results: list[Result]
    reported: int | None
    has_next: bool
    problem: str = ""
    skipped: tuple[str, ...] = ()


class Engine:
    """Base class and contract of a search engine.

    Subclasses set ``name`` (the key in ``PC_ENGINE_BASE_URLS``), ``node_type`` (0 = meta search through
    search engines, 1 = Weibo search; a task only goes to nodes of its engine's type), ``page_size``
    (results per page) and ``default_base_url``, and implement :meth:`page_url` and :meth:`parse`;
    :meth:`is_blocked` usually needs engine-specific patterns too. Engines hold no state beyond their
    configuration and may be shared freely.
    """

    name: ClassVar[str] = ""
    node_type: ClassVar[int] = 0
    page_size: ClassVar[int] = 10
    default_base_url: ClassVar[str] = ""

    def __init__(self, base_url: str, **options: Any) -> None:
        if not base_url or not urlsplit(base_url).scheme or not urlsplit(base_url).netloc:
            raise ValueError(
                f"engine {self.name!r}: base URL must be absolute (scheme://host), got {base_url!r}"
            )
        if options:
            raise TypeError(f"engine {self.name!r}: unknown options {sorted(options)}")
        self.base_url = base_url.rstrip("/")

    @classmethod
    def options_from_settings(cls, settings: BaseSettings) -> dict[str, Any]:
        """Keyword options for ``__init__`` read from ``settings`` (none by default)."""
        return {}

    def page_url(self, words: Sequence[str], site: str, page: int) -> str:
        """URL of result page ``page`` (0-based) of the search for ``words`` restricted to ``site``."""
        raise NotImplementedError

    def query_words(self, words: Sequence[str], site: str) -> list[str]:
        """The leading ``words`` this engine can send in one query on ``site`` (all of them by default)."""
        return list(words)

    def parse(self, response: TextResponse) -> ResultPage:
        """Results, reported count and next-page flag of one result page. A page past the end of the
        results parses to no results and ``has_next=False``; it is not an error. A page that cannot be told
        from a broken one gets a ``problem`` (see :class:`ResultPage`)."""
        raise NotImplementedError

    def request_headers(self) -> dict[str, str]:
        """Extra headers of every result-page request (e.g. a session cookie); none by default."""
        return {}

    def block_reason(self, response: Response) -> str | None:
        """Why ``response`` is a block page (captcha, visitor system, login wall, access limited, account
        abnormal, busy) rather than results, or None. Engines serve most of these with status 200, some as a
        redirect. The base implementation knows no patterns."""
        return None

    def is_blocked(self, response: Response) -> bool:
        """True if :meth:`block_reason` finds a reason."""
        return self.block_reason(response) is not None

    def offered(self, reported: int, page: int) -> int:
        """How many results the engine should show on page ``page`` (0-based) for ``reported`` results.

        >>> Engine.offered(Engine.__new__(Engine), 25, 2)
        5
        """
        return max(0, min(self.page_size, reported - page * self.page_size))

    def pages_for(self, reported: int) -> int:
        """Number of result pages for ``reported`` results.

        >>> Engine.pages_for(Engine.__new__(Engine), 25)
        3
        """
        return max(0, math.ceil(reported / self.page_size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"


def get_engine(name_or_path: str, settings: BaseSettings | Mapping[str, Any] | None = None) -> Engine:
    """The engine registered as ``name_or_path`` in :data:`ENGINES`, or the :class:`Engine` subclass at that
    dotted path, configured from ``settings`` (a Scrapy settings object, a plain dict, or None for defaults).

    Raises ValueError naming the engine (and listing the known names) if it cannot be found, and
    ConfigurationError naming the setting if ``PC_ENGINE_BASE_URLS`` is malformed (:func:`engine_base_urls`).
    """
    if settings is None:
        settings = Settings()
    elif not isinstance(settings, BaseSettings):
        settings = Settings(dict(settings))
    if name_or_path in ENGINES:
        cls = load_object(ENGINES[name_or_path])
    elif "." in name_or_path:
        if name_or_path not in settings.getlist("PC_ALLOWED_ENGINES"):
            raise ValueError(f"engine {name_or_path!r} is not allowed: list its dotted path in PC_ALLOWED_ENGINES "
                             f"(known engines: {', '.join(sorted(ENGINES))})")
        try:
            cls = load_object(name_or_path)
        except (ImportError, NameError, ValueError) as exc:  # not importable, or no such attribute
            raise ValueError(f"unknown engine {name_or_path!r}: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Engine)):
            raise ValueError(f"engine {name_or_path!r} is not an Engine subclass: {cls!r}")
    else:
        raise ValueError(
            f"unknown engine {name_or_path!r}; known engines: {', '.join(sorted(ENGINES))}"
            " (or give the dotted path of an Engine subclass)"
        )
    base_url = engine_base_urls(settings).get(cls.name) or cls.default_base_url
    if not base_url:
        raise ValueError(f"engine {name_or_path!r}: no base URL; set PC_ENGINE_BASE_URLS[{cls.name!r}]")
    return cls(base_url, **cls.options_from_settings(settings))


_BASE_URLS_EXPECTED = 'a JSON object mapping engine names to http(s) URLs, e.g. {"baidu": "http://127.0.0.1:8000"}'


def engine_base_urls(settings: BaseSettings) -> dict[str, str]:
    """``PC_ENGINE_BASE_URLS`` (a dict, or its JSON text as ``-s`` gives it) over :data:`DEFAULT_BASE_URLS`.

    Raises ConfigurationError naming the setting unless it maps names to http(s) URLs with a host.

    >>> engine_base_urls(Settings({"PC_ENGINE_BASE_URLS": '{"baidu": "http://127.0.0.1:8000"}'}))["baidu"]
    'http://127.0.0.1:8000'
    """
    raw = settings.get("PC_ENGINE_BASE_URLS")
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        # Not JSON, or nested past the parser's recursion limit.
        except (ValueError, RecursionError) as exc:
            raise ConfigurationError(f"PC_ENGINE_BASE_URLS: expected {_BASE_URLS_EXPECTED}, "
                                     f"got {shortened(raw)} ({type(exc).__name__})") from exc
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"PC_ENGINE_BASE_URLS: expected {_BASE_URLS_EXPECTED}, got {shortened(raw)}")
    urls = dict(DEFAULT_BASE_URLS)
    for name, url in value.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"PC_ENGINE_BASE_URLS: expected {_BASE_URLS_EXPECTED}, "
                                     f"got the engine name {shortened(name)}")
        if not is_http_url(url):
            raise ConfigurationError(f"PC_ENGINE_BASE_URLS[{name!r}]: expected an http(s) URL with a host, "
                                     f"e.g. http://127.0.0.1:8000, got {shortened(url)}")
        urls[name] = url
    return urls


def is_http_url(url: Any) -> bool:
    """Whether ``url`` is an absolute http(s) URL with a host (and, if any, a valid port).

    >>> is_http_url("http://127.0.0.1:8000"), is_http_url("http://[::1"), is_http_url("ftp://x/")
    (True, False, False)
    """
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (reading it raises ValueError for a port out of range or not a number)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)



_YMD = re.compile(r"((?:19|20)\d\d)\s*[-年/.]\s*(\d{1,2})\s*[-月/.]\s*(\d{1,2})(?!\d)")
_TIME = r"(?:\s*\d{1,2}:\d{2})?"
# Relative dates as the engines show them: "3天前", "5分钟前", "半小时前", "刚刚", "昨天 10:05", and Weibo's
# "3月12日 10:00" (this year's dates, shown without the year).
_RELATIVE = re.compile(
    rf"(?:\d+|半|一|两|几)\s*(?:秒|分钟|小时|天|周|星期|个月|月|年)前|刚刚|(?:今天|昨天|前天){_TIME}"
    rf"|(?<!\d)\d{{1,2}}月\d{{1,2}}日{_TIME}"
)


@functools.lru_cache(maxsize=4096)
def encode_param(name: str, value: str) -> str:
    """``name=value`` percent-encoded as ``urlencode`` does; cached, since every page of a query repeats it.

    >>> encode_param("wd", "光明 site:cca.org.cn")
    'wd=%E5%85%89%E6%98%8E+site%3Acca.org.cn'
    """
    return urlencode([(name, value)])


def normalize_date(text: str | None) -> str | None:
    """The date in ``text``: ``YYYY-MM-DD`` for an absolute date, the relative date as shown, None if the
    text holds no date (a grey label such as ``int./n.`` is not one).

    >>> normalize_date("2013-5-12\\xa0-\\xa0")
    '2013-05-12'
    >>> normalize_date(" 回答时间：2013年5月2日 ")
    '2013-05-02'
    >>> normalize_date("3天前 - ")
    '3天前'
    >>> normalize_date("昨天  10:05 来自 iPhone")
    '昨天 10:05'
    >>> normalize_date("int./n.") is None
    True
    """
    if not text:
        return None
    text = " ".join(text.replace("\xa0", " ").split())
    m = _YMD.search(text)
    if m:
        year, month, day = int(m[1]), int(m[2]), int(m[3])
        if 1 <= month <= 12 and 1 <= day <= 31:
            return f"{year:04d}-{month:02d}-{day:02d}"
    m = _RELATIVE.search(text)
    return " ".join(m[0].split()) if m else None


def usable_url(response: TextResponse, candidates: Iterable[str | None]) -> str:
    """The first candidate that is a usable link, made absolute against ``response``; "" if none is.

    Unusable: empty, ``null``/``undefined``/``#``, ``javascript:`` and other non-HTTP schemes, and Baidu's
    ``nourl`` placeholders. A page read from a file (``scrapy parse-page`` without ``--url``) resolves
    ``//host/...`` links as https and cannot resolve a bare path.
    """
    on_web = urlsplit(response.url).scheme in ("http", "https")
    for candidate in candidates:
        value = (candidate or "").strip()
        if not value or value.lower() in _NOT_URLS or value.startswith("#"):
            continue
        try:
            url = response.urljoin(value) if on_web else urljoin("https://", value) if value.startswith("//") \
                else value
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError:  # "http://[abc", "http://[id]/": a bracketed host that is no IPv6 address failed the page
            continue
        if parts.scheme not in ("http", "https") or not host or parts.path.lower() in ("/null", "/undefined"):
            continue
        if host.startswith("nourl."):
            continue
        return url
    return ""


_NOT_URLS = {"null", "none", "undefined", "about:blank"}


def redirect_target(response: Response) -> str:
    """Where a 3xx ``response`` redirects to (absolute), "" for any other response, or for a ``Location`` that is no
    URL (``http://[abc``: reading its host failed the whole page)."""
    if not 300 <= response.status < 400:
        return ""
    location = response.headers.get(b"Location")
    if not location:
        return ""
    try:
        target = response.urljoin(location.decode("latin-1"))
        urlsplit(target).hostname  # noqa: B018  (a bracketed host that is no IPv6 address raises here)
    except ValueError:
        return ""
    return target


def html_title(response: Response) -> str:
    """The page's ``<title>``, whitespace collapsed; "" for a response that is not text."""
    if not isinstance(response, TextResponse):
        return ""
    return str(compiled("normalize-space(//title)")(response.selector.root))


def without_query(text: str, url: str) -> str:
    """``text`` without the words of the query in ``url`` (``wd``, ``q`` or an old Weibo ``/weibo/<query>``
    path), so that a page is never judged by words the user searched for (a product may be called anything).
    """
    parts = urlsplit(url)
    args = parse_qs(parts.query)
    queries = [*args.get("wd", []), *args.get("q", [])]
    if parts.path.startswith("/weibo/"):
        queries.append(unquote(unquote(parts.path[len("/weibo/"):])))
    for query in queries:
        for word in sorted(re.split(r"[\s&]+", query), key=len, reverse=True):
            if word:
                text = text.replace(word, " ")
    return text


def check_page(results: Sequence[Result], has_next: bool, said_none: bool, has_pager: bool, url: str) -> str:
    """The problem of a page that has no results, no "no results" sentence and no page links: it looks like
    the end of the results but may be a block page nobody has seen yet, or a broken one. "" otherwise."""
    if results or has_next or said_none or has_pager:
        return ""
    return f"suspicious page: no results, no 'no results' sentence and no page links at {url}"


def has_class(*names: str) -> str:
    """An XPath predicate (in parentheses): the element's class list holds one of ``names``."""
    return "(" + " or ".join(f"contains(concat(' ', normalize-space(@class), ' '), ' {n} ')" for n in names) + ")"


@functools.cache
def compiled(path: str) -> etree.XPath:
    """``path`` compiled once, as lxml evaluates it: call it on an lxml node for a list of elements, or of plain
    strings for text and attributes. A parser that reads a page's blocks with these, on the lxml nodes under
    ``response.selector.root``, skips what a parsel ``xpath()`` call adds each time (the evaluator, a Selector
    for every value found): about three quarters of a result page's parse time."""
    return etree.XPath(path, smart_strings=False)


def strings(node: Selector | TextResponse | etree._Element, path: str) -> list[str]:
    """The text and attribute values ``path`` selects under ``node`` (a response, a parsel Selector or an lxml
    node), as plain strings."""
    if isinstance(node, TextResponse):
        node = node.selector.root
    elif isinstance(node, Selector):
        node = node.root
    return [str(v) for v in compiled(path)(node)]


def clean_text(parts: Sequence[str]) -> str:
    """Text nodes joined, with runs of whitespace (including non-breaking spaces) collapsed and zero-width
    characters (Weibo pads posts with them) removed."""
    return " ".join("".join(parts).replace("\xa0", " ").replace("\u200b", "").replace("\ufeff", "").split())


#: The highest result page (0-based) a URL's page number is read as: far past the last page any engine serves
#: (Baidu's about 76, s.weibo.com's 50), and small enough that a rank counted from it (offset + position) stays an
#: exact integer for every reader (JSON read as doubles, MongoDB's 64-bit integers).
MAX_PAGE = 100_000


def page_number(text: str, maximum: int) -> int | None:
    """``text``, a page number or offset read from a URL, as a whole number 0 .. ``maximum`` in ASCII digits; None
    otherwise, and the page is read as one whose number is malformed (``pn=99999999999999999999999`` would make
    every rank on the page about 1e23).

    >>> page_number("20", 750), page_number("99999999999999999999999", 750), page_number("١٠", 750)
    (20, None, None)
    """
    number = whole_number(text.strip())
    return number if number is not None and 0 <= number <= maximum else None


#: The most results an engine's count line can claim (a trillion): a larger one is no count, or a page could make
#: every pair that crawls it look as if it collected nothing of what was offered.
MAX_COUNT = 10**12


def parse_count(text: str, pattern: re.Pattern[str]) -> int | None:
    """The number captured by ``pattern`` in ``text`` with thousands separators removed, in ASCII digits and at most
    :data:`MAX_COUNT`, or None (``,,`` alone failed the page; ``\\d`` also matches other scripts' digits).

    >>> COUNT = re.compile(r"about ([\\d,]+) results")
    >>> [parse_count(t, COUNT) for t in ("about 1,234 results", "about ,, results", "about ١٢ results")]
    [1234, None, None]
    """
    m = pattern.search(text)
    if not m:
        return None
    digits = m[1].replace(",", "").replace("，", "")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 13:
        return None
    count = int(digits)
    return count if count <= MAX_COUNT else None
