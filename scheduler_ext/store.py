"""Every atomic change to the scheduling state in Redis: one Lua script each, registered once per client.

Nodes use :meth:`Store.take`, :meth:`Store.heartbeat`, :meth:`Store.finish` and :meth:`Store.release`; the
control loop commits each of its decisions through :meth:`Store.commit`, a compare-and-apply: a guard (the report
is still at the tail of its list, the lease token still matches, the subtask is still waiting, ...) and the writes
that follow from it happen in one script, so a decision is applied exactly once even if two controls race or one
dies half-way. Times are Redis server time (``TIME`` inside the scripts), never a node's clock.

A key of another type than the schema gives it (a hand ``SET``) makes every command on it fail with WRONGTYPE, and
with it every loop that uses the key. Every script checks the type of each key it writes before its first write
(``lua/types.lua``), so such a call changes nothing; :meth:`Store.set_aside` then renames the keys of the wrong
type aside, kept for a person, and the next call runs normally. The node operations do that themselves, and run
once more; the control does it when its tick fails so (:meth:`Control.heal <scheduler_ext.control.Control.heal>`).

Key schema: :mod:`scheduler_ext.keys` (docs/redis-keys.md).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import redis

from .keys import Keys
from .strategies.posterior import GROUP_NODES

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: Seconds a key set aside (``garbage:<name>:<time>``) is kept before Redis expires it: a week.
GARBAGE_KEPT = 7 * 86400

SCRIPTS = ("take", "heartbeat", "finish", "release", "commit", "lead", "resign", "snapshot", "nodes", "ids",
           "aside")
_INCLUDE = re.compile(r"^--@include (\w+)$", re.MULTILINE)


def load_script(name: str) -> str:
    """The source of ``lua/<name>.lua`` (package data), its ``--@include <helper>`` lines replaced by the helper.

    Helpers (``lua/now.lua``) are included, not copied, so one definition serves every script; an include is
    expanded once, at load time, and the script Redis runs is plain Lua.
    """
    base = resources.files(__package__).joinpath("lua")
    source = base.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: base.joinpath(f"{m.group(1)}.lua").read_text(encoding="utf-8"), source)


def lease_node(raw: str | bytes | None) -> str | None:
    """The node a ``lease_info`` record names (docs/redis-keys.md); None for a record that is not one (written by
    hand, corrupt, hostile)."""
    try:
        info = json.loads(raw or "")
    except (ValueError, RecursionError):
        return None
    node = info.get("node") if isinstance(info, dict) else None
    return node if isinstance(node, str) else None


def wrong_type(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis's WRONGTYPE error (a key of another type than a command or script uses it as), from a
    command, a pipeline or a script (``lua/types.lua``: the script changed nothing)."""
    return isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc)


