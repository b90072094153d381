"""The scheduling configurations the benchmarks compare, built without a crawler (scheduler_ext only).

The settings are those of ``scrapy experiment`` (recall age 20 s, patience 10 s, estimates stale after 60 s for the
paper's allocation), the same for every configuration, so that only the strategies differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..strategies.allocation import DynamicAllocation, SharedAllocation
from ..strategies.bandit import BanditAllocation
from ..strategies.modification import DynamicModification, FixedModification, RelativeModification
from ..strategies.recall import DynamicRecall, NoRecall

RECALL_AGE = 20.0
PATIENCE = 10.0
STALE = 60.0


def _paper(seed: int) -> tuple[Any, Any, Any]:
    return (DynamicAllocation(stale_after=STALE, patience=PATIENCE, explore_timeout=RECALL_AGE),
            DynamicModification(recall_threshold=RECALL_AGE), DynamicRecall(RECALL_AGE))


def _bandit(seed: int) -> tuple[Any, Any, Any]:
    return (BanditAllocation(patience=PATIENCE, explore_timeout=RECALL_AGE, seed=seed),
            RelativeModification(recall_threshold=RECALL_AGE), DynamicRecall(RECALL_AGE))


def _fifo(seed: int) -> tuple[Any, Any, Any]:
    return SharedAllocation(), FixedModification(), NoRecall(RECALL_AGE)


#: name -> seed -> (allocation, modification, recall)
CONFIGS: dict[str, Callable[[int], tuple[Any, Any, Any]]] = {"bandit": _bandit, "paper": _paper, "fifo": _fifo}
