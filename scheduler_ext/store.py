"""Every atomic change to the scheduling state in Redis: one Lua script each, registered once per client.

Nodes use :meth:`Store.take`, :meth:`Store.heartbeat`, :meth:`Store.finish` and :meth:`Store.release`; the
control loop commits each of its decisions through :meth:`Store.commit`, a compare-and-apply: a guard (the report
is still at the tail of its list, the lease token still matches, the subtask is still waiting, ...) and the writes
that follow from it happen in one script, so a decision is applied exactly once even if two controls race or one
dies half-way. Times are Redis server time (``TIME`` inside the scripts), never a node's clock.

Key schema: :mod:`scheduler_ext.keys` (docs/redis-keys.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from .keys import Keys

# Shared Lua prelude: server time in seconds (float).
_NOW = "local _t = redis.call('TIME'); local now = tonumber(_t[1]) + tonumber(_t[2]) / 1e6\n"

# take: move the next subtask of a node's crawl queue into a lease.
# KEYS: crawl:<node>, leases, lease_info, subtasks, failed, queued, seq, count:cluster
# ARGV: node, max entries to look at, lease ttl (s), grace after the time limit (s)
# Returns {subtask json, token, started} or nil. Entries that are not JSON objects of schema 1 with a string id
# and a numeric time limit are moved to `failed` with the reason (the Python side validates the rest).
_TAKE = _NOW + """
for i = 1, tonumber(ARGV[2]) do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then return nil end
  local ok, st = pcall(cjson.decode, raw)
  if ok and type(st) == 'table' and st.v == 1 and type(st.id) == 'string' and st.id ~= ''
      and type(st.time_limit) == 'number' and st.time_limit > 0 then
    local token = ARGV[1] .. ':' .. redis.call('INCR', KEYS[7])
    local hard = now + st.time_limit + tonumber(ARGV[4])
    local deadline = math.min(now + tonumber(ARGV[3]), hard)
    redis.call('ZADD', KEYS[2], deadline, st.id)
    redis.call('HSET', KEYS[3], st.id, cjson.encode({token = token, node = ARGV[1], started = now, hard = hard}))
    redis.call('HSET', KEYS[4], st.id, raw)
    redis.call('ZREM', KEYS[6], st.id)
    return {raw, token, tostring(now)}
  end
  local why = 'not a JSON object'
  if ok and type(st) == 'table' then why = 'missing or invalid v, id or time_limit' end
  local sid = cjson.null
  if ok and type(st) == 'table' and type(st.id) == 'string' then sid = st.id; redis.call('ZREM', KEYS[6], st.id) end
  local shown = string.gsub(string.sub(raw, 1, 120), '[^%w%p ]', '?')
  redis.call('LPUSH', KEYS[5], cjson.encode({v = 1, malformed = true, id = sid, node = ARGV[1], outcome = 'failed',
    reason = 'malformed subtask in ' .. KEYS[1] .. ': ' .. why, raw = shown, size = string.len(raw), at = now}))
  redis.call('HINCRBY', KEYS[8], 'malformed_subtasks', 1)
