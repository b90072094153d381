"""The simulated web's HTTP server: Baidu-like and Weibo-like result pages on loopback, per-node behaviour.

Endpoints (docs/simweb.md has the details):

``/s?wd=<words> site:<site>&pn=<offset>``
    Baidu-like result page (parsed by :class:`product_crawl.engines.baidu.BaiduEngine`).
``/Weibo.php?q=site:<site> <w1>&<w2>...&p=<page from 1>``
    Weibo-like result page (parsed by :class:`product_crawl.engines.weibo.WeiboEngine`).
``/_truth`` (``?engine=baidu&wd=...`` or ``?engine=weibo&q=...`` for one query)
    JSON: the profile in force, the seed, the start time and the reported size of every query seen so far.
``/_counters``
    JSON: requests and outcomes per source address, and per source address and site; per site, the most requests
    that were ever in flight at once from all addresses together (``peak_in_flight``).

Nodes are told apart by the request's source address; the profile gives each (address, site) its share of
results actually served, latency, error and block rates, over time (:mod:`product_crawl.simweb.profile`).
Responses are delayed with ``reactor.callLater``, never by blocking. Random draws (latency, errors, blocks)
come from one generator seeded by ``seed``; which results a node is served is a hash, not a draw.

In process: :func:`listen` (needs a running reactor to answer). As a subprocess: ``python -m
product_crawl.simweb`` or ``scrapy simweb`` (same options), which print exactly one line
``simweb listening on http://HOST:PORT`` to stdout once listening; :class:`SimWebProcess` wraps that.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from product_crawl.services import tcp_port, tied_to_parent
from product_crawl.simweb.corpus import Document, corpus_size, document, is_served, parse_query
from product_crawl.simweb.profile import Behaviour, Profile, ProfileError, load_profile, normalize_address

__all__ = ["LISTENING_PREFIX", "SimWeb", "SimWebProcess", "build_arg_parser", "listen", "main", "serve"]

logger = logging.getLogger(__name__)

#: The start of the one line the server prints on stdout; the URL follows it.
LISTENING_PREFIX = "simweb listening on "

PAGE_SIZE = 10  # results per page, as both real engines


class SimWeb:
    """One simulated web: its profile, seed and clock, the queries it has answered and its counters.

    ``clock`` defaults to the global reactor; ``rng`` (latency, error and block draws) to ``Random(seed)``.
    """

    def __init__(
        self,
        profile: Profile,
        seed: int = 0,
        clock: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        if clock is None:
            from twisted.internet import reactor

            clock = reactor
        self.profile = profile
        self.seed = seed
        self.clock: Any = clock  # an IReactorTime provider (a reactor, or twisted.internet.task.Clock)
        self.rng = rng if rng is not None else random.Random(seed)
        self.started_at = time.time()
        self._start = clock.seconds()
        # (engine, decoded query) -> (words, site, total)
        self.queries: dict[tuple[str, str], tuple[tuple[str, ...], str, int]] = {}
        self.by_address: dict[str, dict[str, int]] = defaultdict(_new_counts)
        self.by_site: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(_new_counts))
        self.in_flight: dict[str, int] = defaultdict(int)  # site -> search requests being answered now
        self.peak_in_flight: dict[str, int] = defaultdict(int)
        # address -> milliseconds its search requests spent in flight here, summed: over a window, its mean
        # number of requests in flight (how much of its concurrency a node kept busy) is the growth / window.
        self.busy_ms: dict[str, int] = defaultdict(int)

    def elapsed(self) -> float:
        """Seconds since this web started (the time ``phases`` are measured in)."""
        return self.clock.seconds() - self._start

    def total(self, words: tuple[str, ...], site: str) -> int:
        """The engine-reported size of the query under this web's profile and seed."""
        return corpus_size(words, site, self.seed, self.profile.corpus_min, self.profile.corpus_max)

    def resource(self) -> Resource:
        """The root resource serving every endpoint."""
        root = _Root()
        # Any: mypy without the zope plugin does not see that Resource subclasses provide IResource.
        children: dict[bytes, Any] = {
            b"s": _SearchResource(self, "baidu"),
            b"Weibo.php": _SearchResource(self, "weibo"),
            b"_truth": _JsonResource(self._truth),
            b"_counters": _JsonResource(lambda args: self.counters()),
        }
        for path, child in children.items():
            root.putChild(path, child)
        return root

    def site(self) -> Site:
        """A Twisted ``Site`` for :meth:`resource`, without per-request access logging."""
        return _QuietSite(self.resource())

    def truth(self, engine: str | None = None, query: str | None = None) -> dict[str, Any]:
        """The profile in force and the reported size of every query seen, or of ``query`` alone."""
        if query is not None:
            words, site = parse_query(query)
            return {
                "engine": engine,
                "query": query,
                "words": list(words),
                "site": site,
                "total": self.total(words, site),
                "seed": self.seed,
            }
        return {
            "profile": self.profile.to_dict(),
            "seed": self.seed,
            "started_at": self.started_at,
            "elapsed": self.elapsed(),
            "corpus": [
                {"engine": eng, "query": q, "words": list(words), "site": site, "total": total}
                for (eng, q), (words, site, total) in sorted(self.queries.items())
            ],
        }

    def counters(self) -> dict[str, Any]:
        """Requests and outcomes (ok, error, blocked, results served) per address and per address and site."""
        return {
            "by_address": {addr: dict(c) for addr, c in sorted(self.by_address.items())},
            "by_site": {
                addr: {site: dict(c) for site, c in sorted(sites.items())}
                for addr, sites in sorted(self.by_site.items())
            },
            "labels": {addr: self.profile.label(addr) for addr in sorted(self.by_address)},
            "peak_in_flight": dict(sorted(self.peak_in_flight.items())),
            "busy_ms": dict(sorted(self.busy_ms.items())),
        }

    def begin(self, engine: str, args: dict[str, str]) -> str:
        """Count a search request in flight on its site (until :meth:`end`); returns the site."""
        query = args.get("wd" if engine == "baidu" else "q")
        site = parse_query(query)[1] if query else ""
        self.in_flight[site] += 1
        self.peak_in_flight[site] = max(self.peak_in_flight[site], self.in_flight[site])
        return site

    def end(self, site: str) -> None:
        self.in_flight[site] -= 1

    def _count(self, address: str, site: str, key: str, n: int = 1) -> None:
        self.by_address[address][key] += n
        self.by_site[address][site][key] += n

    def _truth(self, args: dict[str, str]) -> dict[str, Any]:
        query = args.get("wd", args.get("q"))
        return self.truth(args.get("engine"), query)

    def answer(self, engine: str, address: str, args: dict[str, str]) -> tuple[int, bytes, float]:
        """Status, HTML body and delay (seconds) of the answer to one search request."""
        query = args.get("wd" if engine == "baidu" else "q")
        if not query:
            return 400, _error_page(400, f"missing query parameter {'wd' if engine == 'baidu' else 'q'}"), 0.0
        try:
            if engine == "baidu":
                offset = int(args.get("pn", "0"))
            else:
                offset = (int(args.get("p", "1")) - 1) * PAGE_SIZE
        except ValueError:
            return 400, _error_page(400, "page parameter must be an integer"), 0.0
        if offset < 0:
            return 400, _error_page(400, "page parameter out of range"), 0.0
        address = normalize_address(address)
        words, site = parse_query(query)
        behaviour = self.profile.behaviour(address, site, self.elapsed())
        total = self.total(words, site)
        self.queries[(engine, query)] = (words, site, total)
        self._count(address, site, "requests")
        delay = _draw_delay(self.rng, behaviour)
        # One draw decides the outcome: P(503) = error_rate, P(captcha) = block_rate (capped by what is left).
        draw = self.rng.random()
        if draw < behaviour.error_rate:
            self._count(address, site, "error")
            logger.debug("503 to %s for %s %r", address, engine, query)
            return 503, _error_page(503, "Service Unavailable"), delay
        if draw < behaviour.error_rate + behaviour.block_rate:
            self._count(address, site, "blocked")
            logger.debug("captcha to %s for %s %r", address, engine, query)
            return 200, (_BAIDU_BLOCK if engine == "baidu" else _WEIBO_BLOCK), delay
        docs = [
            document(words, site, self.seed, i)
            for i in range(offset, min(offset + PAGE_SIZE, total))
            if is_served(self.seed, address, words, site, i, behaviour.share)
        ]
        has_next = offset + PAGE_SIZE < total
        self._count(address, site, "ok")
        self._count(address, site, "results", len(docs))
        render = _baidu_page if engine == "baidu" else _weibo_page
        return 200, render(query, total, offset, docs, has_next), delay


