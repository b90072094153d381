"""``scrapy status [--json] [--watch [SECONDS]]``: queues, nodes, completion, efficiency, progress (docs/status.md)."""

from __future__ import annotations

import argparse
import json
import time
import unicodedata
from typing import Any

import redis
from scrapy.commands import ScrapyCommand

from product_crawl.commands._base import OutputClosed, open_store, seconds, write_error, write_line
from scheduler_ext.config import Config
from scheduler_ext.connection import describe
from scheduler_ext.status import collect_status, finite


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def width(text: str) -> int:
    """Columns ``text`` takes in a terminal (CJK characters take two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _joined(value: Any) -> str:
    """A list as comma-separated text, anything else as its text, "-" if empty: what a node registers is read as
    it is, and a registry entry written by hand may hold anything.

    >>> _joined([0, 1]), _joined(None), _joined({"a": 1})
    ('0,1', '-', "{'a': 1}")
    """
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return "-" if value is None or value == "" else str(value)


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned plain-text table lines."""
    widths = [max(width(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]

    def line(cells: list[str]) -> str:
        return "  ".join(c + " " * (w - width(c)) for c, w in zip(cells, widths, strict=False)).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def render(status: dict[str, Any]) -> list[str]:
    """The human form of :func:`collect_status`'s snapshot."""
    q = status["queues"]
    lines = [f"prefix {status['prefix']}   leader {status['leader'] or '-'}",
             f"queues: virtual {q['virtual']}  waiting {q['waiting']}  leased {q['leased']}  sleeping {q['sleeping']}"
             f"  failed {q['failed']}  dead {q['dead']}  crawl " +
             (", ".join(f"{n}={c}" for n, c in q["crawl"].items()) or "-")]
    for c in status.get("controls", []):
        state = (f"STUCK: {c['failed_in_row']} failed ticks in a row ({c['last_error']})" if c["stuck"] else
                 f"{c['failed_in_row']} failed tick(s) in a row ({c['last_error']})" if c["failed_in_row"] else "ok")
        lines.append(f"control {c['id']}{' (leader)' if c['leader'] else ''}: {state}")
    lines.append("")
    nodes = status["nodes"]
    lines += table(["node", "alive", "type", "address", "subtasks", "moved out", "moved in", "modified",
                    "recalled", "dead"],
                   [[n["id"], "yes" if n["alive"] else "no", _joined(n["type"]), _joined(n["address"]),
                     _joined(n["subtasks"]), str(n["counts"]["moved_out"]),
                     str(n["counts"]["moved_in"]), str(n["counts"]["modified"]), str(n["counts"]["recalled"]),
                     str(n["counts"]["dead"])] for n in nodes])
    node_ids = [n["id"] for n in nodes]
    lines += ["", "completion (moving estimate / runs) per site and node:"]
    lines += table(["site", *node_ids],
                   [[site, *(f"{_fmt(c[n]['completion'])}/{c[n]['runs']}" if n in c else "-" for n in node_ids)]
                    for site, c in status["completion"].items()])
    lines += ["", "seconds per page per product, site and node:"]
    lines += table(["product", "site", *node_ids],
                   [[g, site, *(_fmt(v.get(n)) for n in node_ids)]
                    for g, sites in status["seconds_per_page"].items() for site, v in sites.items()])
    lines += ["", "products:"]
    lines += table(["product", "tasks", "done", "pages", "collected"],
                   [[g, str(p["tasks"]), str(p["done"]), str(p["pages"]), str(p["collected"])]
                    for g, p in status["products"].items()])
    return lines


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def short_desc(self) -> str:
        return "Show queues, nodes, completion and efficiency tables, and per-product progress"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--json", action="store_true", help="print the snapshot as one JSON object")
        parser.add_argument("--watch", nargs="?", type=seconds, const=2.0, default=None, metavar="SECONDS",
                            help="repeat every SECONDS (default 2, at most 86400) until interrupted")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        store = open_store(self.settings)
        if store is None:
            self.exitcode = 1
            return
        threshold = Config.from_settings(self.settings).node_timeout
        try:
            while True:
                status = store.healed(lambda: collect_status(store, threshold))
                if opts.json:
                    write_line(json.dumps(finite(status), ensure_ascii=False, sort_keys=True))
                else:
                    if opts.watch:
                        write_line("\x1b[2J\x1b[H" + time.strftime("%H:%M:%S"))
                    for line in render(status):
                        write_line(line)
                if not opts.watch:
                    return
                time.sleep(opts.watch)
        except (KeyboardInterrupt, OutputClosed):
            return
        except redis.RedisError as exc:  # the server went away (under --watch), or refused a read
            write_error(f"Redis at {describe(store.redis)} failed while reading the status: {exc}")
            self.exitcode = 1