class Guard(tuple):  # type: ignore[type-arg]
    """A condition of :meth:`Store.commit` (commit.lua), built by name: ``Guard.tail_is(key, raw)``.

    A guard is checked before anything is written and consumes what it matched (the tail entry, the lease, the
    member), so a decision guarded by the state it was made from is applied once.
    """

    __slots__ = ()

    @classmethod
    def tail_is(cls, key: str, raw: str) -> Guard:
        """The list's oldest entry is ``raw``; it is popped."""
        return cls(("tail_is", key, raw))

    @classmethod
    def tail_sha1_is(cls, key: str, sha1: str) -> Guard:
        """The list's oldest entry has this SHA-1 (an entry too long to send back); it is popped."""
        return cls(("tail_sha1_is", key, sha1))

    @classmethod
    def lease_is(cls, lease_info: str, leases: str, sid: str, token: str) -> Guard:
        """The lease of ``sid`` holds ``token``; the lease and its deadline are removed."""
        return cls(("lease_is", lease_info, leases, sid, token))

    @classmethod
    def zrem(cls, key: str, member: str) -> Guard:
        """``member`` is in the sorted set; it is removed."""
        return cls(("zrem", key, member))

    @classmethod
    def lrem(cls, key: str, raw: str) -> Guard:
        """``raw`` is in the list; one occurrence is removed."""
        return cls(("lrem", key, raw))

    @classmethod
    def lrem_or_lost(cls, key: str, raw: str, queued: str, member: str, score: float,
                     beyond: float = math.inf) -> Guard:
        """``raw`` is in list ``key`` (one occurrence removed), or it is not and ``member``'s score in ``queued`` is
        at most ``score`` (or after ``beyond``, as :meth:`zscore_le`): the entry left its crawl queue without being
        taken (a take removes ``member``), so nothing else will ever run it."""
        return cls(("lrem_or_lost", key, raw, queued, member, score) if beyond == math.inf else
                   ("lrem_or_lost", key, raw, queued, member, score, beyond))

    @classmethod
    def zscore_le(cls, key: str, member: str, score: float, beyond: float = math.inf) -> Guard:
        """``member``'s score is at most ``score``, or after ``beyond`` (+inf always: a time no script writes)
        (nothing removed)."""
        return cls(("zscore_le", key, member, score) if beyond == math.inf else
                   ("zscore_le", key, member, score, beyond))

    @classmethod
    def hdel(cls, key: str, field: str) -> Guard:
        """The field exists; it is removed."""
        return cls(("hdel", key, field))

    @classmethod
    def hexists(cls, key: str, field: str) -> Guard:
        """The field exists (nothing removed)."""
        return cls(("hexists", key, field))

    @classmethod
    def hfield_is(cls, key: str, field: str, raw: str | None) -> Guard:
        """The field holds ``raw`` (absent if None): a record nobody changed since it was read (nothing removed)."""
        return cls(("hfield_is", key, field, raw))


class Write(tuple):  # type: ignore[type-arg]
    """A write of :meth:`Store.commit` (commit.lua), built by name: ``Write.hset(key, field, value)``."""

    __slots__ = ()

    @classmethod
    def hset(cls, key: str, field: str, value: str) -> Write:
        return cls(("hset", key, field, value))

    @classmethod
    def hdel(cls, key: str, field: str) -> Write:
        return cls(("hdel", key, field))

    @classmethod
    def zadd(cls, key: str, score: float, member: str) -> Write:
        return cls(("zadd", key, score, member))

    @classmethod
    def zrem(cls, key: str, member: str) -> Write:
        return cls(("zrem", key, member))

    @classmethod
    def lpush(cls, key: str, value: str) -> Write:
        return cls(("lpush", key, value))

    @classmethod
    def hincrby(cls, key: str, field: str, amount: int = 1) -> Write:
        return cls(("hincrby", key, field, amount))

    @classmethod
    def delete(cls, key: str) -> Write:
        return cls(("del", key))

    @classmethod
    def sadd(cls, key: str, member: str) -> Write:
        return cls(("sadd", key, member))