def _new_counts() -> dict[str, int]:
    return {"requests": 0, "ok": 0, "error": 0, "blocked": 0, "results": 0}


def _draw_delay(rng: random.Random, behaviour: Behaviour) -> float:
    lat = behaviour.latency
    if lat.spread <= 0:
        return max(0.0, lat.mean)
    return max(0.0, rng.uniform(lat.mean - lat.spread, lat.mean + lat.spread))


class _QuietSite(Site):
    """A Site that does not write an access-log line per request (the counters endpoint counts them)."""

    def log(self, request: Any) -> None:
        pass


class _Root(Resource):
    def getChild(self, path: bytes, request: Request) -> Resource:
        if path == b"":
            return self
        return super().getChild(path, request)

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
        return b"simweb: /s?wd=... (Baidu-like), /Weibo.php?q=... (Weibo-like), /_truth, /_counters\n"


def _args(request: Request) -> dict[str, str]:
    """First value of each query argument, decoded as UTF-8."""
    args: dict[bytes, list[bytes]] = request.args or {}
    return {k.decode("utf-8", "replace"): v[0].decode("utf-8", "replace") for k, v in args.items() if v}


class _JsonResource(Resource):
    isLeaf = True

    def __init__(self, produce: Any) -> None:
        super().__init__()
        self._produce = produce

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        return json.dumps(self._produce(_args(request)), ensure_ascii=False, indent=1).encode("utf-8")


