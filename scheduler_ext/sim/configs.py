"""The scheduling configurations the benchmarks compare, built without a crawler (scheduler_ext only).

The settings are those of ``scrapy experiment`` (recall age 20 s, patience 10 s, estimates stale after 60 s for the
paper's allocation), the same for every configuration, so that only the strategies differ; ``recall_age`` and
``patience`` set others (the project's defaults are 60 s and 30 s).
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


def _paper(seed: int, recall_age: float = RECALL_AGE, patience: float = PATIENCE) -> tuple[Any, Any, Any]:
    return (DynamicAllocation(stale_after=STALE, patience=patience, explore_timeout=recall_age),
            DynamicModification(recall_threshold=recall_age), DynamicRecall(recall_age, reset=False))


def _bandit(seed: int, recall_age: float = RECALL_AGE, patience: float = PATIENCE) -> tuple[Any, Any, Any]:
    return (BanditAllocation(patience=patience, explore_timeout=recall_age, seed=seed),
            RelativeModification(recall_threshold=recall_age), DynamicRecall(recall_age))


def _fifo(seed: int, recall_age: float = RECALL_AGE, patience: float = PATIENCE) -> tuple[Any, Any, Any]:
    return SharedAllocation(), FixedModification(), NoRecall(recall_age)


#: name -> (seed, recall_age=, patience=) -> (allocation, modification, recall)
CONFIGS: dict[str, Callable[..., tuple[Any, Any, Any]]] = {"bandit": _bandit, "paper": _paper, "fifo": _fifo}
