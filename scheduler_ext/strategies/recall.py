"""Recall strategies: what happens to failed, stuck and orphaned subtasks.

:class:`DynamicRecall` (default), the paper's: every failure, lapsed lease (a dead or stuck node: no finish before
the deadline), crawl-queue entry older than the recall age (``SCHEDEXT_RECALL_AGE``), and all queued work of a node
whose heartbeat lapsed is recalled: back to ``waiting`` with its attempt count raised and the failing node to avoid.
The recall that brings the count to ``SCHEDEXT_RECALL_MAX`` sends it to the dead-letter list instead (so a subtask
runs at most ``SCHEDEXT_RECALL_MAX`` times without moving on; the paper: "recalled 5 times, then manual handling").
With ``SCHEDEXT_RECALL_RESET`` (the default; ``reset``) a failed run that crawled pages before it failed starts the
count over: the subtask moved on, it is not stuck (the control does it, ``Recall.reset``); without it every recall
counts, as in the paper. A subtask recalled once may run again at once; from its second recall on it waits
``SCHEDEXT_RETRY_BACKOFF`` (2 s), doubling with each recall (2, 4, 8 s ...: at most the recall age), so that its
five runs span a site's passing trouble (a burst of errors, a node restarting) instead of failing five times
within a second.

:class:`NoRecall` (baseline): nothing is recalled. A failed subtask's pages are given up (its task goes on after
them) and a lapsed lease or a stuck queue entry stays where it is, as in a crawler without recall.
"""

from __future__ import annotations

from typing import Any

from ..config import config_for
from ..models import Subtask
from . import Recall, RecallDecision


class DynamicRecall(Recall):
    def __init__(self, threshold: float = 60.0, max_recalls: int = 5, backoff: float = 2.0, *,
                 reset: bool = True) -> None:
        self.threshold, self.max_recalls, self.backoff, self.reset = threshold, max_recalls, backoff, reset

    @classmethod
    def from_crawler(cls, crawler: Any) -> DynamicRecall:
        c = config_for(crawler)
        return cls(c.recall_age, c.recall_max, c.retry_backoff, reset=c.recall_reset)

    def retry_delay(self, subtask: Subtask) -> float:
        """The first recall runs again at once; from the second on, ``backoff`` doubling with each recall, at most
        the recall age.

        >>> [DynamicRecall(60.0, 5, 2.0).retry_delay(Subtask("s", "t", "a", 0, 5, 30.0, attempt=a)) for a in range(6)]
        [0.0, 0.0, 2.0, 4.0, 8.0, 16.0]
        """
        if subtask.attempt < 2:
            return 0.0
        return min(self.threshold, self.backoff * 2.0 ** (subtask.attempt - 2))

    def decide(self, subtask: Subtask, node: str | None, reason: str, *, failed: bool) -> RecallDecision:
        if subtask.attempt + 1 >= self.max_recalls:
            return RecallDecision.DEAD
        return RecallDecision.REQUEUE


class NoRecall(Recall):
    def __init__(self, threshold: float = 60.0) -> None:
        self.threshold, self.max_recalls = threshold, 0

    @classmethod
    def from_crawler(cls, crawler: Any) -> NoRecall:
        return cls(config_for(crawler).recall_age)

    def decide(self, subtask: Subtask, node: str | None, reason: str, *, failed: bool) -> RecallDecision:
        return RecallDecision.ABANDON if failed else RecallDecision.KEEP
