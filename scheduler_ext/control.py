"""The control loop: split, modify, recall and allocate, one tick at a time (docs/control.md).

One control is active at a time: each tick starts by taking or renewing the leader lease (``leader`` key,
``SCHEDEXT_LEADER_TTL``); a standby ticks idly until the lease lapses, then takes over. Every decision is
committed with :meth:`Store.commit`, guarded by the state it was made from (the report still at the tail of its
list, the lease token unchanged, the subtask still waiting), so a decision is applied exactly once even if two
controls overlap for a moment or one is killed half-way.

A tick costs in proportion to the work that changed: at most ``SCHEDEXT_TICK_BATCH`` virtual tasks, reports and
recalls, and a window of the first waiting subtasks sized by the free crawl-queue slots; never a scan of a queue.

Settings: ``SCHEDEXT_TICK_INTERVAL``, ``SCHEDEXT_TICK_BATCH``, ``SCHEDEXT_LEADER_TTL``, ``SCHEDEXT_SPLITTER``,
``SCHEDEXT_ALLOCATION``, ``SCHEDEXT_MODIFICATION``, ``SCHEDEXT_RECALL``, ``SCHEDEXT_PAGE_LIMIT``,
``SCHEDEXT_TIME_LIMIT``, ``SCHEDEXT_RECALL_THRESHOLD``, ``SCHEDEXT_PREFIX``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.asyncio import create_looping_call
from scrapy.utils.misc import load_object
from twisted.internet import threads

from .config import config_for
from .connection import redis_from_settings
from .exceptions import ConfigurationError, InvalidInput
from .keys import Keys
from .models import Report, Subtask, Task, loads_object
from .store import Store
from .strategies import Allocation, Estimate, Modification, NodeView, Recall, RecallDecision, load_strategy

logger = logging.getLogger(__name__)

Splitter = Callable[[str], list[dict[str, Any]]]


class EstimateCache:
    """Run-control estimates for one tick, read from the estimate hashes (one per site and one per (product,
    site), a field per node), so a tick reads every node's figures for a site in one command.

    Each hash is parsed once into :class:`Estimate` objects per node; allocation asks for (site, node) pairs
    hundreds of thousands of times a tick at scale, so a lookup is two dict reads. A cache lives for one tick:
    what it holds is bounded by that tick's work, and the next tick sees the runs that finished meanwhile.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._sites: dict[str, dict[str, tuple[Estimate | None, Estimate | None]]] = {}  # site -> node -> (c, spp)
        self._groups: dict[tuple[str, str], dict[str, Estimate | None]] = {}  # (group, site) -> node -> spp

    def prefetch(self, sites: Iterable[str], group_sites: Iterable[tuple[str, str]]) -> None:
        """Load the estimate hashes of these sites and (product, site) pairs not loaded yet, in one round trip."""
        keys = self.store.keys
        sites = [s for s in set(sites) if s not in self._sites]
        groups = [g for g in set(group_sites) if g not in self._groups]
        if not sites and not groups:
            return
        with self.store.redis.pipeline(transaction=False) as pipe:
            for site in sites:
                pipe.hgetall(keys.est_site(site))
            for group, site in groups:
                pipe.hgetall(keys.est_group_site(group, site))
            rows = pipe.execute()
        for site, fields in zip(sites, rows, strict=False):
            self._sites[site] = {node: (_estimate(e, "c"), _estimate(e, "spp"))
                                 for node, e in _parse(fields).items()}
        for gs, fields in zip(groups, rows[len(sites):], strict=True):
            self._groups[gs] = {node: _estimate(e, "spp") for node, e in _parse(fields).items()}

    # --- the Estimates protocol ----------------------------------------------------------------------------
    def completion(self, site: str, node: str) -> Estimate | None:
        if site not in self._sites:
            self.prefetch([site], [])
        entry = self._sites[site].get(node)
        return entry[0] if entry else None

    def seconds_per_page(self, group: str, site: str, node: str) -> Estimate | None:
        if (group, site) not in self._groups or site not in self._sites:
            self.prefetch([site], [(group, site)])
        spp = self._groups[(group, site)].get(node)
        if spp is not None:
            return spp
        entry = self._sites[site].get(node)
        return entry[1] if entry else None


