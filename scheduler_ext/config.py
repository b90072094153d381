"""The configuration of scheduler_ext: one frozen object, built once from a crawler's settings and validated.

Every component reads its settings from :class:`Config` (``config_for(crawler)``), never from ``crawler.settings``
directly: the defaults are in :mod:`scheduler_ext.defaults`, every value is checked once, and a bad one raises
:class:`~scheduler_ext.exceptions.ConfigurationError` naming the setting and what was expected.

Times are seconds, sizes are counts or bytes as named. Three settings that used to be one (the recall threshold)
are separate; each defaults to the recall age so that a deployment that sets only ``SCHEDEXT_RECALL_THRESHOLD``
keeps its behaviour:

- ``recall_age`` (``SCHEDEXT_RECALL_AGE``, else ``SCHEDEXT_RECALL_THRESHOLD``, 60 s, the paper's minute): how long
  an entry may wait in a crawl queue before it is recalled. Also how long an exploration stays in flight and, halved,
  the expected-duration budget of modification: both are "how long a subtask should take before recall".
- ``lease_ttl`` (``SCHEDEXT_LEASE_TTL``): how long a lease lasts after a node's last renewal. A node killed with
  work in hand loses it after this long.
- ``node_timeout`` (``SCHEDEXT_NODE_TIMEOUT``): how old a node's last heartbeat may be before the control takes the
  node for dead (its crawl queue is recalled) and ``scrapy status`` shows it dead.
"""

from __future__ import annotations

import math
import os
import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .defaults import DEFAULTS
from .exceptions import ConfigurationError


def _raw(settings: Any, name: str) -> Any:
    value = settings.get(name) if settings is not None else None
    return DEFAULTS[name] if value is None else value


def _number(settings: Any, name: str, kind: type, *, low: float | None = None, low_open: bool = False,
            high: float | None = None, value: Any = None) -> Any:
    """``settings[name]`` as ``kind`` within bounds, or ConfigurationError naming the setting."""
    raw = _raw(settings, name) if value is None else value
    bound = ""
    if low is not None:
        bound = f" {'>' if low_open else '>='} {low:g}"
    if high is not None:
        bound += f"{' and' if bound else ''} <= {high:g}"
    expected = f"{'an integer' if kind is int else 'a number'}{bound}"
    try:
        if isinstance(raw, bool):
            raise ValueError("a boolean")
        if isinstance(raw, str) and not raw.isascii():  # int() and float() read other scripts' digits: '١٢' is 12
            raise ValueError("digits other than 0-9")
        number = kind(raw) if kind is float else int(str(raw).strip())
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigurationError(f"{name}: expected {expected}, got {raw!r}") from exc
    if not math.isfinite(number) or (low is not None and (number <= low if low_open else number < low)) \
            or (high is not None and number > high):  # NaN and infinities: no setting means "never" by them
        raise ConfigurationError(f"{name}: expected {expected}, got {raw!r}")
    return number


#: The longest duration any ``SCHEDEXT_*`` setting accepts (a week, in seconds): past it a tick, a lease or a
#: timeout is "never" by accident, and a few (a blocking wait's timeout) overflow Redis's or the OS's clocks.
LONGEST = 7 * 86400.0


def _seconds(settings: Any, name: str, *, zero_ok: bool = False, value: Any = None) -> float:
    return float(_number(settings, name, float, low=0.0, low_open=not zero_ok, high=LONGEST, value=value))


def _flag(settings: Any, name: str) -> bool:
    raw = _raw(settings, name)
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigurationError(f"{name}: expected a boolean (True/False, 1/0), got {raw!r}")


def _text(settings: Any, name: str, *, forbid: str = "") -> str | None:
    raw = _raw(settings, name)
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise ConfigurationError(f"{name}: expected a string, got {raw!r}")
    bad = [c for c in forbid if c in raw]
    if bad:
        raise ConfigurationError(f"{name}: must not contain {' or '.join(repr(c) for c in bad)}, got {raw!r}")
    return raw


