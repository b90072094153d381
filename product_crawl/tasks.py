"""Virtual tasks and task splitting: the paper's section 2.2, for products.

A **virtual task** names a product (and optionally its brand, explicit keywords, node type, sites, engines
and a priority). It arrives as JSON in the Redis list ``<prefix>:virtual`` (``scrapy inject`` or a raw
``LPUSH``); the control loop pops it and calls :func:`splitter` (the ``SCHEDEXT_SPLITTER`` setting) to turn it
into **task specs**: one per (site, engine), each a search query for the product's keywords restricted to one
site.

Keywords come from jieba with the product-term dictionary ``product_crawl/data/userdict.txt``; the brand goes
first when the name does not contain it; the words are joined with ``&``. Default sites per node type are
``product_crawl/data/sites_type0.txt`` (meta search) and ``sites_type1.txt`` (Weibo search). Package data is
read through :mod:`pkgutil`, so all of this works from a zipped egg (scrapyd).

Everything in this module is pure (no Redis, no network); the schema is documented in docs/tasks.md.
"""

from __future__ import annotations

import io
import json
import logging
import math
import pkgutil
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from scheduler_ext.exceptions import InvalidInput

if TYPE_CHECKING:
    import jieba

    from product_crawl.engines import Engine

logger = logging.getLogger(__name__)

VIRTUAL_TASK_VERSION = 1
"""Schema version written as ``"v"`` in a virtual task's canonical JSON."""

META_SEARCH = 0
"""Node type 0: search engines (Baidu and the like), restricted to a site with ``site:``."""
WEIBO_SEARCH = 1
"""Node type 1: Weibo search."""
NODE_TYPES = (META_SEARCH, WEIBO_SEARCH)

DEFAULT_ENGINES: dict[int, tuple[str, ...]] = {META_SEARCH: ("baidu",), WEIBO_SEARCH: ("weibo",)}
"""Engines a virtual task uses when it names none, per node type."""

NAME_MAX = 200
"""Characters in a product name, at most."""
KEYWORDS_MAX = 20
"""Explicit keywords in one virtual task, at most."""
KEYWORD_MAX = 50
"""Characters in one explicit keyword, at most."""

FIELDS = ("v", "name", "brand", "keywords", "type", "sites", "engines", "priority")
"""Every field a virtual task may carry; any other is refused."""

# A bare domain: dot-separated labels of lowercase letters, digits and hyphens (no leading/trailing hyphen),
# at least two labels. No scheme, path, port, user info or trailing dot.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})+")
# An engine: a registered name ("baidu") or the dotted path of an engine class ("myproject.engines.Bing").
_ENGINE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Keyword separators accepted by the command line (explicit JSON keywords may not contain them).
_SEPARATORS_RE = re.compile(r"[\s&]+")


# --- the virtual task -----------------------------------------------------------------------------


@dataclass(frozen=True)
class VirtualTask:
    """One product to collect data about: the paper's virtual task.

    Build it with :func:`parse_virtual_task`, which validates and normalises every field; the constructor
    trusts its arguments. ``keywords``, ``sites`` and ``engines`` are ``None`` when not given explicitly: the
    defaults (segmentation, the type's site list, the type's engines) are applied when the task is split, so
    the canonical JSON stays small and a raw ``{"name": ...}`` and an injected task mean the same thing.
    """

    name: str
    brand: str | None = None
    keywords: tuple[str, ...] | None = None
    type: int = META_SEARCH
    sites: tuple[str, ...] | None = None
    engines: tuple[str, ...] | None = None
    priority: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The canonical mapping: ``v``, ``name`` and ``type`` always, the other fields only when set."""
        data: dict[str, Any] = {"v": VIRTUAL_TASK_VERSION, "name": self.name, "type": self.type}
        if self.brand is not None:
            data["brand"] = self.brand
        if self.keywords is not None:
            data["keywords"] = list(self.keywords)
        if self.sites is not None:
            data["sites"] = list(self.sites)
        if self.engines is not None:
            data["engines"] = list(self.engines)
        if self.priority is not None:
            data["priority"] = self.priority
        return data

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, compact, UTF-8 text): what ``scrapy inject`` pushes to Redis.

        >>> VirtualTask("光明高钙牛奶").to_json()
        '{"name":"光明高钙牛奶","type":0,"v":1}'
        """
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True, separators=(",", ":"))

    @property
    def effective_sites(self) -> tuple[str, ...]:
        """The explicit sites, else the site list of the task's node type."""
        return self.sites if self.sites is not None else load_sites(self.type)

    @property
    def effective_engines(self) -> tuple[str, ...]:
        """The explicit engines, else the default engines of the task's node type."""
        return self.engines if self.engines is not None else DEFAULT_ENGINES[self.type]

    def words(self) -> list[str]:
        """The search words: the explicit keywords or the segmented name, with the brand first (see
        :func:`keywords_for`)."""
        if self.keywords is not None:
            return _with_brand(list(self.keywords), self.brand)
        return keywords_for(self.name, self.brand)


