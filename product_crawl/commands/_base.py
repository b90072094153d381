"""Helpers shared by product_crawl's commands: UTF-8 output whatever the locale, errors on stderr."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from product_crawl.services import checked, real_number
from scheduler_ext.connection import ensure_reachable, redis_from_settings
from scheduler_ext.defaults import setting
from scheduler_ext.exceptions import ConfigurationError, ServiceUnavailable
from scheduler_ext.keys import Keys
from scheduler_ext.store import Store


class OutputClosed(Exception):
    """Raised if the reader of the command's output went away (``scrapy split ... | head``)."""


def write_line(text: str) -> None:
    """Write one line of command output to stdout as UTF-8 (the output is data, e.g. JSON lines, not prose
    for the terminal's locale). Raises :class:`OutputClosed` if the pipe was closed.

    Text read from Redis that was not UTF-8 holds lone surrogates (``surrogateescape``): they are written as
    ``\\udcXX``, which inside a JSON string is a valid escape, rather than failing the whole command."""
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8", "backslashreplace") + b"\n")
        sys.stdout.buffer.flush()
    except BrokenPipeError as exc:
        # Point stdout at /dev/null so that the interpreter's final flush does not fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise OutputClosed("stdout was closed by its reader") from exc


def open_store(settings: Any) -> Store | None:
    """The deployment's store (``SCHEDEXT_PREFIX`` on ``REDIS_URL``), or None after an error naming the server
    (or the setting, if ``REDIS_URL`` / ``REDIS_PARAMS`` is malformed)."""
    try:
        client = redis_from_settings(settings)
        ensure_reachable(client)
    # ConfigurationError: a malformed REDIS_URL or REDIS_PARAMS; ServiceUnavailable: Redis does not answer.
    except (ConfigurationError, ServiceUnavailable) as exc:
        write_error(str(exc))
        return None
    return Store(client, Keys(setting(settings, "SCHEDEXT_PREFIX")))


def seconds(value: Any, maximum: float = 86400.0, *, zero: bool = False) -> float:
    """``value`` as a finite number of seconds, more than 0 (at least 0 if ``zero``) and at most ``maximum``;
    ArgumentTypeError saying what was expected (:func:`product_crawl.services.checked`).

    >>> seconds("2.5"), seconds(1), seconds("0", zero=True)
    (2.5, 1.0, 0.0)
    """
    low = 0.0 if zero else math.nextafter(0.0, 1.0)
    return float(checked(value, real_number, lambda s: math.isfinite(s) and low <= s <= maximum,
                         f"a number of seconds {'>=' if zero else '>'} 0 and <= {maximum:g}"))


def write_error(text: str) -> None:
    """Write an error message for the user to stderr, prefixed with ``error:``."""
    sys.stderr.write(f"error: {text}\n")
    sys.stderr.flush()
