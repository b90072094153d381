"""Search engines: how a (keywords, site, page) subtask becomes a URL, and how a result page becomes results.

An engine is a small stateless object with a fixed contract (see :class:`Engine`): it builds the URL of one
result page and parses the page that comes back. Engines are chosen by name from :data:`ENGINES` or by the
dotted path of an :class:`Engine` subclass, through :func:`get_engine`, which also reads their settings:

``PC_ENGINE_BASE_URLS``
    dict, engine name -> base URL (scheme and host, no trailing path). Missing names fall back to
    :data:`DEFAULT_BASE_URLS` and then to the class's ``default_base_url``. The demo, the tests and the
    experiment point these at the simulated web (:mod:`product_crawl.simweb`).
``PC_WEIBO_EXTRA_WORD``
    str, the word the Weibo engine adds to every query (default ``"投诉"``, "complaint"); empty adds nothing.
``PC_ALLOWED_ENGINES``
    list of dotted paths of :class:`Engine` subclasses that a virtual task or a subtask may name. Names come from
    Redis, and Redis never chooses code: a dotted path not in this list is refused before anything is imported.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlencode, urlsplit

from scrapy.http import Response, TextResponse
from scrapy.settings import BaseSettings, Settings
from scrapy.utils.misc import load_object

__all__ = [
    "DEFAULT_BASE_URLS",
    "DEFAULT_WEIBO_EXTRA_WORD",
    "ENGINES",
    "Engine",
    "Result",
    "ResultPage",
    "get_engine",
    "normalize_date",
]

#: Built-in engines, by name. Values are dotted paths so that importing this package does not import them.
ENGINES: dict[str, str] = {
    "baidu": "product_crawl.engines.baidu.BaiduEngine",
    "weibo": "product_crawl.engines.weibo.WeiboEngine",
}

#: Defaults of ``PC_ENGINE_BASE_URLS`` (the real engines of the paper's Table 3).
DEFAULT_BASE_URLS: dict[str, str] = {"baidu": "http://www.baidu.com", "weibo": "http://weibo.yunyun.com"}

#: Default of ``PC_WEIBO_EXTRA_WORD``.
DEFAULT_WEIBO_EXTRA_WORD = "投诉"


@dataclass(frozen=True)
class Result:
    """One search result as the engine shows it.

    ``rank`` is the 1-based position in the engine's whole result list (not on the page), so that results
    from different pages, or served partially, can be told apart and counted once.
    ``date`` is ``YYYY-MM-DD`` when the engine shows an absolute date, the text as shown otherwise
    (e.g. ``3天前``), or None.
    """

    title: str
    url: str
    snippet: str
    date: str | None
    rank: int


@dataclass(frozen=True)
class ResultPage:
    """What one result page says: its results, the engine-reported total (None if not shown) and whether
    the engine links a next page."""

    results: list[Result]
    reported: int | None
    has_next: bool


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

    def parse(self, response: TextResponse) -> ResultPage:
        """Results, reported count and next-page flag of one result page. A page past the end of the
        results parses to no results and ``has_next=False``; it is not an error."""
        raise NotImplementedError

    def is_blocked(self, response: Response) -> bool:
        """True if ``response`` is a verification (captcha) page rather than results, which engines serve
        with status 200. The base implementation knows no patterns."""
        return False

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

    Raises ValueError naming the engine (and listing the known names) if it cannot be found.
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
    base_urls = {**DEFAULT_BASE_URLS, **settings.getdict("PC_ENGINE_BASE_URLS")}
    base_url = base_urls.get(cls.name) or cls.default_base_url
    if not base_url:
        raise ValueError(f"engine {name_or_path!r}: no base URL; set PC_ENGINE_BASE_URLS[{cls.name!r}]")
    return cls(base_url, **cls.options_from_settings(settings))


_YMD = re.compile(r"(\d{4})\s*[-年/.]\s*(\d{1,2})\s*[-月/.]\s*(\d{1,2})")


@functools.lru_cache(maxsize=4096)
def encode_param(name: str, value: str) -> str:
    """``name=value`` percent-encoded as ``urlencode`` does; cached, since every page of a query repeats it.

    >>> encode_param("wd", "光明 site:cca.org.cn")
    'wd=%E5%85%89%E6%98%8E+site%3Acca.org.cn'
    """
    return urlencode([(name, value)])


def normalize_date(text: str | None) -> str | None:
    """``YYYY-MM-DD`` for an absolute date as engines show it, the stripped text otherwise, None if empty.

    >>> normalize_date("2013-5-12\\xa0-\\xa0")
    '2013-05-12'
    >>> normalize_date(" 2013年5月2日 ")
    '2013-05-02'
    >>> normalize_date("3天前 - ")
    '3天前'
    """
    if text is None:
        return None
    m = _YMD.search(text)
    if m:
        return f"{int(m[1]):04d}-{int(m[2]):02d}-{int(m[3]):02d}"
    cleaned = text.replace("\xa0", " ").strip().rstrip("-").strip()
    return cleaned or None


def clean_text(parts: Sequence[str]) -> str:
    """Text nodes joined, with runs of whitespace (including non-breaking spaces) collapsed."""
    return " ".join("".join(parts).replace("\xa0", " ").split())


def parse_count(text: str, pattern: re.Pattern[str]) -> int | None:
    """The number captured by ``pattern`` in ``text`` with thousands separators removed, or None."""
    m = pattern.search(text)
    if not m:
        return None
    return int(m[1].replace(",", "").replace("，", ""))