def parse_virtual_task(raw: str | bytes | Mapping[str, Any]) -> VirtualTask:
    """Validate a virtual task (JSON text, UTF-8 bytes or an already decoded mapping) and build it.

    Raises :class:`InvalidInput` naming the first bad field and what was expected, e.g.
    ``name: expected a non-empty string of at most 200 characters``. Does not segment the name (no jieba), so
    validating thousands of tasks is fast.

    >>> parse_virtual_task('{"name": " 特仑苏 ", "brand": "蒙牛"}')
    VirtualTask(name='特仑苏', brand='蒙牛', keywords=None, type=0, sites=None, engines=None, priority=None)
    >>> parse_virtual_task('{"name": "x", "colour": "red"}')
    Traceback (most recent call last):
    ...
    scheduler_ext.exceptions.InvalidInput: unknown field 'colour'; expected only: v, name, brand, keywords, \
type, sites, engines, priority
    """
    data = _decode(raw)
    unknown = [key for key in data if key not in FIELDS]
    if unknown:
        noun = "field" if len(unknown) == 1 else "fields"
        raise InvalidInput(
            f"unknown {noun} {', '.join(repr(k) for k in unknown)}; expected only: {', '.join(FIELDS)}"
        )
    if "v" in data and (type(data["v"]) is not int or data["v"] != VIRTUAL_TASK_VERSION):
        raise InvalidInput(f"v: expected schema version {VIRTUAL_TASK_VERSION}, got {data['v']!r}")
    node_type = _parse_type(data.get("type", META_SEARCH))
    return VirtualTask(
        name=_parse_name(data.get("name")),
        brand=_parse_brand(data.get("brand")),
        keywords=_parse_keywords(data["keywords"]) if data.get("keywords") is not None else None,
        type=node_type,
        sites=_parse_sites(data["sites"]) if data.get("sites") is not None else None,
        engines=_parse_engines(data["engines"]) if data.get("engines") is not None else None,
        priority=_parse_priority(data.get("priority")),
    )