def _keys_of(guards: Sequence[Sequence[Any]], writes: Sequence[Sequence[Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for g in guards:
        keys[g[1]] = None
        if g[0] == "lease_is":
            keys[g[2]] = None
    for w in writes:
        keys[w[1]] = None
    return list(keys)


def _tolerant(client: redis.Redis) -> redis.Redis:
    """``client``, or a sibling on the same server that decodes with ``surrogateescape``.

    Lists and hashes in Redis can hold any bytes (a pickle pushed by hand). A strict client raises
    UnicodeDecodeError on reading such an entry, so no loop could even look at it to set it aside. Decoded with
    ``surrogateescape`` the bytes arrive as a ``str`` that the decoders refuse (:func:`models.loads_object`) and
    that encodes back to the very same bytes, so a guard can still name the entry exactly.
    """
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if not kwargs.get("decode_responses") or kwargs.get("encoding_errors") == "surrogateescape":
        return client
    sibling = pool.__class__(connection_class=pool.connection_class,
                             **{**kwargs, "encoding_errors": "surrogateescape"})
    return redis.Redis(connection_pool=sibling)


@dataclass(frozen=True)
class TickRead:
    """What :meth:`Store.snapshot` read (lua/snapshot.lua): the server time; the oldest entries of ``virtual``,
    ``sleeping`` and ``failed`` as (raw, size, sha1), raw cut and sha1 set if the entry was too long; the ids of
    lapsed leases and stale crawl-queue entries; silent and live nodes; (registry JSON or None, crawl-queue
    length) of each node asked about; the first ids of ``waiting``; the ``est:dirty`` members popped. ``more``:
    an input list came back as long as one tick reads (``batch`` entries, or ``budget`` bytes), so more may wait."""

    now: float
    virtual: list[tuple[str, int, str]]
    sleeping: list[tuple[str, int, str]]
    failed: list[tuple[str, int, str]]
    lapsed: list[str]
    stale: list[str]
    silent: list[str]
    live: list[str]
    entries: dict[str, tuple[str | None, int]]
    window: list[str]
    dirty: list[str]
    more: bool = False


class Store:
    """The atomic operations on one deployment's scheduling state (one key prefix)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # Typed Any on purpose: redis-py's annotations cannot express that a decode_responses client returns str.
        self.redis: Any = _tolerant(client)
        self.keys = keys
        scripts = {name: self.redis.register_script(load_script(name)) for name in SCRIPTS}
        self._take, self._heartbeat, self._finish = scripts["take"], scripts["heartbeat"], scripts["finish"]
        self._release, self._commit = scripts["release"], scripts["commit"]
        self._lead, self._resign, self._snapshot = scripts["lead"], scripts["resign"], scripts["snapshot"]
        self._nodes, self._ids, self._aside = scripts["nodes"], scripts["ids"], scripts["aside"]

    def now(self) -> float:
        """Redis server time, seconds."""
        sec, usec = self.redis.time()
        return float(sec) + usec / 1e6

    # --- keys of the wrong type -------------------------------------------------------------------------------
    def set_aside(self, keys: Iterable[str]) -> list[str]:
        """Rename aside each of ``keys`` whose Redis type is not the one the schema gives it (``Keys.expected_type``;
        a key it does not know, or that does not exist, is left alone, and so is ``seq``); the keys set aside.

        Called after a WRONGTYPE error only: one pipeline of ``TYPE`` (and the server time), then, for each key found
        wrong, the ``aside`` script, which checks the type again in the same atomic step as the ``RENAME``, so a key
        of the right type is never moved. The key goes to ``garbage:<name>:<Redis time>`` (``Keys.garbage``), kept
        for a person to look at for a week (:data:`GARBAGE_KEPT`; then Redis expires it), and is counted
        (``count:cluster`` field ``garbage_keys``); a warning names it.
        """
        k = self.keys
        # Never ``seq``: one of another type starts above any id it gave (counter.lua), where one set aside would
        # start again from 1 and give ids twice.
        expected = {key: kind for key in keys if (kind := k.expected_type(key)) is not None and key != k.seq}
        if not expected:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.time()
            for key in expected:
                pipe.type(key)
            (sec, usec), *found = pipe.execute()
        kinds = [f.decode() if isinstance(f, bytes) else f for f in found]
        wrong = [key for key, kind in zip(expected, kinds, strict=True) if kind not in ("none", expected[key])]
        # count:cluster first: the aside script counts there, and a counter of another type would be replaced
        # (counter.lua) rather than kept
        wrong.sort(key=lambda key: key != k.counters)
        moved = []
        for key in wrong:
            aside = k.garbage(key, f"{sec}.{int(usec):06d}")
            found_kind = self._aside(keys=[key, aside, k.counters], args=[expected[key], GARBAGE_KEPT])
            if found_kind:
                logger.warning("%s was a %s where a %s belongs (set by hand?): every command on it failed "
                               "(WRONGTYPE); set aside as %s", key, found_kind, expected[key], aside)
                moved.append(key)
        return moved

    def set_aside_all(self, batch: int = 1000) -> list[str]:
        """:meth:`set_aside` for every key of the deployment (a ``SCAN`` of its prefix, ``batch`` keys at a time): for
        the tools, which read keys of every family (a node's counters, a site's estimates, ...). Only after a
        WRONGTYPE error: at a thousand nodes a deployment holds hundreds of thousands of keys."""
        moved: list[str] = []
        keys: list[str] = []
        for key in self.redis.scan_iter(match=self.keys.everything, count=batch):
            keys.append(key)
            if len(keys) >= batch:
                moved += self.set_aside(keys)
                keys = []
        return moved + self.set_aside(keys)

    def healed(self, read: Callable[[], T], keys: list[str] | None = None) -> T:
        """``read()``; if a key of another type than the schema gives it stopped it (WRONGTYPE), the keys of the
        wrong type among ``keys`` (a script's own: it checks their types before its first write, ``lua/types.lua``,
        so the failed run changed nothing), or of the whole deployment if None (:meth:`set_aside_all`: for the
        tools, ``scrapy status``, ``deadletter``, ``inject`` and the dashboard, which read keys of every family), are
        set aside and it runs once more."""
        try:
            return read()
        except redis.ResponseError as exc:
            if not wrong_type(exc) or not (self.set_aside_all() if keys is None else self.set_aside(keys)):
                raise
        return read()

    def _healing(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        return self.healed(lambda: script(keys=keys, args=args), keys)

    # --- node side ----------------------------------------------------------------------------------------------
    def take(self, node: str, lease_ttl: float, grace: float, max_skip: int = 8) -> tuple[str, str, float] | None:
        """Lease the next subtask of ``node``'s crawl queue: (subtask json, token, start time) or None."""
        k = self.keys
        res = self._healing(self._take, [k.crawl(node), k.leases, k.lease_info, k.subtasks, k.failed, k.queued,
                                         k.seq, k.counters], [node, max_skip, lease_ttl, grace])
        if not res:
            return None
        return res[0], res[1], float(res[2])

    def wait_for_entry(self, key: str, timeout: float) -> bool:
        """Block (in a worker thread, never on the reactor) until the list ``key`` has an entry, at most ``timeout``
        seconds; True if it has one. The list is left as it was: ``BLMOVE key key RIGHT RIGHT`` pops its tail and
        pushes it back at the tail in one atomic step, so a node waits on its crawl queue, or the control on
        ``sleeping``, without taking anything (the take and the tick still consume entries through their scripts,
        guarded). Redis counts a wait only in whole milliseconds; ``timeout`` must stay below the client's socket
        timeout."""
        return self.redis.blmove(key, key, max(0.001, round(timeout, 3)), "RIGHT", "RIGHT") is not None

    def heartbeat(self, node: str, info: dict[str, Any], lease_ttl: float,
                  leases: Iterable[tuple[str, str]]) -> list[str]:
        """Register ``node`` and renew its leases; returns the ids whose lease it lost."""
        k = self.keys
        args: list[Any] = [node, json.dumps(info, ensure_ascii=False), lease_ttl]
        for sid, token in leases:
            args += [sid, token]
        return list(self._healing(self._heartbeat, [k.nodes, k.node_seen, k.leases, k.lease_info], args))

    def finish(self, sid: str, token: str, report_json: str, *, node: str, site: str, group: str,
               offered: int, collected: int, pages: int, seconds: float, ok: bool, alpha: float,
               runs_maxlen: int, attempted: int | None = None, fail_cost: float = 0.0,
               errors: int = 0, node_seconds: float | None = None) -> bool:
        """Finish a leased subtask; False if the lease token is stale (the subtask was recalled meanwhile).

        ``attempted``: pages attempted, as the estimates charge them (``Report.charged``); by default the pages
        crawled, plus the one that failed the run if it failed. ``fail_cost``: seconds the bandit's sums charge a
        failed run beyond its own (1.5 x ``SCHEDEXT_TICK_INTERVAL``: the recall; ``posterior.update_sums``).
        ``errors``: the pages attempted that gave nothing without being blocked (``charged - pages - blocked``;
        ``posterior.update_sums``' ``error_pages``). ``node_seconds``: the run's node time
        (``Report.node_seconds``), which the sums charge instead of ``seconds`` and ``fail_cost`` when given
        (``posterior.run_seconds``)."""
        k = self.keys
        out = k.sleeping if ok else k.failed
        keys = [k.leases, k.lease_info, k.subtasks, out, k.runs, k.agg_site_node(site, node),
                k.agg_group_site_node(group, site, node), k.agg_index, k.node_counters(node), k.progress,
                k.agg_triples, k.est_site(site), k.est_group_site(group, site), k.est_dirty,
                k.est_groups]
        args: list[Any] = [sid, token, report_json, runs_maxlen, alpha, f"{site}|{node}", offered, collected, pages,
                f"{seconds:.6f}", 1 if ok else 0, group, node,
                pages + (0 if ok else 1) if attempted is None else attempted, f"{fail_cost:.6f}", errors,
                f"{node_seconds:.6f}" if node_seconds is not None and 0 <= node_seconds < math.inf else "",
                GROUP_NODES]
        return bool(self._healing(self._finish, keys, args))

    def release(self, node: str, leases: Iterable[tuple[str, str, float]], *, deregister: bool = False) -> int:
        """Return unfinished leased subtasks and the node's crawl queue to ``waiting``; how many moved. With
        ``deregister`` (a node's close) the node first leaves the registry in the same atomic step, so no
        allocation reaches its crawl queue afterwards (allocations are guarded by the registry entry)."""
        k = self.keys
        args: list[Any] = [node, "1" if deregister else "0"]
        for sid, token, priority in leases:
            args += [sid, token, priority]
        return int(self._healing(self._release, [k.leases, k.lease_info, k.subtasks, k.waiting, k.crawl(node),
                                                 k.queued, k.nodes, k.node_seen], args))

    def purge(self) -> int:
        """Delete every key of this deployment's prefix; how many. For the demo, experiments and tests, which own
        their prefix: nodes and controls never call it (shared state is never flushed)."""
        keys = list(self.redis.scan_iter(match=self.keys.everything, count=1000))
        for i in range(0, len(keys), 1000):
            self.redis.delete(*keys[i:i + 1000])
        return len(keys)

    # --- control side -----------------------------------------------------------------------------------------
    def snapshot(self, *, batch: int, max_bytes: int, recall_age: float, node_timeout: float, window: int,
                 nodes: Sequence[str], lease_horizon: float, dirty_limit: int = 100_000, show_bytes: int = 2000,
                 budget: int = 8_000_000) -> TickRead:
        """What a control tick reads first, in one script call (lua/snapshot.lua): see :class:`TickRead`.

        ``nodes``: the nodes expected to be live, whose registry entries and crawl-queue lengths come along;
        ``window``: how many ids of ``waiting`` to return. Pops up to ``dirty_limit`` members of ``est:dirty``.
        A lease deadline more than ``lease_horizon`` seconds ahead, and a heartbeat more than ``node_timeout``
        seconds ahead, are times no script writes: the lease counts as lapsed and the node as silent.
        """
        k = self.keys
        res = self._snapshot(
            keys=[k.virtual, k.sleeping, k.failed, k.leases, k.queued, k.node_seen, k.nodes, k.waiting, k.est_dirty,
                  *(k.crawl(n) for n in nodes)],
            args=[batch, max_bytes, show_bytes, budget, recall_age, node_timeout, window, dirty_limit, lease_horizon,
                  *nodes])
        (sec, usec), virtual, sleeping, failed, lapsed, stale, silent, live, entries, waiting, dirty = res

        def listed(flat: list[Any]) -> list[tuple[str, int, str]]:
            return [(flat[i], int(flat[i + 1]), flat[i + 2]) for i in range(0, len(flat), 3)]

        def full(entries: list[tuple[str, int, str]]) -> bool:
            """As long as the script reads a list: ``batch`` entries, or ``budget`` bytes (a cut one counts
            ``show_bytes``)."""
            return len(entries) >= batch or sum(show_bytes if sha1 else size for _, size, sha1 in entries) >= budget

        inputs = [listed(virtual), listed(sleeping), listed(failed)]
        return TickRead(now=float(sec) + int(usec) / 1e6, virtual=inputs[0], sleeping=inputs[1],
                        failed=inputs[2], lapsed=lapsed, stale=stale, silent=silent, live=live,
                        entries={n: (raw or None, int(queued)) for n, (raw, queued) in
                                 zip(nodes, json.loads(entries) or [], strict=True)},
                        window=list(json.loads(waiting) or []), dirty=dirty or [], more=any(map(full, inputs)))

    def node_entries(self, nodes: Sequence[str]) -> list[tuple[str | None, int]]:
        """(registry JSON or None, crawl-queue length) of each node, in one script call."""
        if not nodes:
            return []
        flat = self._nodes(keys=[self.keys.nodes, *(self.keys.crawl(n) for n in nodes)], args=list(nodes))
        return [(flat[i] or None, int(flat[i + 1])) for i in range(0, len(flat), 2)]

    def reserve_ids(self, n: int) -> list[str]:
        """``n`` fresh ids (task, subtask and dead-letter ids) from the ``seq`` counter."""
        last = int(self._ids(keys=[self.keys.seq], args=[n]))
        return [str(i) for i in range(last - n + 1, last + 1)]

    def report_control(self, control_id: str, info: dict[str, Any]) -> None:
        """Record a control's last tick in ``controls`` (what ``scrapy status`` shows of the controls)."""
        self.redis.hset(self.keys.controls, control_id, json.dumps(info, ensure_ascii=False))

    def drop_orphans(self, zset: str, members: Sequence[str]) -> None:
        """Remove members of a sorted set whose record is gone (a deadline or queue time with nothing behind it)."""
        if members:
            self.redis.zrem(zset, *members)

    def commit(self, guards: Sequence[Sequence[Any]], writes: Sequence[Sequence[Any]],
               pipe: Any = None) -> bool | None:
        """Apply ``writes`` if every guard holds, atomically. With ``pipe``, queue it there (result in execute).

        Guards and writes are built with :class:`Guard` and :class:`Write` (plain lists of the same shape are
        accepted too). An unknown guard or write raises :class:`redis.ResponseError`, nothing applied.
        """
        keys = _keys_of(guards, writes)
        args = [json.dumps([[list(guards), list(writes)]], ensure_ascii=False)]
        if pipe is not None:
            self._commit(keys=keys, args=args, client=pipe)
            return None
        [code] = self._commit(keys=keys, args=args)
        if code < 0:
            raise redis.ResponseError(f"commit refused a malformed decision (unknown guard or write): "
                                      f"{list(guards)!r:.200} {list(writes)!r:.200}")
        return bool(code)

    def commit_many(self, decisions: Sequence[tuple[Sequence[Sequence[Any]], Sequence[Sequence[Any]]]]
                    ) -> list[bool | Exception]:
        """Commit each (guards, writes) in order, in one script call; each is atomic on its own.

        Returns, per decision, whether it was applied, or a :class:`redis.ResponseError` for one the script
        refused as malformed, without stopping the others. A connection error raises: what was sent may or may
        not have run, and every guard makes the retry safe.
        """
        if not decisions:
            return []
        keys: dict[str, None] = {}
        for guards, writes in decisions:
            keys.update(dict.fromkeys(_keys_of(guards, writes)))
        payload = json.dumps([[list(g), list(w)] for g, w in decisions], ensure_ascii=False)
        codes = self._commit(keys=list(keys), args=[payload])
        refused = redis.ResponseError("commit refused a malformed decision (unknown guard or write)")
        return [refused if c < 0 else bool(c) for c in codes]

    def lead(self, control_id: str, ttl: float) -> bool:
        """Take or keep the control leader lease."""
        code = self._lead(keys=[self.keys.leader], args=[control_id, max(1, int(ttl * 1000))])
        if code == 2:  # once: the key now has a TTL
            logger.warning("control %s took over %s: it had no expiry or was not a string (set by hand?), so it "
                           "would never have lapsed", control_id, self.keys.leader)
        return bool(code)

    def resign(self, control_id: str) -> bool:
        """Give up the control leader lease if this control holds it; True if it did."""
        return bool(self._resign(keys=[self.keys.leader], args=[control_id]))
