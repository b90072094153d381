"""The node scheduler: feeds a Scrapy engine from this node's crawl queue in Redis, one subtask at a time.

Settings: ``SCHEDEXT_NODE_ID``, ``SCHEDEXT_NODE_TYPE``, ``SCHEDEXT_BIND_ADDRESS``, ``SCHEDEXT_CONCURRENT_SUBTASKS``,
``SCHEDEXT_PREFETCH``, ``SCHEDEXT_HEARTBEAT_INTERVAL``, ``SCHEDEXT_REFILL_INTERVAL``, ``SCHEDEXT_IDLE_CLOSE``,
``SCHEDEXT_RECALL_THRESHOLD`` (the lease time-to-live), ``SCHEDEXT_LEASE_GRACE``, ``SCHEDEXT_ESTIMATE_ALPHA``,
``SCHEDEXT_RUNS_MAXLEN``, ``SCHEDEXT_PREFIX``; Redis from ``REDIS_URL`` / ``REDIS_PARAMS``.

How it works (docs/node.md):
- A looping call (``SCHEDEXT_REFILL_INTERVAL``) takes a subtask from ``crawl:<node>`` into a lease whenever the node
  has room (one short script call), asks the spider for its page requests (``spider.subtask_requests(subtask)``)
  and hands them to the engine with ``engine.crawl``. ``next_request`` never touches Redis.
- A second looping call (``SCHEDEXT_HEARTBEAT_INTERVAL``) registers the node and renews its leases; a lease it lost
  (recalled by the control) stops its remaining pages.
- When a subtask completes (every page resolved, every item out of the pipelines), the node finishes it in one
  script that checks the lease token: run record, aggregates, report to ``sleeping`` or ``failed``.
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
import os
import socket
import time
from collections import deque
from typing import Any

import redis
from scrapy import Request, Spider, signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.reactor import CallLaterOnce

from .connection import redis_from_settings
from .defaults import setting, setting_float, setting_int
from .exceptions import ConfigurationError, InvalidInput
from .keys import Keys
from .models import Report, Subtask
from .store import Store
from .tracker import META_PAGE, META_SID, Active, Tracker, attach

logger = logging.getLogger(__name__)


def node_identity(settings: Any) -> tuple[str, list[int], str | None]:
    """(node id, node types, bind address) from settings, validated."""
    node_id = setting(settings, "SCHEDEXT_NODE_ID") or f"{socket.gethostname()}-{os.getpid()}"
    raw_types = str(setting(settings, "SCHEDEXT_NODE_TYPE"))
    try:
        types = sorted({int(t) for t in raw_types.replace(" ", "").split(",") if t != ""})
    except ValueError as exc:
        raise ConfigurationError(f"SCHEDEXT_NODE_TYPE: expected 0, 1 or 0,1, got {raw_types!r}") from exc
    if not types or any(t < 0 for t in types):
        raise ConfigurationError(f"SCHEDEXT_NODE_TYPE: expected 0, 1 or 0,1, got {raw_types!r}")
    if ":" in node_id or "|" in node_id:
        raise ConfigurationError(f"SCHEDEXT_NODE_ID: ':' and '|' are not allowed, got {node_id!r}")
    return str(node_id), types, setting(settings, "SCHEDEXT_BIND_ADDRESS")


class SubtaskScheduler:
    """A Scrapy scheduler whose work comes from this node's Redis crawl queue as leased subtasks."""

    def __init__(self, crawler: Any, store: Store, *, node_id: str, node_types: list[int],
                 bind_address: str | None = None, capacity: int = 1, prefetch: int = 1,
                 heartbeat_interval: float = 5.0, refill_interval: float = 0.5, idle_close: float = 0.0,
                 lease_ttl: float = 60.0, grace: float = 10.0, alpha: float = 0.3, runs_maxlen: int = 100_000,
                 take_batch: int = 8) -> None:
        self.crawler = crawler
        self.store = store
        self.node_id = node_id
        self.node_types = node_types
        self.bind_address = bind_address
        self.capacity = capacity
        self.prefetch = prefetch
        self.heartbeat_interval = heartbeat_interval
        self.refill_interval = refill_interval
        self.idle_close = idle_close
        self.lease_ttl = lease_ttl
        self.grace = grace
        self.alpha = alpha
        self.runs_maxlen = runs_maxlen
        self.take_batch = take_batch
        self.stats = crawler.stats
        self.tracker = Tracker(self._complete)
        attach(crawler, self.tracker)
        self.queue: deque[Request] = deque()
        self._loops: list[Any] = []
        self._idle_since: float | None = None
        self._closing = False
        self._redis_ok = True
        self._refill_soon = CallLaterOnce(self.refill)

    @classmethod
    def from_crawler(cls, crawler: Any) -> SubtaskScheduler:
        s = crawler.settings
        node_id, types, address = node_identity(s)
        store = Store(redis_from_settings(s), Keys(setting(s, "SCHEDEXT_PREFIX")))
        return cls(
            crawler, store, node_id=node_id, node_types=types, bind_address=address,
            capacity=max(1, setting_int(s, "SCHEDEXT_CONCURRENT_SUBTASKS")),
            prefetch=max(0, setting_int(s, "SCHEDEXT_PREFETCH")),
            heartbeat_interval=setting_float(s, "SCHEDEXT_HEARTBEAT_INTERVAL"),
            refill_interval=setting_float(s, "SCHEDEXT_REFILL_INTERVAL"),
            idle_close=setting_float(s, "SCHEDEXT_IDLE_CLOSE"),
            lease_ttl=setting_float(s, "SCHEDEXT_RECALL_THRESHOLD"),
            grace=setting_float(s, "SCHEDEXT_LEASE_GRACE"),
            alpha=setting_float(s, "SCHEDEXT_ESTIMATE_ALPHA"),
            runs_maxlen=setting_int(s, "SCHEDEXT_RUNS_MAXLEN"),
            take_batch=setting_int(s, "SCHEDEXT_TAKE_BATCH"),
        )

    # --- Scrapy's scheduler interface -----------------------------------------------------------------------
    def open(self, spider: Spider) -> None:
        if not callable(getattr(spider, "subtask_requests", None)):
            raise ConfigurationError(f"spider {spider.name!r} has no subtask_requests(subtask) method; "
                                     "SubtaskScheduler needs one to turn a subtask into requests")
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self.heartbeat()
        for fn, interval in ((self.heartbeat, self.heartbeat_interval), (self.refill, self.refill_interval)):
            loop = create_looping_call(fn)
            loop.start(interval, now=False)
            self._loops.append(loop)
        logger.info("node %s (types %s, address %s) serving %s", self.node_id, self.node_types,
                    self.bind_address or "default", self.store.keys.crawl(self.node_id))

    def close(self, reason: str) -> None:
        self._closing = True
        self._refill_soon.cancel()
        for loop in self._loops:
            if loop.running:
                loop.stop()
        leases = [(a.subtask.id, a.token, a.subtask.priority) for a in self.tracker.active.values()
                  if not a.lost]
        try:
            moved = self.store.release(self.node_id, leases)
            self.store.deregister(self.node_id)
        except redis.RedisError as exc:  # Redis gone: the leases lapse and the control recalls them
            logger.error("could not return subtasks to waiting on close (%s); they will be recalled", exc)
            return
        self.tracker.active.clear()
        self.queue.clear()
        if moved:
            self.stats.inc_value("schedext/subtasks/released", moved)
            logger.info("returned %d unfinished subtask(s) to waiting (%s)", moved, reason)

    def has_pending_requests(self) -> bool:
        return bool(self.queue)

    def enqueue_request(self, request: Request) -> bool:
        self.queue.append(request)
        return True

    def next_request(self) -> Request | None:
        while self.queue:
            request = self.queue.popleft()
            active, page = self.tracker.get(request.meta.get(META_SID)), request.meta.get(META_PAGE)
            if active is not None and page is not None and active.moot(page):
                self.stats.inc_value("schedext/pages/dropped")
                self.tracker.page_dropped(active.subtask.id, page)
                continue
            return request
        return None

    def __len__(self) -> int:
        return len(self.queue)

    # --- timers ---------------------------------------------------------------------------------------------------
    def node_info(self) -> dict[str, Any]:
        return {"type": self.node_types, "host": socket.gethostname(), "pid": os.getpid(),
                "address": self.bind_address, "capacity": self.capacity, "prefetch": self.prefetch,
                "subtasks": sorted(self.tracker.active)}

    def heartbeat(self) -> None:
        leases = [(sid, a.token) for sid, a in self.tracker.active.items() if not a.lost]
        try:
            lost = self.store.heartbeat(self.node_id, self.node_info(), self.lease_ttl, leases)
        except redis.RedisError as exc:  # cannot renew: take nothing new; running pages go on (items are upserts)
            if self._redis_ok:
                logger.error("heartbeat failed, Redis unreachable: %s", exc)
            self._redis_ok = False
            return
        self._redis_ok = True
        for sid in lost:
            active = self.tracker.get(sid)
            if active is not None and not active.lost:
                active.lost = True
                logger.warning("lease of subtask %s was recalled; dropping its remaining pages", sid)

    def refill(self) -> None:
        """Take subtasks while this node has room; hand their page requests to the engine."""
        while not self._closing and self._redis_ok and len(self.tracker.active) < self.capacity:
            try:
                taken = self.store.take(self.node_id, self.lease_ttl, self.grace, self.take_batch)
            except redis.RedisError as exc:
                logger.error("could not take a subtask: %s", exc)
                return
            if taken is None:
                return
            self._start(*taken)

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
        self.store.finish(stub.id, token, report.to_json(), node=self.node_id, site=stub.site, group="",
                          offered=0, collected=0, pages=0, seconds=0.0, ok=False, alpha=self.alpha,
                          runs_maxlen=self.runs_maxlen)

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
                        exhausted=exhausted, total_pages=a.total_pages, started=a.started, ended=ended)
        try:
            accepted = self.store.finish(st.id, a.token, report.to_json(), node=self.node_id, site=st.site,
                                         group=st.group, offered=a.offered, collected=a.collected,
                                         pages=len(a.pages_done), seconds=report.seconds, ok=report.ok,
                                         alpha=self.alpha, runs_maxlen=self.runs_maxlen)
        except redis.RedisError as exc:  # the lease stays; the control recalls it after its deadline
            logger.error("could not finish subtask %s: %s", st.id, exc)
            return
        if not accepted:
            self.stats.inc_value("schedext/subtasks/stale_finish")
            logger.warning("finish of subtask %s refused: its lease was recalled meanwhile", st.id)
        else:
            self.stats.inc_value(f"schedext/subtasks/{outcome}")
            logger.info("subtask %s %s: %d/%d results, %d pages%s", st.id, outcome, a.collected, a.offered,
                        len(a.pages_done), f" ({a.failure})" if a.failure else "")
        if not self._closing:
            # Take the next subtask at once, but outside the signal handler or callback that completed this one.
            self._refill_soon.schedule()

    # --- keeping the spider open ---------------------------------------------------------------------------
    def _on_idle(self) -> None:
        if self.idle_close <= 0 or self.tracker.active:
            self._idle_since = None
            raise DontCloseSpider
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
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