def _decode(raw: str | bytes | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    if isinstance(raw, bytes | bytearray):
        if raw[:1] == b"\x80":  # the PROTO opcode that starts every pickle of protocol 2 and later
            raise InvalidInput("not UTF-8 JSON: this looks like a pickle; virtual tasks are JSON, never "
                               "pickle")
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"not UTF-8 text (virtual tasks are UTF-8 JSON, never pickle): {exc}") from exc
    if not isinstance(raw, str):
        raise InvalidInput(f"expected JSON text, bytes or a mapping, got {type(raw).__name__}")
    try:
        data = json.loads(raw, object_pairs_hook=_unique_fields)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"not JSON: {exc}") from exc
    except RecursionError as exc:
        raise InvalidInput("JSON nested too deeply") from exc
    if not isinstance(data, dict):
        raise InvalidInput(f"expected a JSON object, got {_json_type(data)}")
    return data


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's fields, refusing one named twice: ``json`` keeps the last silently, so
    ``{"name": "a", "name": "b"}`` would be product b, whatever its writer meant.

    >>> _unique_fields([("name", "a"), ("brand", "b")])
    {'name': 'a', 'brand': 'b'}
    """
    fields: dict[str, Any] = {}
    for key, value in pairs:
        if key in fields:
            raise InvalidInput(f"field {key!r} given twice; expected each field once")
        fields[key] = value
    return fields


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    for kind, label in names.items():
        if isinstance(value, kind):
            return label
    return "a number" if isinstance(value, int | float) else type(value).__name__


def _parse_name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value.strip()) > NAME_MAX:
        raise InvalidInput(
            f"name: expected a non-empty string of at most {NAME_MAX} characters, got {_show(value)}"
        )
    name = value.strip()
    if not name.isprintable():
        raise InvalidInput(f"name: expected printable characters (no tabs, newlines or control characters), "
                           f"got {name!r}")
    if not any(ch.isalnum() for ch in name):
        # Segmentation keeps only tokens with a letter or digit: such a name would give no keywords.
        raise InvalidInput(f"name: expected at least one letter or digit, got {name!r}")
    return name


def _parse_brand(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value.strip()) > NAME_MAX:
        raise InvalidInput(
            f"brand: expected a string of at most {NAME_MAX} characters or null, got {_show(value)}"
        )
    brand = value.strip()
    if not brand:
        return None
    if _SEPARATORS_RE.search(brand) or not any(ch.isalnum() for ch in brand):
        raise InvalidInput(f"brand: expected one word (letters or digits, no spaces or '&'), got {brand!r}")
    return brand


def _parse_keywords(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or len(value) > KEYWORDS_MAX:
        raise InvalidInput(
            f"keywords: expected a non-empty list of at most {KEYWORDS_MAX} strings, got {_show(value)}"
        )
    words: list[str] = []
    for i, word in enumerate(value):
        if (not isinstance(word, str) or not word.strip() or len(word.strip()) > KEYWORD_MAX
                or _SEPARATORS_RE.search(word.strip()) or not any(ch.isalnum() for ch in word)):
            raise InvalidInput(
                f"keywords[{i}]: expected a non-empty word of at most {KEYWORD_MAX} characters with a letter "
                f"or digit and no spaces or '&', got {_show(word)}"
            )
        if word.strip() not in words:
            words.append(word.strip())
    return tuple(words)


def _parse_type(value: Any) -> int:
    # bool is an int in Python; true/false is not a node type.
    if type(value) is not int or value not in NODE_TYPES:
        raise InvalidInput(
            f"type: expected {META_SEARCH} (meta search) or {WEIBO_SEARCH} (Weibo search), got {_show(value)}"
        )
    return value


def _parse_sites(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"sites: expected a non-empty list of domains, got {_show(value)}")
    sites: list[str] = []
    for i, site in enumerate(value):
        try:
            domain = validate_site(site)
        except InvalidInput as exc:
            raise InvalidInput(f"sites[{i}]: {exc}") from exc
        if domain not in sites:
            sites.append(domain)
    return tuple(sites)


def _parse_engines(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"engines: expected a non-empty list of engine names, got {_show(value)}")
    engines: list[str] = []
    for i, engine in enumerate(value):
        if not isinstance(engine, str) or not _ENGINE_RE.fullmatch(engine):
            raise InvalidInput(
                f"engines[{i}]: expected an engine name (e.g. 'baidu', 'weibo') or a dotted path, "
                f"got {_show(engine)}"
            )
        if engine not in engines:
            engines.append(engine)
    return tuple(engines)


def _parse_priority(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(
            f"priority: expected a finite number (lower runs first) or null, got {_show(value)}"
        )
    return value


def _show(value: Any) -> str:
    """A short rendering of a bad value for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- sites ----------------------------------------------------------------------------------------


def validate_site(site: Any) -> str:
    """Return ``site`` if it is a bare domain, else raise :class:`InvalidInput` naming it.

    >>> validate_site("cca.org.cn")
    'cca.org.cn'
    >>> validate_site("http://cca.org.cn/")
    Traceback (most recent call last):
    ...
    scheduler_ext.exceptions.InvalidInput: expected a bare domain (lowercase letters, digits, hyphens and \
dots, at least one dot; no scheme, path or port), got 'http://cca.org.cn/'
    """
    if not isinstance(site, str) or len(site) > 253 or not _DOMAIN_RE.fullmatch(site):
        raise InvalidInput(
            "expected a bare domain (lowercase letters, digits, hyphens and dots, at least one dot; "
            f"no scheme, path or port), got {_show(site)}"
        )
    return site


def parse_site_list(text: str, source: str) -> tuple[str, ...]:
    """Parse a site list: one domain a line, ``#`` starts a comment, blank lines skipped, duplicates refused.

    ``source`` names the list in error messages (``sites_type0.txt line 7: ...``).

    >>> parse_site_list("# quality sites\\ncca.org.cn\\n\\n12315.com  # Table 1\\n", "demo")
    ('cca.org.cn', '12315.com')
    """
    sites: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        domain = line.split("#", 1)[0].strip()
        if not domain:
            continue
        try:
            validate_site(domain)
        except InvalidInput as exc:
            raise InvalidInput(f"{source} line {lineno}: {exc}") from exc
        if domain in sites:
            raise InvalidInput(f"{source} line {lineno}: {domain!r} is listed twice")
        sites.append(domain)
    return tuple(sites)


