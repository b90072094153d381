"""What the dashboard shows, read from Redis (the status snapshot, history, tasks, runs, dead letters, audit) and
MongoDB (items). Plain blocking calls: the server runs each in the reactor's thread pool, never on the reactor.

Everything returned is JSON-ready and free of connection details: no Redis or MongoDB URL or password is ever part
of it (docs/dashboard.md).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

from product_crawl.items import SearchResultItem
from scheduler_ext import deadletter
from scheduler_ext.history import History
from scheduler_ext.status import collect_status
from scheduler_ext.store import Store

logger = logging.getLogger(__name__)

EXPORT_FORMATS = ("jsonl", "csv")
EXPORT_BATCH = 500  # documents per chunk written to the response
CSV_FIELDS = [f.name for f in fields(SearchResultItem)] + ["fingerprint", "last_crawled_at", "last_node_id"]
ITEM_FIELDS = ("product", "site", "engine", "title", "url", "snippet", "date", "rank", "page", "node_id",
               "crawled_at", "last_crawled_at")
RUNS_SCANNED = 1000  # newest run records looked at for one product's recent runs
RUNS_SHOWN = 30  # recent runs of one product shown


class DataUnavailable(RuntimeError):
    """Raised if MongoDB does not answer; the message names what failed, never the server's URI."""


def _csv_cell(value: Any) -> Any:
    # A cell starting with = + - @ is a formula to a spreadsheet: crawled text must never run as one.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _task(raw: str) -> dict[str, Any] | None:
    try:
        t = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(t, dict):
        return None
    payload = t.get("payload") if isinstance(t.get("payload"), dict) else {}
    keep = ("id", "site", "group", "page_limit", "time_limit", "next_page", "total_pages", "reported",
            "subtasks", "collected", "done", "last_node")
    return {**{k: t.get(k) for k in keep}, "engine": payload.get("engine")}


def _run(entry_id: str, raw: str | None) -> dict[str, Any] | None:
    try:
        r = json.loads(raw or "")
    except (ValueError, RecursionError):
        return None
    st = r.get("subtask") if isinstance(r, dict) else None
    if not isinstance(st, dict):
        return None
    keep = ("node", "outcome", "reason", "offered", "collected", "pages", "started", "ended")
    return {"id": entry_id, **{k: r.get(k) for k in keep}, "site": st.get("site"), "group": st.get("group"),
            "subtask": st.get("id"), "page_limit": st.get("page_limit"), "time_limit": st.get("time_limit"),
            "first_page": st.get("first_page"), "attempt": st.get("attempt")}


