"""``scrapy split NAME [options]``: show the real tasks a virtual task becomes, without touching any service.

Prints one JSON object per task and line: ``product``, ``brand``, ``keywords`` (joined with ``&``),
``words``, ``site``, ``engine``, ``type``, ``priority`` and ``url`` (the first result page, built by the
engine with the project's settings, e.g. ``PC_ENGINE_BASE_URLS``). Bad input exits with code 2 and a message
naming the problem.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from product_crawl.commands._base import OutputClosed, write_line
from product_crawl.services import checked, whole_number
from product_crawl.tasks import parse_virtual_task, split, split_keyword_args
from scheduler_ext.exceptions import ConfigurationError, InvalidInput


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "NAME [--brand B] [--keywords K ...] [--type 0|1] [--site S ...] [--engine E ...]"

    def short_desc(self) -> str:
        return "Print the tasks (keywords, site, engine, first-page URL) of a product; touches no service"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        group = parser.add_argument_group(title="Virtual task")
        group.add_argument("--brand", metavar="B",
                           help="brand; put first among the keywords if the name lacks it")
        group.add_argument("--keywords", metavar="K", action="append", default=[],
                           help="explicit keywords instead of segmenting NAME (repeatable; a value may hold "
                                "several words separated by spaces or '&')")
        group.add_argument("--type", metavar="0|1", dest="node_type", default=None,
                           help="node type: 0 meta search (default), 1 Weibo search")
        group.add_argument("--site", metavar="S", action="append", default=[],
                           help="a site to search (repeatable); default: the site list of the type")
        group.add_argument("--engine", metavar="E", action="append", default=[],
                           help="an engine name or dotted path (repeatable); "
                                "default: baidu (type 0), weibo (type 1)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) != 1:
            raise UsageError(
                f"expected one product NAME (quote names with spaces), got {len(args)} arguments",
                print_help=False,
            )
        task: dict[str, Any] = {"name": args[0]}
        if opts.brand is not None:
            task["brand"] = opts.brand
        if opts.keywords:
            task["keywords"] = split_keyword_args(opts.keywords)
        if opts.node_type is not None:
            try:  # any whole number: the virtual task's check names the types that exist
                task["type"] = checked(opts.node_type, whole_number, lambda _: True, "0 or 1")
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"--type: {exc}", print_help=False) from None
        if opts.site:
            task["sites"] = opts.site
        if opts.engine:
            task["engines"] = opts.engine
        try:
            vt = parse_virtual_task(task)
            specs = split(vt, self.settings)
        except InvalidInput as exc:  # the arguments do not make a valid virtual task
            raise UsageError(str(exc), print_help=False) from exc
        except ConfigurationError as exc:  # an engine setting is malformed (PC_ENGINE_BASE_URLS)
            raise UsageError(str(exc), print_help=False) from exc

        from product_crawl.engines import get_engine

        # Every engine was checked by split(): these lookups succeed.
        engines = {name: get_engine(name, self.settings) for name in vt.effective_engines}
        for spec in specs:
            payload = spec["payload"]
            url = engines[payload["engine"]].page_url(payload["keywords"], spec["site"], 0)
            line = {
                "product": payload["product"],
                "brand": payload["brand"],
                "keywords": payload["keywords_joined"],
                "words": payload["keywords"],
                "site": spec["site"],
                "engine": payload["engine"],
                "type": spec["type"],
                "priority": spec["priority"],
                "url": url,
            }
            try:
                write_line(json.dumps(line, ensure_ascii=False))
            except OutputClosed:  # e.g. piped into `head`: the reader has what it wanted
                return
