"""``scrapy inject [FILE|-] [--product NAME ...]``: push virtual tasks to ``<SCHEDEXT_PREFIX>:virtual``.

Input, one task a line: a JSON virtual task (a line starting with ``{``) or a plain product name; blank lines
and lines starting with ``#`` are skipped. A line that is a JSON array or string (``[{"name": ...}]``,
``"特仑苏"``) is a bad line, not a name with brackets or quotes. ``-`` (or no FILE and no ``--product`` with
stdin not a terminal) reads stdin. ``--product`` names come after the file's tasks, in the order given.

All input is validated first: any bad line exits with code 2, naming the line and the problem, and nothing is
injected. Then every task's canonical JSON is LPUSHed in input order in one MULTI/EXEC transaction, so the
control (which pops from the right) takes the first line first. Redis is ``REDIS_URL``; if it does not answer,
exit code 1 with a message naming it. Validation does not segment names (no jieba): 10,000 names inject in
about a second.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import redis
from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from product_crawl.commands._base import write_error, write_line
from product_crawl.tasks import VirtualTask, parse_virtual_task
from scheduler_ext.connection import describe, ensure_reachable, redis_from_settings
from scheduler_ext.defaults import setting
from scheduler_ext.exceptions import ConfigurationError, InvalidInput, ServiceUnavailable
from scheduler_ext.keys import Keys
from scheduler_ext.store import Store

PUSH_CHUNK = 1000
"""Values per LPUSH inside the one transaction (keeps each command a reasonable size)."""
ERRORS_SHOWN = 20
"""Bad lines reported individually, at most; the rest are counted."""


def parse_lines(text: str, source: str) -> tuple[list[VirtualTask], list[str]]:
    """Parse inject input: the virtual tasks, and one message per bad line (``<source> line 3: name: ...``).

    >>> text = '# dairy\\n光明高钙牛奶\\n\\n{"name": "特仑苏", "brand": "蒙牛"}\\n{"nam": 1}'
    >>> tasks, errors = parse_lines(text, "in")
    >>> [t.name for t in tasks]
    ['光明高钙牛奶', '特仑苏']
    >>> errors  # doctest: +ELLIPSIS
    ["in line 5: unknown field 'nam'; expected only: v, name, ..."]
    >>> tasks, errors = parse_lines('[{"name": "特仑苏"}]\\n"光明高钙牛奶"\\n[进口] 雀巢奶粉', "in")
    >>> [t.name for t in tasks], errors[1]
    (['[进口] 雀巢奶粉'], 'in line 2: expected a JSON object or a plain product name, got a JSON string')
    """
    tasks: list[VirtualTask] = []
    errors: list[str] = []
    for lineno, line in _numbered(text):
        try:
            tasks.append(_line_task(line))
        except InvalidInput as exc:
            errors.append(f"{source} line {lineno}: {exc}")
    return tasks, errors


def _line_task(line: str) -> VirtualTask:
    """One input line as a virtual task: JSON if it starts with ``{``, else a plain product name, unless the line
    is a JSON array or string: a list of tasks or a quoted name pasted by mistake would become a name with
    brackets or quotes. A line that starts with ``[`` or ``"`` but is not JSON (``[进口] 雀巢奶粉``) is a name."""
    if line.startswith("{"):
        return parse_virtual_task(line)
    if line.startswith(("[", '"')):
        try:
            json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # not JSON: a name that starts with a bracket or a quote
            pass
        else:
            kind = "array" if line.startswith("[") else "string"
            raise InvalidInput(f"expected a JSON object or a plain product name, got a JSON {kind}")
    # A plain name is validated as {"name": line}: same rules, same canonical form.
    return parse_virtual_task({"name": line})


def _numbered(text: str) -> Iterator[tuple[int, str]]:
    for lineno, raw_line in enumerate(text.splitlines(), 1):
        line = raw_line.strip()
        if line and not line.startswith("#"):
            yield lineno, line


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[FILE|-] [--product NAME ...]"

    def short_desc(self) -> str:
        return "Inject virtual tasks (JSON lines or product names) into Redis, all or nothing"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--product", metavar="NAME", action="append", default=[],
                            help="a product name to inject (repeatable)")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) > 1:
            raise UsageError(f"expected at most one FILE (or -), got {len(args)}", print_help=False)
        if not args and not opts.product and sys.stdin.isatty():
            raise UsageError("nothing to inject: give a FILE, - for stdin, or --product NAME",
                             print_help=False)
        tasks: list[VirtualTask] = []
        errors: list[str] = []
        if args or not opts.product:
            source = args[0] if args else "-"
            try:
                text = self._read(source)
            except (OSError, UnicodeDecodeError) as exc:  # unreadable file, or not UTF-8 text
                write_error(f"cannot read {'stdin' if source == '-' else source}: {exc}")
                self.exitcode = 2
                return
            tasks, errors = parse_lines(text, "stdin" if source == "-" else source)
        for i, name in enumerate(opts.product, 1):
            try:
                tasks.append(parse_virtual_task({"name": name}))
            except InvalidInput as exc:
                errors.append(f"--product #{i}: {exc}")
        if errors:
            for message in errors[:ERRORS_SHOWN]:
                write_error(message)
            if len(errors) > ERRORS_SHOWN:
                write_error(f"... and {len(errors) - ERRORS_SHOWN} more bad lines")
            write_error(f"{len(errors)} bad line(s): nothing injected")
            self.exitcode = 2
            return

        assert self.settings is not None
        keys = Keys(setting(self.settings, "SCHEDEXT_PREFIX"))
        key = keys.virtual
        try:
            client = redis_from_settings(self.settings)
        except ConfigurationError as exc:  # a malformed REDIS_URL or REDIS_PARAMS
            write_error(f"nothing injected: {exc}")
            self.exitcode = 1
            return
        try:
            ensure_reachable(client)
            Store(client, keys).healed(lambda: push(client, key, tasks))
        except ServiceUnavailable as exc:
            write_error(f"nothing injected: {exc}")
            self.exitcode = 1
            return
        # The server answered PING but refused the transaction (e.g. the key holds another type: then nothing
        # was pushed) or the connection dropped (then EXEC may or may not have run: check the list).
        except redis.RedisError as exc:
            write_error(f"Redis at {describe(client)} failed while injecting into {key}: {exc}")
            self.exitcode = 1
            return
        finally:
            client.close()
        write_line(f"injected {len(tasks)} virtual tasks into {key}")

    @staticmethod
    def _read(source: str) -> str:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
        return data.decode("utf-8-sig")  # tolerate the BOM some editors write


def push(client: redis.Redis, key: str, tasks: list[VirtualTask]) -> None:
    """LPUSH the canonical JSON of ``tasks`` to ``key`` in input order, in one MULTI/EXEC transaction.

    LPUSH of v1, v2, ... leaves v1 at the right end, so an RPOP consumer takes the first task first.
    """
    if not tasks:
        return
    values = [task.to_json() for task in tasks]
    pipe = client.pipeline(transaction=True)
    for start in range(0, len(values), PUSH_CHUNK):
        pipe.lpush(key, *values[start:start + PUSH_CHUNK])
    pipe.execute()