@cache
def load_sites(node_type: int) -> tuple[str, ...]:
    """The default sites of a node type, from ``product_crawl/data/sites_type<N>.txt`` (read once).

    >>> load_sites(1)
    ('weibo.com',)
    """
    if node_type not in NODE_TYPES:
        raise InvalidInput(f"type: expected one of {NODE_TYPES}, got {node_type!r}")
    path = f"data/sites_type{node_type}.txt"
    raw = pkgutil.get_data("product_crawl", path)
    if raw is None:  # only when the package's loader cannot read data; a missing file raises OSError
        raise InvalidInput(f"product_crawl/{path}: cannot be read through the package loader")
    sites = parse_site_list(raw.decode("utf-8"), f"product_crawl/{path}")
    if not sites:
        raise InvalidInput(f"product_crawl/{path}: lists no site")
    return sites


# --- keywords -------------------------------------------------------------------------------------

_tokenizer: jieba.Tokenizer | None = None
_tokenizer_lock = threading.Lock()


def _get_tokenizer() -> jieba.Tokenizer:
    """Our own jieba tokenizer with the product-term dictionary, built on first use (about half a second).

    A dedicated instance, not jieba's global one, so that other code using jieba is not affected by our
    dictionary. jieba is imported here, not at module level: injecting and validating tasks never needs it.
    """
    global _tokenizer
    with _tokenizer_lock:
        if _tokenizer is None:
            import jieba as jieba_module

            _quiet_jieba()
            tokenizer = jieba_module.Tokenizer()
            tokenizer.initialize()
            tokenizer.load_userdict(io.BytesIO(_user_dictionary()))
            _tokenizer = tokenizer
            logger.debug("jieba tokenizer ready with the product-term dictionary")
        return _tokenizer


def _quiet_jieba() -> None:
    """Route jieba's "Building prefix dict ..." messages through logging at DEBUG, not its own stderr handler.

    They are DEBUG records already: without jieba's private handler they reach Scrapy's log handler and show
    only when LOG_LEVEL is DEBUG.
    """
    jieba_logger = logging.getLogger("jieba")
    for handler in list(jieba_logger.handlers):
        jieba_logger.removeHandler(handler)
    jieba_logger.setLevel(logging.NOTSET)


def _user_dictionary() -> bytes:
    """The product-term dictionary without its comment lines (jieba would take a comment for a word)."""
    raw = pkgutil.get_data("product_crawl", "data/userdict.txt")
    if raw is None:
        raise InvalidInput("product_crawl/data/userdict.txt: cannot be read through the package loader")
    lines = [line for line in raw.splitlines() if line.strip() and not line.lstrip().startswith(b"#")]
    return b"\n".join(lines)


def keywords_for(name: str, brand: str | None = None) -> list[str]:
    """Segment a product name into search words; the brand goes first when it is not among them.

    Whitespace and punctuation tokens are dropped, repeated words kept once. The paper's Table 2:

    >>> keywords_for("光明高钙牛奶")
    ['光明', '高钙', '牛奶']
    >>> keywords_for("特仑苏", brand="蒙牛")
    ['蒙牛', '特仑苏']
    >>> keywords_for("蒙牛早餐奶")
    ['蒙牛', '早餐奶']
    >>> keywords_for("雀巢中老年奶粉")
    ['雀巢', '中老年', '奶粉']
    """
    words: list[str] = []
    for token in _get_tokenizer().lcut(name):
        word = token.strip()
        if word and any(ch.isalnum() for ch in word) and word not in words:
            words.append(word)
    return _with_brand(words, brand)


def _with_brand(words: list[str], brand: str | None) -> list[str]:
    if brand and brand not in words:
        return [brand, *words]
    return words


def join_keywords(words: Iterable[str]) -> str:
    """The paper's keyword string: words joined with ``&`` (boolean AND).

    >>> join_keywords(["光明", "高钙", "牛奶"])
    '光明&高钙&牛奶'
    """
    return "&".join(words)


def split_keyword_args(values: Sequence[str]) -> list[str]:
    """Command-line keywords: each value may hold several words separated by spaces or ``&``.

    >>> split_keyword_args(["光明&高钙", "牛奶 纯"])
    ['光明', '高钙', '牛奶', '纯']
    """
    return [word for value in values for word in _SEPARATORS_RE.split(value) if word]


# --- splitting ------------------------------------------------------------------------------------


