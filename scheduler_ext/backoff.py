"""Periodic node work that survives its failures: a loop body runs again later, never stops for good.

A looping call whose function raises is stopped by Twisted for good; a node whose refill loop died would heartbeat
forever and crawl nothing. :func:`guarded` wraps a loop body so that a Redis error (Redis restarting, a network
blip) or any unforeseen error is logged once, the body is skipped for a growing delay (:class:`Backoff`), and the
loop goes on by itself when Redis answers again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from .config import backoff

logger = logging.getLogger(__name__)


class Backoff:
    """Failures in a row and when to try again (:func:`scheduler_ext.config.backoff`: ``base`` doubled up to ``cap``).

    >>> b = Backoff(1.0, 4.0, clock=lambda: 0.0)
    >>> b.ready(), b.failed(), b.failed(), b.failed(), b.failed(), b.ready()
    (True, 1.0, 2.0, 4.0, 4.0, False)
    >>> b.ok(); b.ready()
    True
    """

    def __init__(self, base: float = 0.5, cap: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.base, self.cap, self.clock = base, cap, clock
        self.failures = 0
        self._next = 0.0

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def ready(self) -> bool:
        return self.clock() >= self._next

    def failed(self) -> float:
        self.failures += 1
        delay = backoff(self.failures, self.base, self.cap)
        self._next = self.clock() + delay
        return delay

    def ok(self) -> None:
        self.failures = 0
        self._next = 0.0


def record_failure(name: str, backoff: Backoff, exc: BaseException) -> None:
    """Back off after ``exc``; log the first failure of a run of failures, not every attempt."""
    if isinstance(exc, redis.RedisError):  # Redis away: try again after the backoff, with state re-read then
        if not backoff.failing:
            logger.error("%s failed, Redis unreachable (%s); retrying with backoff", name, exc)
    else:  # a bug or an unforeseen record: the loop must outlive it
        logger.error("%s failed; retrying with backoff", name, exc_info=exc)
    backoff.failed()


def record_success(name: str, backoff: Backoff) -> None:
    if backoff.failing:
        logger.info("%s works again", name)
    backoff.ok()


def guarded(name: str, body: Callable[[], Any], backoff: Backoff, *, settles: bool = True) -> Callable[[], None]:
    """``body`` for a looping call: skipped while backing off; an error backs off instead of ending the loop.

    ``settles=False``: ``body`` only starts work that reports its own outcome later (:func:`record_success`,
    :func:`record_failure`, from a worker thread's result), so its returning is not yet a success.
    """

    def run() -> None:
        if not backoff.ready():
            return
        try:
            body()
        except Exception as exc:  # noqa: BLE001 (logged by record_failure; the loop must go on)
            record_failure(name, backoff, exc)
            return
        if settles:
            record_success(name, backoff)

    return run
