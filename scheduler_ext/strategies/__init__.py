"""Pluggable scheduling strategies: allocation, modification and recall, each with its baselines.

A strategy is chosen by dotted path (``SCHEDEXT_ALLOCATION``, ``SCHEDEXT_MODIFICATION``, ``SCHEDEXT_RECALL``) and
built with ``from_crawler``. The contracts are the abstract classes below; docs/strategies.md gives the formulas.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..defaults import setting
from ..exceptions import ConfigurationError
from ..models import Report, Subtask

if TYPE_CHECKING:
    from .posterior import Sums


@dataclass(frozen=True)
class Estimate:
    """A moving estimate (recent runs weigh more) and how much data it rests on."""

    value: float
    runs: int
    last_run: float


@dataclass
class NodeView:
    """A live node as allocation sees it: ``free`` is how many more subtasks its crawl queue may take now,
    ``queued`` how many wait in it already (none of its slots has taken them yet), ``held`` how many it had taken
    and not finished at its last heartbeat (running, or waiting in the node for a slot)."""

    id: str
    types: list[int]
    address: str | None = None
    free: int = 0
    queued: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    held: int = 0


class Estimates(Protocol):
    """Run-control data read by the strategies (from the aggregates the nodes' finish script maintains).

    The control's implementation (:class:`scheduler_ext.control.EstimateCache`) also offers, optionally for any
    other implementation, every node's figures at once: ``site_figures(site) -> {node: (completion,
    site-wide seconds per page)}`` and ``group_figures(group, site) -> {node: seconds per page}`` (only nodes with
    a figure for that product). :class:`~scheduler_ext.strategies.allocation.DynamicAllocation` uses them when
    present to rank nodes once per site; a mapping from ``site_figures`` must be a new object whenever its content
    changes (it is cached by identity).
    """

    def completion(self, site: str, node: str) -> Estimate | None:
        """Collected / offered results of ``node`` on ``site``, None if it never ran there."""

    def seconds_per_page(self, group: str, site: str, node: str) -> Estimate | None:
        """Crawl seconds per page of ``node`` for this product on ``site``; falls back to the site's figure."""


class EstimateSums(Estimates, Protocol):
    """Estimates that also give the sums behind them, from which the bandit builds its posteriors
    (:mod:`scheduler_ext.strategies.posterior`). A store without them still serves the paper's strategies."""

    def site_sums(self, site: str) -> Mapping[str, Sums]:
        """Node -> sums of every node that ran on ``site`` (every product); a new mapping whenever its content
        changes (the bandit keeps its ranking of the site's nodes while it gets the same object)."""

    def group_sums(self, group: str, site: str) -> Mapping[str, Sums]:
        """Node -> sums of every node that ran this product on ``site``."""


class Allocation(abc.ABC):
    """Decides which waiting subtasks go to which node's crawl queue now.

    Called once per control tick from :func:`scheduler_ext.control.decide` (also by a simulator driving
    ``decide``). ``subtasks`` is a window of ``waiting`` in priority order (``32 + 2 x`` the free slots), with the
    subtasks this tick created merged in; ``nodes`` are the live nodes, ``free`` their free crawl-queue slots.
    The control checks the contract below and ignores assignments that break it. If ``allocate`` raises, the
    control calls it again with each subtask alone and dead-letters (requeueably) only the subtasks it raises for:
    raising is safe, but costs a call per subtask. Keep a call's cost proportional to the subtasks and free
    slots, not to subtasks x nodes: at 1,000 nodes the whole tick has ~250 ms.
    """

    @abc.abstractmethod
    def allocate(self, subtasks: Sequence[Subtask], nodes: Sequence[NodeView], estimates: Estimates,
                 now: float) -> list[tuple[Subtask, str]]:
        """Assignments (subtask, node id) for some of ``subtasks`` (given in priority order).

        Contract: only live nodes of the subtask's type; never more assignments to a node than its ``free``;
        a subtask at most once (the very object passed in, or ``subtask.capped(n)``: its first ``n`` pages only, as the
        bandit sends an exploration); subtasks left out stay waiting for a later tick.
        """


class Modification(abc.ABC):
    """Decides the page limit and time limit of a task's next subtask from the report of its last one."""

    @abc.abstractmethod
    def next_limits(self, report: Report, estimates: Estimates) -> tuple[int, float]:
        """(page limit >= 1, time limit in seconds > 0) for the subtask that follows ``report``'s."""


class RecallDecision(enum.Enum):
    REQUEUE = "requeue"  # back to waiting, attempt + 1, avoiding the node it failed on
    DEAD = "dead"  # to the dead-letter list for manual handling
    ABANDON = "abandon"  # not recalled: its pages are given up and the task goes on (baseline "none")
    KEEP = "keep"  # leave it where it is (a lapsed lease or stale queue entry under baseline "none")


class Recall(abc.ABC):
    """Decides what happens to a subtask that failed, whose lease lapsed, or that sat too long in a queue."""

    threshold: float
    max_recalls: int
    #: True: a failed run that crawled pages before it failed moved its subtask on, and the control judges it, and
    #: requeues it, as a subtask never recalled (``attempt`` 0, then 1): only runs that crawl nothing, and recalls
    #: without a report, count towards ``max_recalls``. False (the default of a strategy that does not say): every
    #: recall counts, as in the paper.
    reset: bool = False

    @abc.abstractmethod
    def decide(self, subtask: Subtask, node: str | None, reason: str, *, failed: bool) -> RecallDecision:
        """``failed`` is True for a failure report, False for a lapsed lease / stale queue entry / dead node."""

    def retry_delay(self, subtask: Subtask) -> float:
        """Seconds a recalled subtask (``attempt`` > 0) waits in ``waiting`` from its recall (``since``) before
        allocation may place it again. 0 (the default): at once."""
        return 0.0


STRATEGY_SETTINGS = {"SCHEDEXT_ALLOCATION": Allocation, "SCHEDEXT_MODIFICATION": Modification,
                     "SCHEDEXT_RECALL": Recall}


def strategy_class(settings: Any, name: str) -> type:
    """The class named by strategy setting ``name``; ConfigurationError naming the setting if it is unusable."""
    from scrapy.utils.misc import load_object

    base = STRATEGY_SETTINGS[name]
    path = setting(settings, name)
    try:
        cls = load_object(path)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise ConfigurationError(f"{name}: cannot load strategy {path!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigurationError(f"{name}: {path!r} is not a {base.__name__} strategy")
    return cls


def check_strategy_settings(settings: Any) -> None:
    """Fail fast, naming the setting, if any strategy setting does not name a usable strategy class."""
    for name in STRATEGY_SETTINGS:
        strategy_class(settings, name)


def load_strategy(crawler: Any, name: str) -> Any:
    """Build the strategy named by setting ``name`` (a dotted path), checking it implements its contract."""
    from scrapy.utils.misc import build_from_crawler

    return build_from_crawler(strategy_class(crawler.settings, name), crawler)
