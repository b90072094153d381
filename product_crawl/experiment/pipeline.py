"""A MongoDB pipeline keyed by ``_id``, to show what the storage costs the experiment (``--set ITEM_PIPELINES``).

:class:`~product_crawl.pipelines.MongoPipeline` upserts on the filter ``{fingerprint, product}``. nx-27017 (the
MongoDB-protocol server over SQLite that the project runs) answers an update whose filter is not ``_id`` by
scanning the collection, so each upsert costs time in proportion to the items already stored: about 0.05 ms per
stored item, i.e. ~70 items/s for all nodes together once 10,000 items are stored. The experiment then measures
the server, not the scheduling, and penalises whichever configuration has stored more.

:class:`IdMongoPipeline` stores the same documents with the same uniqueness, ``_id = "<fingerprint>:<product>"``,
so the upsert is a primary-key lookup (constant time). Select it for every node of an experiment with::

    scrapy experiment --set 'ITEM_PIPELINES={"product_crawl.experiment.pipeline.IdMongoPipeline": 300}'

docs/experiment.md gives the numbers with and without it.
"""

from __future__ import annotations

from typing import Any

import pymongo
from pymongo.errors import BulkWriteError, PyMongoError

from product_crawl.pipelines import MongoPipeline, StorageError


class IdMongoPipeline(MongoPipeline):
    """:class:`MongoPipeline` with each item's upsert filtered on ``_id`` = fingerprint and product."""

    def _write(self, batch: list[tuple[dict[str, Any], dict[str, Any]]]) -> int:
        ops = [pymongo.UpdateOne({"_id": f"{f['fingerprint']}:{f['product']}"}, u, upsert=True) for f, u in batch]
        try:
            return int(self.collection.bulk_write(ops, ordered=False).upserted_count)
        except (BulkWriteError, PyMongoError) as exc:  # _id upserts cannot race into duplicates: a real failure
            raise StorageError(f"MongoDB write of {len(ops)} items failed: {exc}") from exc