end
return nil
"""

# heartbeat: register the node and renew the leases it still holds.
# KEYS: nodes, node_seen, leases, lease_info
# ARGV: node, node json, lease ttl (s), then id, token pairs
# Returns the ids whose lease is gone or belongs to someone else (recalled: stop working on them).
_HEARTBEAT = _NOW + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])  -- stored as sent (cjson would turn [] into {}); last seen: KEYS[2]
redis.call('ZADD', KEYS[2], now, ARGV[1])
local lost = {}
for i = 4, #ARGV, 2 do
  local raw = redis.call('HGET', KEYS[4], ARGV[i])
  local lease = raw and cjson.decode(raw)
  if lease and lease.token == ARGV[i + 1] then
    redis.call('ZADD', KEYS[3], 'XX', math.min(now + tonumber(ARGV[3]), lease.hard), ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""

# finish: end a leased subtask: run record, aggregates, report. Refused (returns 0) if the token is stale.
# KEYS: leases, lease_info, subtasks, sleeping|failed, runs, agg site|node, agg product|site|node, agg index,
#       count:node:<node>, progress, agg triples index, est:site:<site>, est:gs:<product>|<site>
# ARGV: id, token, report json, runs maxlen, alpha, "site|node", offered, collected, pages, seconds, ok (1/0),
#       group, node
_FINISH = _NOW + """
local raw = redis.call('HGET', KEYS[2], ARGV[1])
local lease = raw and cjson.decode(raw)
if not lease or lease.token ~= ARGV[2] then
  redis.call('HINCRBY', KEYS[9], 'stale_finish', 1)
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[4], '*', 'report', ARGV[3])
redis.call('LPUSH', KEYS[4], ARGV[3])
local alpha = tonumber(ARGV[5])
local offered, collected = tonumber(ARGV[7]), tonumber(ARGV[8])
local pages, seconds, ok = tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11] == '1'
for k = 6, 7 do  -- counters per (site, node) and per (product, site, node), for status and experiments
  local key = KEYS[k]
  redis.call('HINCRBY', key, 'runs', 1)
  redis.call('HINCRBY', key, 'offered', offered)
  redis.call('HINCRBY', key, 'collected', collected)
  redis.call('HINCRBY', key, 'pages', pages)
  redis.call('HINCRBYFLOAT', key, 'seconds', seconds)
  redis.call('HSET', key, 'last_run', string.format('%.3f', now))
  if not ok then redis.call('HINCRBY', key, 'failures', 1) end
end
-- The moving estimates (recent runs weigh more): one hash per site and one per (product, site), a field per
-- node, so that the control reads every node's figures for a site in one command.
local function ewma(old, x) if old then return old + alpha * (x - old) end return x end
local function estimate(key, with_completion)
  local raw = redis.call('HGET', key, ARGV[13])
  local e = raw and cjson.decode(raw) or {}
  e.runs = (e.runs or 0) + 1
  e.last = now
  if with_completion then
    if offered > 0 then e.c = ewma(e.c, collected / offered) elseif not ok then e.c = ewma(e.c, 0) end
  end
  if ok and pages > 0 then e.spp = ewma(e.spp, seconds / pages) end
  redis.call('HSET', key, ARGV[13], cjson.encode(e))
end
estimate(KEYS[12], true)
estimate(KEYS[13], false)
redis.call('SADD', KEYS[8], ARGV[6])
redis.call('SADD', KEYS[11], ARGV[12] .. '|' .. ARGV[6])
redis.call('HINCRBY', KEYS[10], ARGV[12] .. '|collected', collected)
redis.call('HINCRBY', KEYS[10], ARGV[12] .. '|pages', pages)
return 1
"""

# release: give back the leased subtasks a closing node will not finish, straight to `waiting`.
# KEYS: leases, lease_info, subtasks, waiting, crawl:<node>, queued
# ARGV: node, then id, token, priority triples for leases; the crawl queue is returned whole.
_RELEASE = """
local n = 0
for i = 2, #ARGV, 3 do
  local raw = redis.call('HGET', KEYS[2], ARGV[i])
  local lease = raw and cjson.decode(raw)
  if lease and lease.token == ARGV[i + 1] then
    redis.call('ZREM', KEYS[1], ARGV[i]); redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('ZADD', KEYS[4], ARGV[i + 2], ARGV[i]); n = n + 1
  end
end
local unreadable = {}
for _ = 1, redis.call('LLEN', KEYS[5]) do
  local raw = redis.call('RPOP', KEYS[5])
  local ok, st = pcall(cjson.decode, raw)
  if ok and type(st) == 'table' and type(st.id) == 'string' then
    redis.call('HSET', KEYS[3], st.id, raw)
    redis.call('ZADD', KEYS[4], tonumber(st.priority) or 0, st.id)
    redis.call('ZREM', KEYS[6], st.id); n = n + 1
  else
    table.insert(unreadable, raw)
  end
