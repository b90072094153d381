"""Helpers shared by product_crawl's commands: UTF-8 output whatever the locale, errors on stderr."""

from __future__ import annotations

import os
import sys
from typing import Any

from scheduler_ext.connection import ensure_reachable, redis_from_settings
from scheduler_ext.defaults import setting
from scheduler_ext.exceptions import ServiceUnavailable
from scheduler_ext.keys import Keys
from scheduler_ext.store import Store


class OutputClosed(Exception):
    """Raised if the reader of the command's output went away (``scrapy split ... | head``)."""


def write_line(text: str) -> None:
    """Write one line of command output to stdout as UTF-8 (the output is data, e.g. JSON lines, not prose
    for the terminal's locale). Raises :class:`OutputClosed` if the pipe was closed."""
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8") + b"\n")
        sys.stdout.buffer.flush()
    except BrokenPipeError as exc:
        # Point stdout at /dev/null so that the interpreter's final flush does not fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise OutputClosed("stdout was closed by its reader") from exc


def open_store(settings: Any) -> Store | None:
    """The deployment's store (``SCHEDEXT_PREFIX`` on ``REDIS_URL``), or None after an error naming the server."""
    client = redis_from_settings(settings)
    try:
        ensure_reachable(client)
    except ServiceUnavailable as exc:
        write_error(str(exc))
        return None
    return Store(client, Keys(setting(settings, "SCHEDEXT_PREFIX")))


def write_error(text: str) -> None:
    """Write an error message for the user to stderr, prefixed with ``error:``."""
    sys.stderr.write(f"error: {text}\n")
    sys.stderr.flush()