def _node_types(settings: Any) -> tuple[int, ...]:
    raw = _raw(settings, "SCHEDEXT_NODE_TYPE")
    items = raw if isinstance(raw, (list, tuple)) else str(raw).replace(" ", "").split(",")
    try:
        types = sorted({int(t) for t in items if str(t) != ""})
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"SCHEDEXT_NODE_TYPE: expected 0, 1 or 0,1, got {raw!r}") from exc
    if not types or any(t < 0 for t in types):
        raise ConfigurationError(f"SCHEDEXT_NODE_TYPE: expected 0, 1 or 0,1, got {raw!r}")
    return tuple(types)


@dataclass(frozen=True)
class Config:
    """Every ``SCHEDEXT_*`` setting, typed and validated (docs/settings.md gives each one's meaning and unit)."""

    prefix: str = "{pc}"
    # node
    node_id: str = ""
    node_types: tuple[int, ...] = (0, 1)
    bind_address: str | None = None
    concurrent_subtasks: int = 0  # 0: CONCURRENT_REQUESTS (scheduler.Pace)
    prefetch: int | None = None  # None: adaptive (scheduler.Pace)
    heartbeat_interval: float = 5.0
    refill_interval: float = 0.5
    idle_close: float = 0.0
    lease_grace: float = 10.0
    take_batch: int = 8
    middleware_enabled: bool = True
    # politeness across the cluster (0 = no limit)
    site_concurrency: int = 0
    site_rate: float = 0.0
    site_address_concurrency: int = 0
    site_address_rate: float = 0.0
    politeness_interval: float = 0.1
    # subtask defaults
    page_limit: int = 5
    time_limit: float = 30.0
    task_lanes: int = 2
    task_lanes_idle: int = 8
    # control
    control_enabled: bool = False
    control_id: str = ""
    tick_interval: float = 1.0
    tick_wake: float = 0.1
    tick_batch: int = 500
    tick_alarm: int = 5
    leader_ttl: float = 10.0
    splitter: str | None = None
    allocation: str = "scheduler_ext.strategies.bandit.BanditAllocation"
    modification: str = "scheduler_ext.strategies.modification.DynamicModification"
    recall: str = "scheduler_ext.strategies.recall.DynamicRecall"
    max_entry_bytes: int = 1_000_000
    max_split: int = 1_000
    # the recall threshold's three roles
    recall_age: float = 60.0
    lease_ttl: float = 60.0
    node_timeout: float = 60.0
    recall_max: int = 5
    recall_reset: bool = True
    retry_backoff: float = 2.0
    # estimates and strategies
    estimate_alpha: float = 0.3
    explore_runs: int = 1
    estimate_stale: float = 600.0
    estimate_half_life: float = 30.0
    explore_share: float = 0.2
    explore_pages: int = 3
    bandit_seed: int | None = None
    slow_factor: float = 3.0
    rate_floor: float = 0.6
    patience: float = 30.0
    page_limit_min: int = 1
    page_limit_max: int = 20
    time_limit_min: float = 5.0
    time_limit_max: float = 120.0
    time_safety: float = 2.0
    oracle_url: str | None = None
    # run records, stats, resilience
    runs_maxlen: int = 100_000
    stats_flush_interval: float = 5.0
    backoff_max: float = 30.0

    @property
    def recall_threshold(self) -> float:
        """The recall age under its historical name."""
        return self.recall_age

    @classmethod
    def from_settings(cls, settings: Any) -> Config:
        """Build and validate; ConfigurationError names the first bad setting."""
        s = settings
        # SCHEDEXT_RECALL_THRESHOLD keeps working as the recall age; SCHEDEXT_RECALL_AGE wins if both are set.
        recall_age = _seconds(s, "SCHEDEXT_RECALL_THRESHOLD") if _raw(s, "SCHEDEXT_RECALL_AGE") is None \
            else _seconds(s, "SCHEDEXT_RECALL_AGE")
        lease_ttl = recall_age if _raw(s, "SCHEDEXT_LEASE_TTL") is None else _seconds(s, "SCHEDEXT_LEASE_TTL")
        node_timeout = recall_age if _raw(s, "SCHEDEXT_NODE_TIMEOUT") is None \
            else _seconds(s, "SCHEDEXT_NODE_TIMEOUT")
        heartbeat = _seconds(s, "SCHEDEXT_HEARTBEAT_INTERVAL")
        # The times a subtask lives by, at least what a subtask of SCHEDEXT_PAGE_LIMIT pages takes under the nodes'
        # DOWNLOAD_DELAY (paced_floor); the lease and the heartbeat timeout above do not depend on the pace.
        page_limit = _number(s, "SCHEDEXT_PAGE_LIMIT", int, low=1)
        safety = _number(s, "SCHEDEXT_TIME_SAFETY", float, low=0.0, low_open=True)
        floor = paced_floor(s.get("DOWNLOAD_DELAY") if s is not None else None, page_limit, safety)
        for name, value in (("SCHEDEXT_LEASE_TTL", lease_ttl), ("SCHEDEXT_NODE_TIMEOUT", node_timeout)):
            if value <= heartbeat:  # a healthy node would lose its leases / be taken for dead between heartbeats
                raise ConfigurationError(f"{name}: expected more than SCHEDEXT_HEARTBEAT_INTERVAL ({heartbeat:g} s),"
                                         f" got {value:g} s")
        host = f"{socket.gethostname()}-{os.getpid()}"
        config = cls(
            prefix=_text(s, "SCHEDEXT_PREFIX") or "{pc}",
            node_id=_text(s, "SCHEDEXT_NODE_ID", forbid=":|") or host,
            node_types=_node_types(s),
            bind_address=_text(s, "SCHEDEXT_BIND_ADDRESS"),
            concurrent_subtasks=_number(s, "SCHEDEXT_CONCURRENT_SUBTASKS", int, low=0),
            prefetch=None if _raw(s, "SCHEDEXT_PREFETCH") in (None, "")
            else _number(s, "SCHEDEXT_PREFETCH", int, low=0),
            heartbeat_interval=heartbeat,
            refill_interval=_seconds(s, "SCHEDEXT_REFILL_INTERVAL"),
            idle_close=_seconds(s, "SCHEDEXT_IDLE_CLOSE", zero_ok=True),
            lease_grace=_seconds(s, "SCHEDEXT_LEASE_GRACE", zero_ok=True),
            take_batch=_number(s, "SCHEDEXT_TAKE_BATCH", int, low=1),
            middleware_enabled=_flag(s, "SCHEDEXT_MIDDLEWARE_ENABLED"),
            site_concurrency=_number(s, "SCHEDEXT_SITE_CONCURRENCY", int, low=0),
            site_rate=_number(s, "SCHEDEXT_SITE_RATE", float, low=0.0),
            site_address_concurrency=_number(s, "SCHEDEXT_SITE_ADDRESS_CONCURRENCY", int, low=0),
            site_address_rate=_number(s, "SCHEDEXT_SITE_ADDRESS_RATE", float, low=0.0),
            politeness_interval=_seconds(s, "SCHEDEXT_POLITENESS_INTERVAL"),
            page_limit=page_limit,
            time_limit=_seconds(s, "SCHEDEXT_TIME_LIMIT"),
            task_lanes=_number(s, "SCHEDEXT_TASK_LANES", int, low=1),
            task_lanes_idle=_number(s, "SCHEDEXT_TASK_LANES_IDLE", int, low=1),
            control_enabled=_flag(s, "SCHEDEXT_CONTROL_ENABLED"),
            control_id=_text(s, "SCHEDEXT_CONTROL_ID") or host,
            tick_interval=_seconds(s, "SCHEDEXT_TICK_INTERVAL"),
            tick_wake=_seconds(s, "SCHEDEXT_TICK_WAKE", zero_ok=True),
            tick_batch=_number(s, "SCHEDEXT_TICK_BATCH", int, low=1),
            tick_alarm=_number(s, "SCHEDEXT_TICK_ALARM", int, low=1),
            leader_ttl=_seconds(s, "SCHEDEXT_LEADER_TTL"),
            splitter=_text(s, "SCHEDEXT_SPLITTER"),
            allocation=_text(s, "SCHEDEXT_ALLOCATION") or DEFAULTS["SCHEDEXT_ALLOCATION"],
            modification=_text(s, "SCHEDEXT_MODIFICATION") or DEFAULTS["SCHEDEXT_MODIFICATION"],
            recall=_text(s, "SCHEDEXT_RECALL") or DEFAULTS["SCHEDEXT_RECALL"],
            max_entry_bytes=_number(s, "SCHEDEXT_MAX_ENTRY_BYTES", int, low=1024),
            max_split=_number(s, "SCHEDEXT_MAX_SPLIT", int, low=1),
            recall_age=max(recall_age, floor), lease_ttl=lease_ttl, node_timeout=node_timeout,
            recall_max=_number(s, "SCHEDEXT_RECALL_MAX", int, low=1),
            recall_reset=_flag(s, "SCHEDEXT_RECALL_RESET"),
            retry_backoff=_seconds(s, "SCHEDEXT_RETRY_BACKOFF", zero_ok=True),
            estimate_alpha=_number(s, "SCHEDEXT_ESTIMATE_ALPHA", float, low=0.0, low_open=True, high=1.0),
            explore_runs=_number(s, "SCHEDEXT_EXPLORE_RUNS", int, low=0),
            estimate_stale=_seconds(s, "SCHEDEXT_ESTIMATE_STALE"),
            estimate_half_life=_seconds(s, "SCHEDEXT_ESTIMATE_HALF_LIFE"),
            explore_share=_number(s, "SCHEDEXT_EXPLORE_SHARE", float, low=0.0, high=1.0),
            explore_pages=_number(s, "SCHEDEXT_EXPLORE_PAGES", int, low=0),
            bandit_seed=None if _raw(s, "SCHEDEXT_BANDIT_SEED") is None else _number(s, "SCHEDEXT_BANDIT_SEED", int),
            slow_factor=_number(s, "SCHEDEXT_SLOW_FACTOR", float, low=1.0),
            rate_floor=_number(s, "SCHEDEXT_RATE_FLOOR", float, low=0.0, high=1.0),
            patience=max(_seconds(s, "SCHEDEXT_PATIENCE", zero_ok=True), floor / 2),
            page_limit_min=_number(s, "SCHEDEXT_PAGE_LIMIT_MIN", int, low=1),
            page_limit_max=_number(s, "SCHEDEXT_PAGE_LIMIT_MAX", int, low=1),
            time_limit_min=_seconds(s, "SCHEDEXT_TIME_LIMIT_MIN"),
            time_limit_max=max(_seconds(s, "SCHEDEXT_TIME_LIMIT_MAX"), floor / 2),
            time_safety=safety,
            oracle_url=_text(s, "SCHEDEXT_ORACLE_URL"),
            runs_maxlen=_number(s, "SCHEDEXT_RUNS_MAXLEN", int, low=1),
            stats_flush_interval=_seconds(s, "SCHEDEXT_STATS_FLUSH_INTERVAL"),
            backoff_max=_seconds(s, "SCHEDEXT_BACKOFF_MAX"),
        )
        for low, high in (("page_limit_min", "page_limit_max"), ("time_limit_min", "time_limit_max")):
            if getattr(config, low) > getattr(config, high):
                raise ConfigurationError(f"SCHEDEXT_{low.upper()}: expected at most SCHEDEXT_{high.upper()} "
                                         f"({getattr(config, high)}), got {getattr(config, low)}")
        return config


