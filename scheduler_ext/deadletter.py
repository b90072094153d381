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

Dropping a ``report`` or ``failure`` also counts its subtask out of its task (the ``tasks`` record: ``open``, and
``done`` if that was the last of it), in the same guarded commit: the control left it counted in, since requeued whole
it counts itself out (docs/control.md, "Decide"). Every other kind was counted out when it was dead-lettered.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Any

from .control import counted_out, ended, shown
from .defaults import DEFAULTS
from .exceptions import InvalidInput
from .models import Subtask, Task, loads_object
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


def _audit(store: Store, entry_id: str, entry: dict[str, Any], *, action: str, actor: str,
           to: str | None) -> Write:
    """The write that records the action in the audit list, to be committed with the action itself."""
    record = {"v": 1, "at": store.now(), "actor": actor, "action": action, "id": entry_id,
              "kind": entry.get("kind"), "to": to, "entry": entry}
    return Write.lpush(store.keys.audit, json.dumps(_as_text(record), ensure_ascii=False, sort_keys=True))


def _applied(store: Store, entry_id: str, applied: Any, maxlen: int) -> None:
    """Raise UnknownEntry unless the action's commit was applied; trim the audit list."""
    if not applied:
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
    audit = _audit(store, entry_id, entry, action="requeue", actor=actor, to=where)
    _applied(store, entry_id, store.commit(guard, [*writes, audit]), maxlen)
    return where


def drop(store: Store, entry_id: str, actor: str = "unknown", maxlen: int = AUDIT_MAXLEN) -> None:
    """Delete an entry for good, counting the subtask of a report or failure out of its task (:func:`_counted_out`);
    ``actor`` names who asked, for the audit record.

    One guarded commit, as the control's: the entry's removal (an entry dropped twice at once is counted once) and,
    when a task record is written, that record as it was read (``hfield_is``: a tick of the control that wrote it
    in between is never written over). If only the record changed, it is read again and the drop tried again."""
    k = store.keys
    for _ in range(DROP_TRIES):
        _, entry = _entry(store, entry_id)  # gone meanwhile: UnknownEntry
        guards, writes = _counted_out(store, entry)
        writes = [Write.hincrby(k.counters, "dropped"), *writes,
                  _audit(store, entry_id, entry, action="drop", actor=actor, to=None)]
        if store.commit([Guard.hdel(k.dead, entry_id), *guards], writes):
            _applied(store, entry_id, True, maxlen)
            return
    raise InvalidInput(f"dead-letter entry {entry_id!r}: its task record changed {DROP_TRIES} times while it was "
                       "dropped; nothing was dropped, try again")


#: How many times :func:`drop` reads its task record again when a tick wrote it in between (one a tick at most).
DROP_TRIES = 20


def _counted_out(store: Store, entry: dict[str, Any]) -> tuple[list[Guard], list[Write]]:
    """The guard and writes that count the subtask of a dropped report out of its task, as the control counts out a
    subtask it dead-letters (``open`` and, for a recalled one, ``retrying`` down by one; the task done if nothing of
    it is out and every page was given): the task record as read must be the one written over.

    A report is the ``raw`` of a ``report`` or ``failure`` entry, or of a ``malformed`` one that is a failure report
    the control could not read, kept whole and holding a readable ``subtask``: the control counts none of them out.
    Every other entry was counted out when it was dead-lettered (``subtask``, ``lease``, a silent node's crawl-queue
    entry: a subtask, not a report), or holds no subtask (``virtual``, ``waiting``, the take script's records). None
    either for a task with no readable record, or one that ended."""
    raw = entry.get("raw")
    if entry.get("kind") not in ("report", "failure", "malformed") or entry.get("cut") or not isinstance(raw, str):
        return [], []
    try:  # the report itself may be what was wrong (that is why most are here): its subtask is enough
        sub = loads_object(raw, "report").get("subtask")
        st = Subtask.from_dict(sub if isinstance(sub, dict) else {}, "report.subtask")
        keys = store.keys
        raw_task = store.redis.hget(keys.tasks, st.task)
        task = None if raw_task is None else Task.from_json(raw_task)
    except InvalidInput:
        return [], []
    if task is None or task.done:
        return [], []
    task = counted_out(task, st)
    return [Guard.hfield_is(keys.tasks, st.task, raw_task)], [*ended(keys, task),
                                                              Write.hset(keys.tasks, st.task, task.to_json())]
