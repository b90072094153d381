"""``scrapy services start|stop|status``: Redis and the MongoDB-protocol server on embedded defaults."""

from __future__ import annotations

import argparse
import sys

from scrapy.commands import ScrapyCommand

from product_crawl.services import ServiceError, Services, check_mongo_uri, mask_url
from scheduler_ext.connection import check_redis_url
from scheduler_ext.exceptions import ConfigurationError


class Command(ScrapyCommand):
    requires_project = True
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "start|stop|status"

    def short_desc(self) -> str:
        return "Start, stop or show Redis and MongoDB (embedded servers unless REDIS_URL / MONGO_URI are set)"

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) != 1 or args[0] not in ("start", "stop", "status"):
            raise self._usage_error()
        assert self.settings is not None
        services = Services(self.settings)
        action = args[0]
        if action != "stop":  # stop only reads pid files: a malformed URL must not keep it from stopping servers
            try:
                check_redis_url(services.redis_url, "REDIS_URL" if services.redis_explicit else "PC_EMBEDDED_REDIS_URL")
                check_mongo_uri(services.mongo_uri, "MONGO_URI" if services.mongo_explicit else "PC_EMBEDDED_MONGO_URI")
            except ConfigurationError as exc:
                print(f"error: {exc}", file=sys.stderr)
                self.exitcode = 1
                return
        if action == "start":
            try:
                states = services.start()
            except ServiceError as exc:
                print(f"error: {exc}", file=sys.stderr)
                self.exitcode = 1
                return
            for s in states:
                print(f"{s.name:8} {mask_url(s.url):32} {s.detail}{f' (pid {s.pid})' if s.pid else ''}")
        elif action == "stop":
            stopped = services.stop()
            print("stopped " + ", ".join(stopped) if stopped else "nothing to stop (no server started here)")
        else:
            states = services.status()
            for s in states:
                origin = "configured" if s.explicit else ("embedded" if s.pid else "default")
                answer = "answering" if s.answering else "NOT answering"
                print(f"{s.name:8} {mask_url(s.url):32} {answer:14} {origin}{f' (pid {s.pid})' if s.pid else ''}")
            if not all(s.answering for s in states):
                self.exitcode = 1

    def _usage_error(self) -> Exception:
        from scrapy.exceptions import UsageError

        return UsageError("expected one of: start, stop, status")
