"""``scrapy simweb [--profile paper|FILE] [--port N] [--host H] [--seed N]``: run the simulated web.

Prints one line ``simweb listening on http://HOST:PORT`` on stdout once listening and runs until SIGINT or
SIGTERM. A profile that does not validate exits with code 1 and a message naming the field on stderr.
Same server and options as ``python -m product_crawl.simweb`` (which starts faster).
"""

from __future__ import annotations

import argparse

from scrapy.commands import ScrapyCommand
from scrapy.utils.log import configure_logging

from product_crawl.simweb.server import build_arg_parser, serve


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False  # a plain Twisted web server, no crawler

    def syntax(self) -> str:
        return "[--profile paper|FILE] [--port N] [--host H] [--seed N]"

    def short_desc(self) -> str:
        return "Run the simulated web (Baidu-like and Weibo-like search on loopback)"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        # Scrapy's global --profile (cProfile output) is replaced by ours; scrapy.cmdline still reads
        # opts.profile to decide whether to profile, so keep that attribute, always off.
        build_arg_parser(parser)
        parser.set_defaults(profile=None)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        configure_logging(self.settings)
        self.exitcode = serve(opts.simweb_profile, host=opts.host, port=opts.port, seed=opts.seed)
