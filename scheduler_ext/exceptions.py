"""The small exception hierarchy of scheduler_ext."""

from __future__ import annotations


class SchedExtError(Exception):
    """Base class of every error raised by scheduler_ext."""


class InvalidInput(SchedExtError, ValueError):
    """Raised if data handed to scheduler_ext (a payload from Redis, a setting, a file) is malformed."""


class ConfigurationError(SchedExtError):
    """Raised if a setting names something that cannot be used (a bad dotted path, a bad value)."""


class ServiceUnavailable(SchedExtError):
    """Raised if Redis (or another required service) does not answer."""
