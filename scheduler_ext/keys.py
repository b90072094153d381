"""The one owner of the Redis key schema (documented in docs/redis-keys.md).

Every key is ``<prefix>:<name>``; the default prefix ``{pc}`` is a Redis Cluster hash tag, so every key of one
deployment maps to one slot and multi-key Lua scripts stay legal on a cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The Redis type of every key of the schema (docs/redis-keys.md), by its name after the prefix, as ``TYPE`` names
#: it. A name that ends in ``:`` is a family (``crawl:<node>``), matched by the start of the key's name. This is the
#: one list :meth:`Store.set_aside <scheduler_ext.store.Store.set_aside>` checks keys against.
TYPES: dict[str, str] = {
    "virtual": "list", "seq": "string", "tasks": "hash", "subtasks": "hash", "waiting": "zset", "crawl:": "list",
    "queued": "zset", "leases": "zset", "lease_info": "hash", "sleeping": "list", "failed": "list", "dead": "hash",
    "nodes": "hash", "node_seen": "zset", "leader": "string", "controls": "hash", "runs": "stream",
    "agg:sn:": "hash", "agg:psn:": "hash", "est:site:": "hash", "est:gs:": "hash", "est:dirty": "set",
    "est:groups": "set", "agg:pairs": "set", "agg:triples": "set", "count:node:": "hash", "count:cluster": "hash",
    "progress": "hash", "stats:node:": "hash", "stats:site:": "hash", "history": "list", "history:slot": "string",
    "audit": "list", "polite:slots:": "hash", "polite:seen:": "zset", "polite:bucket:": "hash",
}
_FAMILIES = tuple(name for name in TYPES if name.endswith(":"))


@dataclass(frozen=True)
class Keys:
    prefix: str = "{pc}"

    def _k(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    @property
    def everything(self) -> str:
        r"""The ``SCAN`` pattern of every key of this deployment: ``<prefix>:*``, the prefix's glob characters
        escaped (a prefix ``{p*}`` matched ``{pc}``'s keys too, and ``Store.purge`` deleted another deployment).

        >>> Keys("{pc}").everything, Keys("{p*}").everything, Keys("[a]?").everything
        ('{pc}:*', '{p\\*}:*', '\\[a\\]\\?:*')
        """
        return re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix) + ":*"

    # --- the schema's types ----------------------------------------------------------------------------------
    @property
    def cluster_keys(self) -> list[str]:
        """Every key of the schema that is one per deployment (not per node, site or product)."""
        return [self._k(name) for name in TYPES if not name.endswith(":")]

    def expected_type(self, key: str) -> str | None:
        """The Redis type the schema gives ``key`` (:data:`TYPES`); None for a key it does not know (another
        prefix, a key set aside, a name of no family).

        >>> keys = Keys("{pc}")
        >>> keys.expected_type("{pc}:waiting"), keys.expected_type("{pc}:crawl:n1"), keys.expected_type("{x}:tasks")
        ('zset', 'list', None)
        """
        head = f"{self.prefix}:"
        if not key.startswith(head):
            return None
        name = key[len(head):]
        if name in TYPES and not name.endswith(":"):
            return TYPES[name]
        family = next((f for f in _FAMILIES if name.startswith(f) and len(name) > len(f)), None)
        return None if family is None else TYPES[family]

    def garbage(self, key: str, at: str) -> str:
        """Where :meth:`Store.set_aside <scheduler_ext.store.Store.set_aside>` keeps ``key``, found of another type
        than the schema gives it at Redis time ``at``: ``garbage:<name>:<at>``, under the same prefix (the same
        hash tag, so the script that renames it stays legal on Redis Cluster), for a person to look at."""
        return self._k(f"garbage:{key[len(self.prefix) + 1:]}:{at}")

    # --- input and records -------------------------------------------------------------------------------
    @property
    def virtual(self) -> str:
        """List of injected virtual tasks (JSON). LPUSH to inject; the control pops from the right (FIFO)."""
        return self._k("virtual")

    @property
    def seq(self) -> str:
        """Counter that numbers tasks and subtasks (monotonic ids)."""
        return self._k("seq")

    @property
    def tasks(self) -> str:
        """Hash task id -> task JSON."""
        return self._k("tasks")

    @property
    def subtasks(self) -> str:
        """Hash subtask id -> subtask JSON (the record of every subtask not yet reported)."""
        return self._k("subtasks")

    # --- queues ----------------------------------------------------------------------------------------------
    @property
    def waiting(self) -> str:
        """Sorted set subtask id -> priority (lower first; FIFO sequence by default)."""
        return self._k("waiting")

    def crawl(self, node: str) -> str:
        """List of subtask JSON allocated to ``node`` (LPUSH by the control, taken from the right)."""
        return self._k(f"crawl:{node}")

    @property
    def queued(self) -> str:
        """Sorted set subtask id -> time it entered a crawl queue (Redis time, seconds)."""
        return self._k("queued")

    @property
    def leases(self) -> str:
        """Sorted set subtask id -> lease deadline (Redis time, seconds)."""
        return self._k("leases")

    @property
    def lease_info(self) -> str:
        """Hash subtask id -> lease JSON {token, node, started, hard} (hard: the latest deadline a renewal may set)."""
        return self._k("lease_info")

    @property
    def sleeping(self) -> str:
        """List of success reports (JSON), LPUSH by nodes, consumed by the control from the right."""
        return self._k("sleeping")

    @property
    def failed(self) -> str:
        """List of failure reports (JSON), LPUSH by nodes, consumed by the control from the right."""
        return self._k("failed")

    @property
    def dead(self) -> str:
        """Hash dead-letter id -> JSON {v, id, kind, reason, attempts, last_node, at, subtask | raw (+ size, source,
        cut)}."""
        return self._k("dead")

    # --- nodes, control ----------------------------------------------------------------------------------
    @property
    def nodes(self) -> str:
        """Hash node id -> node JSON (type, host, pid, address, capacity, prefetch, subtasks); see node_seen."""
        return self._k("nodes")

    @property
    def node_seen(self) -> str:
        """Sorted set node id -> last heartbeat (Redis time, seconds)."""
        return self._k("node_seen")

    @property
    def controls(self) -> str:
        """Hash control id -> JSON {leader, at, ok_at, failed_in_row, last_error, alarm}: each control's last tick."""
        return self._k("controls")

    @property
    def leader(self) -> str:
        """String holding the active control's id, with a TTL (the leader lease)."""
        return self._k("leader")

    # --- run records, aggregates, counters -------------------------------------------------------------
    @property
    def runs(self) -> str:
        """Capped stream of run records, one per subtask execution."""
        return self._k("runs")

    def agg_site_node(self, site: str, node: str) -> str:
        """Hash of counters and moving estimates for one (site, node)."""
        return self._k(f"agg:sn:{site}|{node}")

    def agg_group_site_node(self, group: str, site: str, node: str) -> str:
        """Hash of counters and moving estimates for one (product, site, node)."""
        return self._k(f"agg:psn:{group}|{site}|{node}")

    def est_site(self, site: str) -> str:
        """Hash node -> JSON {c, spp, runs, last}: the moving estimates of every node on ``site``, for allocation."""
        return self._k(f"est:site:{site}")

    def est_group_site(self, group: str, site: str) -> str:
        """Hash node -> JSON {spp, runs, last}: seconds per page of every node for one (product, site)."""
        return self._k(f"est:gs:{group}|{site}")

    @property
    def est_dirty(self) -> str:
        """Set of the estimates changed since the control last read them: "s|<node>|<site>" and
        "g|<node>|<site>|<product>" (added by the finish script, taken by the leading control)."""
        return self._k("est:dirty")

    @property
    def est_groups(self) -> str:
        """Set of the "<product>|<site>" pairs that have an ``est:gs`` hash (so the control reads only those)."""
        return self._k("est:groups")

    @property
    def agg_index(self) -> str:
        """Set of "site|node" pairs that have aggregates (for status and for a new leader)."""
        return self._k("agg:pairs")

    @property
    def agg_triples(self) -> str:
        """Set of "product|site|node" triples that have aggregates (for status)."""
        return self._k("agg:triples")

    def node_counters(self, node: str) -> str:
        """Hash of per-node scheduling counts: moved_out, moved_in, modified, recalled, dead, stale_finish."""
        return self._k(f"count:node:{node}")

    @property
    def counters(self) -> str:
        """Hash of cluster-wide counts (tasks, subtasks, done tasks, malformed input, ...)."""
        return self._k("count:cluster")

    @property
    def progress(self) -> str:
        """Hash "<group>|<field>" -> count: per-product progress (tasks, done, collected, pages)."""
        return self._k("progress")

    # --- history and audit (read by dashboards) -------------------------------------------------------------
    @property
    def history(self) -> str:
        """Capped list of status samples (JSON, oldest first), RPUSH + LTRIM by :mod:`scheduler_ext.history`."""
        return self._k("history")

    @property
    def history_slot(self) -> str:
        """String with a TTL of one sampling interval: whoever sets it (NX) takes the next history sample."""
        return self._k("history:slot")

    @property
    def audit(self) -> str:
        """Capped list of audit records (JSON, newest first) of manual actions: dead-letter requeue and drop."""
        return self._k("audit")

    # --- politeness (scheduler_ext/politeness.py); <limit> is "<site>" or "<site>|<address>" ------------------
    def polite_slots(self, limit: str) -> str:
        """Hash node -> request slots it holds on ``limit``; field ``|sum`` is the total. Expires when unused."""
        return self._k(f"polite:slots:{limit}")

    def polite_seen(self, limit: str) -> str:
        """Sorted set node -> when its holding on ``limit`` lapses unless renewed (Redis time, seconds)."""
        return self._k(f"polite:seen:{limit}")

    def polite_bucket(self, limit: str) -> str:
        """Hash {tokens, ts}: the token bucket of ``limit``'s request rate. Expires when unused."""
        return self._k(f"polite:bucket:{limit}")

    def stats(self, scope: str, name: str) -> str:
        """Hash of Scrapy stats flushed by nodes: scope is "node" or "site"."""
        return self._k(f"stats:{scope}:{name}")