end
-- What cannot be read stays, in order, for a node's take script to move to `failed` with the reason.
for _, raw in ipairs(unreadable) do redis.call('LPUSH', KEYS[5], raw) end
return n
"""

# commit: the control's compare-and-apply. ARGV[1] is a JSON list of guards, ARGV[2] a JSON list of writes;
# every key either names is in KEYS (so the script is legal on Redis Cluster). Guards:
#   ["tail_is", list, value]        the list's last element is value; it is popped
#   ["lease_is", lease_info, leases, id, token]  the lease of id has this token; the lease and its deadline go
#   ["zrem", zset, member]          member was in the sorted set; it is removed
#   ["lrem", list, value]           value was in the list; one occurrence is removed
#   ["zscore_le", zset, member, x]  member's score is <= x (e.g. a node's last heartbeat is old)
#   ["hdel", hash, field]           the field exists; it is removed
# Writes: ["hset", k, f, v] ["hdel", k, f] ["zadd", k, score, m] ["zrem", k, m] ["lpush", k, v] ["hincrby", k, f, n]
#   ["del", k] ["sadd", k, m]
# Returns 1 if applied, 0 if a guard failed (nothing written).
_COMMIT = """
local guards, writes = cjson.decode(ARGV[1]), cjson.decode(ARGV[2])
local known = {hset = 1, hdel = 1, zadd = 1, zrem = 1, lpush = 1, hincrby = 1, del = 1, sadd = 1}
for _, w in ipairs(writes) do  -- refuse a bad write before anything changes: never half-applied
  if not known[w[1]] then return redis.error_reply('unknown write ' .. tostring(w[1])) end
end
for _, g in ipairs(guards) do
  local op = g[1]
  if op == 'tail_is' then
    if redis.call('LINDEX', g[2], -1) ~= g[3] then return 0 end
  elseif op == 'lease_is' then
    local raw = redis.call('HGET', g[2], g[4])
    if not raw or cjson.decode(raw).token ~= g[5] then return 0 end
  elseif op == 'zrem' then
    if not redis.call('ZSCORE', g[2], g[3]) then return 0 end
  elseif op == 'lrem' then
    if not redis.call('LPOS', g[2], g[3]) then return 0 end
  elseif op == 'hdel' then
    if redis.call('HEXISTS', g[2], g[3]) == 0 then return 0 end
  elseif op == 'zscore_le' then
    local s = redis.call('ZSCORE', g[2], g[3])
    if not s or tonumber(s) > tonumber(g[4]) then return 0 end
  else
    return redis.error_reply('unknown guard ' .. tostring(op))
  end
end
for _, g in ipairs(guards) do
  local op = g[1]
  if op == 'tail_is' then redis.call('RPOP', g[2])
  elseif op == 'lease_is' then redis.call('HDEL', g[2], g[4]); redis.call('ZREM', g[3], g[4])
  elseif op == 'zrem' then redis.call('ZREM', g[2], g[3])
  elseif op == 'lrem' then redis.call('LREM', g[2], 1, g[3])
  elseif op == 'hdel' then redis.call('HDEL', g[2], g[3]) end
end
for _, w in ipairs(writes) do
  local op = w[1]
  if op == 'hset' then redis.call('HSET', w[2], w[3], w[4])
  elseif op == 'hdel' then redis.call('HDEL', w[2], w[3])
  elseif op == 'zadd' then redis.call('ZADD', w[2], w[3], w[4])
  elseif op == 'zrem' then redis.call('ZREM', w[2], w[3])
  elseif op == 'lpush' then redis.call('LPUSH', w[2], w[3])
  elseif op == 'hincrby' then redis.call('HINCRBY', w[2], w[3], w[4])
  elseif op == 'del' then redis.call('DEL', w[2])
  elseif op == 'sadd' then redis.call('SADD', w[2], w[3]) end
end
return 1
"""

# leader: take or renew the control leader lease (ttl 0: give it up if ours). KEYS: leader; ARGV: control id,
# ttl (ms). Returns 1 if leader.
_LEADER = """
local cur = redis.call('GET', KEYS[1])
if ARGV[2] == '0' then  -- resign: give the lease up if it is ours
  if cur == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 0
