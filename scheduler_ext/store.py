"""Every atomic change to the scheduling state in Redis: one Lua script each, registered once per client.

Nodes use :meth:`Store.take`, :meth:`Store.heartbeat`, :meth:`Store.finish` and :meth:`Store.release`; the
control loop commits each of its decisions through :meth:`Store.commit`, a compare-and-apply: a guard (the report
is still at the tail of its list, the lease token still matches, the subtask is still waiting, ...) and the writes
that follow from it happen in one script, so a decision is applied exactly once even if two controls race or one
dies half-way. Times are Redis server time (``TIME`` inside the scripts), never a node's clock.

Key schema: :mod:`scheduler_ext.keys` (docs/redis-keys.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

import redis

from .keys import Keys

SCRIPTS = ("take", "heartbeat", "finish", "release", "commit", "lead", "resign")
_INCLUDE = re.compile(r"^--@include (\w+)$", re.MULTILINE)


def load_script(name: str) -> str:
    """The source of ``lua/<name>.lua`` (package data), its ``--@include <helper>`` lines replaced by the helper.

    Helpers (``lua/now.lua``) are included, not copied, so one definition serves every script; an include is
    expanded once, at load time, and the script Redis runs is plain Lua.
    """
    base = resources.files(__package__).joinpath("lua")
    source = base.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: base.joinpath(f"{m.group(1)}.lua").read_text(encoding="utf-8"), source)


def _keys_of(guards: Sequence[Sequence[Any]], writes: Sequence[Sequence[Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for g in guards:
        keys[g[1]] = None
        if g[0] == "lease_is":
            keys[g[2]] = None
    for w in writes:
        keys[w[1]] = None
    return list(keys)


class Store:
    """The atomic operations on one deployment's scheduling state (one key prefix)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # Typed Any on purpose: redis-py's annotations cannot express that a decode_responses client returns str.
        self.redis: Any = client
        self.keys = keys
        scripts = {name: client.register_script(load_script(name)) for name in SCRIPTS}
        self._take, self._heartbeat, self._finish = scripts["take"], scripts["heartbeat"], scripts["finish"]
        self._release, self._commit = scripts["release"], scripts["commit"]
        self._lead, self._resign = scripts["lead"], scripts["resign"]

    def now(self) -> float:
        """Redis server time, seconds."""
        sec, usec = self.redis.time()
        return float(sec) + usec / 1e6

    # --- node side ----------------------------------------------------------------------------------------------
    def take(self, node: str, lease_ttl: float, grace: float, max_skip: int = 8) -> tuple[str, str, float] | None:
        """Lease the next subtask of ``node``'s crawl queue: (subtask json, token, start time) or None."""
        k = self.keys
        res = self._take(keys=[k.crawl(node), k.leases, k.lease_info, k.subtasks, k.failed, k.queued, k.seq,
                               k.counters], args=[node, max_skip, lease_ttl, grace])
        if not res:
            return None
        return res[0], res[1], float(res[2])

    def heartbeat(self, node: str, info: dict[str, Any], lease_ttl: float,
                  leases: Iterable[tuple[str, str]]) -> list[str]:
        """Register ``node`` and renew its leases; returns the ids whose lease it lost."""
        k = self.keys
        args: list[Any] = [node, json.dumps(info, ensure_ascii=False), lease_ttl]
        for sid, token in leases:
            args += [sid, token]
        return list(self._heartbeat(keys=[k.nodes, k.node_seen, k.leases, k.lease_info], args=args))

    def finish(self, sid: str, token: str, report_json: str, *, node: str, site: str, group: str,
               offered: int, collected: int, pages: int, seconds: float, ok: bool, alpha: float,
               runs_maxlen: int) -> bool:
        """Finish a leased subtask; False if the lease token is stale (the subtask was recalled meanwhile)."""
        k = self.keys
        out = k.sleeping if ok else k.failed
        keys = [k.leases, k.lease_info, k.subtasks, out, k.runs, k.agg_site_node(site, node),
                k.agg_group_site_node(group, site, node), k.agg_index, k.node_counters(node), k.progress,
                k.agg_triples, k.est_site(site), k.est_group_site(group, site)]
        args: list[Any] = [sid, token, report_json, runs_maxlen, alpha, f"{site}|{node}", offered, collected, pages,
                f"{seconds:.6f}", 1 if ok else 0, group, node]
        return bool(self._finish(keys=keys, args=args))

    def release(self, node: str, leases: Iterable[tuple[str, str, float]]) -> int:
        """Return unfinished leased subtasks and the node's crawl queue to ``waiting``; how many moved."""
        k = self.keys
        args: list[Any] = [node]
        for sid, token, priority in leases:
            args += [sid, token, priority]
        return int(self._release(keys=[k.leases, k.lease_info, k.subtasks, k.waiting, k.crawl(node), k.queued],
                                 args=args))

    def purge(self) -> int:
        """Delete every key of this deployment's prefix; how many. For the demo, experiments and tests, which own
        their prefix: nodes and controls never call it (shared state is never flushed)."""
        keys = list(self.redis.scan_iter(match=f"{self.keys.prefix}:*", count=1000))
        for i in range(0, len(keys), 1000):
            self.redis.delete(*keys[i:i + 1000])
        return len(keys)

    def deregister(self, node: str) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.nodes, node)
            pipe.zrem(self.keys.node_seen, node)
            pipe.execute()

    # --- control side -----------------------------------------------------------------------------------------
    def commit(self, guards: Sequence[Sequence[Any]], writes: Sequence[Sequence[Any]],
               pipe: Any = None) -> bool | None:
        """Apply ``writes`` if every guard holds, atomically. With ``pipe``, queue it there (result in execute)."""
        keys = _keys_of(guards, writes)
        args = [json.dumps(list(guards), ensure_ascii=False), json.dumps(list(writes), ensure_ascii=False)]
        if pipe is not None:
            self._commit(keys=keys, args=args, client=pipe)
            return None
        return bool(self._commit(keys=keys, args=args))

    def lead(self, control_id: str, ttl: float) -> bool:
        """Take or keep the control leader lease."""
        return bool(self._lead(keys=[self.keys.leader], args=[control_id, max(1, int(ttl * 1000))]))

    def resign(self, control_id: str) -> bool:
        """Give up the control leader lease if this control holds it; True if it did."""
        return bool(self._resign(keys=[self.keys.leader], args=[control_id]))
