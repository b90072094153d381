"""Recall strategies: what happens to failed, stuck and orphaned subtasks.

:class:`DynamicRecall` (default), the paper's: every failure, lapsed lease (a dead or stuck node: no finish before
the deadline), crawl-queue entry older than the recall age (``SCHEDEXT_RECALL_AGE``), and all queued work of a node
whose heartbeat lapsed is recalled: back to ``waiting`` with its attempt count raised and the failing node to avoid.
The recall that brings the count to ``SCHEDEXT_RECALL_MAX`` sends it to the dead-letter list instead (so a subtask
runs at most ``SCHEDEXT_RECALL_MAX`` times; the paper: "recalled 5 times, then manual handling").

:class:`NoRecall` (baseline): nothing is recalled. A failed subtask's pages are given up (its task goes on after
them) and a lapsed lease or a stuck queue entry stays where it is, as in a crawler without recall.
"""

from __future__ import annotations

from typing import Any

from ..config import config_for
from ..models import Subtask
from . import Recall, RecallDecision


class DynamicRecall(Recall):
    def __init__(self, threshold: float = 60.0, max_recalls: int = 5) -> None:
        self.threshold, self.max_recalls = threshold, max_recalls

    @classmethod
    def from_crawler(cls, crawler: Any) -> DynamicRecall:
        c = config_for(crawler)
        return cls(c.recall_age, c.recall_max)

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