class _SearchResource(Resource):
    """One engine's search endpoint; answers after the profile's latency without blocking the reactor."""

    isLeaf = True

    def __init__(self, web: SimWeb, engine: str) -> None:
        super().__init__()
        self.web = web
        self.engine = engine

    def render_GET(self, request: Request) -> Any:
        address = request.getClientAddress().host  # type: ignore[attr-defined]
        args = _args(request)
        site = self.web.begin(self.engine, args)
        status, body, delay = self.web.answer(self.engine, address, args)
        begun = self.web.clock.seconds()
        finished = False

        def deliver() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            self.web.end(site)
            self.web.busy_ms[normalize_address(address)] += round(1000 * (self.web.clock.seconds() - begun))
            request.setResponseCode(status)
            request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
            request.write(body)
            request.finish()

        def lost(_: Any) -> None:  # the client went away before the delay ran out
            nonlocal finished
            if not finished:
                finished = True
                self.web.end(site)
            if call.active():
                call.cancel()

        call = self.web.clock.callLater(delay, deliver)
        request.notifyFinish().addErrback(lost)
        return NOT_DONE_YET


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _error_page(status: int, message: str) -> bytes:
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{status} {_e(message)}</title></head>'
        f"<body><h1>{status} {_e(message)}</h1></body></html>"
    ).encode()


def _cn_date(iso: str) -> str:
    y, m, d = (int(x) for x in iso.split("-"))
    return f"{y}年{m}月{d}日"


def _baidu_page(query: str, total: int, offset: int, docs: list[Document], has_next: bool) -> bytes:
    """A result page in Baidu's newer layout (count ``找到相关结果数约N个``, ``mu``, ``c-color-gray2``)."""
    blocks = []
    for doc in docs:
        shown = doc.url.split("//", 1)[-1]
        blocks.append(
            f'<div class="result c-container xpath-log new-pmd" srcid="1599" id="{doc.rank}" '
            f'tpl="se_com_default" mu="{_e(doc.url)}">\n'
            f'<h3 class="c-title t t tts-title"><a href="{_e(doc.url)}" target="_blank">'
            f"{_e(doc.title)}</a></h3>\n"
            f'<div class="c-abstract"><span class="c-color-gray2">{_cn_date(doc.date)} </span>'
            f"{_e(doc.snippet)}</div>\n"
            f'<div class="f13 c-gap-top-xsmall se_st_footer"><a class="c-showurl c-color-gray" '
            f'href="{_e(doc.url)}">{_e(shown)}</a></div>\n</div>'
        )
    if offset >= total:
        blocks.append(
            f'<div class="content_none"><div class="nors"><p>抱歉没有找到与<em>“{_e(query)}”</em>'
            "相关的网页。</p></div></div>"
        )

    def href(pn: int) -> str:
        return "/s?" + urlencode([("wd", query), ("pn", str(pn)), ("cl", "0"), ("ie", "utf-8")])

    links = []
    if offset > 0:
        links.append(f'<a class="n" href="{_e(href(max(0, offset - PAGE_SIZE)))}">&lt; 上一页</a>')
    current = offset // PAGE_SIZE
    last = (total - 1) // PAGE_SIZE if total else 0
    for number in range(max(0, current - 4), min(last, current + 5) + 1):
        if number == current:
            links.append(f'<strong><span class="page-item_M4MDr pc">{number + 1}</span></strong>')
        else:
            links.append(
                f'<a href="{_e(href(number * PAGE_SIZE))}"><span class="page-item_M4MDr pc">'
                f"{number + 1}</span></a>"
            )
    if has_next:
        links.append(f'<a class="n" href="{_e(href(offset + PAGE_SIZE))}">下一页 &gt;</a>')
    body = "\n".join(blocks)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{_e(query)}_百度搜索</title></head>\n<body>\n"
        f'<div id="head"><form id="form" name="f" action="/s"><input id="kw" name="wd" value="{_e(query)}">'
        "</form></div>\n"
        '<div id="container" class="container_l">\n'
        '<div id="tsn_inner"><div class="head_nums_cont_outer OP_LOG"><div class="head_nums_cont_inner">'
        f'<div class="nums"><span class="nums_text">找到相关结果数约{total:,}个</span></div>'
        "</div></div></div>\n"
        f'<div id="content_left">\n{body}\n</div>\n'
        f'<div id="page"><div class="page-inner_2jZi2">{"".join(links)}</div></div>\n'
        "</div>\n</body></html>\n"
    ).encode()


