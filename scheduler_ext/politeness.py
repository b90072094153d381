"""Politeness that holds across the cluster: per-site limits that every node honours together.

Scrapy's own limits (``CONCURRENT_REQUESTS_PER_DOMAIN``, ``DOWNLOAD_DELAY``, AutoThrottle) are per process; ten
nodes that each respect them send ten times as much to a site. :class:`Politeness` adds limits for the whole
cluster, shared through Redis:

``SCHEDEXT_SITE_CONCURRENCY``
    int, requests in flight per site, all nodes together; 0 = no limit.
``SCHEDEXT_SITE_RATE``
    float, requests per second per site, all nodes together; 0 = no limit.
``SCHEDEXT_SITE_ADDRESS_CONCURRENCY``, ``SCHEDEXT_SITE_ADDRESS_RATE``
    the same per (site, source address): nodes that share a ``SCHEDEXT_BIND_ADDRESS`` share these (an engine
    blocks an address, not a process).
``SCHEDEXT_POLITENESS_INTERVAL``
    float, seconds between a node's syncs with Redis (default 0.1).

A request's *site* is its subtask's site (``Subtask.site``) and, for a request that belongs to no subtask, its
URL's host.

No Redis round trip per request: a node holds *slots* (requests it may have in flight) and *tokens* (requests it
may start) per site, granted in batches by the ``polite`` script (``lua/polite.lua``), one call per limited key
and all of a sync in one pipeline. The scheduler asks :meth:`Politeness.allows` before it hands a request to the
engine and tells :meth:`Politeness.dispatched` when it did; a request stops counting as in flight when it leaves
Scrapy's downloader. Every ``SCHEDEXT_POLITENESS_INTERVAL`` the node renews its holding with its demand (requests
in flight plus waiting), gives back what it does not need and takes new tokens.

Why the cluster never exceeds a limit: a grant never takes the total held past the limit; a node never has more
in flight than it holds; a holding that is not renewed within its TTL (20 intervals, at least 2 s) lapses in
Redis, and the node stops starting requests on it after half that time without a successful sync (Redis away).
Tokens are spent within a second or dropped, so that unused ones do not pile up into a burst.

Redis keys (docs/redis-keys.md): ``polite:slots:<key>``, ``polite:seen:<key>``, ``polite:bucket:<key>``, where
``<key>`` is ``<site>`` or ``<site>|<address>``; all expire by themselves when unused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy import Request

from .keys import Keys

TOKEN_LIFETIME = 1.0  # seconds a granted token may wait before it is dropped
UNSEEN_GRACE = 1.0  # seconds a handed-out request counts in flight before it is seen in the downloader


@dataclass(frozen=True)
class Limits:
    """The configured limits; 0 means none."""

    site_concurrency: int = 0
    site_rate: float = 0.0
    address_concurrency: int = 0
    address_rate: float = 0.0
    interval: float = 0.1

    @property
    def enabled(self) -> bool:
        return any((self.site_concurrency, self.site_rate, self.address_concurrency, self.address_rate))


@dataclass
class _Scope:
    """One limited key (a site, or a site and address) as this node holds it."""

    key: str
    concurrency: int
    rate: float
    slots: int = 0
    granted_at: float = -math.inf
    tokens: int = 0
    tokens_at: float = -math.inf


@dataclass
class _Site:
    scopes: list[_Scope]
    # Request -> when dispatched, or None once seen in the downloader (see Politeness.inflight).
    inflight: dict[Request, float | None] = field(default_factory=dict)


class Politeness:
    """This node's view of the cluster-wide limits. Build with a store-like ``script`` runner (see
    :meth:`from_store`); ``in_downloader`` tells whether a request is still in Scrapy's downloader."""

    def __init__(self, limits: Limits, *, node: str, address: str | None, keys: Keys, script: Any,
                 in_downloader: Callable[[], Container[Request]], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.limits, self.node, self.address, self.keys = limits, node, address, keys
        self.script = script  # a registered redis-py Script of lua/polite.lua
        self.in_downloader = in_downloader
        self.clock = clock
        self.ttl = max(2.0, 20 * limits.interval)
        self.burst_factor = max(1.0, 2 * limits.interval)
        self.sites: dict[str, _Site] = {}

    # --- the hot path: no Redis --------------------------------------------------------------------------------
    def _site(self, site: str) -> _Site:
        s = self.sites.get(site)
        if s is None:
            lim, scopes = self.limits, []
            if lim.site_concurrency or lim.site_rate:
                scopes.append(_Scope(site, lim.site_concurrency, lim.site_rate))
            if self.address and (lim.address_concurrency or lim.address_rate):
                scopes.append(_Scope(f"{site}|{self.address}", lim.address_concurrency, lim.address_rate))
            s = self.sites[site] = _Site(scopes)
        return s

    def inflight(self, site: str) -> int:
        """Requests of ``site`` this node started that may still be in the downloader.

        A request enters the downloader right after the scheduler hands it out, in the same reactor turn, and
        leaves it when its download (and the downloader middlewares) are done. One not seen there yet counts for
        up to ``UNSEEN_GRACE`` seconds (a request dropped before it got there); one seen there counts until it left.
        """
        s = self.sites.get(site)
        if s is None:
            return 0
        active, now = self.in_downloader(), self.clock()
        for request, dispatched in list(s.inflight.items()):
            if request in active:
                s.inflight[request] = None
            elif dispatched is None or now - dispatched > UNSEEN_GRACE:
                del s.inflight[request]
        return len(s.inflight)

    def allows(self, site: str) -> bool:
        """True if this node may start one more request on ``site`` now."""
        s = self._site(site)
        if not s.scopes:
            return True
        now, n = self.clock(), self.inflight(site)
        for sc in s.scopes:
            if sc.concurrency and (n >= sc.slots or now - sc.granted_at > self.ttl / 2):
                return False
            if sc.rate and (sc.tokens <= 0 or now - sc.tokens_at > TOKEN_LIFETIME):
                return False
        return True

    def dispatched(self, site: str, request: Request) -> None:
        s = self._site(site)
        s.inflight[request] = self.clock()
        for sc in s.scopes:
            if sc.rate:
                sc.tokens -= 1

    # --- the sync: one pipeline --------------------------------------------------------------------------------
    def sync(self, pipe_factory: Callable[[], Any], waiting: Mapping[str, int]) -> bool:
        """Renew holdings and take tokens for every site with requests waiting, in flight or slots held.

        ``waiting`` is the number of requests of each site waiting in the node's queue. Returns True if some site
        may now start a request it could not start before (the caller wakes the engine). A Redis error propagates
        and changes nothing here: the grants it would have replaced age out on their own.
        """
        now = self.clock()
        calls: list[tuple[_Scope, int]] = []
        for site in set(waiting) | set(self.sites):
            s = self._site(site)
            n, wait = self.inflight(site), int(waiting.get(site, 0))
            for sc in s.scopes:
                want_tokens = 0
                if sc.rate:
                    fresh = sc.tokens if now - sc.tokens_at <= TOKEN_LIFETIME else 0
                    want_tokens = max(0, min(wait - fresh, math.ceil(sc.rate * self.burst_factor)))
                if sc.slots or n or wait or want_tokens:
                    calls.append((sc, want_tokens))
        if not calls:
            return False
        before = {site: self.allows(site) for site in waiting}
        k = self.keys
        with pipe_factory() as pipe:
            for sc, want_tokens in calls:
                site = sc.key.split("|", 1)[0]
                n = self.inflight(site)
                self.script(keys=[k.polite_slots(sc.key), k.polite_seen(sc.key), k.polite_bucket(sc.key)],
                            args=[self.node, sc.concurrency, n, n + int(waiting.get(site, 0)), self.ttl, sc.rate,
                                  max(1.0, sc.rate * self.burst_factor), want_tokens], client=pipe)
            replies = pipe.execute()
        for (sc, want_tokens), (slots, tokens) in zip(calls, replies, strict=True):
            if sc.concurrency:
                sc.slots, sc.granted_at = int(slots), now
            if want_tokens:
                fresh = sc.tokens if now - sc.tokens_at <= TOKEN_LIFETIME else 0
                sc.tokens, sc.tokens_at = max(0, fresh) + int(tokens), now
        for site in [s for s, v in self.sites.items() if not v.inflight and not waiting.get(s)
                     and not any(sc.slots for sc in v.scopes)]:
            del self.sites[site]
        return any(not was and self.allows(site) for site, was in before.items())