end
if cur == ARGV[1] or not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]); return 1
end
return 0
"""


def _keys_of(guards: Sequence[Sequence[Any]], writes: Sequence[Sequence[Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for g in guards:
        keys[g[1]] = None
        if g[0] == "lease_is":
            keys[g[2]] = None
    for w in writes:
        keys[w[1]] = None
    return list(keys)


class Store:
    """The atomic operations on one deployment's scheduling state (one key prefix)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        # Typed Any on purpose: redis-py's annotations cannot express that a decode_responses client returns str.
        self.redis: Any = client
        self.keys = keys
        self._take = client.register_script(_TAKE)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._finish = client.register_script(_FINISH)
        self._release = client.register_script(_RELEASE)
        self._commit = client.register_script(_COMMIT)
        self._leader = client.register_script(_LEADER)

    def now(self) -> float:
        """Redis server time, seconds."""
        sec, usec = self.redis.time()
        return float(sec) + usec / 1e6

    # --- node side ----------------------------------------------------------------------------------------------
    def take(self, node: str, lease_ttl: float, grace: float, max_skip: int = 8) -> tuple[str, str, float] | None:
        """Lease the next subtask of ``node``'s crawl queue: (subtask json, token, start time) or None."""
        k = self.keys
        res = self._take(keys=[k.crawl(node), k.leases, k.lease_info, k.subtasks, k.failed, k.queued, k.seq,
                               k.counters], args=[node, max_skip, lease_ttl, grace])
        if not res:
            return None
        return res[0], res[1], float(res[2])

    def heartbeat(self, node: str, info: dict[str, Any], lease_ttl: float,
                  leases: Iterable[tuple[str, str]]) -> list[str]:
        """Register ``node`` and renew its leases; returns the ids whose lease it lost."""
        k = self.keys
        args: list[Any] = [node, json.dumps(info, ensure_ascii=False), lease_ttl]
        for sid, token in leases:
            args += [sid, token]
        return list(self._heartbeat(keys=[k.nodes, k.node_seen, k.leases, k.lease_info], args=args))

    def finish(self, sid: str, token: str, report_json: str, *, node: str, site: str, group: str,
               offered: int, collected: int, pages: int, seconds: float, ok: bool, alpha: float,
               runs_maxlen: int) -> bool:
        """Finish a leased subtask; False if the lease token is stale (the subtask was recalled meanwhile)."""
        k = self.keys
        out = k.sleeping if ok else k.failed
        keys = [k.leases, k.lease_info, k.subtasks, out, k.runs, k.agg_site_node(site, node),
                k.agg_group_site_node(group, site, node), k.agg_index, k.node_counters(node), k.progress,
                k.agg_triples, k.est_site(site), k.est_group_site(group, site)]
        args: list[Any] = [sid, token, report_json, runs_maxlen, alpha, f"{site}|{node}", offered, collected, pages,
                f"{seconds:.6f}", 1 if ok else 0, group, node]
        return bool(self._finish(keys=keys, args=args))

    def release(self, node: str, leases: Iterable[tuple[str, str, float]]) -> int:
        """Return unfinished leased subtasks and the node's crawl queue to ``waiting``; how many moved."""
        k = self.keys
        args: list[Any] = [node]
        for sid, token, priority in leases:
            args += [sid, token, priority]
        return int(self._release(keys=[k.leases, k.lease_info, k.subtasks, k.waiting, k.crawl(node), k.queued],
                                 args=args))

    def purge(self) -> int:
        """Delete every key of this deployment's prefix; how many. For the demo, experiments and tests, which own
        their prefix: nodes and controls never call it (shared state is never flushed)."""
        keys = list(self.redis.scan_iter(match=f"{self.keys.prefix}:*", count=1000))
        for i in range(0, len(keys), 1000):
            self.redis.delete(*keys[i:i + 1000])
        return len(keys)

    def deregister(self, node: str) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.nodes, node)
            pipe.zrem(self.keys.node_seen, node)
            pipe.execute()

    # --- control side -----------------------------------------------------------------------------------------
    def commit(self, guards: Sequence[Sequence[Any]], writes: Sequence[Sequence[Any]],
               pipe: Any = None) -> bool | None:
        """Apply ``writes`` if every guard holds, atomically. With ``pipe``, queue it there (result in execute)."""
        keys = _keys_of(guards, writes)
        args = [json.dumps(list(guards), ensure_ascii=False), json.dumps(list(writes), ensure_ascii=False)]
        if pipe is not None:
            self._commit(keys=keys, args=args, client=pipe)
            return None
        return bool(self._commit(keys=keys, args=args))

    def lead(self, control_id: str, ttl: float) -> bool:
        """Take or keep the control leader lease."""
        return bool(self._leader(keys=[self.keys.leader], args=[control_id, max(1, int(ttl * 1000))]))

    def resign(self, control_id: str) -> None:
        """Give up the control leader lease if this control holds it."""
        self._leader(keys=[self.keys.leader], args=[control_id, 0])