def _weibo_page(query: str, total: int, offset: int, docs: list[Document], has_next: bool) -> bytes:
    """A Weibo-like result page (count line ``找到N条结果``, ``div.card-wrap``, ``.m-page a.next``)."""
    cards = []
    for doc in docs:
        mid = doc.url.rsplit("/", 2)[-2]
        cards.append(
            f'<div class="card-wrap" action-type="feed_list_item" mid="{mid}{doc.rank}" '
            f'data-rank="{doc.rank}">\n<div class="card"><div class="content" node-type="like">\n'
            f'<div class="info"><a class="name" href="https://weibo.com/u/{doc.author[2:]}">{_e(doc.author)}</a></div>\n'
            f'<p class="txt" node-type="feed_list_content">{_e(doc.title)}：{_e(doc.snippet)}</p>\n'
            f'<p class="from"><a href="{_e(doc.url)}" target="_blank">{doc.date} 10:{doc.rank % 60:02d}</a> '
            "来自 微博 weibo.com</p>\n</div></div>\n</div>"
        )
    if offset >= total:
        cards.append('<div class="card card-no-result"><p>抱歉，未找到相关结果。</p></div>')
    page = offset // PAGE_SIZE + 1

    def href(p: int) -> str:
        return "/Weibo.php?" + urlencode([("p", str(p)), ("q", query), ("wbts", "1")])

    links = []
    if page > 1:
        links.append(f'<a class="prev" href="{_e(href(page - 1))}">上一页</a>')
    if has_next:
        links.append(f'<a class="next" href="{_e(href(page + 1))}">下一页</a>')
    body = "\n".join(cards)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{_e(query)} - 微博搜索</title></head>\n<body>\n"
        '<div class="m-main"><div class="search-info">'
        f'<span class="search_num">找到{total:,}条结果</span></div>\n'
        f'<div id="pl_feedlist_index">\n{body}\n</div>\n'
        f'<div class="m-page"><span class="list">第{page}页</span>{"".join(links)}</div>\n'
        "</div>\n</body></html>\n"
    ).encode()


# Modelled on Baidu's real verification page (served with status 200 instead of results).
_BAIDU_BLOCK = (
    '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>百度安全验证</title></head>\n<body>\n'
    '<div class="timeout hide-callback"><div class="timeout-img"></div>'
    '<div class="timeout-title">网络不给力，请稍后重试</div>'
    '<button type="button" class="timeout-button">返回首页</button></div>\n'
    '<div class="timeout-feedback hide-callback"><p class="timeout-feedback-title">问题反馈</p></div>\n'
    '<script src="https://wappass.baidu.com/static/machine/js/api/mkd.js"></script>\n'
    "</body></html>\n"
).encode()

# Modelled on Sina's visitor system, which Weibo search serves to clients it does not trust.
_WEIBO_BLOCK = (
    '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Sina Visitor System</title></head>\n<body>\n'
    '<div class="verify"><p>请输入验证码</p><img src="/visitor/captcha.png" alt="验证码"></div>\n'
    "</body></html>\n"
).encode()


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def listen(
    profile: Profile | str,
    *,
    seed: int = 0,
    host: str = "127.0.0.1",
    port: int = 0,
    reactor: Any = None,
) -> tuple[SimWeb, IListeningPort, str]:
    """Start serving ``profile`` (a :class:`Profile`, a built-in name or a file path) on ``host:port``
    (0 = a free port) in this process's reactor. Returns the web, the listening port and its URL.

    Raises :class:`ProfileError` for a bad profile, ``CannotListenError`` if the address is taken.
    """
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    if not isinstance(profile, Profile):
        profile = load_profile(profile)
    web = SimWeb(profile, seed=seed, clock=reactor)
    listening = reactor.listenTCP(port, web.site(), interface=host)
    url = _url(host, listening.getHost().port)
    logger.info("simweb serving profile %r (%s), seed %d, on %s", profile.name, profile.source, seed, url)
    return web, listening, url