def _parse(fields: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {node: json.loads(raw) for node, raw in fields.items()}


def _estimate(entry: dict[str, Any], name: str) -> Estimate | None:
    value = entry.get(name)
    return None if value is None else Estimate(float(value), int(entry.get("runs") or 0), float(entry.get("last") or 0))


@dataclass
class TickResult:
    leader: bool
    split: int = 0
    reports: int = 0
    recalled: int = 0
    dead: int = 0
    allocated: int = 0
    notes: list[str] = field(default_factory=list)


class Control:
    """The control loop of one deployment. Build with :meth:`from_crawler`, call :meth:`tick` on a timer."""

    def __init__(self, store: Store, *, splitter: Splitter | None, allocation: Allocation,
                 modification: Modification, recall: Recall, control_id: str | None = None,
                 page_limit: int = 5, time_limit: float = 30.0, batch: int = 500, leader_ttl: float = 10.0,
                 node_timeout: float | None = None) -> None:
        self.store, self.keys = store, store.keys
        self.splitter = splitter
        self.allocation, self.modification, self.recall = allocation, modification, recall
        self.control_id = control_id or f"{socket.gethostname()}-{os.getpid()}"
        self.page_limit, self.time_limit = page_limit, time_limit
        self.batch, self.leader_ttl = batch, leader_ttl
        self.node_timeout = recall.threshold if node_timeout is None else node_timeout
        self.estimates = EstimateCache(store)  # renewed every tick
        self.now = 0.0  # Redis time at the start of the current tick
        self.is_leader = False

    @classmethod
    def from_crawler(cls, crawler: Any) -> Control:
        c = config_for(crawler)
        try:
            splitter = load_object(c.splitter) if c.splitter else None
        except (ImportError, NameError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"SCHEDEXT_SPLITTER: cannot load {c.splitter!r}: {exc}") from exc
        return cls(
            Store(redis_from_settings(crawler.settings), Keys(c.prefix)), splitter=splitter,
            allocation=load_strategy(crawler, "SCHEDEXT_ALLOCATION"),
            modification=load_strategy(crawler, "SCHEDEXT_MODIFICATION"),
            recall=load_strategy(crawler, "SCHEDEXT_RECALL"),
            control_id=c.control_id, page_limit=c.page_limit, time_limit=c.time_limit, batch=c.tick_batch,
            leader_ttl=c.leader_ttl, node_timeout=c.node_timeout)

    # --- the tick --------------------------------------------------------------------------------------------------
    def tick(self) -> TickResult:
        leader = self.store.lead(self.control_id, self.leader_ttl)
        if leader != self.is_leader:
            logger.info("control %s is now %s", self.control_id, "the leader" if leader else "on standby")
            self.is_leader = leader
        result = TickResult(leader)
        if not leader:
            return result
        self.estimates = EstimateCache(self.store)
        now = self.now = self.store.now()  # one Redis time per tick: the time stamps of its decisions
        self._split(result)
        self._reports(result)
        self._failures(result)
        self._lapsed_leases(result, now)
        self._stale_queued(result, now)
        self._dead_nodes(result, now)
        self._allocate(result, now)
        return result

    def resign(self) -> None:
        """Give up the leader lease at once (on a clean stop), so a standby need not wait for it to lapse."""
        if self.is_leader:
            self.store.resign(self.control_id)
            self.is_leader = False

    # --- helpers -----------------------------------------------------------------------------------------------
    def _oldest(self, key: str) -> Iterator[tuple[str, list[Any]]]:
        """Up to a batch of the list's entries, oldest first, each with the guard that consumes exactly it.

        An entry is only looked at here; the commit that acts on it pops it (``tail_is``), so a control that dies
        between the two leaves it for the next tick, and one that loses the race to another control changes nothing.
        """
        for _ in range(self.batch):
            raw = self.store.redis.lindex(key, -1)
            if raw is None:
                return
            yield raw, ["tail_is", key, raw]

    def _ids(self, n: int) -> list[str]:
        last = int(self.store.redis.incrby(self.keys.seq, n))
        return [str(i) for i in range(last - n + 1, last + 1)]

    def _dead_entry(self, dead_id: str, **entry: Any) -> list[Any]:
        """The write that puts one entry (docs/redis-keys.md, dead-letter entries) on the dead-letter list."""
        entry = {"v": 1, "id": dead_id, "at": self.now, **entry}
        return ["hset", self.keys.dead, dead_id, json.dumps(entry, ensure_ascii=False)]

    def _dead_letter(self, src_guard: list[Any], dead_id: str, entry: dict[str, Any],
                     extra: list[list[Any]] | None = None) -> bool:
        return bool(self.store.commit([src_guard], [self._dead_entry(dead_id, **entry), *(extra or [])]))

    def _new_subtask_writes(self, st: Subtask) -> list[list[Any]]:
        return [["hset", self.keys.subtasks, st.id, st.to_json()], ["zadd", self.keys.waiting, st.priority, st.id]]

    # --- 1. split injected virtual tasks ---------------------------------------------------------------------
    def _split(self, result: TickResult) -> None:
        k = self.keys
        for raw, guard in self._oldest(k.virtual):
            try:
                if self.splitter is None:
                    raise ConfigurationError("SCHEDEXT_SPLITTER is not set: cannot split virtual tasks")
                specs = self.splitter(raw)
            except (InvalidInput, ConfigurationError) as exc:
                vid = "v" + self._ids(1)[0]
                self._dead_letter(guard, vid, {"kind": "virtual", "reason": str(exc), "raw": raw[:2000],
                                               "attempts": 0, "last_node": None},
                                  [["hincrby", k.counters, "malformed_virtual", 1]])
                result.dead += 1
                logger.warning("virtual task dead-lettered as %s: %s", vid, exc)
                continue
            ids = self._ids(2 * len(specs))
            writes: list[list[Any]] = []
            now = self.now
            for i, spec in enumerate(specs):
                tid, sid = ids[2 * i], ids[2 * i + 1]
                prio = spec.get("priority")
                task = Task(id=tid, site=spec["site"], group=spec.get("group", ""), type=int(spec.get("type", 0)),
                            priority=float(tid) if prio is None else float(prio), payload=spec.get("payload", {}),
                            page_limit=self.page_limit, time_limit=self.time_limit)
                st = Subtask(id=sid, task=tid, site=task.site, group=task.group, type=task.type,
                             priority=task.priority, first_page=0, page_limit=self.page_limit,
                             time_limit=self.time_limit, since=now, payload=task.payload)
                writes += [["hset", k.tasks, tid, task.to_json()], *self._new_subtask_writes(st),
                           ["hincrby", k.progress, f"{task.group}|tasks", 1]]
            writes.append(["hincrby", k.counters, "virtual_tasks", 1])
            writes.append(["hincrby", k.counters, "tasks", len(specs)])
            if self.store.commit([guard], writes):
                result.split += 1

    # --- 2. modification: reports of finished subtasks -----------------------------------------------------
    def _reports(self, result: TickResult) -> None:
        k = self.keys
        for raw, guard in self._oldest(k.sleeping):
            try:
                report = Report.from_json(raw)
            except InvalidInput as exc:
                self._dead_letter(guard, "r" + self._ids(1)[0], {"kind": "report", "reason": str(exc),
                                                                 "raw": raw[:2000], "attempts": 0,
                                                                 "last_node": None})
                result.dead += 1
                continue
            if self.store.commit([guard], self._advance(report)):
                result.reports += 1

    def _advance(self, report: Report, *, abandoned: bool = False) -> list[list[Any]]:
        """Writes that record ``report`` on its task and, if pages remain, queue the task's next subtask."""
        k, st = self.keys, report.subtask
        writes: list[list[Any]] = [["hincrby", k.counters, "reports", 1]]
        raw_task = self.store.redis.hget(k.tasks, st.task)
        if raw_task is None:  # a subtask pushed by hand, with no task record: nothing to continue
            return writes
        try:
            task = Task.from_json(raw_task)
        except InvalidInput as exc:  # a corrupt task record: keep it for inspection, continue nothing
            logger.error("task %s: %s; its next subtask is not made", st.task, exc)
            return [*writes, ["hincrby", k.counters, "corrupt_tasks", 1]]
        if task.done:
            return writes
        task.subtasks += 1
        task.collected += report.collected
        task.last_node = report.node
        if report.reported is not None:
            task.reported = report.reported
        if report.total_pages is not None:
            task.total_pages = report.total_pages
        next_page = st.first_page + st.page_limit if abandoned else max(report.next_page, st.first_page)
        task.next_page = max(task.next_page, next_page)
        if report.exhausted or (task.total_pages is not None and task.next_page >= task.total_pages):
            task.done = True
            writes.append(["hincrby", k.progress, f"{task.group}|done", 1])
            writes.append(["hincrby", k.counters, "tasks_done", 1])
        else:
            chosen = self.modification.next_limits(report, self.estimates)
            # "Modified": the strategy chose other limits than the task's last ones (not a recall's remainder of a
            # slice, nor the cut to the pages left at the end of the results).
            if chosen != (task.page_limit, task.time_limit):
                writes.append(["hincrby", k.node_counters(report.node), "modified", 1])
            pages, limit = chosen
            if task.total_pages is not None:
                pages = max(1, min(pages, task.total_pages - task.next_page))
            nid = self._ids(1)[0]
            nxt = Subtask(id=nid, task=task.id, site=task.site, group=task.group, type=task.type,
                          priority=task.priority, first_page=task.next_page, page_limit=pages, time_limit=limit,
                          prev_node=report.node, since=self.now, payload=task.payload)
            task.page_limit, task.time_limit = chosen
            writes += self._new_subtask_writes(nxt)
        writes.append(["hset", k.tasks, task.id, task.to_json()])
        return writes

    # --- 3. recall ------------------------------------------------------------------------------------------------
    def _recall_writes(self, st: Subtask, node: str | None, reason: str, decision: RecallDecision
                       ) -> list[list[Any]]:
        """Writes that requeue ``st`` (attempt + 1, avoiding ``node``) or dead-letter it."""
        k = self.keys
        writes: list[list[Any]] = []
        who = node or "?"
        if decision is RecallDecision.DEAD:
            writes += [self._dead_entry(st.id, kind="subtask", reason=reason, attempts=st.attempt + 1,
                                        last_node=node, subtask=json.loads(st.to_json())),
                       ["hdel", k.subtasks, st.id], ["hincrby", k.node_counters(who), "dead", 1],
                       ["hincrby", k.node_counters(who), "recalled", 1]]
        else:
            avoid = list(dict.fromkeys([*st.avoid, *([node] if node else [])]))[-3:]
            again = Subtask(**{**st.__dict__, "attempt": st.attempt + 1, "avoid": avoid, "node": None,
                               "prev_node": node or st.prev_node, "since": self.now})
            writes += self._new_subtask_writes(again)
            writes.append(["hincrby", k.node_counters(who), "recalled", 1])
        return writes

    def _failures(self, result: TickResult) -> None:
        k = self.keys
        for raw, guard in self._oldest(k.failed):
            try:
                report = Report.from_json(raw)
            except InvalidInput as exc:
                try:
                    obj = loads_object(raw, "failure")
                except InvalidInput:
                    obj = {}
                reason = str(obj.get("reason") or exc)
                did = str(obj.get("id") or "") or "f" + self._ids(1)[0]
                self._dead_letter(guard, did, {"kind": "malformed", "reason": reason, "raw": raw[:2000],
                                               "attempts": 0, "last_node": obj.get("node")},
                                  [["hdel", k.subtasks, did]])
                result.dead += 1
                continue
            st = report.subtask
            if "malformed" in st.payload:  # the node could not read it: no retry can help, a person must look
                decision = RecallDecision.DEAD
            else:
                decision = self.recall.decide(st, report.node, report.reason, failed=True)
            end = st.first_page + st.page_limit
            if decision is RecallDecision.ABANDON:
                writes = self._advance(report, abandoned=True)
            elif decision is RecallDecision.REQUEUE and st.first_page < report.next_page < end:
                # The pages before the failure were crawled and stored: recall only the rest of the slice.
                rest = Subtask(**{**st.__dict__, "first_page": report.next_page, "page_limit": end - report.next_page})
                writes = self._recall_writes(rest, report.node, f"failed on {report.node}: {report.reason}", decision)
            else:
                writes = self._recall_writes(st, report.node, f"failed on {report.node}: {report.reason}", decision)
            if self.store.commit([guard], writes):
                result.recalled += 1
                result.dead += decision is RecallDecision.DEAD

    def _lapsed_leases(self, result: TickResult, now: float) -> None:
        k = self.keys
        ids = self.store.redis.zrangebyscore(k.leases, "-inf", now, start=0, num=self.batch)
        if not ids:
            return
        with self.store.redis.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.hget(k.lease_info, sid)
                pipe.hget(k.subtasks, sid)
            rows = pipe.execute()
        for i, sid in enumerate(ids):
            lease_raw, st_raw = rows[2 * i], rows[2 * i + 1]
            if lease_raw is None:
                self.store.redis.zrem(k.leases, sid)  # orphan deadline entry: nothing to recall
                continue
            try:
                lease = json.loads(lease_raw)
                guard = ["lease_is", k.lease_info, k.leases, sid, lease["token"]]
            except (ValueError, KeyError, TypeError):  # not a lease we wrote: drop the deadline, keep the info
                logger.error("lease of %s is unreadable: %r", sid, lease_raw[:200])
                self.store.redis.zrem(k.leases, sid)
                continue
            try:
                st = Subtask.from_json(st_raw or "null")
            except InvalidInput as exc:
                self._dead_letter(guard, sid, {"kind": "lease", "reason": f"leased subtask unreadable: {exc}",
                                               "attempts": 0, "last_node": lease.get("node")})
                continue
            reason = f"lease expired on {lease['node']} (no finish before its deadline)"
            decision = self.recall.decide(st, lease["node"], reason, failed=False)
            if decision is RecallDecision.KEEP:
                continue
            if self.store.commit([guard], self._recall_writes(st, lease["node"], reason, decision)):
                result.recalled += 1
                result.dead += decision is RecallDecision.DEAD

    def _stale_queued(self, result: TickResult, now: float) -> None:
        k = self.keys
        ids = self.store.redis.zrangebyscore(k.queued, "-inf", now - self.recall.threshold, start=0,
                                             num=self.batch)
        for sid in ids:
            raw = self.store.redis.hget(k.subtasks, sid)
            try:
                st = Subtask.from_json(raw or "null")
            except InvalidInput:  # no readable record: the crawl queue entry, if any, goes to `failed` on take
                self.store.redis.zrem(k.queued, sid)
                continue
            self._recall_queued(result, st, raw, f"not taken by {st.node} within {self.recall.threshold:.0f} s")

    def _recall_queued(self, result: TickResult, st: Subtask, raw: str, reason: str) -> None:
        k = self.keys
        decision = self.recall.decide(st, st.node, reason, failed=False)
        if decision is RecallDecision.KEEP or st.node is None:
            return
        writes = [["zrem", k.queued, st.id], *self._recall_writes(st, st.node, reason, decision)]
        if self.store.commit([["lrem", k.crawl(st.node), raw]], writes):
            result.recalled += 1
            result.dead += decision is RecallDecision.DEAD

    def _dead_nodes(self, result: TickResult, now: float) -> None:
        k = self.keys
        cutoff = now - self.node_timeout
        for node in self.store.redis.zrangebyscore(k.node_seen, "-inf", cutoff, start=0, num=self.batch):
            for raw in self.store.redis.lrange(k.crawl(node), 0, -1):
                try:
                    st = Subtask.from_json(raw)
                except InvalidInput:
                    continue  # a malformed entry: left for the node or a later tick to move to `failed`
                self._recall_queued(result, st, raw, f"node {node} stopped heartbeating")
            self.store.commit([["zscore_le", k.node_seen, node, cutoff]],
                              [["hdel", k.nodes, node], ["zrem", k.node_seen, node]])
            result.notes.append(f"node {node} lapsed")
            logger.warning("node %s stopped heartbeating; its queued work was recalled", node)

    # --- 4. allocation --------------------------------------------------------------------------------------
    def live_nodes(self, now: float) -> list[NodeView]:
        k = self.keys
        ids = self.store.redis.zrangebyscore(k.node_seen, now - self.node_timeout, "+inf")
        if not ids:
            return []
        with self.store.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(k.nodes, ids)
            for nid in ids:
                pipe.llen(k.crawl(nid))
            rows = pipe.execute()
        nodes = []
        for nid, raw, queued in zip(ids, rows[0], rows[1:], strict=True):
            if raw is None:
                continue
            info = json.loads(raw)
            free = max(0, int(info.get("prefetch", 1)) - int(queued))
            nodes.append(NodeView(id=nid, types=[int(t) for t in info.get("type", [0])],
                                  address=info.get("address"), free=free, info=info))
        return nodes

    def _allocate(self, result: TickResult, now: float) -> None:
        k = self.keys
        nodes = self.live_nodes(now)
        total_free = sum(n.free for n in nodes)
        if not total_free:
            return
        window = min(self.batch, max(32, 4 * total_free))
        ids = self.store.redis.zrange(k.waiting, 0, window - 1)
        if not ids:
            return
        raws = self.store.redis.hmget(k.subtasks, ids)
        subtasks: list[Subtask] = []
        for sid, raw in zip(ids, raws, strict=True):
            try:
                subtasks.append(Subtask.from_json(raw or "null"))
            except InvalidInput as exc:
                self._dead_letter(["zrem", k.waiting, sid], sid, {"kind": "waiting", "reason": str(exc),
                                                                  "attempts": 0, "last_node": None})
                result.dead += 1
        self.estimates.prefetch({st.site for st in subtasks}, {(st.group, st.site) for st in subtasks})
        assignments = self.allocation.allocate(subtasks, nodes, self.estimates, now)
        if not assignments:
            return
        with self.store.redis.pipeline(transaction=False) as pipe:
            for st, nid in assignments:
                moved = st.prev_node is not None and st.prev_node != nid
                placed = Subtask(**{**st.__dict__, "node": nid})
                raw = placed.to_json()
                writes: list[list[Any]] = [["hset", k.subtasks, st.id, raw], ["lpush", k.crawl(nid), raw],
                                           ["zadd", k.queued, now, st.id]]
                if moved:
                    writes += [["hincrby", k.node_counters(str(st.prev_node)), "moved_out", 1],
                               ["hincrby", k.node_counters(nid), "moved_in", 1]]
                self.store.commit([["zrem", k.waiting, st.id]], writes, pipe=pipe)
            result.allocated += sum(1 for ok in pipe.execute() if ok)


class ControlExtension:
    """Runs :class:`Control` on a timer inside a Scrapy process and keeps it open (the control spider).

    Enabled by ``SCHEDEXT_CONTROL_ENABLED`` (the control spider turns it on); ``SCHEDEXT_TICK_INTERVAL`` seconds
    between ticks. Stats: ``schedext/control/ticks``, ``.../split``, ``.../reports``, ``.../recalled``,
    ``.../dead``, ``.../allocated``, ``schedext/control/errors``.
    """

    def __init__(self, crawler: Any, control: Control, interval: float) -> None:
        self.crawler, self.control, self.interval = crawler, control, interval
        self.stats = crawler.stats
        self._loop: Any = None
        self._ticking = False
        crawler.signals.connect(self.opened, signal=signals.spider_opened)
        crawler.signals.connect(self.closed, signal=signals.spider_closed)
        crawler.signals.connect(self.idle, signal=signals.spider_idle)

    @classmethod
    def from_crawler(cls, crawler: Any) -> ControlExtension:
        config = config_for(crawler)
        if not config.control_enabled:
            raise NotConfigured("SCHEDEXT_CONTROL_ENABLED is off")
        return cls(crawler, Control.from_crawler(crawler), config.tick_interval)

    def opened(self) -> None:
        self._loop = create_looping_call(self.tick)
        self._loop.start(self.interval, now=True)
        logger.info("control %s ticking every %.1f s on %s", self.control.control_id, self.interval,
                    self.control.keys.prefix)

    def tick(self) -> None:
        """Run one tick in a worker thread (its Redis calls never block the reactor); skip if one is running."""
        if self._ticking:
            return
        self._ticking = True
        d = threads.deferToThread(self._tick)
        d.addBoth(self._ticked)

    def _tick(self) -> TickResult | None:
        try:
            return self.control.tick()
        except redis.RedisError as exc:  # Redis away for a moment: try again next tick, lose nothing
            logger.error("control tick failed: %s", exc)
        except Exception:
            # A bug or an unforeseen record must not stop the loop for good (the spider would stay open and
            # schedule nothing). Every decision is a guarded commit, so a half-done tick left nothing torn.
            logger.exception("control tick failed; trying again next tick")
        return None

    def _ticked(self, r: TickResult | None) -> None:
        self._ticking = False
        if r is None:
            self.stats.inc_value("schedext/control/errors")
            return
        self.stats.inc_value("schedext/control/ticks")
        for name in ("split", "reports", "recalled", "dead", "allocated"):
            if getattr(r, name):
                self.stats.inc_value(f"schedext/control/{name}", getattr(r, name))

    def idle(self) -> None:
        raise DontCloseSpider

    def closed(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        try:
            self.control.resign()
        except redis.RedisError as exc:
            logger.warning("could not resign the leader lease (%s); it lapses by itself", exc)
