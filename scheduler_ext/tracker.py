"""Per-node bookkeeping of the subtasks a node is crawling, shared by the scheduler and the middlewares.

Completion is counted, not guessed: a subtask is complete when every page request it produced is resolved
(parsed by the spider, failed, or dropped) and every item it produced has left the item pipelines
(``item_scraped``, ``item_dropped`` or ``item_error``). The scheduler owns one :class:`Tracker` per crawler;
the middlewares find it with :func:`tracker_for`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .models import Subtask

META_SID = "schedext_sid"
META_PAGE = "schedext_page"
# Set by the spider on ``response.meta`` while parsing a result page:
META_OFFERED = "schedext_offered"  # results the engine should show on this page
META_REPORTED = "schedext_reported"  # engine-reported result count
META_LAST = "schedext_last_page"  # True if this page is the end of the results
META_TOTAL_PAGES = "schedext_total_pages"
# Set by the node's downloader when a page's request takes a download slot (time.monotonic()):
META_SLOT_TAKEN = "schedext_slot_taken"


@dataclass
class Active:
    """One leased subtask being crawled on this node."""

    subtask: Subtask
    token: str
    started: float  # Redis time when leased
    started_local: float = field(default_factory=time.monotonic)
    pages_pending: set[int] = field(default_factory=set)
    pages_done: set[int] = field(default_factory=set)
    items_outstanding: int = 0
    offered: int = 0
    collected: int = 0
    reported: int | None = None
    total_pages: int | None = None
    last_page: int | None = None  # end of results seen at this page
    failure: str = ""
    # Pages whose download was attempted and gave nothing, every one (pages already in flight when the first one
    # failed included): answered by a block page, failed (HTTP or download error, spider error), or cut short by
    # the time limit. The finish report carries them so that the estimates charge them (posterior.py).
    blocked: int = 0
    failed: int = 0
    cut: int = 0
    held: float = 0.0  # seconds the run's attempted pages held download slots, all together (Report.node_seconds)
    timed_out: bool = False
    lost: bool = False  # the lease was recalled: finish will be refused

    @property
    def deadline_local(self) -> float:
        return self.started_local + self.subtask.time_limit

    def moot(self, page: int) -> bool:
        """True if ``page`` should not be downloaded any more."""
        return bool(self.failure or self.timed_out or self.lost
                    or (self.last_page is not None and page > self.last_page))

    @property
    def complete(self) -> bool:
        return not self.pages_pending and self.items_outstanding <= 0


class Tracker:
    """The active subtasks of one node; calls ``on_complete(active)`` once when one completes."""

    def __init__(self, on_complete: Callable[[Active], Any]) -> None:
        self.active: dict[str, Active] = {}
        self._on_complete = on_complete

    def add(self, active: Active, pages: list[int]) -> None:
        active.pages_pending = set(pages)
        self.active[active.subtask.id] = active
        self._check(active)

    def get(self, sid: str | None) -> Active | None:
        return self.active.get(sid) if sid else None

    def page_parsed(self, sid: str, page: int, meta: dict[str, Any], items: int) -> None:
        a = self.get(sid)
        if a is None or page not in a.pages_pending:
            return
        a.pages_pending.discard(page)
        a.pages_done.add(page)
        a.collected += items
        a.offered += int(meta.get(META_OFFERED) or 0)
        if meta.get(META_REPORTED) is not None:
            a.reported = int(meta[META_REPORTED])
        if meta.get(META_TOTAL_PAGES) is not None:
            a.total_pages = int(meta[META_TOTAL_PAGES])
        if meta.get(META_LAST):
            a.last_page = page if a.last_page is None else min(a.last_page, page)
        self._check(a)

    def page_held(self, sid: str, seconds: float) -> None:
        """A page of ``sid`` held a download slot for ``seconds`` (its download ended, however)."""
        a = self.get(sid)
        if a is not None and seconds > 0:
            a.held += seconds

    def page_failed(self, sid: str, page: int, reason: str, *, blocked: bool = False) -> None:
        """``page`` was attempted and failed (``blocked``: a block page); the first failure fails the subtask."""
        a = self.get(sid)
        if a is None or page not in a.pages_pending:
            return
        a.pages_pending.discard(page)
        if blocked:
            a.blocked += 1
        else:
            a.failed += 1
        a.failure = a.failure or reason
        self._check(a)

    def page_dropped(self, sid: str, page: int, *, attempted: bool = False) -> None:
        """``page`` will not be crawled: never started, or (``attempted``) cut short by the time limit."""
        a = self.get(sid)
        if a is None or page not in a.pages_pending:
            return
        a.pages_pending.discard(page)
        a.cut += attempted
        self._check(a)

    def item_in(self, sid: str) -> None:
        a = self.get(sid)
        if a is not None:
            a.items_outstanding += 1

    def item_out(self, sid: str, error: str = "") -> None:
        a = self.get(sid)
        if a is None:
            return
        a.items_outstanding -= 1
        if error:
            a.failure = a.failure or error
        self._check(a)

    def _check(self, a: Active) -> None:
        if a.complete and self.active.get(a.subtask.id) is a:
            del self.active[a.subtask.id]
            self._on_complete(a)


_TRACKERS: weakref.WeakKeyDictionary[Any, Tracker] = weakref.WeakKeyDictionary()


def attach(crawler: Any, tracker: Tracker) -> None:
    _TRACKERS[crawler] = tracker


def tracker_for(crawler: Any) -> Tracker | None:
    """The tracker of the subtask scheduler running in ``crawler``, if any."""
    return _TRACKERS.get(crawler)