_CONFIGS: weakref.WeakKeyDictionary[Any, Config] = weakref.WeakKeyDictionary()


def config_for(crawler: Any) -> Config:
    """The crawler's :class:`Config`, built on first use and shared by every component of that crawler."""
    config = _CONFIGS.get(crawler)
    if config is None:
        config = _CONFIGS[crawler] = Config.from_settings(crawler.settings)
    return config


def paced_floor(delay: Any, page_limit: int, safety: float) -> float:
    """The least recall age under a ``DOWNLOAD_DELAY`` of ``delay`` seconds (None: none): twice the time limit
    a subtask of ``page_limit`` pages is given at that pace with the time safety ``safety`` (``2 x safety x
    page_limit x delay``, 20 delays with the defaults), so that modification's budget (half the recall age) holds
    such a subtask. Half of it is the least patience (a good node frees up about once a subtask) and the least
    ``SCHEDEXT_TIME_LIMIT_MAX``. Below a delay of 3 s with the defaults it is under the paper's minute and changes
    nothing; at 30 s a page, a recall age of a minute gave one-page subtasks cut by their own time limit, and
    a 100-node cluster collected next to nothing (docs/settings.md, "Pace"). At most a week, as any duration.

    >>> paced_floor(None, 5, 2.0), paced_floor(2, 5, 2.0), paced_floor("30", 5, 2.0), paced_floor(86400, 5, 2.0)
    (0.0, 40.0, 600.0, 604800.0)
    """
    if delay in (None, ""):
        return 0.0
    return min(LONGEST, 2 * safety * page_limit * check_number("DOWNLOAD_DELAY", delay, float, low=0.0, high=LONGEST))


