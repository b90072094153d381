"""A capped history of status samples in Redis, so that charts over time survive a restart of whoever draws them.

A sample is a small JSON object distilled from :func:`scheduler_ext.status.collect_status`'s snapshot: queue
depths, nodes alive, cumulative pages / collected results / reports, the completion estimate of every (site, node)
and the per-node scheduling counts, plus whatever the caller adds (the dashboard adds the items stored in MongoDB,
which scheduler_ext cannot see). Rates (pages/s) are differences of consecutive samples, computed by the reader.

Any number of processes may call :func:`record` (the dashboard does, every ``SCHEDEXT_HISTORY_INTERVAL``; the
control could): the ``history:slot`` key, set with ``NX`` and a TTL of one interval in the same script as the
push, lets exactly one sample through per interval whoever offers it.

Settings: ``SCHEDEXT_HISTORY_INTERVAL`` (seconds between samples), ``SCHEDEXT_HISTORY_MAXLEN`` (samples kept).
Redis keys: ``history`` (list, oldest first), ``history:slot`` (docs/redis-keys.md).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .store import Store

HISTORY_VERSION = 1

# record: push one sample unless another process took this interval's slot.
# KEYS: history, history:slot
# ARGV: sample json, max samples kept, interval (ms)
# Returns 1 if the sample was pushed, 0 if the slot was taken.
# A slot with no expiry (PTTL -1), or a key of another type, was set by hand: it would hold the slot for ever and
# stop the sampling silently, so it is taken over as if free.
_RECORD = """
local slot = KEYS[2]
if redis.call('PTTL', slot) == -1 or redis.call('TYPE', slot).ok ~= 'string' then redis.call('DEL', slot) end
if not redis.call('SET', slot, '1', 'NX', 'PX', ARGV[3]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
return 1
"""


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def sample_of(status: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The history sample of one status snapshot (read defensively: missing parts count as empty).

    >>> s = sample_of({"time": 5.0, "queues": {"waiting": 2, "crawl": {"n1": 1}}, "nodes": [{"id": "n1",
    ...     "alive": True, "counts": {"recalled": 1}}], "completion": {"a.com": {"n1": {"completion": 0.5}}},
    ...     "products": {"milk": {"pages": 3, "collected": 20}}, "cluster": {"reports": 4}})
    >>> s["queues"]["crawl"], s["alive"], s["pages"], s["completion"], s["counts"]["n1"]["recalled"]
    (1, 1, 3, {'a.com': {'n1': 0.5}}, 1)
    """
    queues = status.get("queues") or {}
    nodes = status.get("nodes") or []
    products = (status.get("products") or {}).values()
    cluster = status.get("cluster") or {}
    return {
        "v": HISTORY_VERSION, "t": status.get("time"),
        "queues": {**{q: _int(queues.get(q)) for q in ("virtual", "waiting", "leased", "sleeping", "failed", "dead")},
                   "crawl": sum(_int(n) for n in (queues.get("crawl") or {}).values())},
        "alive": sum(1 for n in nodes if n.get("alive")), "nodes": len(nodes),
        "pages": sum(_int(p.get("pages")) for p in products),
        "collected": sum(_int(p.get("collected")) for p in products),
        "reports": _int(cluster.get("reports")), "tasks_done": _int(cluster.get("tasks_done")),
        "completion": {site: {node: (c or {}).get("completion") for node, c in by_node.items()}
                       for site, by_node in (status.get("completion") or {}).items()},
        "counts": {n.get("id"): {c: _int(v) for c, v in (n.get("counts") or {}).items()} for n in nodes},
        **(extra or {}),
    }


def _parse(raw: str) -> dict[str, Any] | None:
    """A sample, or None if ``raw`` is not one: not a JSON object of this version, or its time ``t`` is not a
    finite number (readers compare and subtract it)."""
    try:
        s = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(s, dict) or s.get("v") != HISTORY_VERSION:
        return None
    t = s.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    return s


class History:
    """The ``history`` list of one deployment: record samples, read them back."""

    def __init__(self, store: Store, interval: float = 5.0, maxlen: int = 2880) -> None:
        if interval <= 0 or maxlen < 1:
            raise ValueError(f"history: expected interval > 0 s and maxlen >= 1, got {interval} and {maxlen}")
        self.store, self.interval, self.maxlen = store, interval, maxlen
        self._record = store.redis.register_script(_RECORD)

    def record(self, status: dict[str, Any], extra: dict[str, Any] | None = None) -> bool:
        """Push the sample of ``status`` unless this interval already has one; True if pushed."""
        k = self.store.keys
        raw = json.dumps(sample_of(status, extra), ensure_ascii=False, separators=(",", ":"))
        return bool(self._record(keys=[k.history, k.history_slot],
                                 args=[raw, self.maxlen, max(1, int(self.interval * 1000))]))

    def read(self, since: float | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Samples oldest first: the last ``limit`` (all by default), only those after ``since``. A sample that is
        not a JSON object of this version is skipped: one bad entry must not blank a chart.

        With ``since`` (a poll for what is new) only the tail of the list is read, growing until it reaches back to
        ``since``: a poll costs the new samples, not the whole history."""
        n = 16 if since is not None else max(16, limit or self.maxlen)
        while True:
            raws = self.store.redis.lrange(self.store.keys.history, -n, -1)
            samples = [s for s in map(_parse, raws) if s is not None]
            fresh = [s for s in samples if since is None or s["t"] > since]
            whole = len(raws) < n
            covered = since is not None and bool(samples) and samples[0]["t"] <= since
            if whole or covered or (since is None and limit and len(fresh) >= limit):
                break
            n *= 4
        return fresh[-limit:] if limit else fresh
