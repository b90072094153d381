"""MongoDB storage of collected items: pymongo through itemadapter, upserts by a unique key, batched off the reactor.

Settings: ``MONGO_URI`` (default mongodb://127.0.0.1:27017), ``MONGO_DATABASE``, ``PC_MONGO_COLLECTION``,
``PC_MONGO_BATCH_SIZE`` (items per bulk write), ``PC_MONGO_BATCH_DELAY`` (seconds the first item of a batch waits
for others while no write is in flight), ``PC_MONGO_TIMEOUT`` (seconds before an unanswered write counts as
failed), ``PC_MONGO_OUTAGE`` (seconds a batch is retried while MongoDB cannot be reached at all, before its items
fail; 0 = no retry), ``PC_ITEM_FIELD_MAXLEN`` (an item with a longer text field is refused before it is written:
:func:`product_crawl.guard.check_fields`).

Writes are a group commit: one bulk write in flight at a time (a second only when a batch fills up meanwhile);
the items that arrive while it is in flight form the next batch, written as soon as it is answered. So an item
waits for at most ``PC_MONGO_BATCH_DELAY`` plus one write, on a quiet node as on a busy one, and a busy node
writes large batches without a long fixed delay. A subtask finishes only when its items are stored, and the next
subtask of its task exists only after that, so this wait is on every task's critical path (docs/node.md).

Each item is stored under ``_id = "<fingerprint>:<product>"``, ``fingerprint`` being the SHA-1 of the canonical
URL: the same result crawled again (a recalled subtask, another node) updates ``last_crawled_at`` and is never stored
twice. A batch is one unordered bulk insert; the items refused as duplicate keys (stored before) then get their
refreshed fields in one bulk update by ``_id``. Most results are new, and an insert costs the server less than an
upsert (nx-27017: a fifth less CPU an item, no lookup first); keying on ``_id`` keeps the update a primary-key lookup
(nx-27017 scans the collection for an update filtered on other fields).

``process_item`` awaits the bulk write that holds its item, so ``item_scraped`` means "acknowledged by MongoDB"
and the node finishes a subtask only after its items are stored. A write error raises, the item ends in
``item_error`` and its subtask fails (and is recalled): nothing is dropped silently. A MongoDB that cannot be
reached (down, restarting, failing over) is not the subtask's fault: the batch is written again, with backoff, for
up to ``PC_MONGO_OUTAGE`` seconds (upserts by ``_id`` make a repeated write harmless), so that an outage shorter than
that costs a pause, not failed subtasks that would count towards the dead-letter list. A node that starts while
MongoDB does not answer starts all the same (its first batch waits the same way and makes the indexes).
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import pymongo
from itemadapter import ItemAdapter
from pymongo.errors import BulkWriteError, ConnectionFailure, PyMongoError
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import deferred_to_future
from twisted.internet import defer, reactor, threads
from w3lib.url import canonicalize_url

from product_crawl.guard import DEFAULT_ITEM_FIELD_MAXLEN, ItemRefused, check_fields
from product_crawl.services import check_mongo_uri, mask_url
from scheduler_ext.config import LONGEST, check_number

logger = logging.getLogger(__name__)

DEFAULT_MONGO_URI = "mongodb://127.0.0.1:27017"
_PLAIN = (str, int, float, bool, type(None))  # field values a shallow copy of an item can hand to pymongo as they are


def fingerprint(url: str) -> str:
    """SHA-1 of the canonical form of ``url``."""
    return hashlib.sha1(canonicalize_url(url).encode("utf-8")).hexdigest()


def fingerprint_range(url: str) -> dict[str, Any]:
    """The MongoDB filter of every stored item of ``url``, whatever its product: a range of ``_id``
    (``"<fingerprint>:<product>"``), served by the ``_id`` index.

    >>> fingerprint_range("http://example.com/a")["_id"]["$lt"][-1]
    ';'
    """
    fp = fingerprint(url)
    return {"_id": {"$gte": f"{fp}:", "$lt": f"{fp};"}}  # ";" is the character after ":"


class StorageError(RuntimeError):
    """Raised if MongoDB did not acknowledge a batch of items."""


class StorageUnreachable(StorageError):
    """Raised if MongoDB could not be reached at all for a batch (worth writing again later)."""


def _setting(settings: Any, name: str, default: float, kind: type = float, **bounds: Any) -> Any:
    """The ``PC_*`` setting ``name`` checked as the ``SCHEDEXT_*`` ones are: a ConfigurationError naming it."""
    value = settings.get(name)
    return check_number(name, default if value is None else value, kind, **bounds)


class MongoPipeline:
    def __init__(self, uri: str, database: str, collection: str, batch_size: int = 100,
                 batch_delay: float = 0.02, timeout: float = 10.0, outage: float = 60.0,
                 field_maxlen: int = DEFAULT_ITEM_FIELD_MAXLEN, stats: Any = None) -> None:
        self.uri, self.database_name, self.collection_name = uri, database, collection
        self.field_maxlen, self.stats = field_maxlen, stats
        self.timeout, self.outage = timeout, outage
        self.batch_size, self.batch_delay = batch_size, batch_delay
        self.client: Any = None
        self.collection: Any = None
        self._batch: list[tuple[dict[str, Any], dict[str, Any]]] = []  # (document, fields a duplicate refreshes)
        self._waiters: list[defer.Deferred[None]] = []
        self._timer: Any = None
        self._writing = 0  # bulk writes in flight
        self._indexed = False  # the collection's indexes made (at the open, or with the first write that reached it)

    @classmethod
    def from_crawler(cls, crawler: Any) -> MongoPipeline:
        s = crawler.settings
        if not s.getbool("PC_MONGO_ENABLED", True):
            raise NotConfigured("PC_MONGO_ENABLED is off")
        uri = s.get("MONGO_URI") or DEFAULT_MONGO_URI
        check_mongo_uri(uri)  # pymongo alone takes "notaurl" for a host, and the node waits for it for ever
        return cls(uri, s.get("MONGO_DATABASE") or "product_crawl",
                   s.get("PC_MONGO_COLLECTION") or "items", _setting(s, "PC_MONGO_BATCH_SIZE", 100, int, low=1),
                   _setting(s, "PC_MONGO_BATCH_DELAY", 0.02, low=0.0, high=LONGEST),
                   _setting(s, "PC_MONGO_TIMEOUT", 10.0, low=0.0, low_open=True, high=LONGEST),
                   _setting(s, "PC_MONGO_OUTAGE", 60.0, low=0.0, high=LONGEST),
                   _setting(s, "PC_ITEM_FIELD_MAXLEN", DEFAULT_ITEM_FIELD_MAXLEN, int, low=1), crawler.stats)

    async def open_spider(self) -> None:
        """Connects and makes the indexes. A MongoDB that does not answer yet is an outage like any other (the
        node starts; its items wait for it as ``PC_MONGO_OUTAGE`` says, and the first write that reaches it makes
        the indexes), not a node that fails to start."""
        ms = int(self.timeout * 1000)
        self.client = pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=ms, socketTimeoutMS=ms, retryWrites=True)
        self.collection = self.client[self.database_name][self.collection_name]
        try:
            await deferred_to_future(threads.deferToThread(self._create_indexes))
        except ConnectionFailure as exc:
            logger.error("MongoDB at %s does not answer (%s); items wait for it, each batch for up to %.0f s "
                         "(PC_MONGO_OUTAGE)", mask_url(self.uri), exc, self.outage)
        logger.info("storing items in %s.%s", self.database_name, self.collection_name)

    def _create_indexes(self) -> None:
        # Uniqueness is the _id; these serve the analysts' queries and the dashboard's newest-first item list. No
        # index on fingerprint: the _id starts with it, so a URL's items are a range of the _id index
        # (fingerprint_range), and every index costs every insert (nx-27017: about a tenth of its CPU an item).
        self.collection.create_index([("product", 1), ("site", 1)], name="product_site")
        self.collection.create_index([("crawled_at", -1)], name="crawled_at")
        self._indexed = True

    async def close_spider(self) -> None:
        if self._batch:
            await deferred_to_future(self._flush())
        if self.client is not None:
            self.client.close()

    async def process_item(self, item: Any) -> Any:
        adapter = ItemAdapter(item)
        doc = dict(adapter)  # asdict() looks into every value for nested items: 6 times the cost of this copy
        if not all(type(value) in _PLAIN for value in doc.values()):
            doc = adapter.asdict()
        try:
            check_fields(doc, self.field_maxlen)
        except ItemRefused:
            if self.stats is not None:
                self.stats.inc_value("pc/guard/item_refused")
            raise
        doc["fingerprint"] = fingerprint(doc["url"])
        refreshed = {"last_crawled_at": doc.get("crawled_at", time.time()), "last_node_id": doc.get("node_id"),
                     "last_subtask_id": doc.get("subtask_id")}
        self._batch.append(({**doc, **refreshed, "_id": f"{doc['fingerprint']}:{doc['product']}"}, refreshed))
        waiter: defer.Deferred[None] = defer.Deferred()
        self._waiters.append(waiter)
        if len(self._batch) >= self.batch_size:
            self._flush()
        elif self._timer is None and not self._writing:
            self._timer = reactor.callLater(self.batch_delay, self._flush)
        await deferred_to_future(waiter)
        return item

    def _flush(self) -> defer.Deferred[None]:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        batch, waiters = self._batch, self._waiters
        self._batch, self._waiters = [], []
        self._writing += 1
        done = self._store(batch, waiters, time.monotonic(), 0.5)
        done.addBoth(self._written)
        return done

    def _written(self, result: Any) -> Any:
        # The items that arrived while this write was in flight have waited for it already: write them now.
        self._writing -= 1
        if self._batch and not self._writing:
            self._flush()
        return result

    def _store(self, batch: list[tuple[dict[str, Any], dict[str, Any]]], waiters: list[defer.Deferred[None]],
               since: float, delay: float) -> defer.Deferred[None]:
        """Write a batch; while MongoDB cannot be reached, again after ``delay`` (doubling, at most 5 s) until
        ``PC_MONGO_OUTAGE`` seconds have passed since the first attempt. Fires once the waiters have their answer."""
        done: defer.Deferred[None] = defer.Deferred()
        d = threads.deferToThread(self._write, batch)

        def stored(_: Any) -> None:
            for w in waiters:
                w.callback(None)
            done.callback(None)

        def failed(failure: Any) -> None:
            if failure.check(StorageUnreachable) and time.monotonic() - since + delay < self.outage:
                if delay == 0.5:  # once per batch, not per attempt
                    logger.warning("MongoDB unreachable; %d items wait, written again for up to %.0f s",
                                   len(batch), self.outage)
                reactor.callLater(delay, retry)
                return
            logger.error("MongoDB write failed: %s", failure.getErrorMessage())
            for w in waiters:
                w.errback(failure)
            done.callback(None)

        def retry() -> None:
            self._store(batch, waiters, since, min(2 * delay, 5.0)).chainDeferred(done)

        d.addCallbacks(stored, failed)
        return done

    def _write(self, batch: list[tuple[dict[str, Any], dict[str, Any]]]) -> int:
        """One unordered bulk insert (in a worker thread), then one bulk update of the refreshed fields of the items
        already stored (refused as duplicate keys: a recrawl, another node, an earlier attempt of this batch).
        Returns how many items were new."""
        docs = [doc for doc, _ in batch]
        try:
            if not self._indexed:
                self._create_indexes()
            self.collection.insert_many(docs, ordered=False)
            return len(docs)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            others = [e for e in errors if e.get("code") != 11000]
            if others:
                raise StorageError(f"MongoDB refused {len(others)} of {len(docs)} items: "
                                   f"{others[0].get('errmsg')}") from exc
            if not errors:  # a write concern error: nothing says which items are stored
                raise StorageError(f"MongoDB did not acknowledge a write of {len(docs)} items: {exc}") from exc
            stored = [e["index"] for e in errors]
        except ConnectionFailure as exc:  # not reachable (down, restarting, no primary): try again later
            raise StorageUnreachable(f"MongoDB write of {len(docs)} items failed: {exc}") from exc
        except PyMongoError as exc:
            raise StorageError(f"MongoDB write of {len(docs)} items failed: {exc}") from exc
        ops = [pymongo.UpdateOne({"_id": docs[i]["_id"]}, {"$set": batch[i][1]}) for i in stored]
        try:
            self.collection.bulk_write(ops, ordered=False)
        except ConnectionFailure as exc:  # the batch is written again: the new items are duplicates by then
            raise StorageUnreachable(f"MongoDB update of {len(ops)} stored items failed: {exc}") from exc
        except PyMongoError as exc:
            raise StorageError(f"MongoDB update of {len(ops)} stored items failed: {exc}") from exc
        return len(docs) - len(ops)
