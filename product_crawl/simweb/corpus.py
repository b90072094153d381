"""The simulated web's corpus: for each query, an engine-reported size and deterministic documents.

Everything here is a pure function of its arguments (a query is its words and its site; ``seed`` selects one
of many equally plausible webs), so a test, the experiment's scorer and the server all agree on the truth
without talking to each other: :func:`corpus_size` is the count every node is shown, :func:`document` the
i-th result, :func:`is_served` whether a node with a given share is served that result.
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Document", "corpus_size", "document", "is_served", "parse_query", "query_id"]

_SPLIT = re.compile(r"[\s&]+")
_EPOCH = datetime.date(2010, 1, 1)
_DAYS = (datetime.date(2013, 5, 31) - _EPOCH).days  # the paper's experiment ran in May 2013

_TITLES = (
    "{kw}质量问题投诉",
    "消费者投诉：{kw}存在质量问题",
    "关于{kw}的投诉与处理结果",
    "{kw}被曝质量问题 消费者要求退货",
    "网友反映{kw}异味，商家回应",
    "{kw}售后服务投诉汇总",
)
_SNIPPETS = (
    "本人于{date}购买{kw}，开封后发现产品有异味，联系商家未果，特此投诉。",
    "{kw}批次产品疑似变质，消费者要求退款并赔偿，目前处理中。",
    "有消费者反映{kw}包装破损、日期不清，已转交相关部门调查。",
    "关于{kw}的质量投诉，商家称将进一步核实并给出处理意见。",
    "{kw}饮用后出现不适，消费者已保留证据并向协会投诉。",
)


@dataclass(frozen=True)
class Document:
    """One result of the simulated corpus; ``rank`` is its 1-based position in the query's result list."""

    title: str
    url: str
    snippet: str
    date: str
    author: str
    rank: int


def parse_query(text: str) -> tuple[tuple[str, ...], str]:
    """Words and site of a query as the engines send it (Baidu's ``wd`` or Weibo's ``q``).

    >>> parse_query("光明 高钙 牛奶 site:cca.org.cn")
    (('光明', '高钙', '牛奶'), 'cca.org.cn')
    >>> parse_query("site:weibo.com 光明&高钙&牛奶&投诉")
    (('光明', '高钙', '牛奶', '投诉'), 'weibo.com')
    """
    words: list[str] = []
    site = ""
    for token in _SPLIT.split(text.strip()):
        if not token:
            continue
        if token.lower().startswith("site:"):
            site = token[5:].lower()
        else:
            words.append(token)
    return tuple(words), site


def query_id(words: Sequence[str], site: str, seed: int = 0) -> str:
    """A short stable identifier of a query under ``seed`` (also the path segment of its documents)."""
    return _digest(str(seed), site.lower(), " ".join(words))[:12]


def corpus_size(words: Sequence[str], site: str, seed: int = 0, low: int = 300, high: int = 3000) -> int:
    """The engine-reported number of results for ``words`` on ``site``, in [low, high], for every node.

    >>> words = ["光明", "高钙", "牛奶"]
    >>> corpus_size(words, "cca.org.cn") == corpus_size(tuple(words), "CCA.org.cn")
    True
    """
    if not 0 <= low <= high:
        raise ValueError(f"corpus range must satisfy 0 <= low <= high, got low={low}, high={high}")
    return low + int(_unit("size", str(seed), site.lower(), " ".join(words)) * (high - low + 1))


def document(words: Sequence[str], site: str, seed: int, index: int) -> Document:
    """The result at 0-based ``index`` of the query (valid for any index; callers bound it by the size)."""
    qid = query_id(words, site, seed)
    h = _digest("doc", qid, str(index))
    kw = "".join(words) or "产品"
    day = _EPOCH + datetime.timedelta(days=int(h[:8], 16) % (_DAYS + 1))
    date = day.isoformat()
    host = site.lower() or "example.invalid"
    return Document(
        title=f"{_TITLES[int(h[8:10], 16) % len(_TITLES)].format(kw=kw)} ({index + 1})",
        url=f"http://{host}/{qid}/{index + 1}.html",
        snippet=_SNIPPETS[int(h[10:12], 16) % len(_SNIPPETS)].format(kw=kw, date=date),
        date=date,
        author=f"用户{h[12:18]}",
        rank=index + 1,
    )


def is_served(seed: int, address: str, words: Sequence[str], site: str, index: int, share: float) -> bool:
    """Whether the node at ``address`` is shown result ``index`` when served a ``share`` of the results.

    Deterministic, so a node re-crawling a page sees the same subset; independent across addresses.
    """
    if share >= 1.0:
        return True
    if share <= 0.0:
        return False
    return _unit("serve", str(seed), address, site.lower(), " ".join(words), str(index)) < share


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


def _unit(*parts: str) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    return int(_digest(*parts)[:13], 16) / float(16**13)
