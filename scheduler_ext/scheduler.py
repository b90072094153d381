"""The node scheduler: feeds a Scrapy engine from this node's crawl queue in Redis, as fast as Scrapy may crawl.

Settings (through :class:`scheduler_ext.config.Config`): ``SCHEDEXT_NODE_ID``, ``SCHEDEXT_NODE_TYPE``,
``SCHEDEXT_BIND_ADDRESS``, ``SCHEDEXT_CONCURRENT_SUBTASKS``, ``SCHEDEXT_PREFETCH``, ``SCHEDEXT_HEARTBEAT_INTERVAL``,
``SCHEDEXT_REFILL_INTERVAL``, ``SCHEDEXT_IDLE_CLOSE``, ``SCHEDEXT_LEASE_TTL``, ``SCHEDEXT_LEASE_GRACE``,
``SCHEDEXT_ESTIMATE_ALPHA``, ``SCHEDEXT_RUNS_MAXLEN``, ``SCHEDEXT_PAGE_LIMIT`` and ``SCHEDEXT_TICK_INTERVAL`` (to size
the prefetch), ``SCHEDEXT_BACKOFF_MAX``, the politeness settings of :mod:`scheduler_ext.politeness`,
``SCHEDEXT_PREFIX``; Scrapy's ``CONCURRENT_REQUESTS`` and ``CONCURRENT_REQUESTS_PER_DOMAIN``; Redis from
``REDIS_URL`` / ``REDIS_PARAMS``.

How it works (docs/node.md):
- **Demand-driven takes.** The node takes a subtask from ``crawl:<node>`` (one script call in a worker thread, so
  the reactor never waits on the round trip) whenever fewer pages are ready to download than Scrapy could start
  at once (``CONCURRENT_REQUESTS_PER_DOMAIN``): pages waiting here plus pages waiting in the downloader's slot
  queues. So the engine never waits for a subtask, and delays,
  AutoThrottle or politeness that slow the downloads also slow the takes (no subtask is leased to sit idle).
  A page goes to the engine only while its downloader slot has fewer pages waiting than it may run at once;
  the rest wait here, where a stop returns them (Scrapy fetches every page in its downloader before closing).
  A take is tried when the engine asks for a request, when a subtask finishes, and every
  ``SCHEDEXT_REFILL_INTERVAL`` as a fallback. ``next_request`` itself never touches Redis.
- **Prefetch sized by the node's own pace.** The node advertises ``prefetch`` (in its heartbeat): how many entries
  the control may queue ahead. Unless ``SCHEDEXT_PREFETCH`` fixes it, that is about two control ticks of this
  node's measured take rate, doubled at once (at most once per ``SCHEDEXT_REFILL_INTERVAL``) when the node finds
  its queue empty while busy and has taken a whole prefetch since it last changed (the control gives it all it
  asks for), bounded by ``4 x CONCURRENT_REQUESTS``: enough that the control's tick never starves
  the node, few enough that work is not committed to a node long before it can start (late binding stays
  meaningful).
- A second looping call (``SCHEDEXT_HEARTBEAT_INTERVAL``) registers the node and renews its leases; a lease it lost
  (recalled by the control) stops its remaining pages.
- When a subtask completes (every page resolved, every item out of the pipelines), the node finishes it in one
  script that checks the lease token (in a worker thread, one finish at a time). A finish that fails (Redis away)
  is kept, its lease renewed, and retried with the same token until Redis answers; the script refuses it if the
  subtask was recalled meanwhile.
- Every loop (take, heartbeat, finish, politeness) survives errors and backs off (:mod:`scheduler_ext.backoff`).
- The spider stays open while the cluster has work; ``SCHEDEXT_IDLE_CLOSE`` > 0 lets it close after that many
  idle seconds (batch use). On close (SIGTERM included) unfinished subtasks and the crawl queue go straight back
  to ``waiting``. Shared state is never flushed.

Stats: ``schedext/subtasks/taken``, ``schedext/subtasks/done``, ``schedext/subtasks/timeout``,
``schedext/subtasks/failed``, ``schedext/subtasks/stale_finish``, ``schedext/subtasks/malformed``,
``schedext/subtasks/released``, ``schedext/pages/dropped``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import redis
from scrapy import Request, Spider, signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.reactor import CallLaterOnce
from twisted.internet import threads

from .backoff import Backoff, guarded, record_failure, record_success
from .config import LONGEST, Config, check_number, config_for, ready_pages
from .connection import redis_from_settings
from .exceptions import ConfigurationError, InvalidInput
from .keys import Keys
from .models import Report, Subtask, resume_page
from .politeness import Limits, Politeness
from .store import Store, load_script
from .tracker import META_PAGE, META_SID, Active, Tracker, attach

logger = logging.getLogger(__name__)

META_SITE = "schedext_site"  # the politeness site of a request (its subtask's site, else its host)
MAX_WAIT = 1.0  # seconds one blocking wait for work lasts at most: well under the Redis client's socket timeout


@dataclass(frozen=True)
class Pace:
    """How much work a node keeps at hand, derived from Scrapy's concurrency unless fixed by settings.

    ``ready``: pages that should wait ready to download (Scrapy's ``CONCURRENT_REQUESTS_PER_DOMAIN``, capped by
    ``CONCURRENT_REQUESTS``; under a ``DOWNLOAD_DELAY``, what starts within a second:
    :func:`~.config.ready_pages`); ``max_leases``: subtasks held at once at most (``SCHEDEXT_CONCURRENT_SUBTASKS``, or
    ``CONCURRENT_REQUESTS``: one per request slot); ``prefetch``: a fixed prefetch (``SCHEDEXT_PREFETCH``) or None
    for the adaptive one, which starts at ``prefetch_min`` and stays within ``prefetch_max``. ``prefetch_min`` is
    the subtasks that fill the node's ready pages once (``ceil(ready / SCHEDEXT_PAGE_LIMIT)``): a node starts no more
    at a time, and what waits beyond that in its queue is committed to it while another node may be idle
    (docs/node.md).
    """

    ready: int = 8
    max_leases: int = 16
    prefetch: int | None = None
    prefetch_min: int = 2
    prefetch_max: int = 64
    tick: float = 1.0

    @classmethod
    def from_config(cls, config: Config, settings: Any) -> Pace:
        """From scheduler_ext's config and Scrapy's own concurrency settings.

        >>> from scrapy.settings import Settings
        >>> Pace.from_config(Config(), Settings())
        Pace(ready=8, max_leases=16, prefetch=None, prefetch_min=2, prefetch_max=64, tick=1.0)
        >>> Pace.from_config(Config(concurrent_subtasks=1, prefetch=2), Settings({"CONCURRENT_REQUESTS": 4}))
        Pace(ready=4, max_leases=1, prefetch=2, prefetch_min=2, prefetch_max=16, tick=1.0)
        >>> Pace.from_config(Config(), Settings({"DOWNLOAD_DELAY": 2}))  # a page per 2 s: one waits ready
        Pace(ready=1, max_leases=16, prefetch=None, prefetch_min=1, prefetch_max=64, tick=1.0)
        """
        # Scrapy's own settings, checked as ours are: a NaN delay failed the node's start in ready_pages
        requests = check_number("CONCURRENT_REQUESTS", settings.get("CONCURRENT_REQUESTS"), int, low=1)
        ready = ready_pages(min(requests, check_number("CONCURRENT_REQUESTS_PER_DOMAIN",
                                                       settings.get("CONCURRENT_REQUESTS_PER_DOMAIN"), int, low=1)),
                            check_number("DOWNLOAD_DELAY", settings.get("DOWNLOAD_DELAY"), float, low=0.0,
                                         high=LONGEST))
        start = math.ceil(ready / config.page_limit) if config.prefetch is None else config.prefetch
        return cls(ready=ready, max_leases=config.concurrent_subtasks or requests, prefetch=config.prefetch,
                   prefetch_min=start, prefetch_max=max(start, 4 * requests), tick=config.tick_interval)


@dataclass
class _Finish:
    """A finish to send: kept until Redis accepted or refused it, retried with the same lease token."""

    report: Report
    token: str


class SubtaskScheduler:
    """A Scrapy scheduler whose work comes from this node's Redis crawl queue as leased subtasks."""

    def __init__(self, crawler: Any, store: Store, *, node_id: str, node_types: list[int],
                 bind_address: str | None = None, pace: Pace | None = None, heartbeat_interval: float = 5.0,
                 refill_interval: float = 0.5, idle_close: float = 0.0, lease_ttl: float = 60.0,
                 grace: float = 10.0, alpha: float = 0.3, runs_maxlen: int = 100_000, take_batch: int = 8,
                 limits: Limits | None = None, backoff_max: float = 10.0, fail_cost: float = 0.0) -> None:
        self.crawler = crawler
        self.store = store
        self.node_id = node_id
        self.node_types = node_types
        self.bind_address = bind_address
        self.pace = pace or Pace()
        self.prefetch = self.pace.prefetch if self.pace.prefetch is not None else self.pace.prefetch_min
        self.heartbeat_interval = heartbeat_interval
        self.refill_interval = refill_interval
        self.idle_close = idle_close
        self.lease_ttl = lease_ttl
        self.grace = grace
        self.alpha = alpha
        self.fail_cost = fail_cost  # seconds a failed run costs its task beyond its own (the recall: 1.5 ticks)
        self.runs_maxlen = runs_maxlen
        self.take_batch = take_batch
        self.stats = crawler.stats
        self.tracker = Tracker(self._complete)
        attach(crawler, self.tracker)
        # Requests waiting for the engine, one FIFO per politeness site, served round robin.
        self.queues: dict[str, deque[Request]] = {}
        self._queued = 0  # requests in ``queues`` (asked for at every engine turn: kept, not summed)
        self._loops: list[Any] = []
        self._idle_since: float | None = None
        self._worked_at = time.monotonic()  # when the node last finished a subtask (or opened)
        self._closing = False
        self._unsent: dict[str, _Finish] = {}
        self._taken = 0  # takes since the last heartbeat (the pace that sizes the prefetch)
        self._fed = 0  # takes since the prefetch last changed: a node asks for more only once it got what it asked
        self._paced_at = time.monotonic()
        self._grown_at = -math.inf
        backoffs = self._backoffs = {name: Backoff(min(1.0, refill_interval), backoff_max)
                                     for name in ("refill", "heartbeat", "finish", "politeness")}
        self._taking = False  # a take is on its way (worker thread)
        self._waiting = False  # waiting for the crawl queue to get an entry (worker thread)
        self._sending: str | None = None  # the subtask whose finish is on its way (worker thread)
        self._refill = guarded("taking subtasks", self.refill, backoffs["refill"], settles=False)
        self._heartbeat = guarded("heartbeat", self.heartbeat, backoffs["heartbeat"])
        self._paced_heartbeat = guarded("heartbeat", self._beat, backoffs["heartbeat"])
        self._send = guarded("finishing subtasks", self.send_finishes, backoffs["finish"], settles=False)
        self._polite_sync = guarded("politeness sync", self.sync_politeness, backoffs["politeness"])
        self._refill_soon = CallLaterOnce(self._refill)
        self._heartbeat_soon = CallLaterOnce(self._heartbeat)
        self.politeness: Politeness | None = None
        if limits is not None and limits.enabled:
            self.politeness = Politeness(limits, node=node_id, address=bind_address, keys=store.keys,
                                         script=store.redis.register_script(load_script("polite")),
                                         in_downloader=self._in_downloader)

    @classmethod
    def from_crawler(cls, crawler: Any) -> SubtaskScheduler:
        c = config_for(crawler)
        limits = Limits(site_concurrency=c.site_concurrency, site_rate=c.site_rate,
                        address_concurrency=c.site_address_concurrency, address_rate=c.site_address_rate,
                        interval=c.politeness_interval)
        return cls(
            crawler, Store(redis_from_settings(crawler.settings), Keys(c.prefix)), node_id=c.node_id,
            node_types=list(c.node_types), bind_address=c.bind_address, pace=Pace.from_config(c, crawler.settings),
            heartbeat_interval=c.heartbeat_interval, refill_interval=c.refill_interval, idle_close=c.idle_close,
            lease_ttl=c.lease_ttl, grace=c.lease_grace, alpha=c.estimate_alpha, runs_maxlen=c.runs_maxlen,
            take_batch=c.take_batch, limits=limits, backoff_max=c.backoff_max,
            fail_cost=1.5 * c.tick_interval)

    # --- Scrapy's scheduler interface -----------------------------------------------------------------------
    def open(self, spider: Spider) -> None:
        if not callable(getattr(spider, "subtask_requests", None)):
            raise ConfigurationError(f"spider {spider.name!r} has no subtask_requests(subtask) method; "
                                     "SubtaskScheduler needs one to turn a subtask into requests")
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self.crawler.signals.connect(self._wake_engine, signal=signals.request_left_downloader)
        self._heartbeat()
        loops = [(self._paced_heartbeat, self.heartbeat_interval), (self._refill_tick, self.refill_interval)]
        if self.politeness is not None:
            loops.append((self._polite_sync, self.politeness.limits.interval))
            logger.info("politeness across the cluster: %s", self.politeness.limits)
        for fn, interval in loops:
            loop = create_looping_call(fn)
            loop.start(interval, now=False)
            self._loops.append(loop)
        logger.info("node %s (types %s, address %s) serving %s; up to %d subtasks, %d pages ready, prefetch %s",
                    self.node_id, self.node_types, self.bind_address or "default",
                    self.store.keys.crawl(self.node_id), self.pace.max_leases, self.pace.ready,
                    self.prefetch if self.pace.prefetch is not None else f"adaptive from {self.prefetch}")

    def close(self, reason: str) -> None:
        self._closing = True
        self._refill_soon.cancel()
        self._heartbeat_soon.cancel()
        for loop in self._loops:
            if loop.running:
                loop.stop()
        try:
            self._send_remaining()
            leases = [(a.subtask.id, a.token, a.subtask.priority) for a in self.tracker.active.values()
                      if not a.lost]
            moved = self.store.release(self.node_id, leases, deregister=True)
        except redis.RedisError as exc:  # Redis gone: the leases lapse and the control recalls them
            logger.error("could not return subtasks to waiting on close (%s); they will be recalled", exc)
            return
        self.tracker.active.clear()
        self.queues.clear()
        self._queued = 0
        if moved:
            self.stats.inc_value("schedext/subtasks/released", moved)
            logger.info("returned %d unfinished subtask(s) to waiting (%s)", moved, reason)

    def has_pending_requests(self) -> bool:
        return self._queued > 0

    def enqueue_request(self, request: Request) -> bool:
        site = request.meta.get(META_SITE)
        if site is None:
            active = self.tracker.get(request.meta.get(META_SID))
            site = request.meta[META_SITE] = active.subtask.site if active else urlparse_cached(request).hostname
        self.queues.setdefault(site or "", deque()).append(request)
        self._queued += 1
        return True

    def next_request(self) -> Request | None:
        request = self._pop()
        if self._ready_pages() < self.pace.ready:
            self._refill_soon.schedule()
        return request

    def _pop(self) -> Request | None:
        """The next request, round robin over sites, skipping sites that politeness holds back."""
        polite = self.politeness
        for _ in range(len(self.queues)):
            site, queue = next(iter(self.queues.items()))
            del self.queues[site]  # to the back of the rotation (dicts keep insertion order)
            request = None
            while queue and (polite is None or polite.allows(site)) and not self._slot_full(queue[0]):
                candidate = queue.popleft()
                self._queued -= 1
                active, page = self.tracker.get(candidate.meta.get(META_SID)), candidate.meta.get(META_PAGE)
                if active is not None and page is not None and active.moot(page):
                    self.stats.inc_value("schedext/pages/dropped")
                    self.tracker.page_dropped(active.subtask.id, page)
                    continue
                request = candidate
                break
            if queue:
                self.queues[site] = queue
            if request is not None:
                if polite is not None:
                    polite.dispatched(site, request)
                return request
        return None

    def _slot_full(self, request: Request) -> bool:
        """Whether the downloader slot ``request`` would join already has as many requests waiting to start as it
        may run at once: the page is better kept here, where a graceful stop returns it with its subtask (a page in
        the downloader is fetched before the spider closes) and where it does not count as started."""
        downloader = getattr(getattr(self.crawler, "engine", None), "downloader", None)
        if downloader is None:
            return False
        slot = downloader.slots.get(downloader.get_slot_key(request))
        return slot is not None and len(slot.queue) >= max(1, slot.concurrency)

    def __len__(self) -> int:
        return self._queued

    # --- how much work is at hand ------------------------------------------------------------------------------
    def _in_downloader(self) -> Any:
        return self.crawler.engine.downloader.active

    def _ready_pages(self) -> int:
        """Pages waiting to download: here (politeness may be holding them back: a node must not hoard subtasks it
        cannot start) or in the downloader's slot queues."""
        engine = getattr(self.crawler, "engine", None)
        slots = engine.downloader.slots.values() if engine is not None else ()
        return len(self) + sum(len(slot.queue) for slot in slots)

    def _has_room(self) -> bool:
        return (len(self.tracker.active) + len(self._unsent) < self.pace.max_leases
                and self._ready_pages() < self.pace.ready)

    def _wake_engine(self, **_: Any) -> None:
        # Scrapy's engine asks the scheduler for more only when a response has been fully scraped (its items
        # through the pipelines: for us, acknowledged by MongoDB) or a request is scheduled. A download that
        # left the downloader, or a politeness grant, frees room earlier: nudge the engine's own "next call"
        # (CallLaterOnce: many nudges in one reactor turn make one call; there is no public hook for this).
        slot = getattr(getattr(self.crawler, "engine", None), "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    # --- timers ---------------------------------------------------------------------------------------------------
    def node_info(self) -> dict[str, Any]:
        return {"type": self.node_types, "host": socket.gethostname(), "pid": os.getpid(),
                "address": self.bind_address, "capacity": self.pace.max_leases, "prefetch": self.prefetch,
                "subtasks": sorted(self.tracker.active)}

    def _beat(self) -> None:
        self._adapt_prefetch()
        self.heartbeat()

    def heartbeat(self) -> None:
        leases = [(sid, a.token) for sid, a in self.tracker.active.items() if not a.lost]
        leases += [(sid, f.token) for sid, f in self._unsent.items()]  # kept alive until their finish is sent
        lost = self.store.heartbeat(self.node_id, self.node_info(), self.lease_ttl, leases)
        for sid in lost:
            active = self.tracker.get(sid)
            if active is not None and not active.lost:
                active.lost = True
                logger.warning("lease of subtask %s was recalled; dropping its remaining pages", sid)

    def _adapt_prefetch(self) -> None:
        """About two control ticks of this node's measured take rate (unless SCHEDEXT_PREFETCH fixes it)."""
        now = time.monotonic()
        rate = self._taken / max(1e-3, now - self._paced_at)
        self._taken, self._paced_at, self._fed = 0, now, 0
        if self.pace.prefetch is None:
            self.prefetch = min(self.pace.prefetch_max,
                                max(self.pace.prefetch_min, math.ceil(2 * rate * self.pace.tick) + 1))

    def _starved(self) -> None:
        """The crawl queue was empty while the node had room: if it is busy and took a whole prefetch since the
        prefetch last changed (the control gives it all it asks for), ask for more at once. A node the control
        gives less than it asks for has room already: asking for more would only widen every tick's window."""
        now = time.monotonic()
        if (self.pace.prefetch is None and self.tracker.active and self.prefetch < self.pace.prefetch_max
                and self._fed >= self.prefetch and now - self._grown_at >= self.refill_interval):
            self.prefetch = min(self.pace.prefetch_max, 2 * self.prefetch)
            self._grown_at, self._fed = now, 0
            self._heartbeat_soon.schedule()

    def _refill_tick(self) -> None:
        self._send()
        self._refill()

    def refill(self) -> None:
        """Take a subtask if this node has room; its pages go to the engine when the lease comes back.

        The take's round trip runs in a worker thread (the reactor goes on meanwhile), one at a time; a successful
        take asks for the next at once, so a node with room takes until it has none or the queue is empty.
        """
        if self._closing or self._taking or self._waiting or not self._has_room():
            return
        self._taking = True
        d = threads.deferToThread(self.store.take, self.node_id, self.lease_ttl, self.grace, self.take_batch)
        d.addCallbacks(self._took, self._take_failed)

    def _took(self, taken: tuple[str, str, float] | None) -> None:
        self._taking = False
        record_success("taking subtasks", self._backoffs["refill"])
        if taken is None:
            self._starved()
            self._wait_for_work()
            return
        if self._closing:  # taken while the node was closing: straight back to waiting
            self._release_late(taken)
            return
        self._taken += 1
        self._fed += 1
        self._start(*taken)
        self._refill_soon.schedule()

    def _wait_for_work(self) -> None:
        """The crawl queue was empty: wait in a worker thread until the control queues an entry (at most
        ``SCHEDEXT_REFILL_INTERVAL``, and 1 s), then take at once. Without it a node with room learns of new work
        only at its next refill tick; a task's next subtask is made only after its previous one is finished, so
        that wait was on every task's critical path. No take is tried meanwhile: the queue is known to be empty."""
        if self._closing or self._waiting:
            return
        self._waiting = True
        d = threads.deferToThread(self.store.wait_for_entry, self.store.keys.crawl(self.node_id),
                                  min(self.refill_interval, MAX_WAIT))
        d.addCallbacks(self._waited, self._wait_failed)

    def _waited(self, _: bool) -> None:
        self._waiting = False
        self._refill_soon.schedule()

    def _wait_failed(self, failure: Any) -> None:
        # Redis away: the refill loop's own take reports it and backs off; waiting is only a shortcut.
        self._waiting = False
        logger.debug("waiting for work failed: %s", failure.getErrorMessage())

    def _take_failed(self, failure: Any) -> None:
        self._taking = False
        record_failure("taking subtasks", self._backoffs["refill"], failure.value)

    def _release_late(self, taken: tuple[str, str, float]) -> None:
        raw, token, _ = taken
        try:
            obj = json.loads(raw)
            self.store.release(self.node_id, [(str(obj["id"]), token, float(obj.get("priority") or 0))])
        except (redis.RedisError, ValueError, KeyError, TypeError, RecursionError) as exc:
            # its lease lapses; the control recalls it
            logger.error("could not return a subtask taken while closing (%s); it will be recalled", exc)

    def sync_politeness(self) -> None:
        if self.politeness is None or self._closing:
            return
        waiting = {site: len(q) for site, q in self.queues.items() if q}
        if self.politeness.sync(lambda: self.store.redis.pipeline(transaction=False), waiting):
            self._wake_engine()

    def _start(self, raw: str, token: str, started: float) -> None:
        self.stats.inc_value("schedext/subtasks/taken")
        try:
            subtask = Subtask.from_json(raw)
        except InvalidInput as exc:
            self._finish_invalid(raw, token, started, str(exc))
            return
        active = Active(subtask, token, started)
        spider = self.crawler.spider
        try:
            requests = list(spider.subtask_requests(subtask))
        except Exception as exc:  # the spider could not build requests from this payload: the subtask failed
            logger.error("spider could not expand subtask %s: %s", subtask.id, exc)
            active.failure = f"spider could not expand the subtask: {exc}"
            requests = []
        pages: list[int] = []
        for request in requests:
            request.meta[META_SID] = subtask.id
            request.meta[META_SITE] = subtask.site
            request.meta.setdefault(META_PAGE, len(pages) + subtask.first_page)
            request.meta.setdefault("download_timeout", subtask.time_limit)
            if self.bind_address:
                request.meta.setdefault("bindaddress", (self.bind_address, 0))
            pages.append(request.meta[META_PAGE])
        logger.debug("took subtask %s (%d pages)", subtask.id, len(pages))
        self.tracker.add(active, pages)
        for request in requests:
            self.crawler.engine.crawl(request)

    def _finish_invalid(self, raw: str, token: str, started: float, reason: str) -> None:
        """A payload that passed the take script's checks but not full validation: report it failed."""
        self.stats.inc_value("schedext/subtasks/malformed")
        obj = json.loads(raw)  # the take script already checked it is a JSON object with a string id
        # The original payload travels in the report so the dead-letter entry shows what was wrong.
        stub = Subtask(id=obj["id"], task=str(obj.get("task") or "?"), site=str(obj.get("site") or "?"),
                       first_page=0, page_limit=1, time_limit=float(obj["time_limit"]),
                       payload={"malformed": raw[:2000]})
        report = Report(subtask=stub, node=self.node_id, outcome="failed",
                        reason=f"malformed subtask: {reason}", started=started, ended=started)
        self._finish(report, token)

    # --- finishing ---------------------------------------------------------------------------------------------
    def _complete(self, a: Active) -> None:
        st = a.subtask
        pages_range = range(st.first_page, st.first_page + st.page_limit)
        next_page = next((p for p in pages_range if p not in a.pages_done), st.first_page + st.page_limit)
        exhausted = a.last_page is not None
        if a.failure:
            outcome = "failed"
        elif exhausted or next_page >= st.first_page + st.page_limit:
            outcome = "done"
        else:
            outcome = "timeout"
        # Redis time at the lease plus the node's monotonic duration: no clock of the node, no extra round trip.
        ended = a.started + (time.monotonic() - a.started_local)
        report = Report(subtask=st, node=self.node_id, outcome=outcome, reason=a.failure, reported=a.reported,
                        offered=a.offered, collected=a.collected, pages=len(a.pages_done), next_page=next_page,
                        exhausted=exhausted, total_pages=a.total_pages, started=a.started, ended=ended,
                        attempted=len(a.pages_done) + a.blocked + a.failed + a.cut, blocked=a.blocked,
                        failed=a.failed, resume_page=resume_page(st.first_page, st.page_limit, a.pages_done),
                        node_seconds=round(a.held / self.pace.ready, 6))
        self._finish(report, a.token)

    def _finish(self, report: Report, token: str) -> None:
        self._unsent[report.subtask.id] = _Finish(report, token)
        self._send()
        if not self._closing:
            # Take the next subtask at once, but outside the signal handler or callback that completed this one.
            self._refill_soon.schedule()

    def send_finishes(self) -> None:
        """Send the oldest finish not sent yet, in a worker thread; the next follows when it is answered. A Redis
        error keeps it (and its lease, renewed by the heartbeat) for the next try."""
        if self._sending is not None or not self._unsent:
            return
        sid, f = next(iter(self._unsent.items()))
        self._sending = sid
        d = threads.deferToThread(self._send_one, sid, f)
        d.addCallbacks(lambda accepted: self._sent(sid, f, accepted), self._send_failed)

    def _send_one(self, sid: str, f: _Finish) -> bool:
        r, st = f.report, f.report.subtask
        return self.store.finish(sid, f.token, r.to_json(), node=self.node_id, site=st.site, group=st.group,
                                 offered=r.offered, collected=r.collected, pages=r.pages, seconds=r.seconds,
                                 ok=r.ok, alpha=self.alpha, runs_maxlen=self.runs_maxlen, attempted=r.charged,
                                 fail_cost=self.fail_cost, errors=r.charged - r.pages - r.blocked,
                                 node_seconds=r.node_seconds)

    def _sent(self, sid: str, f: _Finish, accepted: bool) -> None:
        self._sending = None
        record_success("finishing subtasks", self._backoffs["finish"])
        self._unsent.pop(sid, None)
        self._worked_at = time.monotonic()
        r = f.report
        if not accepted:
            self.stats.inc_value("schedext/subtasks/stale_finish")
            logger.warning("finish of subtask %s refused: its lease was recalled meanwhile", sid)
        elif r.subtask.payload.get("malformed") is None:
            self.stats.inc_value(f"schedext/subtasks/{r.outcome}")
            logger.info("subtask %s %s: %d/%d results, %d pages%s", sid, r.outcome, r.collected, r.offered,
                        r.pages, f" ({r.reason})" if r.reason else "")
        if not self._closing:  # on close, _send_remaining sends the rest itself
            self.send_finishes()
            self._refill_soon.schedule()

    def _send_failed(self, failure: Any) -> None:
        self._sending = None
        record_failure("finishing subtasks", self._backoffs["finish"], failure.value)

    def _send_remaining(self) -> None:
        """On close: send what is left, here and now (a finish already on its way in a thread is left to it)."""
        for sid, f in list(self._unsent.items()):
            if sid != self._sending:
                self._sent(sid, f, self._send_one(sid, f))

    # --- keeping the spider open ---------------------------------------------------------------------------
    def _on_idle(self) -> None:
        if self.idle_close <= 0 or self.tracker.active or self._unsent:
            self._idle_since = None
            raise DontCloseSpider
        now = time.monotonic()
        if self._idle_since is None:
            # Idle since its last finish, not since this signal: Scrapy sends it every 5 s (its engine's heartbeat),
            # and counting from the first would keep an idle node open one heartbeat longer than asked.
            self._idle_since = self._worked_at
        if now - self._idle_since < self.idle_close or self._cluster_has_work():
            raise DontCloseSpider
        logger.info("cluster idle for %.0f s; closing (SCHEDEXT_IDLE_CLOSE)", now - self._idle_since)

    def _cluster_has_work(self) -> bool:
        k = self.store.keys
        try:
            with self.store.redis.pipeline(transaction=False) as pipe:
                pipe.llen(k.crawl(self.node_id))
                pipe.zcard(k.waiting)
                pipe.llen(k.virtual)
                pipe.zcard(k.leases)
                return any(pipe.execute())
        except redis.RedisError:
            return True
