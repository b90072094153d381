"""A Scrapy stats collector that also keeps per-node and per-site counters in Redis.

Scrapy's stats API unchanged (``inc_value`` and friends, kept in memory as by ``MemoryStatsCollector``); on top,
every numeric increment is buffered and flushed every ``SCHEDEXT_STATS_FLUSH_INTERVAL`` seconds (and at close) as
``HINCRBY`` / ``HINCRBYFLOAT`` deltas in one MULTI transaction: no read-modify-write across round trips.

Keys (docs/redis-keys.md): ``stats:node:<node>`` gets every numeric stat of the node; a stat named
``site/<site>/<name>`` also goes to ``stats:site:<site>`` as ``<name>`` (cluster-wide per site) and
``<node>/<name>`` (per site and node).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import redis
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.asyncio import create_looping_call

from .backoff import Backoff, guarded
from .config import config_for
from .connection import redis_from_settings
from .keys import Keys
from .store import load_script

logger = logging.getLogger(__name__)


class RedisStatsCollector(MemoryStatsCollector):
    def __init__(self, crawler: Any, client: redis.Redis | None = None) -> None:
        super().__init__(crawler)
        c = config_for(crawler)
        self.node_id = c.node_id
        self.keys = Keys(c.prefix)
        self.redis = client if client is not None else redis_from_settings(crawler.settings)
        self.interval = c.stats_flush_interval
        self._flush = guarded("stats flush", self.flush, Backoff(self.interval, c.backoff_max))
        self._pending: dict[str, float] = defaultdict(float)  # stat -> delta not yet sent (cheap per event)
        self._loop: Any = None
        # hincr of counter.lua, atomically: a field or key a hand edit spoiled starts over from the increment.
        # KEYS: the stats hash; ARGV: field, increment, "float" for HINCRBYFLOAT. Returns the field's new value.
        self._start_over = self.redis.register_script(
            load_script("counter") + "\nreturn hincr(KEYS[1], ARGV[1], ARGV[2], ARGV[3] == 'float')\n")

    def inc_value(self, key: str, count: int = 1, start: int = 0, spider: Any = None) -> None:
        super().inc_value(key, count, start)
        if isinstance(count, (int, float)) and not isinstance(count, bool):
            self._pending[key] += count

    def _writes(self, pending: dict[str, float]) -> dict[str, dict[str, float]]:
        """The hash increments for these deltas: every stat to the node's hash, ``site/<site>/<name>`` also to the
        site's hash as ``<name>`` and ``<node>/<name>``."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        node_key = self.keys.stats("node", self.node_id)
        for key, delta in pending.items():
            out[node_key][key] += delta
            if key.startswith("site/"):
                _, site, name = key.split("/", 2)
                site_key = self.keys.stats("site", site)
                out[site_key][name] += delta
                out[site_key][f"{self.node_id}/{name}"] += delta
        return out

    def flush(self) -> None:
        """Send the buffered deltas in one MULTI transaction; on failure keep them for the next flush (and re-raise).

        A transaction that fails before EXEC changed nothing, so resending counts nothing twice; only a connection
        lost after EXEC reached Redis, before its reply, can count one flush twice (stats, never scheduling state).
        """
        if not self._pending:
            return
        pending, self._pending = self._pending, defaultdict(float)
        try:
            sent: list[tuple[str, str, float]] = []
            with self.redis.pipeline(transaction=True) as pipe:
                for key, fields in self._writes(pending).items():
                    for name, delta in fields.items():
                        if float(delta).is_integer():
                            pipe.hincrby(key, name, int(delta))
                        else:
                            pipe.hincrbyfloat(key, name, delta)
                        sent.append((key, name, delta))
                results = pipe.execute(raise_on_error=False)
        except BaseException:
            for key, delta in pending.items():
                self._pending[key] += delta
            raise
        # The transaction ran every increment; one whose field held no number, or whose key was no hash (hand
        # edits), failed alone: that field starts over from this delta (the key replaced by a hash, as counter.lua
        # does), rather than failing (and resending everything) at every flush.
        for (key, name, delta), result in zip(sent, results, strict=True):
            if not isinstance(result, redis.ResponseError):
                continue
            logger.warning("stat %s in %s held no number or the key no hash (%s); counted again from %s",
                           name, key, result, delta)
            whole = float(delta).is_integer()
            self._start_over(keys=[key], args=[name, int(delta) if whole else delta, "" if whole else "float"])

    def open_spider(self, spider: Any = None) -> None:
        super().open_spider()
        self._loop = create_looping_call(self._flush)
        self._loop.start(self.interval, now=False)

    def close_spider(self, spider: Any = None, reason: str | None = None) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        try:
            self.flush()
        except redis.RedisError as exc:  # Redis away at close: these last deltas are lost, the crawl's items are not
            logger.error("last stats flush failed (%s); %d counters not sent", exc, len(self._pending))
        super().close_spider(reason=reason)
