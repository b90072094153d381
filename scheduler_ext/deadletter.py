"""The dead-letter list (the paper's "manual handling"): list, requeue and drop entries.

An entry is JSON in the ``dead`` hash: ``{id, kind, reason, attempts, last_node, at, subtask | raw}``. ``kind`` is
``subtask`` (recalled the maximum number of times), ``virtual`` (an injected virtual task that does not validate),
``malformed`` (a crawl-queue entry or failure that is not a valid subtask), ``report`` (an entry of ``sleeping`` the
control could not use), ``failure`` (an entry of ``failed`` a strategy failed on), ``lease`` or ``waiting``.
Entries that hold a subtask, and entries of ``virtual``, ``sleeping`` and ``failed`` kept whole (``raw`` not
``cut``), can be requeued (to ``waiting``, or back to the list they came from); the others can only be dropped.

Every requeue and drop writes an audit record (``{v, at, actor, action, id, kind, to, entry}``) to the ``audit``
list in the same atomic commit as the change itself, so an action is applied and audited together, once. The list
is newest first and trimmed to ``SCHEDEXT_AUDIT_MAXLEN`` records (docs/redis-keys.md).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

from .control import shown
from .defaults import DEFAULTS
from .exceptions import InvalidInput
from .models import Subtask
from .store import Guard, Store, Write

AUDIT_MAXLEN: int = DEFAULTS["SCHEDEXT_AUDIT_MAXLEN"]

_SOURCES = {"virtual": "virtual", "report": "sleeping", "failure": "failed"}  # kind -> list it came from


class UnknownEntry(InvalidInput):
    """Raised if no dead-letter entry has the given id."""


def _decode(entry_id: str, raw: str) -> dict[str, Any]:
    """A dead-letter entry; one that is not ours (written by hand) shows as kind ``unreadable`` (drop only)."""
    try:
        entry = json.loads(raw)
    except (ValueError, RecursionError):
        entry = None
    if not isinstance(entry, dict):
        return {"id": entry_id, "kind": "unreadable", "reason": "not a dead-letter entry (not a JSON object)",
                "attempts": 0, "last_node": None, "at": 0, "raw": shown(raw)}
    return {**entry, "id": entry.get("id", entry_id)}


def list_entries(store: Store) -> list[dict[str, Any]]:
    entries = [_decode(eid, raw) for eid, raw in store.redis.hgetall(store.keys.dead).items()]
    return sorted(entries, key=lambda e: (_at(e), str(e.get("id"))))


def _at(entry: dict[str, Any]) -> float:
    at = entry.get("at")
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else 0.0


def _entry(store: Store, entry_id: str) -> tuple[str, dict[str, Any]]:
    raw = store.redis.hget(store.keys.dead, entry_id)
    if raw is None:
        raise UnknownEntry(f"no dead-letter entry with id {entry_id!r} (see `scrapy deadletter list`)")
    return raw, _decode(entry_id, raw)


def list_audit(store: Store, limit: int = 100) -> list[dict[str, Any]]:
    """The latest audit records, newest first (records that are not JSON objects are skipped)."""
    out = []
    for raw in store.redis.lrange(store.keys.audit, 0, max(0, limit - 1)):
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _as_text(value: Any) -> Any:
    """``value`` (decoded JSON) with every string, keys included, valid UTF-8: bytes that were not (they arrive as
    lone surrogates, :mod:`scheduler_ext.connection`) shown as ``\\xNN`` by :func:`~scheduler_ext.control.shown`,
    whole. An audit record is a record of what was done, for people: it must stay readable by every reader."""
    if isinstance(value, str):
        return shown(value, limit=sys.maxsize)
    if isinstance(value, dict):
        return {_as_text(k): _as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_text(v) for v in value]
    return value


def _audited(store: Store, entry_id: str, entry: dict[str, Any], guard: list[Any], writes: list[Any], *,
             action: str, actor: str, to: str | None, maxlen: int) -> None:
    """Commit ``writes`` under ``guard`` together with the audit record of the action; trim the audit list."""
    record = {"v": 1, "at": store.now(), "actor": actor, "action": action, "id": entry_id,
              "kind": entry.get("kind"), "to": to, "entry": entry}
    record = _as_text(record)
    writes = [*writes, Write.lpush(store.keys.audit, json.dumps(record, ensure_ascii=False, sort_keys=True))]
    if not store.commit(guard, writes):
        raise UnknownEntry(f"dead-letter entry {entry_id!r} was removed meanwhile")
    # Trimming apart from the commit is harmless: it only ever drops the oldest records.
    store.redis.ltrim(store.keys.audit, 0, max(1, maxlen) - 1)


def requeue(store: Store, entry_id: str, actor: str = "unknown", maxlen: int = AUDIT_MAXLEN) -> str:
    """Send an entry back: a subtask to ``waiting`` with a fresh attempt count, a virtual task to ``virtual``, a
    whole report or failure to the list it came from. ``actor`` names who asked, for the audit record."""
    k = store.keys
    _, entry = _entry(store, entry_id)
    guard = [Guard.hdel(k.dead, entry_id)]
    if isinstance(entry.get("subtask"), dict):
        st = Subtask.from_dict(entry["subtask"], f"dead-letter entry {entry_id}")
        fresh = replace(st, attempt=0, avoid=[], node=None, since=store.now())
        writes = [Write.hset(k.subtasks, fresh.id, fresh.to_json()), Write.zadd(k.waiting, fresh.priority, fresh.id),
                  Write.hincrby(k.counters, "requeued")]
        where = "waiting"
    elif entry.get("kind") in _SOURCES and isinstance(entry.get("raw"), str) and entry["raw"] \
            and not entry.get("cut") and (entry["kind"] == "virtual" or entry.get("source")):
        where = _SOURCES[entry["kind"]]
        writes = [Write.lpush(getattr(k, where), entry["raw"]), Write.hincrby(k.counters, "requeued")]
    else:
        raise InvalidInput(f"dead-letter entry {entry_id!r} ({entry.get('kind')}) holds no subtask or virtual "
                           "task, nor any whole entry, to requeue; inspect it and drop it")
    _audited(store, entry_id, entry, guard, writes, action="requeue", actor=actor, to=where, maxlen=maxlen)
    return where


def drop(store: Store, entry_id: str, actor: str = "unknown", maxlen: int = AUDIT_MAXLEN) -> None:
    """Delete an entry for good; ``actor`` names who asked, for the audit record."""
    _, entry = _entry(store, entry_id)
    _audited(store, entry_id, entry, [Guard.hdel(store.keys.dead, entry_id)],
             [Write.hincrby(store.keys.counters, "dropped")], action="drop", actor=actor, to=None, maxlen=maxlen)
