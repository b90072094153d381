"""``scrapy deadletter list [--json] | requeue ID | drop ID``: the manual-handling queue (docs/control.md)."""

from __future__ import annotations

import argparse
import getpass
import json
import socket

import redis
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from product_crawl.commands._base import open_store, write_error, write_line
from scheduler_ext import deadletter
from scheduler_ext.connection import describe
from scheduler_ext.exceptions import InvalidInput
from scheduler_ext.status import finite
from scheduler_ext.store import Store


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "list [--json] | requeue ID | drop ID"

    def short_desc(self) -> str:
        return "List, requeue or drop subtasks that went to manual handling"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--json", action="store_true", help="list as JSON lines")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args or args[0] not in ("list", "requeue", "drop") or len(args) != (1 if args[0] == "list" else 2):
            raise UsageError("expected: list | requeue ID | drop ID")
        assert self.settings is not None
        store = open_store(self.settings)
        if store is None:
            self.exitcode = 1
            return
        actor = f"cli:{getpass.getuser()}@{socket.gethostname()}"  # for the audit record
        try:
            if args[0] == "list":
                self._list(store, opts.json)
            elif args[0] == "requeue":
                where = store.healed(lambda: deadletter.requeue(store, args[1], actor))
                write_line(f"requeued {args[1]} into {store.keys.prefix}:{where}")
            else:
                store.healed(lambda: deadletter.drop(store, args[1], actor))
                write_line(f"dropped {args[1]}")
        except InvalidInput as exc:
            write_error(str(exc))
            self.exitcode = 1
        except redis.RedisError as exc:  # the server went away, or refused the change (then nothing changed)
            write_error(f"Redis at {describe(store.redis)} failed during deadletter {args[0]}: {exc}")
            self.exitcode = 1

    def _list(self, store: Store, as_json: bool) -> None:
        entries = store.healed(lambda: deadletter.list_entries(store))
        for e in entries:
            if as_json:
                write_line(json.dumps(finite(e), ensure_ascii=False, sort_keys=True))
            else:
                write_line(f"{e.get('id')!s:>8}  {e.get('kind', '?')!s:9} attempts={e.get('attempts', 0)} "
                           f"last_node={e.get('last_node') or '-'}  {e.get('reason', '')}")
        if not as_json:
            write_line(f"{len(entries)} dead-letter entr{'y' if len(entries) == 1 else 'ies'}")
