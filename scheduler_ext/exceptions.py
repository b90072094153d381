"""The small exception hierarchy of scheduler_ext."""

from __future__ import annotations

from typing import Any


class SchedExtError(Exception):
    """Base class of every error raised by scheduler_ext."""


class InvalidInput(SchedExtError, ValueError):
    """Raised if data handed to scheduler_ext (a payload from Redis, a setting, a file) is malformed."""


class ConfigurationError(SchedExtError):
    """Raised if a setting names something that cannot be used (a bad dotted path, a bad value)."""


class ServiceUnavailable(SchedExtError):
    """Raised if Redis (or another required service) does not answer."""


def shortened(value: Any, limit: int = 200) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters: a message must stay readable whatever was
    given.

    >>> shortened("x" * 300, 5)
    "'xxxx... (302 characters)"
    """
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