def check_number(name: str, value: Any, kind: type, *, low: float, low_open: bool = False,
                 high: float | None = None) -> Any:
    """``value`` of setting ``name`` as ``kind``, finite and within bounds, checked as :class:`Config` checks its
    own: ConfigurationError naming the setting. For settings that are not ``SCHEDEXT_*`` (the Scrapy settings a
    node paces by, given to ``scrapy experiment --set``; the project's ``PC_*``).

    >>> check_number("DOWNLOAD_DELAY", "1.5", float, low=0.0)
    1.5
    """
    if value is None:
        raise ConfigurationError(f"{name}: expected {'an integer' if kind is int else 'a number'} >= {low:g}, "
                                 f"got None")
    return _number(None, name, kind, low=low, low_open=low_open, high=high, value=value)


#: Seconds of a node's pages that wait ready to download under a ``DOWNLOAD_DELAY`` (:func:`ready_pages`).
READY_HORIZON = 1.0


def ready_pages(concurrency: int, delay: float) -> int:
    """Pages a node keeps waiting ready to download: its concurrency (``CONCURRENT_REQUESTS_PER_DOMAIN``, capped by
    ``CONCURRENT_REQUESTS``), but under a ``DOWNLOAD_DELAY`` of ``delay`` seconds only what starts within
    :data:`READY_HORIZON`, at least one. Every page of a node goes to the engine's host, one download slot that
    starts a page per ``delay``: eight pages waiting there at a 2 s delay were 16 s of backlog, during which the
    subtasks they belong to ran down their time limits and held their tasks (the simulator, 1,000 nodes at a 2 s
    delay: most subtasks ended by their time limit with no page; with one page ready, 15 % more items from 40 %
    of the subtasks). The node takes its next subtask as a page starts, so one waiting page keeps the slot busy.

    >>> ready_pages(8, 0.0), ready_pages(8, 0.25), ready_pages(8, 2.0), ready_pages(2, 0.1)
    (8, 4, 1, 2)
    """
    if delay <= 0:
        return max(1, concurrency)
    return max(1, min(concurrency, math.ceil(READY_HORIZON / delay)))


def backoff(failures: int, base: float, cap: float, jitter: Callable[[], float] | None = None) -> float:
    """Seconds to wait after ``failures`` consecutive failures: ``base`` doubled each time, at most ``cap``.

    >>> [backoff(n, 0.5, 4.0) for n in range(6)]
    [0.0, 0.5, 1.0, 2.0, 4.0, 4.0]
    """
    if failures <= 0:
        return 0.0
    delay = min(cap, base * 2 ** min(failures - 1, 32))
    return delay * (jitter() if jitter is not None else 1.0)
