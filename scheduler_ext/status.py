"""A snapshot of a deployment for people and scripts: what ``scrapy status --json`` prints (docs/status.md).

The JSON form is a stable contract (schema version ``v``): queues, nodes, controls (each control's last tick and
whether it is stuck), completion per (site, node), seconds per page per (product, site, node), per-product progress,
per-node scheduling counts, cluster counters.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from .store import Store
from .strategies.posterior import Sums

NODE_COUNTS = ("moved_out", "moved_in", "modified", "recalled", "dead", "stale_finish")


def _count(value: Any) -> int:
    """A counter's value; 0 if it holds no whole number (a hand edit: the next increment starts it over)."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _num(value: Any, kind: type = float) -> Any:
    """``value`` as a ``kind`` (float or int); None if it is missing or no finite number (a hand edit)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return kind(number) if math.isfinite(number) else None


def finite(value: Any) -> Any:
    """``value`` (decoded JSON) with every number that is not finite (read from an entry written by hand: 1e999,
    NaN) as None: Python writes them as ``Infinity`` and ``NaN``, which neither jq nor a browser's ``JSON.parse``
    reads. What ``scrapy status --json``, ``scrapy deadletter list --json`` and the dashboard's API write.

    >>> finite({"at": float("inf"), "n": [1, float("nan")]})
    {'at': None, 'n': [1, None]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _pace(est: dict[str, Any]) -> float | None:
    """Pages attempted per second of node time in a pair's sums (the bandit's pace, before its prior): what the
    bandit's allocation ranks the pair by, with the served share; None if the entry has no sums or no pace yet."""
    sums = Sums.from_entry(est)
    return None if sums is None else sums.pace


def _object(raw: str | None) -> dict[str, Any]:
    """A JSON object read from Redis, or {} if it is missing or anything else (status shows what it can)."""
    try:
        value = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def control_rows(controls: dict[str, str], leader: str | None) -> list[dict[str, Any]]:
    """Each control's last tick as it reported it (``controls`` hash), read defensively.

    ``stuck`` is true once ``failed_in_row`` reached the control's alarm (``SCHEDEXT_TICK_ALARM``); ``at`` and
    ``ok_at`` are the control's clock (Unix seconds) at its last tick and last good tick.
    """
    rows = []
    for cid, raw in sorted(controls.items()):
        info = _object(raw)
        failed = _num(info.get("failed_in_row"), int) or 0
        alarm = _num(info.get("alarm"), int) or 5
        rows.append({"id": cid, "leader": cid == leader, "at": _num(info.get("at")),
                     "ok_at": _num(info.get("ok_at")), "failed_in_row": failed, "stuck": failed >= alarm,
                     "last_error": str(info.get("last_error") or "")})
    return rows


def collect_status(store: Store, node_timeout: float = 60.0, *, recall_threshold: float | None = None
                   ) -> dict[str, Any]:
    """Everything ``scrapy status`` shows, as plain JSON-ready data. Cost: O(nodes x sites + products).

    A node is alive if its last heartbeat is at most ``node_timeout`` seconds old (``Config.node_timeout``), and no
    further ahead than that (a time no heartbeat writes: the control takes such a node for dead too);
    ``recall_threshold`` is its older name, kept for callers that pass it by keyword.
    """
    if recall_threshold is not None:
        node_timeout = recall_threshold
    r, k = store.redis, store.keys
    now = store.now()
    node_ids = set(r.hkeys(k.nodes)) | set(r.zrange(k.node_seen, 0, -1))
    # A member or field that does not split as its key's schema says (a hand edit) counts nothing.
    pairs = sorted(p for p in r.smembers(k.agg_index) if "|" in p)
    triples = sorted(t for t in r.smembers(k.agg_triples) if t.count("|") >= 2)
    node_ids |= {p.rsplit("|", 1)[1] for p in pairs}
    nodes = sorted(node_ids)
    with r.pipeline(transaction=False) as pipe:
        for name in ("virtual", "sleeping", "failed"):
            pipe.llen(getattr(k, name))
        pipe.zcard(k.waiting)
        pipe.zcard(k.leases)
        pipe.hlen(k.dead)
        pipe.get(k.leader)
        pipe.hgetall(k.counters)
        pipe.hgetall(k.progress)
        pipe.hgetall(k.controls)
        for n in nodes:
            pipe.llen(k.crawl(n))
            pipe.hget(k.nodes, n)
            pipe.zscore(k.node_seen, n)
            pipe.hgetall(k.node_counters(n))
        for p in pairs:
            site, node = p.rsplit("|", 1)
            pipe.hgetall(k.agg_site_node(site, node))
            pipe.hget(k.est_site(site), node)
        for t in triples:
            group, site, node = t.rsplit("|", 2)
            pipe.hget(k.est_group_site(group, site), node)
        rows = pipe.execute()
    virtual, sleeping, failed, waiting, leased, dead, leader, counters, progress, controls = rows[:10]
    pos = 10
    node_rows = []
    crawl: dict[str, int] = {}
    for n in nodes:
        qlen, raw, seen, counts = rows[pos:pos + 4]
        pos += 4
        info = _object(raw)
        crawl[n] = int(qlen)
        node_rows.append({
            "id": n, "alive": seen is not None and abs(now - float(seen)) <= node_timeout,
            "type": info.get("type"), "address": info.get("address"), "host": info.get("host"),
            "pid": info.get("pid"), "last_seen": _num(seen), "subtasks": info.get("subtasks", []),
            "crawl_queue": int(qlen), "counts": {c: _count(counts.get(c)) for c in NODE_COUNTS}})
    completion: dict[str, dict[str, Any]] = defaultdict(dict)
    for p in pairs:
        site, node = p.rsplit("|", 1)
        h, est = rows[pos], _object(rows[pos + 1])
        pos += 2
        offered, collected = _count(h.get("offered")), _count(h.get("collected"))
        completion[site][node] = {
            "completion": _num(est.get("c")), "ratio": collected / offered if offered else None,
            "runs": _count(h.get("runs")), "failures": _count(h.get("failures")), "offered": offered,
            "collected": collected, "pages": _count(h.get("pages")),
            "seconds_per_page": _num(est.get("spp")), "pace": _pace(est)}
    spp: dict[str, dict[str, dict[str, float | None]]] = defaultdict(lambda: defaultdict(dict))
    for t in triples:
        group, site, node = t.rsplit("|", 2)
        spp[group][site][node] = _num(_object(rows[pos]).get("spp"))
        pos += 1
    products: dict[str, dict[str, int]] = defaultdict(dict)
    for field, value in progress.items():
        if "|" in field:
            group, name = field.rsplit("|", 1)
            products[group][name] = _count(value)
    return {
        "v": 1, "prefix": k.prefix, "time": now, "leader": leader,
        "queues": {"virtual": int(virtual), "waiting": int(waiting), "crawl": crawl, "leased": int(leased),
                   "sleeping": int(sleeping), "failed": int(failed), "dead": int(dead)},
        "nodes": node_rows,
        "controls": control_rows(controls, leader),
        "completion": {s: dict(v) for s, v in sorted(completion.items())},
        "seconds_per_page": {g: {s: dict(n) for s, n in v.items()} for g, v in sorted(spp.items())},
        "products": {g: {"tasks": v.get("tasks", 0), "done": v.get("done", 0), "collected": v.get("collected", 0),
                         "pages": v.get("pages", 0)} for g, v in sorted(products.items())},
        "cluster": {c: _count(v) for c, v in sorted(counters.items())},
    }
