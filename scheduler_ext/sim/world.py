"""What the simulated sites do to each simulated node, over time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

PAGE_SIZE = 10  # results per result page, as both engines of the project and the simulated web


@dataclass(frozen=True)
class Behaviour:
    """How ``site`` treats a node at one moment: the share of each page's results served, the page latency
    (uniform in ``latency +- spread`` seconds), and the probabilities of an HTTP error and of a captcha page."""

    share: float
    latency: float
    spread: float = 0.0
    error_rate: float = 0.0
    block_rate: float = 0.0

    @property
    def served(self) -> float:
        """Probability that a page is served at all (no error, no captcha)."""
        return max(0.0, 1.0 - self.error_rate - self.block_rate)


class World(Protocol):
    """The truth the simulation draws from (and the upper bound is computed from)."""

    def behaviour(self, node: str, site: str, t: float) -> Behaviour:
        """How ``site`` treats node ``node`` (its id) ``t`` seconds after the start."""

    def changes(self) -> list[float]:
        """Every time at which some behaviour changes, sorted (the phases of the upper bound)."""
