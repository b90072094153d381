"""The control loop: split, modify, recall and allocate, one tick at a time (docs/control.md).

A tick is three steps:

1. **read** (:meth:`Control.read`): one thin Redis layer takes a :class:`Snapshot` of what the tick needs (the
   oldest entries of ``virtual``, ``sleeping`` and ``failed``, lapsed leases, stale crawl-queue entries, silent
   nodes, live nodes and their free slots, a window of ``waiting``). Nothing is decided on a half-read state: a
   Redis error here fails the tick before any decision.
2. **decide** (:func:`decide`): a pure function of the snapshot, the strategies and the time, returning
   :class:`Decision` objects. Any exception while decoding, splitting, validating or deciding about *one* entry
   becomes a dead-letter decision for that entry (reason and raw bytes, safely shown); the others go on.
3. **apply** (:meth:`Control.apply`): every decision is one guarded :meth:`Store.commit`, guarded by the state it
   was made from (the entry still at the tail of its list, the lease token unchanged, the subtask still waiting),
   so a decision is applied exactly once even if two controls overlap for a moment or one dies half-way.

One control is active at a time: each tick starts by taking or renewing the leader lease (``leader`` key,
``SCHEDEXT_LEADER_TTL``); a standby ticks idly until the lease lapses, then takes over.

A tick costs in proportion to the work that changed: at most ``SCHEDEXT_TICK_BATCH`` entries per input, a window
of waiting subtasks sized by the free crawl-queue slots, and only the estimates that changed since the last tick
(``est:dirty``); never a scan of a queue.

Settings (through :class:`~scheduler_ext.config.Config`): ``SCHEDEXT_TICK_INTERVAL``, ``SCHEDEXT_TICK_BATCH``,
``SCHEDEXT_TICK_ALARM``, ``SCHEDEXT_LEADER_TTL``, ``SCHEDEXT_SPLITTER``, ``SCHEDEXT_ALLOCATION``,
``SCHEDEXT_MODIFICATION``, ``SCHEDEXT_RECALL``, ``SCHEDEXT_PAGE_LIMIT``, ``SCHEDEXT_TIME_LIMIT``,
``SCHEDEXT_RECALL_AGE``, ``SCHEDEXT_NODE_TIMEOUT``, ``SCHEDEXT_LEASE_TTL``, ``SCHEDEXT_MAX_ENTRY_BYTES``,
``SCHEDEXT_BACKOFF_MAX``, ``SCHEDEXT_PREFIX``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol

import redis
from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.asyncio import call_later, create_looping_call
from scrapy.utils.misc import load_object
from twisted.internet import threads

from .config import Config, backoff, config_for
from .connection import redis_from_settings
from .exceptions import ConfigurationError, InvalidInput
from .keys import Keys
from .models import Report, Subtask, Task, loads_object
from .store import Guard, Store, Write, wrong_type
from .strategies import Allocation, Estimate, Estimates, Modification, NodeView, Recall, RecallDecision, load_strategy
from .strategies.posterior import SiteSums, Sums

logger = logging.getLogger(__name__)

Splitter = Callable[[str], list[dict[str, Any]]]

SHOWN_CHARS = 2000  # characters of an entry a dead letter shows when it cannot keep the entry whole
# A lease deadline is at most SCHEDEXT_LEASE_TTL ahead of the Redis time it was written at (take.lua, heartbeat.lua).
# One more than this many lease TTLs ahead (set by hand, or a server clock gone back that far) is none a script
# wrote: it counts as lapsed, or it would never lapse and its subtask would be stuck for ever. Generous, so that a
# clock that went back a little recalls no lease that is still held.
LEASE_HORIZON = 10
KEPT_CHARS = 65_536  # a valid UTF-8 entry up to this long is kept whole in its dead letter (so it can be requeued)


# --- estimates ----------------------------------------------------------------------------------------------------
class EstimateCache:
    """Run-control estimates, read from the estimate hashes (one per site and one per (product, site), a field per
    node) and kept across ticks: each tick re-reads only the fields the finish script marked in ``est:dirty``.

    Implements :class:`~scheduler_ext.strategies.Estimates`, plus :meth:`site_figures` and :meth:`group_figures`
    (every node's figures at once) that let allocation rank nodes once per site instead of once per subtask.
    A miss loads the hash (one round trip); the read step prefetches what a tick will need so that deciding
    does not wait on Redis. :meth:`reset` forgets everything (a control that regains the lead, or after a Redis
    error: the server may have restarted from an older state).
    """

    MAX_GROUPS = 200_000  # (product, site) hashes kept, at most; the oldest are forgotten first

    def __init__(self, store: Store) -> None:
        self.store = store
        self._sites: dict[str, dict[str, tuple[Estimate | None, Estimate | None]]] = {}  # site -> node -> (c, spp)
        self._groups: dict[tuple[str, str], dict[str, Estimate | None]] = {}  # (group, site) -> node -> spp
        # The bandit's sums (scheduler_ext/strategies/posterior.py), parsed from the same fields.
        self._site_sums: dict[str, SiteSums] = {}
        self._group_sums: dict[tuple[str, str], dict[str, Sums]] = {}
        self.reads = 0  # hashes or fields read from Redis, for benchmarks and tests

    def reset(self) -> None:
        self._sites.clear()
        self._groups.clear()
        self._site_sums.clear()
        self._group_sums.clear()

    def changed(self, members: Iterable[str]) -> list[tuple[str, Any, str]]:
        """The fields that ``est:dirty`` members name, of the hashes held, as (kind, site or (product, site),
        node); the others are read whole when first needed."""
        fields: list[tuple[str, Any, str]] = []
        for member in members:
            parts = member.split("|", 3)
            if len(parts) == 3 and parts[0] == "s" and parts[2] in self._sites:
                fields.append(("s", parts[2], parts[1]))
            elif len(parts) == 4 and parts[0] == "g" and (parts[3], parts[2]) in self._groups:
                fields.append(("g", (parts[3], parts[2]), parts[1]))
        return fields

    def queue_reads(self, fields: Sequence[tuple[str, Any, str]], pipe: Any) -> None:
        """Queue on ``pipe`` the reads of these fields (their rows go to :meth:`update`, in order)."""
        keys = self.store.keys
        for kind, what, node in fields:
            pipe.hget(keys.est_site(what) if kind == "s" else keys.est_group_site(*what), node)

    def update(self, fields: Sequence[tuple[str, Any, str]], rows: Sequence[str | None]) -> None:
        """Take in the fields :meth:`changed` named, as read again (``rows``, in the same order)."""
        if not fields:
            return
        self.reads += len(fields)
        # Copy on write: a changed site gets a new mapping, which is how allocation knows to re-rank its nodes (the
        # nodes that changed only: SiteSums).
        sites = {what: dict(self._sites[what]) for kind, what, _ in fields if kind == "s"}
        site_sums = {what: self._site_sums[what].successor() if what in self._site_sums else SiteSums()
                     for what in sites}
        for (kind, what, node), raw in zip(fields, rows, strict=True):
            e = _parse_one(raw)
            sums = _sums(e)
            if kind == "s":
                sites[what][node] = (_estimate(e, "c"), _estimate(e, "spp"))
                site_sums[what].put(node, sums)
            elif e is None:  # gone: the finish script keeps the most recent GROUP_NODES nodes' figures
                self._groups[what].pop(node, None)
                self._group_sums.get(what, {}).pop(node, None)
            else:
                self._groups[what][node] = _estimate(e, "spp")
                _put(self._group_sums.setdefault(what, {}), node, sums)
        self._sites.update(sites)
        self._site_sums.update(site_sums)

    def prefetch(self, sites: Iterable[str], group_sites: Iterable[tuple[str, str]]) -> None:
        """Load the estimate hashes of these sites and (product, site) pairs not loaded yet, in one round trip
        (plus one to learn which pairs have a hash at all: most products have none yet)."""
        keys = self.store.keys
        sites = [s for s in set(sites) if s not in self._sites]
        groups = [g for g in set(group_sites) if g not in self._groups]
        if groups:
            exist = self.store.redis.smismember(keys.est_groups, [f"{g}|{s}" for g, s in groups])
            for gs, there in zip(groups, exist, strict=True):
                if not there:
                    self._groups[gs] = {}
            groups = [gs for gs, there in zip(groups, exist, strict=True) if there]
        if not sites and not groups:
            return
        with self.store.redis.pipeline(transaction=False) as pipe:
            for site in sites:
                pipe.hgetall(keys.est_site(site))
            for group, site in groups:
                pipe.hgetall(keys.est_group_site(group, site))
            rows = pipe.execute()
        self.reads += len(rows)
        for site, fields in zip(sites, rows, strict=False):
            parsed = {node: e for node, raw in fields.items() if (e := _parse_one(raw)) is not None}
            self._sites[site] = {node: (_estimate(e, "c"), _estimate(e, "spp")) for node, e in parsed.items()}
            self._site_sums[site] = SiteSums({node: s for node, e in parsed.items() if (s := _sums(e)) is not None})
        for gs, fields in zip(groups, rows[len(sites):], strict=True):
            parsed = {node: e for node, raw in fields.items() if (e := _parse_one(raw)) is not None}
            self._groups[gs] = {node: _estimate(e, "spp") for node, e in parsed.items()}
            self._group_sums[gs] = {node: s for node, e in parsed.items() if (s := _sums(e)) is not None}
        while len(self._groups) > self.MAX_GROUPS:
            oldest = next(iter(self._groups))
            del self._groups[oldest]
            self._group_sums.pop(oldest, None)

    # --- the Estimates protocol ----------------------------------------------------------------------------
    def completion(self, site: str, node: str) -> Estimate | None:
        entry = self.site_figures(site).get(node)
        return entry[0] if entry else None

    def seconds_per_page(self, group: str, site: str, node: str) -> Estimate | None:
        spp = self.group_figures(group, site).get(node)
        if spp is not None:
            return spp
        entry = self.site_figures(site).get(node)
        return entry[1] if entry else None

    # --- every node at once (used by DynamicAllocation when present) ---------------------------------------
    def site_figures(self, site: str) -> dict[str, tuple[Estimate | None, Estimate | None]]:
        """node -> (completion, site-wide seconds per page) for every node with figures on ``site``."""
        if site not in self._sites:
            self.prefetch([site], [])
        return self._sites[site]

    def group_figures(self, group: str, site: str) -> dict[str, Estimate | None]:
        """node -> seconds per page for this (product, site), for the nodes that have one."""
        if (group, site) not in self._groups:
            self.prefetch([], [(group, site)])
        return self._groups[(group, site)]

    # --- the bandit's sums (the EstimateSums protocol) -------------------------------------------------------
    def site_sums(self, site: str) -> Mapping[str, Sums]:
        if site not in self._sites:
            self.prefetch([site], [])
        return self._site_sums.setdefault(site, SiteSums())

    def group_sums(self, group: str, site: str) -> Mapping[str, Sums]:
        key = (group, site)
        if key not in self._groups:
            self.prefetch([], [key])
        return self._group_sums.get(key, _NO_SUMS)  # most products have none: no empty dict kept for each


_NO_SUMS: Mapping[str, Sums] = MappingProxyType({})


def _sums(entry: dict[str, Any] | None) -> Sums | None:
    return None if entry is None else Sums.from_entry(entry)


def _put(per_node: dict[str, Sums], node: str, sums: Sums | None) -> None:
    if sums is None:
        per_node.pop(node, None)
    else:
        per_node[node] = sums


def _parse_one(raw: str | None) -> dict[str, Any] | None:
    """``raw`` (an estimate field, a registry entry) as a JSON object; None if missing or anything else (a record
    we did not write)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _estimate(entry: dict[str, Any] | None, name: str) -> Estimate | None:
    if entry is None:
        return None
    try:
        value = entry.get(name)
        if value is None:
            return None
        est = Estimate(float(value), int(entry.get("runs") or 0), float(entry.get("last") or 0))
    except (TypeError, ValueError):
        return None
    # a number no finish writes (NaN, Infinity, a negative completion or pace: a hand edit) is no data
    return est if 0 <= est.value < math.inf and math.isfinite(est.last_run) else None


# --- the snapshot ---------------------------------------------------------------------------------------------
class IdSource(Protocol):
    """Fresh ids for tasks, subtasks and dead letters: the one thing :func:`decide` asks of the outside world."""

    def take(self, n: int) -> list[str]:
        """``n`` ids never handed out before (gaps are harmless)."""


#: Ids a control reserves from ``seq`` at a time (:class:`StoreIds`).
ID_BLOCK = 32


class StoreIds:
    """Ids from the deployment's ``seq`` counter, reserved :data:`ID_BLOCK` at a time: a tick that makes a subtask
    for each of its reports asked Redis once for each (a round trip within the tick, on every task's path from one
    subtask to the next). Ids a control reserved and did not hand out before it stopped are a gap, which is
    harmless: ids grow and never repeat."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool: list[str] = []

    def take(self, n: int) -> list[str]:
        if len(self._pool) < n:
            self._pool += self.store.reserve_ids(max(n - len(self._pool), ID_BLOCK))
        taken, self._pool = self._pool[:n], self._pool[n:]
        return taken


class CountingIds:
    """Ids from a local counter (simulations and tests of :func:`decide`)."""

    def __init__(self, start: int = 0) -> None:
        self.last = start

    def take(self, n: int) -> list[str]:
        self.last += n
        return [str(i) for i in range(self.last - n + 1, self.last + 1)]


@dataclass(frozen=True)
class Entry:
    """One entry of an input list as read: ``raw`` (cut if ``sha1`` is set: the entry was too long), its size."""

    key: str
    raw: str
    size: int
    sha1: str = ""
    report: Report | None = None  # the report itself, decoded already (the simulator's object path); else raw

    @property
    def whole(self) -> bool:
        return not self.sha1

    @property
    def guard(self) -> Guard:
        """The guard that consumes exactly this entry (it must still be the oldest of its list)."""
        return Guard.tail_sha1_is(self.key, self.sha1) if self.sha1 else Guard.tail_is(self.key, self.raw)


@dataclass(frozen=True)
class LapsedLease:
    sid: str
    lease: str | None  # lease_info JSON
    subtask: str | None  # subtasks JSON
    beyond: float = math.inf  # a deadline after this is no time a script wrote: lapsed too (LEASE_HORIZON)


@dataclass(frozen=True)
class SilentNode:
    """A node whose last heartbeat is older than the node timeout (``cutoff``), or further ahead than a clock can
    be wrong (``beyond``: the node timeout ahead), with its crawl queue."""

    node: str
    cutoff: float
    queue: list[str]
    beyond: float = math.inf


@dataclass
class Snapshot:
    """What one tick reads, all of it before any decision. Built by :meth:`Control.read`, or by hand (simulator)."""

    keys: Keys
    now: float
    estimates: Estimates
    ids: IdSource
    virtual: list[Entry] = field(default_factory=list)  # oldest first
    reports: list[Entry] = field(default_factory=list)  # sleeping, oldest first
    failures: list[Entry] = field(default_factory=list)  # failed, oldest first
    tasks: dict[str, str | Task | None] = field(default_factory=dict)  # task id -> record (or Task), for reports
    lapsed: list[LapsedLease] = field(default_factory=list)
    stale: list[tuple[str, str | None]] = field(default_factory=list)  # (subtask id, record) queued too long
    silent: list[SilentNode] = field(default_factory=list)
    nodes: list[NodeView] = field(default_factory=list)  # live nodes with their free slots
    waiting: list[tuple[str, str | None]] = field(default_factory=list)  # (id, record), priority order
    parsed: dict[str, Subtask] = field(default_factory=dict)  # record -> subtask, decoded already (optional)
    # The simulator's object path: the subtask and task records of the writes are the objects themselves, not
    # their JSON (nothing crosses Redis there); the decisions are the same. The control never sets it.
    objects: bool = False
    more: bool = False  # an input came back as long as a tick reads it (TickRead.more): more of it may wait


@dataclass
class Strategies:
    """The policy :func:`decide` applies: the three strategies, the splitter and the limits of first subtasks."""

    allocation: Allocation
    modification: Modification
    recall: Recall
    splitter: Splitter | None = None
    page_limit: int = 5
    time_limit: float = 30.0
    recall_age: float = 60.0
    max_entry_bytes: int = 1_000_000
    max_split: int = 1_000  # tasks one virtual task may become (one commit writes them all)
    lanes: int = 2  # a task's subtasks out at most (SCHEDEXT_TASK_LANES; beyond one only where its site runs dry)
    idle_lanes: int = 8  # the same while nodes of the cluster idle (SCHEDEXT_TASK_LANES_IDLE: one per idle node)
    window: Callable[[int], int] = lambda free: 32 + 2 * free  # waiting subtasks offered to allocation


@dataclass
class Decision:
    """One guarded commit: applied whole if every guard still holds, else not at all.

    ``kind`` is ``split``, ``report``, ``recall``, ``dead``, ``allocate``, ``forget`` (a silent node) or ``drop``
    (a deadline or queue entry with no record behind it); ``dead`` counts the dead letters it writes.
    """

    kind: str
    guards: list[Guard]
    writes: list[Write]
    subject: str = ""
    dead: int = 0
    note: str = ""


def shown(raw: str, limit: int = SHOWN_CHARS) -> str:
    """``raw`` safe to show and store as UTF-8 JSON: undecodable bytes as ``\\xNN``, cut to ``limit``.

    >>> shown("ok")
    'ok'
    >>> shown(b"\\x80\\x04K".decode("utf-8", "surrogateescape"))
    '\\\\x80\\x04K'
    """
    text = raw.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _is_utf8(raw: str) -> bool:
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class HealthySites:
    """Whether a site is healthy now: most of the runs its nodes ended in the last ``horizon`` seconds finished
    (their sums' failed runs over runs with Jeffreys' prior, ``(fl + 1/2) / (n + 1) < 1/2``, the rule
    :meth:`BanditAllocation._avoidable` judges one pair by). No recent run, or estimates that keep no sums, is not
    healthy: nothing tells. Each site is summed once (the object lives for one tick)."""

    def __init__(self, estimates: Estimates, now: float, horizon: float) -> None:
        self.sums_of = getattr(estimates, "site_sums", None)
        self.now, self.horizon = now, horizon
        self.memo: dict[str, bool] = {}

    def __call__(self, site: str) -> bool:
        if self.sums_of is None:
            return False
        hit = self.memo.get(site)
        if hit is None:
            failed = runs = 0.0
            for s in self.sums_of(site).values():
                if self.now - s.t <= self.horizon:
                    failed += s.fl
                    runs += s.n
            hit = self.memo[site] = (failed + 0.5) / (runs + 1.0) < 0.5
        return hit


def backing_off(recall: Recall, st: Subtask, now: float, healthy: Callable[[str], bool]) -> bool:
    """True while a recalled subtask waits out ``recall``'s retry delay (from its recall, ``since``): allocation
    leaves it in ``waiting``. A strategy that fails or answers no number delays nothing.

    ``healthy`` (:class:`HealthySites`): no delay where the subtask's site is healthy. The delay is for a site's
    passing trouble (a rate limiter, a restart: every node's runs there fail for a while), so that the subtask's
    runs are not all burnt within a second; where most runs there finish, its failures were its nodes' own (errors
    or captchas now and then), its next run on another node is as likely to finish now as later, and a delay only
    holds its task back (docs/strategies.md, "Recall")."""
    if not st.attempt:
        return False
    try:
        delay = float(recall.retry_delay(st))
    except Exception:  # noqa: BLE001 - a plug-in's bug must not hold work back
        logger.warning("recall strategy's retry_delay failed on %s; not delayed", st.id, exc_info=True)
        return False
    return delay > 0 and now < st.since + delay and not healthy(st.site)


def _reason(exc: BaseException) -> str:
    """A dead letter's reason: our own errors as they are, anything else with its type (a bug or a bad plug-in)."""
    if isinstance(exc, (InvalidInput, ConfigurationError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


# --- decide -------------------------------------------------------------------------------------------------------
def decide(snapshot: Snapshot, strategies: Strategies, now: float) -> list[Decision]:
    """Every decision of one tick, in the order they must be applied. Pure but for ``snapshot.ids``.

    Never raises for a bad entry or a failing strategy: what cannot be decided about one entry becomes a
    dead-letter decision for it (its reason, its raw bytes safely shown), and the rest is decided as usual.
    Subtasks created by this tick's splits, reports and recalls are offered to allocation in the same tick.
    """
    return _Decider(snapshot, strategies, now).run()


def ended(k: Keys, task: Task) -> list[Write]:
    """Mark ``task`` done if nothing of it is out and no page is left to give; the writes that count it."""
    if task.open or task.total_pages is None or task.next_page < task.total_pages:
        return []
    task.done = True
    return [Write.hincrby(k.progress, f"{task.group}|done"), Write.hincrby(k.counters, "tasks_done")]


def counted_out(task: Task, st: Subtask) -> Task:
    """``task`` with its subtask ``st`` no longer out (dead-lettered, or its dead letter dropped)."""
    return replace(task, open=max(0, task.open - 1),
                   retrying=max(0, task.retrying - 1) if st.attempt else task.retrying)


class _Decider:
    def __init__(self, snap: Snapshot, strat: Strategies, now: float) -> None:
        self.snap, self.strat, self.now, self.k = snap, strat, now, snap.keys
        self.decisions: list[Decision] = []
        self.fresh: list[Subtask] = []  # subtasks this tick puts into waiting (offered to allocation too)
        self.tasks: dict[str, Task] = {}  # task records this tick changed (set last by _advance: never torn)
        self._undo: dict[str, Task | None] | None = None  # within an isolated call: what its records replaced
        self._split_tasks: set[str] = set()  # tasks a capped placement of this tick split (see _placed)
        self.unexpected = 0  # exceptions other than InvalidInput / ConfigurationError (a bug or a bad plug-in)
        self.views = {n.id: n for n in snap.nodes}
        self._idle_left: int | None = None  # see _take_idle
        self._waiting_sites: set[str] | None = None  # sites with a subtask waiting (see _dry), read when first asked

    def run(self) -> list[Decision]:
        for e in self.snap.virtual:
            self._isolated(partial(self._split, e), self._dead_entry, e, "virtual")
        for e in self.snap.reports:
            self._isolated(partial(self._report, e), self._dead_entry, e, "report")
        for e in self.snap.failures:
            self._isolated(partial(self._failure, e), self._dead_entry, e, "failure")
        for lease in self.snap.lapsed:
            self._isolated(partial(self._lapsed, lease), self._dead_lease, lease)
        for sid, raw in self.snap.stale:
            self._isolated(partial(self._stale, sid, raw), self._dead_stale, sid, raw)
        for silent in self.snap.silent:
            self._silent(silent)
        self._allocate()
        return self.decisions

    def _isolated(self, fn: Callable[[], Decision | list[Decision] | None],
                  on_error: Callable[..., Decision], *args: Any) -> None:
        """Run ``fn`` (which builds decisions without side effects until it returns); any exception becomes
        ``on_error(exc, *args)``: a dead-letter decision for the one entry."""
        fresh, self._undo = len(self.fresh), {}
        try:
            made = fn()
        except Exception as exc:  # noqa: BLE001 - anything about one entry must not stop the tick
            del self.fresh[fresh:]
            for tid, was in self._undo.items():  # the task records as they were before the call
                if was is None:
                    del self.tasks[tid]
                else:
                    self.tasks[tid] = was
            self._undo = None
            if not isinstance(exc, (InvalidInput, ConfigurationError)):
                self.unexpected += 1
                if self.unexpected == 1:  # the traceback once per tick: a plug-in failing on every entry
                    logger.warning("dead-lettering an entry after an unexpected error", exc_info=True)
            self.decisions.append(on_error(exc, *args))
            return
        self._undo = None
        if isinstance(made, Decision):
            self.decisions.append(made)
        elif made:
            self.decisions.extend(made)

    # --- helpers ------------------------------------------------------------------------------------------------
    def _dead_write(self, dead_id: str, **entry: Any) -> Write:
        """The write that puts one entry (docs/redis-keys.md, dead-letter entries) on the dead-letter list."""
        return Write.hset(self.k.dead, dead_id, json.dumps({"v": 1, "id": dead_id, "at": self.now, **entry},
                                                          ensure_ascii=False))

    def _raw_fields(self, raw: str, size: int | None = None, cut: bool = False) -> dict[str, Any]:
        """How a dead letter holds a raw entry: whole if it is UTF-8 and not too long, else shown safely."""
        whole = not cut and _is_utf8(raw) and len(raw) <= KEPT_CHARS
        out: dict[str, Any] = {"raw": raw if whole else shown(raw), "size": size if size is not None else
                               len(raw.encode("utf-8", "surrogateescape"))}
        if not whole:
            out["cut"] = True
        return out

    def _dead_entry(self, exc: BaseException, e: Entry, kind: str) -> Decision:
        """An entry of ``virtual``, ``sleeping`` or ``failed`` that cannot be used, to the dead-letter list."""
        counter = {"virtual": "malformed_virtual", "report": "malformed_reports", "failure": "malformed_failures"}
        prefix = {"virtual": "v", "report": "r", "failure": "f"}[kind]
        dead_id = prefix + self.snap.ids.take(1)[0]
        writes = [self._dead_write(dead_id, kind=kind, reason=_reason(exc), attempts=0, last_node=None,
                                   source=e.key, **self._raw_fields(e.raw, e.size, cut=not e.whole)),
                  Write.hincrby(self.k.counters, counter[kind])]
        return Decision("dead", [e.guard], writes, subject=dead_id, dead=1, note=_reason(exc))

    def _text(self, e: Entry, what: str) -> str:
        if not e.whole:
            raise InvalidInput(f"{what} of {e.size} bytes is longer than SCHEDEXT_MAX_ENTRY_BYTES "
                               f"({self.strat.max_entry_bytes}); not read")
        if not _is_utf8(e.raw):
            raise InvalidInput(f"{what}: not UTF-8 JSON (a pickle or other binary payload?)")
        return e.raw

    def _record(self, obj: Subtask | Task) -> Any:
        """What a write stores for a subtask or task: its JSON, or itself on the object path (Snapshot.objects)."""
        return obj if self.snap.objects else obj.to_json()

    def _waiting_writes(self, st: Subtask) -> list[Write]:
        self.fresh.append(st)
        if self._waiting_sites is not None:
            self._waiting_sites.add(st.site)
        return [Write.hset(self.k.subtasks, st.id, self._record(st)), Write.zadd(self.k.waiting, st.priority, st.id)]

    # --- 1. split -------------------------------------------------------------------------------------------------
    def _split(self, e: Entry) -> Decision:
        raw = self._text(e, "virtual task")
        if self.strat.splitter is None:
            raise ConfigurationError("SCHEDEXT_SPLITTER is not set: cannot split virtual tasks")
        specs = self.strat.splitter(raw)
        if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
            raise InvalidInput(f"SCHEDEXT_SPLITTER returned {type(specs).__name__}, expected a list of task specs")
        if len(specs) > self.strat.max_split:
            raise InvalidInput(f"virtual task splits into {len(specs)} tasks, more than SCHEDEXT_MAX_SPLIT "
                               f"({self.strat.max_split}); split it into smaller virtual tasks")
        k, page_limit, time_limit = self.k, self.strat.page_limit, self.strat.time_limit
        ids = self.snap.ids.take(2 * len(specs))
        writes: list[Write] = []
        for i, spec in enumerate(specs):
            tid, sid = ids[2 * i], ids[2 * i + 1]
            site, group, prio = spec.get("site"), spec.get("group", ""), spec.get("priority")
            payload = spec.get("payload", {})
            if not isinstance(site, str) or not site or not isinstance(group, str) or not isinstance(payload, dict):
                raise InvalidInput(f"task spec {i}: expected site (a non-empty string), group (a string) and "
                                   f"payload (an object), got {spec!r:.200}")
            priority = float(tid) if prio is None else float(prio)
            if not math.isfinite(priority):
                raise InvalidInput(f"task spec {i}: priority {prio!r} is not a finite number")
            task = Task(id=tid, site=site, group=group, type=int(spec.get("type", 0)), priority=priority,
                        payload=payload, next_page=page_limit, page_limit=page_limit, time_limit=time_limit)
            st = Subtask(id=sid, task=tid, site=site, group=group, type=task.type, priority=priority, first_page=0,
                         page_limit=page_limit, time_limit=time_limit, since=self.now, payload=payload)
            self._put(task)
            writes += [Write.hset(k.tasks, tid, task.to_json()), *self._waiting_writes(st),
                       Write.hincrby(k.progress, f"{group}|tasks")]
        writes += [Write.hincrby(k.counters, "virtual_tasks"), Write.hincrby(k.counters, "tasks", len(specs))]
        return Decision("split", [e.guard], writes, subject=f"{len(specs)} tasks")

    # --- 2. reports ---------------------------------------------------------------------------------------------
    def _report(self, e: Entry) -> Decision:
        report = e.report or Report.from_json(self._text(e, "report"))
        return Decision("report", [e.guard], self._advance(report), subject=report.subtask.id)

    def _task(self, tid: str) -> Task | None:
        if tid in self.tasks:
            return self.tasks[tid]
        raw = self.snap.tasks.get(tid)
        return raw if raw is None or isinstance(raw, Task) else Task.from_json(raw)

    def _put(self, task: Task) -> Task:
        """``task`` as this tick's record of its task (what the tick's later entries read); within an isolated
        call, the record it replaces is kept, to be put back if the call fails (:meth:`_isolated`)."""
        if self._undo is not None and task.id not in self._undo:
            self._undo[task.id] = self.tasks.get(task.id)
        self.tasks[task.id] = task
        return task

    def _going(self, tid: str) -> Task | None:
        """The record of task ``tid`` if it goes on: None for no record (a subtask pushed by hand), an unreadable
        one or a finished task."""
        try:
            task = self._task(tid)
        except InvalidInput:
            return None
        return None if task is None or task.done else task

    def _advance(self, report: Report, *, abandoned: bool = False) -> list[Write]:
        """Writes that record ``report`` on its task, give the task back the pages its slice did not crawl and,
        while pages remain, keep its lanes of subtasks out (:meth:`_open`: one, more where its site runs dry for the
        node that reported)."""
        k, st = self.k, report.subtask
        writes = [Write.hincrby(k.counters, "reports")]
        try:
            task = self._task(st.task)
        except InvalidInput as exc:  # a corrupt task record: keep it for inspection, continue nothing
            logger.error("task %s: %s; its next subtask is not made", st.task, exc)
            return [*writes, Write.hincrby(k.counters, "corrupt_tasks")]
        if task is None or task.done:  # a subtask pushed by hand (no task record), or a finished task
            return writes
        task = replace(task, subtasks=task.subtasks + 1, collected=task.collected + report.collected,
                       last_node=report.node, open=max(0, task.open - 1),
                       retrying=max(0, task.retrying - 1) if st.attempt else task.retrying)
        if report.reported is not None:
            task.reported = report.reported
        if report.total_pages is not None:
            task.total_pages = report.total_pages
        # The slice's crawl stopped at ``stop``: from there to its end (its rest included) the pages go back.
        stop, end = (st.first_page + st.page_limit if abandoned else max(report.next_page, st.first_page)), st.end
        if report.exhausted:  # the results end there
            task.total_pages = stop if task.total_pages is None else min(task.total_pages, stop)
        total = math.inf if task.total_pages is None else task.total_pages
        hole = (stop, min(end, total))
        task.next_page = max(task.next_page, end)
        if stop < end and end >= task.next_page:  # the task's last slice so far: the task goes on from its stop
            task.next_page, hole = stop, (stop, stop)
        task.next_page = int(min(task.next_page, total))
        if hole[0] >= hole[1]:
            writes += self._ended(task)
        if not task.done:
            chosen = self.strat.modification.next_limits(report, self.snap.estimates)
            pages, limit = int(chosen[0]), float(chosen[1])
            if pages < 1 or not (limit > 0 and math.isfinite(limit)):
                raise InvalidInput(f"modification strategy chose limits {chosen!r}; expected pages >= 1 and "
                                   "seconds > 0")
            # "Modified": the strategy chose other limits than the task's last ones (not a recall's remainder of
            # a slice, nor the cut to the pages left at the end of the results).
            if (pages, limit) != (task.page_limit, task.time_limit):
                writes.append(Write.hincrby(k.node_counters(report.node), "modified"))
            task.page_limit, task.time_limit = pages, limit
            if hole[0] < hole[1]:  # pages before other subtasks' slices: a subtask of their own
                writes += self._slice(task, hole[0], int(hole[1] - hole[0]), report.node)
            dry = task.total_pages is not None and self._dry(task.site, report.node)  # else one lane: no need to ask
            writes += self._open(task, pages, dry, report.node)
        self._put(task)
        writes.append(Write.hset(k.tasks, task.id, self._record(task)))
        return writes

    def _open(self, task: Task, pages: int, dry: bool, node: str | None) -> list[Write]:
        """Writes that open ``task``'s next slices of ``pages`` pages while fewer of its subtasks are out than its
        lanes: one, until its page count is known and wherever its site does not run dry (``dry``,
        :meth:`_dry`); where it does, ``SCHEDEXT_TASK_LANES``, and up to ``SCHEDEXT_TASK_LANES_IDLE`` one per idle
        node (:meth:`_take_idle`), each plus one while a recalled subtask of the task is out (:meth:`_recalled`;
        ``SCHEDEXT_TASK_LANES = 1`` is the paper's one subtask at a time)."""
        writes: list[Write] = []
        total = math.inf if task.total_pages is None else task.total_pages
        wide = dry and task.total_pages is not None and self.strat.lanes > 1
        beside = int(wide and task.retrying > 0)
        lanes = self.strat.lanes + beside if wide else 1
        idle_lanes = self.strat.idle_lanes + beside if wide else 1
        while task.next_page < total:
            if task.open >= lanes and (task.open >= idle_lanes or not self._take_idle()):
                break
            first, task.next_page = task.next_page, int(min(task.next_page + pages, total))
            writes += self._slice(task, first, task.next_page - first, node)
        return writes

    def _take_idle(self) -> bool:
        """Takes one of this tick's idle nodes for a lane beyond ``SCHEDEXT_TASK_LANES``: False if none is left.
        The idle nodes are the live nodes that hold nothing and have nothing queued, counted at the first ask,
        less the subtasks waiting then (the tick's window and the subtasks it made: work that may go to them now,
        as at a cluster's start)."""
        if self._idle_left is None:
            idle = sum(1 for v in self.views.values() if not v.held and not v.queued and v.free > 0)
            self._idle_left = idle - len(self.snap.waiting) - len(self.fresh)
        if self._idle_left <= 0:
            return False
        self._idle_left -= 1
        return True

    def _recalled(self, st: Subtask, node: str | None, dry: bool) -> list[Write]:
        """Writes that count ``st``, requeued, among its task's recalled subtasks (on its first recall) and, where
        its site runs dry for ``node`` (``dry``, found before ``st`` was requeued), let the task go on beside it
        (:meth:`_open`): a failed run's remainder is mostly a page or two, and the task's lane held for it cost a
        whole turn of the task (a report, a tick, a take) for those pages."""
        task = None if st.attempt else self._going(st.task)
        if task is None:
            return []
        task = self._put(replace(task, retrying=task.retrying + 1))
        writes = self._open(task, task.page_limit or self.strat.page_limit, dry, node)
        return [*writes, Write.hset(self.k.tasks, task.id, self._record(task))]

    def _dry(self, site: str, node: str | None) -> bool:
        """Whether ``site``'s work runs dry for ``node``, which just reported a run there: the node could take more
        (its crawl queue has free slots) and no subtask of the site is waiting (in the tick's window, or made by this
        tick). Only then does a task open lanes beyond its first: where a site has fewer tasks than the nodes
        suited to it have slots, one subtask a task at a time leaves them idle between a run's report and the
        task's next subtask; where its subtasks wait anyway, more of them would only go to worse nodes (on
        bench_quality's captcha worlds, to the nodes answered with captchas: dead letters)."""
        view = self.views.get(node) if node else None
        if view is None or view.free <= 0:
            return False
        if self._waiting_sites is None:
            self._waiting_sites = {st.site for st in self.fresh}
            for sid, raw in self.snap.waiting:
                try:
                    self._waiting_sites.add(self._waiting_subtask(sid, raw).site)
                except InvalidInput:
                    continue  # allocation dead-letters it
        return site not in self._waiting_sites

    def _waiting_subtask(self, sid: str, raw: str | None) -> Subtask:
        """The subtask of a waiting entry: decoded by the read already (``Snapshot.parsed``), or decoded here;
        InvalidInput if its record is not a subtask, or another subtask's."""
        st = self.snap.parsed.get(raw or "") or Subtask.from_json(raw or "null", f"waiting subtask {sid}")
        if st.id != sid:
            raise InvalidInput(f"waiting subtask {sid}: its record holds subtask {st.id!r}")
        return st

    def _slice(self, task: Task, first: int, pages: int, prev_node: str | None) -> list[Write]:
        """Writes that put a new subtask of ``task`` (pages ``[first, first + pages)``) into waiting."""
        task.open += 1
        st = Subtask(id=self.snap.ids.take(1)[0], task=task.id, site=task.site, group=task.group, type=task.type,
                     priority=task.priority, first_page=first, page_limit=pages,
                     time_limit=task.time_limit or self.strat.time_limit, prev_node=prev_node, since=self.now,
                     payload=task.payload)
        return self._waiting_writes(st)

    def _ended(self, task: Task) -> list[Write]:
        return ended(self.k, task)

    def _closed(self, st: Subtask) -> list[Write]:
        """Writes that count ``st`` as no longer out of its task (dead-lettered), and end the task if that was the
        last of it."""
        task = self._going(st.task)
        if task is None:
            return []
        task = self._put(counted_out(task, st))
        return [*self._ended(task), Write.hset(self.k.tasks, task.id, self._record(task))]

    def _closed_raw(self, raw: str | None) -> list[Write]:
        """:meth:`_closed` for a subtask record that may not be one: nothing to count out if it is unreadable.
        (Not for a dead-lettered report or failure: requeued whole, it counts its subtask out itself.)"""
        try:
            st = Subtask.from_json(raw or "null")
        except InvalidInput:
            return []
        return self._closed(st)

    # --- 3. recall ----------------------------------------------------------------------------------------------
    def _recall_writes(self, st: Subtask, node: str | None, reason: str, decision: RecallDecision) -> list[Write]:
        """Writes that requeue ``st`` (attempt + 1, avoiding ``node``) or dead-letter it."""
        k, who = self.k, node or "?"
        if decision is RecallDecision.DEAD:
            return [self._dead_write(st.id, kind="subtask", reason=reason, attempts=st.attempt + 1,
                                     last_node=node, subtask=json.loads(st.to_json())),
                    Write.hdel(k.subtasks, st.id), Write.hincrby(k.node_counters(who), "dead"),
                    Write.hincrby(k.node_counters(who), "recalled"), *self._closed(st)]
        avoid = list(dict.fromkeys([*st.avoid, *([node] if node else [])]))[-3:]
        # recalled whole: the pages an allocation took off it (its rest) come back with it
        again = replace(st, attempt=st.attempt + 1, avoid=avoid, node=None, prev_node=node or st.prev_node,
                        since=self.now, page_limit=st.page_limit + st.rest, rest=0)
        return [*self._waiting_writes(again), Write.hincrby(k.node_counters(who), "recalled")]

    def _recall(self, kind: str, guards: list[Guard], st: Subtask, node: str | None, reason: str, *,
                failed: bool, extra: Sequence[Write] = ()) -> Decision | None:
        decision = self.strat.recall.decide(st, node, reason, failed=failed)
        if not isinstance(decision, RecallDecision):
            raise InvalidInput(f"recall strategy returned {decision!r}, expected a RecallDecision")
        if decision is RecallDecision.KEEP:
            return None
        dry = decision is RecallDecision.REQUEUE and self._dry(st.site, node)
        writes = [*extra, *self._recall_writes(st, node, reason, decision)]
        if decision is RecallDecision.REQUEUE:
            writes += self._recalled(st, node, dry)
        return Decision(kind, guards, writes, subject=st.id, dead=int(decision is RecallDecision.DEAD))

    def _failure(self, e: Entry) -> Decision | None:
        raw = "" if e.report else self._text(e, "failure report")
        try:
            report = e.report or Report.from_json(raw)
        except InvalidInput as exc:  # e.g. the take script's record of an unreadable crawl-queue entry
            try:
                obj = loads_object(raw, "failure")
            except InvalidInput:
                obj = {}
            dead_id = str(obj.get("id") or "") or "f" + self.snap.ids.take(1)[0]
            node = obj.get("node") if isinstance(obj.get("node"), str) else None
            writes = [self._dead_write(dead_id, kind="malformed", reason=str(obj.get("reason") or exc),
                                       attempts=0, last_node=node, **self._raw_fields(raw)),
                      Write.hdel(self.k.subtasks, dead_id)]
            return Decision("dead", [e.guard], writes, subject=dead_id, dead=1, note=str(exc))
        st = report.subtask
        reason = f"failed on {report.node}: {report.reason}"
        if "malformed" in st.payload:  # the node could not read it: no retry can help, a person must look
            return Decision("recall", [e.guard], self._recall_writes(st, report.node, reason, RecallDecision.DEAD),
                            subject=st.id, dead=1)
        end, resume = st.first_page + st.page_limit, self._resumed(report)
        if st.rest:  # the pages after the slice were not crawled: the recalled part runs to its rest's end
            resume = end
        # Pages of the slice were crawled: only the part between them is recalled, smaller than the slice.
        shrinks = report.next_page < end and (st.first_page < report.next_page or resume < end)
        # Such a run moved its subtask on: it is not stuck, and where the recall strategy says so (``Recall.reset``,
        # SCHEDEXT_RECALL_RESET) its count of recalls starts over, so that work crawled a few pages at a time by
        # nodes answered with captchas now and then is not dead-lettered for it. (Each such recall is smaller than
        # the last: a subtask starts over at most as many times as it has pages.)
        moved_on = shrinks and getattr(self.strat.recall, "reset", False) is True
        judged = replace(st, attempt=0) if moved_on and st.attempt else st
        decision = self.strat.recall.decide(judged, report.node, report.reason, failed=True)
        dry = decision is RecallDecision.REQUEUE and self._dry(st.site, report.node)  # before its pages wait again
        if decision is RecallDecision.ABANDON:
            writes = self._advance(report, abandoned=True)
        elif decision is RecallDecision.REQUEUE and shrinks:
            # The pages before the failure were crawled and stored, and so were those in flight with it to the
            # slice's end: recall only the pages between, and let the task go on after the slice.
            rest = replace(judged, first_page=report.next_page, page_limit=resume - report.next_page)
            writes = self._recall_writes(rest, report.node, reason, decision)
            if resume < end:
                writes += self._skip_to(st.task, end)
        elif isinstance(decision, RecallDecision):
            writes = self._recall_writes(judged, report.node, reason, decision)
        else:
            raise InvalidInput(f"recall strategy returned {decision!r}, expected a RecallDecision")
        if decision is RecallDecision.REQUEUE:
            writes += self._recalled(st, report.node, dry)
        return Decision("recall", [e.guard], writes, subject=st.id, dead=int(decision is RecallDecision.DEAD))

    @staticmethod
    def _resumed(report: Report) -> int:
        """Where the failed slice's crawled tail starts: past ``next_page``, else the slice's end (also if unknown
        or out of the slice)."""
        st, r = report.subtask, report.resume_page
        end = st.first_page + st.page_limit
        return r if r is not None and report.next_page < r < end else end

    def _skip_to(self, task_id: str, page: int) -> list[Write]:
        """Writes that move a task's next subtask to ``page`` at least (the pages before it are crawled or
        recalled): none for a task without a usable record."""
        task = self._going(task_id)
        if task is None or task.next_page >= page:
            return []
        task = self._put(replace(task, next_page=page))
        return [Write.hset(self.k.tasks, task.id, self._record(task))]

    def _lapsed(self, lease: LapsedLease) -> Decision | None:
        k, sid = self.k, lease.sid
        if lease.lease is None:  # a deadline with no lease behind it: nothing to recall
            return Decision("drop", [Guard.zscore_le(k.leases, sid, self.now, lease.beyond)],
                            [Write.zrem(k.leases, sid)], sid)
        try:
            info = json.loads(lease.lease)
            token, node = info["token"], info.get("node")
            if not isinstance(token, str):
                raise TypeError("token")
            guards = [Guard.lease_is(k.lease_info, k.leases, sid, token)]
            extra: list[Write] = []
        except (ValueError, KeyError, TypeError, RecursionError):  # not a lease we wrote: recall what it holds
            node = None
            guards = [Guard.zscore_le(k.leases, sid, self.now, lease.beyond)]
            extra = [Write.zrem(k.leases, sid), Write.hdel(k.lease_info, sid)]
        node = node if isinstance(node, str) else None
        st = Subtask.from_json(lease.subtask or "null", "leased subtask")
        reason = f"lease expired on {node or '?'} (no finish before its deadline)"
        return self._recall("recall", guards, st, node, reason, failed=False, extra=extra)

    def _dead_lease(self, exc: BaseException, lease: LapsedLease) -> Decision:
        k, sid = self.k, lease.sid
        writes = [self._dead_write(sid, kind="lease", reason=f"lapsed lease: {_reason(exc)}", attempts=0,
                                   last_node=None, lease=shown(lease.lease or ""),
                                   **self._raw_fields(lease.subtask or "")),
                  Write.zrem(k.leases, sid), Write.hdel(k.lease_info, sid), Write.hdel(k.subtasks, sid),
                  *self._closed_raw(lease.subtask)]
        return Decision("dead", [Guard.zscore_le(k.leases, sid, self.now, lease.beyond)], writes, subject=sid, dead=1,
                        note=_reason(exc))

    def _stale(self, sid: str, raw: str | None) -> Decision | None:
        k = self.k
        try:
            st = Subtask.from_json(raw or "null")
        except InvalidInput:  # no readable record: the crawl-queue entry, if any, goes to `failed` on take
            st = None
        if st is None or st.node is None:
            guard = Guard.zscore_le(k.queued, sid, *self._stale_bounds())
            return Decision("drop", [guard], [Write.zrem(k.queued, sid)], sid)
        reason = f"not taken by {st.node} within {self.strat.recall_age:.0f} s"
        assert raw is not None
        return self._recall("recall", [self._queued_entry(sid, st.node, raw)], st, st.node, reason, failed=False,
                            extra=[Write.zrem(k.queued, sid)])

    def _stale_bounds(self) -> tuple[float, float]:
        """A queue time at or before the first is stale; after the second (the recall age ahead: no time the
        control writes, a hand edit or a clock gone back) it would never be, and counts as stale too."""
        return self.now - self.strat.recall_age, self.now + self.strat.recall_age

    def _queued_entry(self, sid: str, node: str, raw: str) -> Guard:
        """The guard of a stale entry's recall: the entry is still in its node's crawl queue (and is taken out), or
        it is gone from there but still queued since before the recall age. A take removes the queued member in the
        same step, so the second can only be an entry lost by hand (a ``DEL``, a key set aside for its type): with
        the first alone its subtask stayed queued, and its task open, for ever."""
        return Guard.lrem_or_lost(self.k.crawl(node), raw, self.k.queued, sid, *self._stale_bounds())

    def _dead_stale(self, exc: BaseException, sid: str, raw: str | None) -> Decision:
        k = self.k
        st = Subtask.from_json(raw or "null")  # _stale only raises after the record was read
        assert st.node is not None and raw is not None
        writes = [self._dead_write(sid, kind="subtask", reason=f"recall failed: {_reason(exc)}",
                                   attempts=st.attempt, last_node=st.node, subtask=json.loads(st.to_json())),
                  Write.zrem(k.queued, sid), Write.hdel(k.subtasks, sid), *self._closed(st)]
        return Decision("dead", [self._queued_entry(sid, st.node, raw)], writes, subject=sid, dead=1)

    def _silent(self, silent: SilentNode) -> None:
        k, node = self.k, silent.node
        for raw in silent.queue:
            guard = Guard.lrem(k.crawl(node), raw)

            def recall(raw: str = raw, guard: Guard = guard) -> Decision | None:
                st = Subtask.from_json(raw, f"entry of {k.crawl(node)}")
                return self._recall("recall", [guard], st, node, f"node {node} stopped heartbeating",
                                    failed=False, extra=[Write.zrem(k.queued, st.id)])

            def dead(exc: BaseException, raw: str = raw, guard: Guard = guard) -> Decision:
                dead_id = "q" + self.snap.ids.take(1)[0]
                return Decision("dead", [guard], [self._dead_write(dead_id, kind="malformed", reason=_reason(exc),
                                                                   attempts=0, last_node=node,
                                                                   **self._raw_fields(raw)),
                                                  *self._closed_raw(raw)],
                                subject=dead_id, dead=1)

            self._isolated(recall, dead)
        self.decisions.append(Decision("forget", [Guard.zscore_le(k.node_seen, node, silent.cutoff, silent.beyond)],
                                       [Write.hdel(k.nodes, node), Write.zrem(k.node_seen, node)], subject=node,
                                       note=f"node {node} stopped heartbeating; its queued work was recalled"))

    # --- 4. allocation ------------------------------------------------------------------------------------------
    def _allocate(self) -> None:
        k, nodes = self.k, self.snap.nodes
        total_free = sum(n.free for n in nodes)
        if not total_free:
            return
        window: list[Subtask] = []
        for sid, raw in self.snap.waiting:
            try:
                window.append(self._waiting_subtask(sid, raw))
            except InvalidInput as exc:
                writes = [self._dead_write(sid, kind="waiting", reason=str(exc), attempts=0, last_node=None,
                                           **self._raw_fields(raw or "")), Write.hdel(k.subtasks, sid)]
                self.decisions.append(Decision("dead", [Guard.zrem(k.waiting, sid)], writes, subject=sid, dead=1,
                                               note=str(exc)))
        size = self.strat.window(total_free)
        if self.fresh:  # this tick's new subtasks compete in priority order, as Redis would order them
            window = sorted([*window, *self.fresh], key=lambda s: (s.priority, s.id))
        # Subtasks waiting out their retry delay take no room: the window is the first ``size`` that may be placed
        # (the control reads as many more ids as the last tick held back).
        healthy = HealthySites(self.snap.estimates, self.now, self.strat.recall_age)
        window = [st for st in window if not backing_off(self.strat.recall, st, self.now, healthy)][:size]
        if not window:
            return
        assignments = self._assignments(window, nodes)
        free = {n.id: n.free for n in nodes}
        done: set[str] = set()
        by_id = {st.id: st for st in window}
        for got, nid in assignments:
            # A strategy's bug must not break the contract: a subtask once (itself, or fewer of its pages), a node
            # within its free slots.
            given = by_id.get(str(getattr(got, "id", "")))
            if (given is None or not (isinstance(got, Subtask) and got.is_capped_of(given)) or given.id in done
                    or free.get(nid, 0) <= 0):
                logger.error("allocation strategy returned an invalid assignment (%r -> %r); ignored",
                             getattr(got, "id", got), nid)
                continue
            st = given
            done.add(st.id)
            free[nid] -= 1
            placed, rest = self._placed(st, got, nid)
            raw = self._record(placed)
            writes = [Write.hset(k.subtasks, st.id, raw), Write.lpush(k.crawl(nid), raw),
                      Write.zadd(k.queued, self.now, st.id), *rest]
            if st.prev_node is not None and st.prev_node != nid:
                writes += [Write.hincrby(k.node_counters(st.prev_node), "moved_out"),
                           Write.hincrby(k.node_counters(nid), "moved_in")]
            # Guarded by the node's registry entry too: a node that closed (release.lua deregisters it and drains its
            # queue in one step) or was forgotten gets nothing more; the subtask stays waiting.
            self.decisions.append(Decision("allocate", [Guard.zrem(k.waiting, st.id), Guard.hexists(k.nodes, nid)],
                                           writes, subject=st.id))

    def _placed(self, st: Subtask, got: Subtask, nid: str) -> tuple[Subtask, list[Write]]:
        """``got`` (``st`` or its first pages, :meth:`Subtask.capped`) placed on ``nid``. A look of one page (the
        bandit's probe) leaves the pages after it to wait at once, a subtask of their own of the same task, so the
        task does not wait for the look's report behind the looking node's queue; those are the writes returned.
        Any other capped placement keeps them as its :attr:`~Subtask.rest`, given back by its report, or recalled
        with it: where nothing works (a blocked site) a failed look recalls its whole slice, and the task makes one
        dead letter, not one per look. So does a one-page look of no task record (pushed by hand) or of a finished
        one, and a task's second one in a tick: each allocation is a decision of its own, applied only if its
        guards hold, and the task record one writes must not count a subtask that another one made."""
        left = st.end - (got.first_page + got.page_limit)
        if left <= 0:
            return replace(got, node=nid), []
        if got.page_limit > 1:
            return replace(got, node=nid, rest=left), []
        task = self._going(st.task)
        if task is None or task.id in self._split_tasks:
            return replace(got, node=nid, rest=left), []
        self._split_tasks.add(task.id)
        task = self._put(replace(task, open=task.open + 1,
                                 retrying=task.retrying + 1 if st.attempt else task.retrying))
        rest = replace(st, id=self.snap.ids.take(1)[0], first_page=got.first_page + got.page_limit,
                       page_limit=left, rest=0, node=None, since=self.now)
        return replace(got, node=nid, rest=0), [*self._waiting_writes(rest),
                                                Write.hset(self.k.tasks, task.id, self._record(task))]

    def _assignments(self, window: list[Subtask], nodes: list[NodeView]) -> list[tuple[Subtask, str]]:
        """The strategy's assignments; if it raises, each subtask alone, so that the one it fails on is
        dead-lettered (it stays requeueable) and the others are allocated."""
        allocation, estimates = self.strat.allocation, self.snap.estimates
        try:
            return list(allocation.allocate(window, nodes, estimates, self.now))
        except Exception:  # noqa: BLE001 - a strategy that fails on one subtask must not stop the others
            logger.warning("allocation strategy failed on the window; allocating subtask by subtask", exc_info=True)
        out: list[tuple[Subtask, str]] = []
        free = {n.id: n.free for n in nodes}
        for st in window:
            left = [replace(n, free=free[n.id]) for n in nodes if free[n.id] > 0]
            if not left:
                break
            try:
                got = list(allocation.allocate([st], left, estimates, self.now))
            except Exception as exc:  # noqa: BLE001
                writes = [self._dead_write(st.id, kind="subtask", reason=f"allocation failed: {_reason(exc)}",
                                           attempts=st.attempt, last_node=st.prev_node,
                                           subtask=json.loads(st.to_json())), Write.hdel(self.k.subtasks, st.id)]
                self.decisions.append(Decision("dead", [Guard.zrem(self.k.waiting, st.id)], writes, subject=st.id,
                                               dead=1, note=_reason(exc)))
                continue
            for pair in got[:1]:
                if free.get(pair[1], 0) > 0:
                    free[pair[1]] -= 1
                    out.append(pair)
        return out


# --- the tick -----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the span of a tick (resumed after, unless it was off).

    A working tick at 1,000 nodes allocates some 100,000 container objects (records, views, decisions) that live
    until it ends. At the collector's young-generation threshold (700 allocations) most of them would be promoted
    to the oldest generation before they die, and the full collections that this brings on every few ticks scan
    everything the control holds (its estimates: 50 to 150 ms each at 1,000 nodes x 35 sites). Paused, the
    tick's objects die young (reference counting frees them), and only what outlives the tick is ever examined;
    what it leaves in reference cycles is collected after it, as usual."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class TickResult:
    leader: bool
    split: int = 0
    reports: int = 0
    recalled: int = 0
    dead: int = 0
    allocated: int = 0
    refused: int = 0  # decisions whose guard no longer held (another control, or a node, got there first)
    behind: bool = False  # an input was read a full batch: more may wait, and the next tick starts at once
    notes: list[str] = field(default_factory=list)


_COUNTS = {"split": "split", "report": "reports", "recall": "recalled", "allocate": "allocated"}


class Control:
    """The control loop of one deployment. Build with :meth:`from_crawler`, call :meth:`tick` on a timer."""

    def __init__(self, store: Store, *, splitter: Splitter | None, allocation: Allocation,
                 modification: Modification, recall: Recall, control_id: str | None = None,
                 page_limit: int = 5, time_limit: float = 30.0, batch: int = 500, leader_ttl: float = 10.0,
                 node_timeout: float | None = None, recall_age: float | None = None,
                 max_entry_bytes: int = 1_000_000, max_split: int = 1_000, lanes: int = 2,
                 idle_lanes: int = 8, lease_ttl: float | None = None) -> None:
        self.store, self.keys = store, store.keys
        self.splitter = splitter
        self.allocation, self.modification, self.recall = allocation, modification, recall
        self.control_id = control_id or f"{socket.gethostname()}-{os.getpid()}"
        self.page_limit, self.time_limit = page_limit, time_limit
        self.batch, self.leader_ttl = batch, leader_ttl
        self.recall_age = recall.threshold if recall_age is None else recall_age
        self.node_timeout = self.recall_age if node_timeout is None else node_timeout
        self.lease_horizon = LEASE_HORIZON * (self.recall_age if lease_ttl is None else lease_ttl)
        self.max_entry_bytes = max_entry_bytes
        self.strategies = Strategies(allocation=allocation, modification=modification, recall=recall,
                                     splitter=splitter, page_limit=page_limit, time_limit=time_limit,
                                     recall_age=self.recall_age, max_entry_bytes=max_entry_bytes,
                                     max_split=max_split, lanes=lanes, idle_lanes=idle_lanes)
        self.estimates = EstimateCache(store)  # kept across ticks; only changed estimates are re-read
        self._ids = StoreIds(store)  # ids reserved a block at a time, kept across ticks
        self._window: dict[str, tuple[str | None, Subtask | None]] = {}  # last tick's window: id -> record, decoded
        self._slots: dict[str, int] = {}  # last tick's live nodes -> crawl-queue slots (what the next one asks)
        self._free = 0  # last tick's free slots
        self._held = 0  # subtasks of last tick's window waiting out their retry delay: read as many more ids
        self._registry: dict[str, tuple[str | None, NodeView | None, int]] = {}  # node -> entry, view, slots
        self.now = 0.0  # Redis time at the start of the current tick
        self.is_leader = False

    @classmethod
    def from_config(cls, crawler: Any, config: Config) -> Control:
        try:
            splitter = load_object(config.splitter) if config.splitter else None
        except (ImportError, NameError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"SCHEDEXT_SPLITTER: cannot load {config.splitter!r}: {exc}") from exc
        if splitter is not None and not callable(splitter):
            raise ConfigurationError(f"SCHEDEXT_SPLITTER: {config.splitter!r} is not callable")
        return cls(
            Store(redis_from_settings(crawler.settings), Keys(config.prefix)), splitter=splitter,
            allocation=load_strategy(crawler, "SCHEDEXT_ALLOCATION"),
            modification=load_strategy(crawler, "SCHEDEXT_MODIFICATION"),
            recall=load_strategy(crawler, "SCHEDEXT_RECALL"),
            control_id=config.control_id, page_limit=config.page_limit, time_limit=config.time_limit,
            batch=config.tick_batch, leader_ttl=config.leader_ttl, node_timeout=config.node_timeout,
            recall_age=config.recall_age, max_entry_bytes=config.max_entry_bytes, max_split=config.max_split,
            lanes=config.task_lanes, idle_lanes=config.task_lanes_idle, lease_ttl=config.lease_ttl)

    @classmethod
    def from_crawler(cls, crawler: Any) -> Control:
        return cls.from_config(crawler, config_for(crawler))

    def tick(self) -> TickResult:
        """Lead (or stand by), read, decide, apply. Redis errors propagate (the caller retries with backoff); after
        a WRONGTYPE error the keys of the wrong type are set aside first (:meth:`heal`), so the next tick runs."""
        try:
            return self._tick()
        except redis.ResponseError as exc:
            if wrong_type(exc):
                self.heal()
            raise

    def heal(self) -> list[str]:
        """Set aside every key a tick uses that is of another type than the schema gives it (``Store.set_aside``);
        the keys set aside. Only after a WRONGTYPE error, which does not say which key: a hand ``SET`` on one
        cluster key (``sleeping``, ``waiting``, ``tasks``, ...) or on a node's crawl queue failed every tick until a
        person deleted it. First the deployment's own keys, so that ``node_seen`` and ``nodes`` can name the nodes;
        then the crawl queue of every node known; if none of those is of the wrong type, every key of the
        deployment (a ``SCAN``: a site's or a product's estimates, or another key of a family the tick reads)."""
        store, k = self.store, self.keys
        moved = store.set_aside(k.cluster_keys)
        nodes = set(self._slots) | set(store.redis.zrange(k.node_seen, 0, -1)) | set(store.redis.hkeys(k.nodes))
        moved += store.set_aside([k.crawl(n) for n in sorted(nodes)])
        if not moved:
            moved = store.set_aside_all()
        if not moved:
            logger.warning("control %s: a WRONGTYPE error, and no key the tick uses is of another type than "
                           "docs/redis-keys.md gives it", self.control_id)
        return moved

    def _tick(self) -> TickResult:
        leader = self.store.lead(self.control_id, self.leader_ttl)
        if leader != self.is_leader:
            logger.info("control %s is now %s", self.control_id, "the leader" if leader else "on standby")
            self.is_leader = leader
            self.estimates.reset()  # another control led meanwhile: what we held may be old
            self._window = {}
        if not leader:
            return TickResult(False)
        with _collector_paused():
            snapshot = self.read()
            result = self.apply(decide(snapshot, self.strategies, snapshot.now), snapshot.tasks)
        # More may wait, and this tick took some of it (entries that keep being refused must not spin the loop)
        result.behind = snapshot.more and bool(result.split or result.reports or result.recalled or result.dead)
        return result

    def forget(self) -> None:
        """Drop what this control holds in memory (after a Redis error: the server may have restarted older)."""
        self.is_leader = False
        self.estimates.reset()
        self._window = {}
        self._ids = StoreIds(self.store)

    def resign(self) -> None:
        """Give up the leader lease at once (on a clean stop), so a standby need not wait for it to lapse."""
        if self.is_leader:
            self.store.resign(self.control_id)
            self.is_leader = False

    # --- read -----------------------------------------------------------------------------------------------------
    def read(self) -> Snapshot:
        """Everything one tick needs, read before any decision (a Redis error here means no decision at all).

        Two round trips as a rule: the snapshot script (lua/snapshot.lua: the time, the inputs, deadlines, nodes,
        the first ids of ``waiting``, the changed estimates), then one pipeline for the records those name that
        this control does not hold yet. More only when the cluster changed: nodes that joined since the last tick,
        many more free slots than at the last tick (a larger window), (product, site) pairs never seen (one
        ``SMISMEMBER``), estimates of a new site or product.
        """
        k, r, store, batch = self.keys, self.store.redis, self.store, self.batch
        slots = self._slots  # the nodes live at the last tick -> their crawl-queue slots
        # The window to read with the snapshot, before the free slots are known: about the last tick's free slots
        # (a busy cluster frees a few per tick), never more than all the slots; one more round trip if short.
        guess = min(sum(slots.values()), self._free + max(16, self._free // 8))
        asked = self.strategies.window(guess) + self._held if slots else 0
        t = store.snapshot(batch=batch, max_bytes=self.max_entry_bytes, recall_age=self.recall_age,
                           node_timeout=self.node_timeout, window=asked, nodes=list(slots),
                           lease_horizon=self.lease_horizon)
        now = self.now = t.now  # one Redis time per tick: the time stamps of its decisions
        snap = Snapshot(keys=k, now=now, estimates=self.estimates, ids=self._ids, more=t.more,
                        virtual=[Entry(k.virtual, *e) for e in t.virtual],
                        reports=[Entry(k.sleeping, *e) for e in t.sleeping],
                        failures=[Entry(k.failed, *e) for e in t.failed])
        entries = t.entries
        joined = [nid for nid in t.live if nid not in entries]
        if joined:
            entries.update(zip(joined, store.node_entries(joined), strict=True))
        snap.nodes = self._views(t.live, entries)
        total_free = self._free = sum(n.free for n in snap.nodes)
        size = self.strategies.window(total_free) + self._held if total_free else 0
        ids = t.window[:size]
        if len(ids) < size and len(t.window) == asked:  # more slots free than guessed: read the whole window
            ids = r.zrange(k.waiting, 0, size - 1)
        tids = sorted({tid for e in (*snap.reports, *snap.failures) if (tid := _task_id(e))})
        new = [sid for sid in ids if sid not in self._window]
        fields = self.estimates.changed(t.dirty)
        with r.pipeline(transaction=False) as pipe:
            for key, names in ((k.tasks, tids), (k.lease_info, t.lapsed), (k.subtasks, t.lapsed),
                               (k.subtasks, t.stale), (k.subtasks, new)):
                pipe.hmget(key, names or ["-"])  # HMGET needs a field; "-" is never an id
            for node in t.silent:
                pipe.lrange(k.crawl(node), -batch, -1)
            self.estimates.queue_reads(fields, pipe)
            rows = pipe.execute()
        tasks, leases, leased, stale_raw, records = rows[:5]
        silent_queues = rows[5:5 + len(t.silent)]
        self.estimates.update(fields, rows[5 + len(t.silent):])
        # The tasks of the subtasks recalled without a report (lapsed leases, stale entries, silent nodes' queues):
        # a recall counts them in or out of their task too. Read only when there are some (one round trip more).
        recalled = {tid for raw in (*leased, *stale_raw, *(raw for q in silent_queues for raw in q))
                    if (tid := _subtask_task(_parse_one(raw)))}.difference(tids)
        if recalled:
            more = sorted(recalled)
            # ``tasks[:len(tids)]``: with no report naming a task the pipeline read the placeholder "-" (None)
            tasks = [*tasks[:len(tids)], *r.hmget(k.tasks, more)]
            tids = [*tids, *more]
        snap.tasks = dict(zip(tids, tasks, strict=False))
        snap.lapsed = [LapsedLease(sid, lease, st, now + self.lease_horizon)
                       for sid, lease, st in zip(t.lapsed, leases, leased, strict=False)]
        snap.stale = list(zip(t.stale, stale_raw, strict=False))
        snap.silent = [SilentNode(node, now - self.node_timeout, list(reversed(queue)), now + self.node_timeout)
                       for node, queue in zip(t.silent, silent_queues, strict=True)]
        if total_free:
            snap.waiting, snap.parsed = self._read_window(ids, dict(zip(new, records, strict=False)))
            healthy = HealthySites(snap.estimates, now, self.strategies.recall_age)
            held = sum(backing_off(self.strategies.recall, st, now, healthy) for st in snap.parsed.values())
            self._held = min(held, batch)  # an outage's many retries cost at most a batch of ids more a tick
            # What allocation will ask for, of the subtasks new to the window (the others' were read with them).
            pairs = {(st.group, st.site) for sid in new if (st := self._window[sid][1]) is not None}
            self.estimates.prefetch({site for _, site in pairs}, pairs)
        return snap

    def _views(self, live: list[str], entries: dict[str, tuple[str | None, int]]) -> list[NodeView]:
        """The live nodes as allocation sees them (:func:`node_view`). A registry entry that did not change since
        the last tick is not decoded again: its view is kept, with this tick's free slots; ``_slots`` keeps each
        node's crawl-queue slots for the next read."""
        kept: dict[str, tuple[str | None, NodeView | None, int]] = {}
        views: list[NodeView] = []
        for nid in live:
            raw, queued = entries[nid]
            hit = self._registry.get(nid)
            if hit is None or hit[0] != raw:
                view = node_view(nid, raw, 0)  # its free slots are all its slots
                hit = (raw, view, 0 if view is None else view.free)
            kept[nid] = hit
            if hit[1] is not None:
                hit[1].free = max(0, hit[2] - queued)
                views.append(hit[1])
        self._registry = kept
        self._slots = {nid: slots for nid, (_, _, slots) in kept.items()}
        return views

    def _read_window(self, ids: list[str], fresh: dict[str, str | None]
                     ) -> tuple[list[tuple[str, str | None]], dict[str, Subtask]]:
        """The records of the waiting window, decoded: those of the ids new to the window are ``fresh`` (read by
        this tick's pipeline), the others kept from the last tick: while an id stays in ``waiting`` its record does not
        change (a subtask's record is rewritten only on its way into ``waiting``), so the window costs what
        changed, not its size. decide judges, and dead-letters, bad ones."""
        known = self._window
        window: dict[str, tuple[str | None, Subtask | None]] = {}
        for sid in ids:
            if sid in known:
                window[sid] = known[sid]
                continue
            raw, st = fresh.get(sid), None
            if raw is not None:
                try:
                    st = Subtask.from_json(raw)
                except InvalidInput:
                    pass
            window[sid] = (raw, st)
        self._window = window
        return [(sid, raw) for sid, (raw, _) in window.items()], \
            {raw: st for raw, st in window.values() if raw is not None and st is not None}

    # --- apply ----------------------------------------------------------------------------------------------------
    def apply(self, decisions: Sequence[Decision], tasks: Mapping[str, Any] | None = None) -> TickResult:
        """Commit every decision in order, in one round trip per chunk; count what was applied.

        ``tasks``: the task records as the tick read them. A decision that writes a task record commits only if the
        record is still the one it was decided on (``hfield_is``: as read, or as the tick's decision before it
        wrote it): the control is not the only writer (``scrapy deadletter drop`` counts a subtask out), and a
        record changed meanwhile was written over with what the tick had read. Such a decision is refused, with
        the tick's later ones on the same task, and their entries are decided again by the next tick on the new
        record."""
        result = TickResult(True)
        dead_notes: list[str] = []
        records = None if tasks is None else dict(tasks)  # task id -> its record as the decisions so far leave it
        for start in range(0, len(decisions), 1000):
            chunk = decisions[start:start + 1000]
            outcomes = self.store.commit_many([(d.guards if records is None else self._unchanged(d, records),
                                                d.writes) for d in chunk])
            for d, ok in zip(chunk, outcomes, strict=True):
                if isinstance(ok, Exception):  # the script refused it (a bug in a decision): log, go on
                    logger.error("decision %s on %s refused by Redis: %s", d.kind, d.subject, ok)
                    result.refused += 1
                    continue
                if not ok:
                    result.refused += 1
                    continue
                if d.kind in _COUNTS:
                    setattr(result, _COUNTS[d.kind], getattr(result, _COUNTS[d.kind]) + 1)
                result.dead += d.dead
                if d.kind == "dead" and len(dead_notes) < 3:
                    dead_notes.append(f"{d.subject}: {d.note}")
                if d.kind == "forget":
                    result.notes.append(d.note)
                    logger.warning("%s", d.note)
        if result.dead:  # one line a tick, not one per entry (a flood of bad input must not flood the log)
            logger.warning("dead-lettered %d entr%s this tick (%s%s); see `scrapy deadletter list`", result.dead,
                           "y" if result.dead == 1 else "ies", "; ".join(dead_notes),
                           ", ..." if result.dead > len(dead_notes) else "")
        return result


    def _unchanged(self, d: Decision, records: dict[str, Any]) -> list[Any]:
        """``d``'s guards, and for each task record it writes, that the record is the one ``records`` holds (which
        then holds what ``d`` writes)."""
        guards, tasks = list(d.guards), self.keys.tasks
        written: dict[str, Any] = {}
        for w in d.writes:
            if w[0] == "hset" and w[1] == tasks:
                if w[2] not in written:
                    raw = records.get(w[2])
                    guards.append(Guard.hfield_is(tasks, w[2], raw if isinstance(raw, str) else None))
                written[w[2]] = w[3]
        records.update(written)
        return guards


def node_view(nid: str, raw: str | None, queued: int) -> NodeView | None:
    """A live node as allocation sees it, read defensively from its registry entry; None if unusable.

    Reads ``type`` (list of ints), ``prefetch`` (crawl-queue slots) and ``address``. A field that is missing gets
    its default (types [0], prefetch 1), so a node of another version still gets work; a field of the wrong type
    makes the entry unusable (no work goes to a node the control cannot understand).
    """
    obj = _parse_one(raw)
    if obj is None:
        return None
    types, prefetch, address = obj.get("type", [0]), obj.get("prefetch", 1), obj.get("address")
    if not (isinstance(types, list) and types and all(type(t) is int and t >= 0 for t in types)) \
            or type(prefetch) is not int or not (address is None or isinstance(address, str)):
        return None
    held = obj.get("subtasks")
    return NodeView(id=nid, types=types, address=address, free=max(0, min(prefetch, 10_000) - queued),
                    queued=max(0, queued), info=obj, held=len(held) if isinstance(held, list) else 0)


def _task_id(e: Entry) -> str | None:
    """The task id a report names, if it can be read at all (the decoders judge the rest)."""
    obj = _parse_one(e.raw) if e.whole else None
    return _subtask_task(obj.get("subtask") if obj else None)


def _subtask_task(sub: Any) -> str | None:
    """The task id of a subtask record (a JSON object), if it names one."""
    tid = sub.get("task") if isinstance(sub, dict) else None
    return str(tid) if isinstance(tid, (str, int)) and not isinstance(tid, bool) else None


MAX_WAIT = 1.0  # seconds one blocking wait on Redis lasts at most: well under the client's socket timeout


class ControlExtension:
    """Runs :class:`Control` on a timer inside a Scrapy process and keeps it open (the control spider).

    Enabled by ``SCHEDEXT_CONTROL_ENABLED`` (the control spider turns it on); ``SCHEDEXT_TICK_INTERVAL`` seconds
    between ticks, and sooner when a node reports: between ticks the leader waits on ``sleeping`` (a blocking
    rotate that takes nothing, :meth:`Store.wait_for_entry`) and ticks ``SCHEDEXT_TICK_WAKE`` seconds after the
    previous tick ended at the earliest, so a task's next subtask is made about that soon after its last one is
    finished instead of half a tick interval later on average (0 turns waking off); a tick that read a full batch
    of an input (``SCHEDEXT_TICK_BATCH`` virtual tasks, reports or failures) is followed at once by the next, so
    the control never falls behind its cluster for more than the ticks a backlog takes. Nothing but the process
    ending stops the loop: a failed tick (Redis away, or an error no entry explains) is retried with a backoff
    that doubles up to ``SCHEDEXT_BACKOFF_MAX``; after ``SCHEDEXT_TICK_ALARM`` failures in a row
    the control logs an error every tick and ``scrapy status`` shows it stuck (``controls``).

    Stats: ``schedext/control/ticks``, ``.../split``, ``.../reports``, ``.../recalled``, ``.../dead``,
    ``.../allocated``, ``.../woken`` (ticks started early by a report), ``.../behind`` (ticks that read a full
    batch of an input, each followed at once by the next tick), ``schedext/control/errors``,
    ``schedext/control/failed_in_row`` (a gauge).
    """

    def __init__(self, crawler: Any, control: Control, interval: float, *, alarm: int = 5,
                 backoff_max: float = 30.0, wake: float = 0.0) -> None:
        self.crawler, self.control, self.interval = crawler, control, interval
        self.wake = wake
        self._waiting = False  # waiting on sleeping for a report (worker thread)
        self._closing = False
        self.alarm, self.backoff_max = alarm, backoff_max
        self.stats = crawler.stats
        self.failed_in_row = 0
        self.last_error = ""
        self.last_ok = 0.0
        self._next_at = 0.0  # monotonic time before which a tick is skipped (backoff)
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
        return cls(crawler, Control.from_config(crawler, config), config.tick_interval, alarm=config.tick_alarm,
                   backoff_max=config.backoff_max, wake=config.tick_wake)

    def opened(self) -> None:
        self._loop = create_looping_call(self.tick)
        self._loop.start(self.interval, now=True)
        logger.info("control %s ticking every %.1f s on %s", self.control.control_id, self.interval,
                    self.control.keys.prefix)

    def tick(self) -> None:
        """Run one tick in a worker thread (its Redis calls never block the reactor); skip if one is running
        or while backing off."""
        if self._ticking or time.monotonic() < self._next_at:
            return
        self._ticking = True
        d = threads.deferToThread(self.run_once)
        d.addBoth(self._ticked)

    def run_once(self) -> TickResult | None:
        """One tick that never raises: its result, or None after recording the failure."""
        try:
            result = self.control.tick()
        except redis.RedisError as exc:  # Redis away: nothing was decided on a half-read state; retry later
            self.control.forget()
            self._failed(f"Redis: {exc}")
            return None
        except Exception as exc:  # noqa: BLE001 - a bug must not stop the loop; every decision is guarded
            logger.exception("control tick failed")
            self._failed(f"{type(exc).__name__}: {exc}")
            return None
        if self.failed_in_row:
            logger.warning("control %s ticks again after %d failed tick(s)", self.control.control_id,
                           self.failed_in_row)
        self.failed_in_row, self.last_error, self.last_ok = 0, "", time.time()
        self._next_at = 0.0
        self._report(result.leader)
        return result

    def _failed(self, error: str) -> None:
        self.failed_in_row += 1
        self.last_error = error
        wait = backoff(self.failed_in_row, self.interval, self.backoff_max)
        self._next_at = time.monotonic() + wait
        if self.failed_in_row >= self.alarm:
            logger.error("control %s is STUCK: %d ticks in a row failed (last: %s); retrying in %.1f s",
                         self.control.control_id, self.failed_in_row, error, wait)
        else:
            logger.error("control tick failed (%s); retrying in %.1f s", error, wait)
        self._report(self.control.is_leader)

    def _report(self, leader: bool) -> None:
        """Tell ``scrapy status`` how this control is doing (best effort: Redis may be the thing that is down)."""
        info = {"leader": leader, "at": time.time(), "ok_at": self.last_ok or None,
                "failed_in_row": self.failed_in_row, "last_error": self.last_error[:500], "alarm": self.alarm}
        try:
            self.control.store.report_control(self.control.control_id, info)
        except redis.RedisError:  # Redis is down: the log says it; status cannot be read either
            pass

    def _ticked(self, r: TickResult | None) -> None:
        self._ticking = False
        self.stats.set_value("schedext/control/failed_in_row", self.failed_in_row)
        if r is None:
            self.stats.inc_value("schedext/control/errors")
            return
        self.stats.inc_value("schedext/control/ticks")
        for name in ("split", "reports", "recalled", "dead", "allocated"):
            if getattr(r, name):
                self.stats.inc_value(f"schedext/control/{name}", getattr(r, name))
        if r.leader and r.behind and not self._closing:
            # A full batch of some input was read: more waits. Tick again at once, whatever the interval and
            # the wake (with long ticks and no wake, a cluster finishing more than a batch a tick fell behind
            # for good: docs/experiment.md, "A polite day at scale").
            self.stats.inc_value("schedext/control/behind")
            call_later(0, self.tick)
        elif r.leader:
            self._wait_for_reports()

    def _wait_for_reports(self) -> None:
        """Tick again as soon as a report waits in ``sleeping`` (not before ``wake`` seconds from now), or at the
        next interval. Only the leader waits: a standby's ticks do nothing but watch the lease."""
        if self.wake <= 0 or self._waiting or self._closing:
            return
        self._waiting = True
        d = threads.deferToThread(self.control.store.wait_for_entry, self.control.keys.sleeping,
                                  min(self.interval, MAX_WAIT))
        d.addCallbacks(self._woken, self._wait_failed)

    def _woken(self, report: bool) -> None:
        self._waiting = False
        if self._closing:
            return
        if report:
            self.stats.inc_value("schedext/control/woken")
            call_later(self.wake, self.tick)  # which waits again once it has ticked
        elif self.control.is_leader:
            self._wait_for_reports()

    def _wait_failed(self, failure: Any) -> None:
        # Redis away: the interval's tick reports it and backs off; waking is only a shortcut.
        self._waiting = False
        logger.debug("waiting for reports failed: %s", failure.getErrorMessage())

    def idle(self) -> None:
        raise DontCloseSpider

    def closed(self) -> None:
        self._closing = True
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        try:
            self.control.resign()
        except redis.RedisError as exc:
            logger.warning("could not resign the leader lease (%s); it lapses by itself", exc)