def split(vt: VirtualTask, settings: Any = None) -> list[dict[str, Any]]:
    """Split a virtual task into task specs: one per site and engine (sites outer, engines inner).

    Each spec is what scheduler_ext's control makes a task of::

        {"group": <product name>, "site": <domain>, "type": <node type>, "priority": <number or None>,
         "payload": {"product": ..., "brand": ..., "keywords": [...], "keywords_joined": "光明&高钙&牛奶",
                     "engine": "baidu"}}

    ``keywords`` are the words the engine actually searches (:meth:`~product_crawl.engines.Engine.query_words`):
    all of them, except where Baidu's query limit would silently drop the last ones on that site (logged as a
    warning). Every engine is looked up (:func:`product_crawl.engines.get_engine`, configured from ``settings``,
    None for the defaults) and must serve the task's node type. Raises :class:`InvalidInput` naming the field if an
    engine is unknown or of another node type, or if the name gives no search words.
    """
    engines = {name: check_engine(name, vt.type, settings) for name in vt.effective_engines}
    words = vt.words()
    if not words:
        raise InvalidInput(f"name: no search words in {vt.name!r}")
    specs = []
    for site in vt.effective_sites:
        for name, engine in engines.items():
            # The words the engine can send: Baidu ignores what follows its query limit, so the task records
            # only the words actually searched.
            searched = engine.query_words(words, site)
            if searched != words:
                logger.warning("%s on %s: %s searches %s, not %s (its query length limit)", vt.name, site, name,
                               join_keywords(searched), join_keywords(words))
            specs.append({
                "group": vt.name,
                "site": site,
                "type": vt.type,
                "priority": vt.priority,
                "payload": {
                    "product": vt.name,
                    "brand": vt.brand,
                    "keywords": list(searched),
                    "keywords_joined": join_keywords(searched),
                    "engine": name,
                },
            })
    return specs


def check_engine(name: str, node_type: int, settings: Any = None) -> Engine:
    """The engine ``name`` configured from ``settings``; raises :class:`InvalidInput` unless it is a known engine
    serving ``node_type``."""
    from product_crawl.engines import get_engine  # imports Scrapy's HTTP stack: only when splitting

    try:
        engine = get_engine(name, settings)
    # ValueError: unknown name or bad dotted path; ImportError: a registered engine's module is missing.
    except (ValueError, ImportError) as exc:
        raise InvalidInput(f"engines: {exc}") from exc
    if engine.node_type != node_type:
        raise InvalidInput(
            f"engines: {name!r} serves node type {engine.node_type}, but the task's type is {node_type}; "
            f"type {node_type} uses engines like {', '.join(DEFAULT_ENGINES[node_type])}"
        )
    return engine


def splitter(raw: str | bytes) -> list[dict[str, Any]]:
    """The ``SCHEDEXT_SPLITTER`` entry point: one raw entry of ``<prefix>:virtual`` -> task specs.

    Engines are checked against the project's settings (``PC_ALLOWED_ENGINES`` lives in the settings module).
    Raises :class:`InvalidInput` for any malformed entry (the control moves it to the dead-letter list).
    """
    return split(parse_virtual_task(raw), _project_settings())


def prepare() -> None:
    """Load what the first split needs (jieba's dictionary with ours, the project's settings): about a second of
    CPU that would otherwise delay the first product injected. The control spider calls it as it starts."""
    _get_tokenizer()
    _project_settings()


@cache
def _project_settings() -> Any:
    from scrapy.utils.project import get_project_settings

    return get_project_settings()


# --- subtask chunking -----------------------------------------------------------------------------


def chunk_pages(total_pages: int, page_limit: int) -> list[tuple[int, int]]:
    """Cut ``total_pages`` result pages (0-based) into ``(first_page, count)`` chunks of ``page_limit``.

    The paper's step 5: each chunk seeds one subtask.

    >>> chunk_pages(12, 5)
    [(0, 5), (5, 5), (10, 2)]
    >>> chunk_pages(0, 5)
    []
    >>> chunk_pages(3, 10)
    [(0, 3)]
    """
    if type(total_pages) is not int or total_pages < 0:
        raise ValueError(f"total_pages: expected an integer >= 0, got {total_pages!r}")
    if type(page_limit) is not int or page_limit < 1:
        raise ValueError(f"page_limit: expected an integer >= 1, got {page_limit!r}")
    return [(first, min(page_limit, total_pages - first)) for first in range(0, total_pages, page_limit)]