class DashboardData:
    """The dashboard's reads and its two actions, on one deployment (a Store) and one items collection.

    ``collection`` is a pymongo collection (None: no items views). ``status_ttl`` is how long one snapshot serves
    every client (seconds): ten open pages cost one snapshot per refresh, not ten.
    """

    def __init__(self, store: Store, history: History, collection: Any = None, *, recall_threshold: float = 60.0,
                 status_ttl: float = 1.0, audit_maxlen: int = deadletter.AUDIT_MAXLEN) -> None:
        self.store, self.history, self.collection = store, history, collection
        self.recall_threshold, self.status_ttl, self.audit_maxlen = recall_threshold, status_ttl, audit_maxlen
        self._lock = threading.Lock()
        self._status: tuple[float, dict[str, Any]] | None = None

    # --- Redis ----------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The ``scrapy status --json`` snapshot (schema ``v: 1``), at most ``status_ttl`` old."""
        with self._lock:
            if self._status is not None and time.monotonic() - self._status[0] < self.status_ttl:
                return self._status[1]
        snap = collect_status(self.store, self.recall_threshold)
        with self._lock:
            self._status = (time.monotonic(), snap)
        return snap

    def sample(self) -> bool:
        """Offer a history sample (the snapshot plus items stored); True if this process took the slot."""
        extra: dict[str, Any] = {}
        if self.collection is not None:
            try:
                extra["items"] = int(self.collection.estimated_document_count())
            except Exception as exc:  # any pymongo failure: sample without items rather than not at all
                logger.warning("dashboard: items not counted in this sample: %s", type(exc).__name__)
        return self.history.record(collect_status(self.store, self.recall_threshold), extra)

    def products(self, product: str | None = None) -> dict[str, Any]:
        """Per-product progress and items stored; with ``product``, its tasks (current page and time limits) and
        recent runs (the limits each run had, as the modification strategy changed them)."""
        out: dict[str, Any] = {"v": 1, "products": self.status().get("products", {}),
                               "items": self.items_per_product() if self.collection is not None else None}
        if product is None:
            return out
        tasks = [t for raw in self.store.redis.hvals(self.store.keys.tasks) if (t := _task(raw))]
        out["tasks"] = sorted((t for t in tasks if t["group"] == product), key=lambda t: (str(t["site"]),
                                                                                        str(t["engine"])))
        out["runs"] = self._recent_runs(lambda run: run["group"] == product)
        return out

    def _recent_runs(self, keep: Any) -> list[dict[str, Any]]:
        """The newest runs (of the last :data:`RUNS_SCANNED`) for which ``keep(run)`` holds, newest first."""
        runs = []
        for entry_id, entry in self.store.redis.xrevrange(self.store.keys.runs, count=RUNS_SCANNED):
            run = _run(entry_id, entry.get("report"))
            if run is not None and keep(run):
                runs.append(run)
                if len(runs) >= RUNS_SHOWN:
                    break
        return runs

    def deadletters(self) -> dict[str, Any]:
        """The dead-letter entries, the latest audit records, and the latest failed runs (each one a recall)."""
        return {"v": 1, "entries": deadletter.list_entries(self.store),
                "audit": deadletter.list_audit(self.store, 50),
                "failures": self._recent_runs(lambda run: run["outcome"] == "failed")}

    def requeue(self, entry_id: str, actor: str) -> str:
        return deadletter.requeue(self.store, entry_id, actor, self.audit_maxlen)

    def drop(self, entry_id: str, actor: str) -> None:
        deadletter.drop(self.store, entry_id, actor, self.audit_maxlen)

    # --- MongoDB --------------------------------------------------------------------------------------------
    def _items(self) -> Any:
        if self.collection is None:
            raise DataUnavailable("no items collection is configured")
        return self.collection

    def items_per_product(self) -> dict[str, int]:
        try:
            rows = self._items().aggregate([{"$group": {"_id": "$product", "n": {"$sum": 1}}}])
            return {str(r["_id"]): int(r["n"]) for r in rows}
        except DataUnavailable:
            raise
        except Exception as exc:  # any pymongo failure means: the items cannot be read now
            raise DataUnavailable(f"MongoDB did not answer ({type(exc).__name__})") from exc

    def items(self, product: str | None = None, site: str | None = None, words: str = "",
              limit: int = 50) -> list[dict[str, Any]]:
        """The latest items, newest first, of a product and site, whose title or snippet contains every word."""
        query: dict[str, Any] = {}
        if product:
            query["product"] = product
        if site:
            query["site"] = site
        terms = [w for w in words.split() if w][:5]
        if terms:
            query["$and"] = [{"$or": [{f: {"$regex": re.escape(w), "$options": "i"}} for f in ("title", "snippet")]}
                             for w in terms]
        try:
            cursor = self._items().find(query, {f: 1 for f in ITEM_FIELDS}).sort("crawled_at", -1).limit(limit)
            return [{f: doc.get(f) for f in ITEM_FIELDS} for doc in cursor]
        except DataUnavailable:
            raise
        except Exception as exc:  # any pymongo failure
            raise DataUnavailable(f"MongoDB did not answer ({type(exc).__name__})") from exc

    def export(self, product: str, fmt: str) -> Iterator[bytes]:
        """One product's items as JSON lines or CSV, in chunks of :data:`EXPORT_BATCH` documents (any size: the
        cursor is read as the chunks are written)."""
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"format: expected one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
        cursor = self._items().find({"product": product}, batch_size=EXPORT_BATCH).sort("_id", 1)
        try:
            if fmt == "csv":
                buf = io.StringIO()
                csv.writer(buf).writerow(CSV_FIELDS)
                yield buf.getvalue().encode("utf-8")
            batch: list[dict[str, Any]] = []
            for doc in cursor:
                batch.append(doc)
                if len(batch) >= EXPORT_BATCH:
                    yield self._format(batch, fmt)
                    batch = []
            if batch:
                yield self._format(batch, fmt)
        finally:
            cursor.close()

    @staticmethod
    def _format(docs: list[dict[str, Any]], fmt: str) -> bytes:
        if fmt == "jsonl":
            return "".join(json.dumps(d, ensure_ascii=False, sort_keys=True, default=str) + "\n"
                           for d in docs).encode("utf-8")
        buf = io.StringIO()
        w = csv.writer(buf)
        for d in docs:
            w.writerow([_csv_cell(d.get(f)) for f in CSV_FIELDS])
        return buf.getvalue().encode("utf-8")