def serve(profile: str, host: str = "127.0.0.1", port: int = 0, seed: int = 0) -> int:
    """Listen, print the ``simweb listening on URL`` line, and run the reactor until SIGINT/SIGTERM.

    Returns the process exit code: 0 after a normal stop, 1 if the profile is bad or the port is taken.
    """
    try:
        loaded = load_profile(profile)
    except ProfileError as exc:
        print(f"simweb: {exc}", file=sys.stderr, flush=True)
        return 1
    from twisted.internet import reactor

    try:
        _, _, url = listen(loaded, seed=seed, host=host, port=port, reactor=reactor)
    except CannotListenError as exc:
        print(f"simweb: cannot listen on {host}:{port}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"{LISTENING_PREFIX}{url}", flush=True)
    reactor.run()  # type: ignore[misc]  # installs SIGINT/SIGTERM handlers that stop it
    logger.info("simweb stopped")
    return 0


def listen_host(value: str) -> str:
    """``value`` as an address to listen on; ArgumentTypeError for an empty one, which Twisted takes as every
    interface: the simulated web is meant for loopback, so all interfaces must be asked for by name (0.0.0.0).

    >>> listen_host(" 127.0.0.1 ")
    '127.0.0.1'
    """
    host = value.strip()
    if not host:
        raise argparse.ArgumentTypeError(f"expected an address to listen on, such as 127.0.0.1 (0.0.0.0 for every "
                                         f"interface), got {value!r}")
    return host


def build_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The options shared by ``python -m product_crawl.simweb`` and ``scrapy simweb``."""
    if parser is None:
        parser = argparse.ArgumentParser(
            prog="python -m product_crawl.simweb", description="Run the simulated web."
        )
    parser.add_argument(
        "--profile",
        dest="simweb_profile",
        default="paper",
        metavar="paper|FILE",
        help="built-in profile or JSON file (default: paper)",
    )
    parser.add_argument("--port", type=tcp_port, default=0, help="TCP port; 0 picks a free one (default: 0)")
    parser.add_argument("--host", type=listen_host, default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--seed", type=int, default=0, help="corpus and random seed (default: 0)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m product_crawl.simweb``."""
    parser = build_arg_parser()
    parser.add_argument(
        "--loglevel", default=os.environ.get("PC_LOG_LEVEL", "INFO"), help="log level (default: INFO)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.loglevel.upper(),
        stream=sys.stderr,
        format="%(asctime)s [%(name)s] %(levelname)s: %(message)s",
    )
    return serve(args.simweb_profile, host=args.host, port=args.port, seed=args.seed)


class SimWebProcess:
    """The simulated web in a subprocess (``python -m product_crawl.simweb``), for tests, demo and experiment.

    ``with SimWebProcess("paper", seed=1) as web: web.url`` starts it on a free port and stops it on exit.
    Startup failures raise RuntimeError with the server's stderr.
    """

    def __init__(
        self,
        profile: str | Path = "paper",
        *,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        python: str = sys.executable,
        timeout: float = 20.0,
        loglevel: str = "WARNING",
    ) -> None:
        self.argv = [
            python,
            "-m",
            "product_crawl.simweb",
            "--profile",
            str(profile),
            "--host",
            host,
            "--port",
            str(port),
            "--seed",
            str(seed),
            "--loglevel",
            loglevel,
        ]
        self.timeout = timeout
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    def start(self) -> str:
        """Start the server and return its URL once it listens."""
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self._stderr,
                                     preexec_fn=tied_to_parent())
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline().decode("utf-8", "replace").strip() if ready else ""
        if not line.startswith(LISTENING_PREFIX):
            self.stop()
            self._stderr.seek(0)
            err = self._stderr.read().decode("utf-8", "replace").strip()
            raise RuntimeError(f"simweb did not start ({' '.join(self.argv)}): {err or line or 'timed out'}")
        self.url = line[len(LISTENING_PREFIX) :]
        return self.url

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 5 s) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SimWebProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self._stderr is not None:
            self._stderr.close()
