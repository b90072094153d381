"""``scrapy parse_page FILE --engine baidu``: what a node would make of a saved result page.

Reads one saved page (as the engine served it: any encoding the page declares, GBK included) and prints one JSON
object: the verdict (``blocked``, ``failed``, ``last page`` or ``more pages``), the block reason or the problem
that would fail the page, the engine-reported count, the next-page flag, every result (rank, kind, title, URL,
date, snippet) and every block the parser left out with the reason. ``--url`` gives the page's address (ranks
count from its ``pn=``/``page=``; relative links resolve against it). An operator who saves a page the parser
gets wrong sees why here, and turns it into a fixture: the page plus this output, checked, as
``tests/pages/<name>.json`` (docs/engines.md). Touches no service. Also installed as ``scrapy parse-page``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.http import HtmlResponse

from product_crawl.commands._base import OutputClosed, write_line
from scheduler_ext.exceptions import ConfigurationError


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "FILE [--engine baidu|sweibo|weibo|DOTTED.PATH] [--url URL] [--encoding ENC]"

    def short_desc(self) -> str:
        return "Show how an engine parses a saved result page (results, count, next page, block verdict)"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        group = parser.add_argument_group(title="Page")
        group.add_argument("--engine", metavar="E", default="baidu",
                           help="engine name or dotted path (default: baidu)")
        group.add_argument("--url", metavar="URL", default=None,
                           help="the page's address (default: the engine's base URL, i.e. the first page)")
        group.add_argument("--encoding", metavar="ENC", default=None,
                           help="the page's encoding when it does not declare one (e.g. gbk)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) != 1:
            raise UsageError(f"expected one FILE (a saved result page), got {len(args)} arguments",
                             print_help=False)
        if not args[0]:  # Path("") is the current folder: say what is wrong with what was given
            raise UsageError("FILE '': expected the path of a saved result page", print_help=False)
        if opts.url is not None:
            check_url(opts.url)
        if opts.encoding is not None:
            check_encoding(opts.encoding)
        from product_crawl.engines import get_engine

        try:
            engine = get_engine(opts.engine, self.settings)
        except (ValueError, ImportError) as exc:  # unknown name, bad dotted path or bad engine setting
            raise UsageError(f"--engine: {exc}", print_help=False) from exc
        except ConfigurationError as exc:  # a malformed setting (PC_ENGINE_BASE_URLS): its message names it
            raise UsageError(str(exc), print_help=False) from exc
        path = Path(args[0])
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"FILE {args[0]!r}: cannot read it: {exc.strerror or exc}", print_help=False) from exc
        url = opts.url or f"{engine.base_url}/"
        try:
            response = HtmlResponse(url=url, body=body, encoding=opts.encoding)
        except (ValueError, TypeError) as exc:  # a malformed --url
            raise UsageError(f"--url: expected an absolute http(s) URL, got {url!r}", print_help=False) from exc
        try:
            write_line(json.dumps(report(engine, response, str(path)), ensure_ascii=False, indent=1))
        except OutputClosed:
            return


def check_url(url: str) -> None:
    """Raise a UsageError naming ``--url`` unless ``url`` is an absolute http(s) URL with a host (and a valid port)."""
    from product_crawl.engines import is_http_url

    if not is_http_url(url):
        raise UsageError(f"--url: expected an absolute http(s) URL with a host, got {url!r}", print_help=False)


def check_encoding(name: str) -> None:
    """Raise a UsageError naming ``--encoding`` unless ``name`` is a text encoding Python knows (gbk, utf-8, ...)."""
    try:
        # Not b"": decoding nothing never looks the codec up. LookupError: unknown, or not a text encoding (base64).
        b"a".decode(name)
    except LookupError:
        raise UsageError(f"--encoding: expected a text encoding such as gbk or utf-8, got {name!r}",
                         print_help=False) from None
    except UnicodeError:  # a text encoding that cannot decode one byte alone (utf-16 needs two): fine
        pass


def report(engine: Any, response: HtmlResponse, name: str) -> dict[str, Any]:
    """The parse of one page as the command prints it."""
    out: dict[str, Any] = {"file": name, "engine": engine.name, "url": response.url,
                           "encoding": response.encoding}
    reason = engine.block_reason(response)
    if reason is not None:
        return {**out, "verdict": "blocked", "blocked": reason}
    page = engine.parse(response)
    verdict = "failed" if page.problem else ("more pages" if page.has_next else "last page")
    return {**out, "verdict": verdict, "blocked": None, "problem": page.problem or None,
            "reported": page.reported, "has_next": page.has_next,
            "results": [asdict(r) for r in page.results], "skipped": list(page.skipped)}
