"""Every default of scheduler_ext, in one place, each with its unit.

Settings use the ``SCHEDEXT_`` prefix; Redis connection settings are scrapy-redis's (``REDIS_URL``,
``REDIS_PARAMS``). Components read them through :class:`scheduler_ext.config.Config` (built once per crawler,
validated); :func:`setting` remains for code that needs one raw value.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    # Redis key prefix. Contains a hash tag so all scheduling keys live on one Redis Cluster slot.
    "SCHEDEXT_PREFIX": "{pc}",
    # --- node identity -------------------------------------------------------------------------------
    "SCHEDEXT_NODE_ID": None,  # str; default "<hostname>-<pid>"
    "SCHEDEXT_NODE_TYPE": "0,1",  # node types served: "0", "1" or "0,1"
    "SCHEDEXT_BIND_ADDRESS": None,  # source IP address of every request the node makes
    "SCHEDEXT_CONCURRENT_SUBTASKS": 0,  # subtasks a node holds at most (leases); 0 = CONCURRENT_REQUESTS
    "SCHEDEXT_PREFETCH": None,  # subtasks the control may queue ahead for a node; None = adaptive (docs/node.md)
    "SCHEDEXT_HEARTBEAT_INTERVAL": 5.0,  # seconds between node heartbeats and lease renewals
    "SCHEDEXT_REFILL_INTERVAL": 0.5,  # seconds between fallback attempts to take work (takes are demand-driven)
    "SCHEDEXT_IDLE_CLOSE": 0.0,  # seconds the cluster may be idle before a node closes; 0 = never
    "SCHEDEXT_LEASE_GRACE": 10.0,  # seconds a lease may outlive its subtask's time limit before recall
    "SCHEDEXT_TAKE_BATCH": 8,  # malformed entries a take may skip (moving them to failed) in one call
    # --- politeness across the cluster (0 = no limit) ------------------------------------------------------
    "SCHEDEXT_SITE_CONCURRENCY": 0,  # requests in flight per site, all nodes together
    "SCHEDEXT_SITE_RATE": 0.0,  # requests per second per site, all nodes together
    "SCHEDEXT_SITE_ADDRESS_CONCURRENCY": 0,  # requests in flight per (site, source address)
    "SCHEDEXT_SITE_ADDRESS_RATE": 0.0,  # requests per second per (site, source address)
    "SCHEDEXT_POLITENESS_INTERVAL": 0.1,  # seconds between a node's politeness syncs with Redis
    # --- subtask defaults --------------------------------------------------------------------------------
    "SCHEDEXT_PAGE_LIMIT": 5,  # pages in a task's first subtask
    "SCHEDEXT_TIME_LIMIT": 30.0,  # seconds for a task's first subtask
    "SCHEDEXT_TASK_LANES": 2,  # a task's subtasks out at most once its page count is known (>1: where a site runs dry)
    "SCHEDEXT_TASK_LANES_IDLE": 8,  # the same while nodes of the cluster idle (one more lane per idle node)
    # --- control loop --------------------------------------------------------------------------------------
    "SCHEDEXT_CONTROL_ENABLED": False,  # run the control loop in this process (the control spider sets it)
    "SCHEDEXT_CONTROL_ID": None,  # str; default "<hostname>-<pid>"
    "SCHEDEXT_MIDDLEWARE_ENABLED": True,  # the subtask downloader and spider middlewares
    "SCHEDEXT_TICK_INTERVAL": 1.0,  # seconds between control ticks
    "SCHEDEXT_TICK_WAKE": 0.1,  # seconds after a tick before a node's report may start the next one (0: no wake)
    "SCHEDEXT_TICK_BATCH": 500,  # reports / virtual tasks / recalls handled per step of one tick, at most
    "SCHEDEXT_TICK_ALARM": 5,  # failed ticks in a row after which the control says loudly that it is stuck
    "SCHEDEXT_MAX_ENTRY_BYTES": 1_000_000,  # bytes; a longer entry of an input list is dead-lettered unread
    "SCHEDEXT_MAX_SPLIT": 1_000,  # tasks one virtual task may split into; more is dead-lettered
    "SCHEDEXT_LEADER_TTL": 10.0,  # seconds a control's leader lease lasts unless renewed
    "SCHEDEXT_SPLITTER": None,  # dotted path: callable(raw_json: str) -> list[dict] (task specs)
    "SCHEDEXT_ALLOCATION": "scheduler_ext.strategies.bandit.BanditAllocation",
    "SCHEDEXT_MODIFICATION": "scheduler_ext.strategies.modification.RelativeModification",
    "SCHEDEXT_RECALL": "scheduler_ext.strategies.recall.DynamicRecall",
    # --- recall (the paper: 1 minute, 5 recalls, then manual handling) -----------------------------------
    "SCHEDEXT_RECALL_THRESHOLD": 60.0,  # seconds; the recall age under its historical name
    "SCHEDEXT_RECALL_AGE": None,  # seconds a crawl-queue entry may wait before recall; default the threshold
    "SCHEDEXT_LEASE_TTL": None,  # seconds a lease lasts after its last renewal; default the recall age
    "SCHEDEXT_NODE_TIMEOUT": None,  # seconds without heartbeat before a node is dead; default the recall age
    "SCHEDEXT_RECALL_MAX": 5,  # recalls before a subtask goes to the dead-letter list
    "SCHEDEXT_RECALL_RESET": True,  # a failed run that crawled pages starts the count over (False: the paper's)
    "SCHEDEXT_RETRY_BACKOFF": 2.0,  # seconds; a subtask's 2nd recall waits this long before it runs again, doubling
    # --- estimates and strategies ------------------------------------------------------------------------
    "SCHEDEXT_ESTIMATE_ALPHA": 0.3,  # weight of the newest run in the moving estimates (0..1]
    "SCHEDEXT_EXPLORE_RUNS": 1,  # runs a (site, node) pair gets before its estimate is trusted
    "SCHEDEXT_SLOW_FACTOR": 3.0,  # a node this many times slower per page than the best is excluded
    "SCHEDEXT_RATE_FLOOR": 0.6,  # a free node gets a subtask only at >= this share of the best node's rate
    "SCHEDEXT_PATIENCE": 30.0,  # seconds a subtask waits for a good node before any eligible node will do
    "SCHEDEXT_ESTIMATE_STALE": 600.0,  # seconds after which a (site, node) estimate is explored again
    "SCHEDEXT_ESTIMATE_HALF_LIFE": 30.0,  # seconds; bandit: prior half-life of unused evidence (then learnt)
    "SCHEDEXT_EXPLORE_SHARE": 0.2,  # bandit: the exploration budget, a share of the pages sent
    "SCHEDEXT_EXPLORE_PAGES": 3,  # bandit: pages an exploration crawls at most (0: its whole subtask)
    "SCHEDEXT_BANDIT_SEED": None,  # int; bandit's random draws (None: different every run)
    "SCHEDEXT_PAGE_LIMIT_MIN": 1,
    "SCHEDEXT_PAGE_LIMIT_MAX": 20,
    "SCHEDEXT_TIME_LIMIT_MIN": 5.0,  # seconds
    "SCHEDEXT_TIME_LIMIT_MAX": 120.0,  # seconds
    "SCHEDEXT_TIME_SAFETY": 2.0,  # time limit = pages x seconds per page x this factor
    "SCHEDEXT_ORACLE_URL": None,  # truth endpoint read by the oracle allocation (experiments only)
    # --- run records and stats ------------------------------------------------------------------------------
    "SCHEDEXT_RUNS_MAXLEN": 100_000,  # approximate length of the run-record stream
    "SCHEDEXT_STATS_FLUSH_INTERVAL": 5.0,  # seconds between flushes of per-site / per-node counters
    "SCHEDEXT_HISTORY_INTERVAL": 5.0,  # seconds between status samples in the history list (dashboards)
    "SCHEDEXT_HISTORY_MAXLEN": 2880,  # status samples kept (4 hours at 5 s)
    "SCHEDEXT_AUDIT_MAXLEN": 10_000,  # audit records of manual actions (dead-letter requeue / drop) kept
    # --- resilience --------------------------------------------------------------------------------------------
    "SCHEDEXT_BACKOFF_MAX": 30.0,  # seconds; longest wait between retries of a loop whose Redis calls fail
}


def setting(settings: Any, name: str) -> Any:
    """Return ``settings[name]`` if set, else the scheduler_ext default."""
    value = settings.get(name) if settings is not None else None
    return DEFAULTS[name] if value is None else value


def setting_float(settings: Any, name: str) -> float:
    return float(setting(settings, name))


def setting_int(settings: Any, name: str) -> int:
    return int(setting(settings, name))
