"""The dead-letter list (the paper's "manual handling"): list, requeue and drop entries.

An entry is JSON in the ``dead`` hash: ``{id, kind, reason, attempts, last_node, at, subtask | raw}``. ``kind`` is
``subtask`` (recalled the maximum number of times), ``virtual`` (an injected virtual task that does not validate),
``malformed`` (a crawl-queue entry or report that is not a valid subtask), ``report``, ``lease`` or ``waiting``.
Only entries that hold a subtask or a virtual task can be requeued; the others can only be dropped.

Every requeue and drop writes an audit record (``{v, at, actor, action, id, kind, to, entry}``) to the ``audit``
list in the same atomic commit as the change itself, so an action is applied and audited together, once. The list
is newest first and trimmed to ``SCHEDEXT_AUDIT_MAXLEN`` records (docs/redis-keys.md).
"""

from __future__ import annotations

import json
from typing import Any

from .defaults import DEFAULTS
from .exceptions import InvalidInput
from .models import Subtask
from .store import Store

AUDIT_MAXLEN: int = DEFAULTS["SCHEDEXT_AUDIT_MAXLEN"]


class UnknownEntry(InvalidInput):
    """Raised if no dead-letter entry has the given id."""


def _parse(entry_id: str, raw: str) -> dict[str, Any]:
    """An entry as stored, or, for a value that is not a JSON object, a ``kind: unreadable`` entry to drop."""
    try:
        entry = json.loads(raw)
    except ValueError:
        entry = None
    if isinstance(entry, dict):
        return entry
    return {"id": entry_id, "kind": "unreadable", "reason": "entry is not a JSON object", "raw": raw[:2000]}


def list_entries(store: Store) -> list[dict[str, Any]]:
    entries = [_parse(i, raw) for i, raw in store.redis.hgetall(store.keys.dead).items()]
    return sorted(entries, key=lambda e: (e.get("at") or 0, str(e.get("id"))))


def _entry(store: Store, entry_id: str) -> tuple[str, dict[str, Any]]:
    raw = store.redis.hget(store.keys.dead, entry_id)
    if raw is None:
        raise UnknownEntry(f"no dead-letter entry with id {entry_id!r} (see `scrapy deadletter list`)")
    return raw, _parse(entry_id, raw)


def list_audit(store: Store, limit: int = 100) -> list[dict[str, Any]]:
    """The latest audit records, newest first (records that are not JSON objects are skipped)."""
    out = []
    for raw in store.redis.lrange(store.keys.audit, 0, max(0, limit - 1)):
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _audited(store: Store, entry_id: str, entry: dict[str, Any], guard: list[list[Any]], writes: list[list[Any]],
             *, action: str, actor: str, to: str | None, maxlen: int) -> None:
    """Commit ``writes`` under ``guard`` together with the audit record of the action; trim the audit list."""
    record = {"v": 1, "at": store.now(), "actor": actor, "action": action, "id": entry_id,
              "kind": entry.get("kind"), "to": to, "entry": entry}
    writes = [*writes, ["lpush", store.keys.audit, json.dumps(record, ensure_ascii=False, sort_keys=True)]]
    if not store.commit(guard, writes):
        raise UnknownEntry(f"dead-letter entry {entry_id!r} was removed meanwhile")
    # Trimming apart from the commit is harmless: it only ever drops the oldest records.
    store.redis.ltrim(store.keys.audit, 0, max(1, maxlen) - 1)


def requeue(store: Store, entry_id: str, actor: str = "unknown", maxlen: int = AUDIT_MAXLEN) -> str:
    """Send an entry back: a subtask to ``waiting`` with a fresh attempt count, a virtual task to ``virtual``.
    ``actor`` names who asked, for the audit record."""
    k = store.keys
    _, entry = _entry(store, entry_id)
    guard = [["hdel", k.dead, entry_id]]
    if isinstance(entry.get("subtask"), dict):
        st = Subtask.from_dict(entry["subtask"], f"dead-letter entry {entry_id}")
        fresh = Subtask(**{**st.__dict__, "attempt": 0, "avoid": [], "node": None, "since": store.now()})
        writes: list[list[Any]] = [["hset", k.subtasks, fresh.id, fresh.to_json()],
                                   ["zadd", k.waiting, fresh.priority, fresh.id],
                  ["hincrby", k.counters, "requeued", 1]]
        where = "waiting"
    elif entry.get("kind") == "virtual" and entry.get("raw"):
        writes = [["lpush", k.virtual, entry["raw"]], ["hincrby", k.counters, "requeued", 1]]
        where = "virtual"
    else:
        raise InvalidInput(f"dead-letter entry {entry_id!r} ({entry.get('kind')}) holds no subtask or virtual "
                           "task to requeue; inspect it and drop it")
    _audited(store, entry_id, entry, guard, writes, action="requeue", actor=actor, to=where, maxlen=maxlen)
    return where


def drop(store: Store, entry_id: str, actor: str = "unknown", maxlen: int = AUDIT_MAXLEN) -> None:
    """Delete an entry for good; ``actor`` names who asked, for the audit record."""
    _, entry = _entry(store, entry_id)
    _audited(store, entry_id, entry, [["hdel", store.keys.dead, entry_id]],
             [["hincrby", store.keys.counters, "dropped", 1]], action="drop", actor=actor, to=None, maxlen=maxlen)
