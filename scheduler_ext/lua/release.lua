--[[
release: a closing node gives back the leased subtasks it will not finish, and its whole crawl queue, to waiting;
on close it first leaves the registry, in the same step, so no allocation can reach its queue after the drain.

  KEYS[1] leasesKey    leases
  KEYS[2] leaseInfoKey lease_info
  KEYS[3] subtasksKey  subtasks
  KEYS[4] waitingKey   waiting: subtask id -> priority
  KEYS[5] crawlKey     crawl:<node>
  KEYS[6] queuedKey    queued
  KEYS[7] nodesKey     nodes
  KEYS[8] seenKey      node_seen

  ARGV[1] node         the node's id
  ARGV[2] deregister   "1": remove the node from nodes and node_seen first (its close); "0": keep it
  ARGV[3..] id, token, priority triples of the leases it holds

Returns how many subtasks went back to waiting. Crawl-queue entries that cannot be read stay, in order, for a
node's take script to move to `failed` with the reason. Every key is checked for its type before the first write
(types.lua): a `waiting` of another type failed the script after it had popped the crawl queue.
]]
--@include types

local leasesKey, leaseInfoKey, subtasksKey, waitingKey, crawlKey, queuedKey, nodesKey, seenKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]

for i, kind in ipairs({'zset', 'hash', 'hash', 'zset', 'list', 'zset', 'hash', 'zset'}) do expect(KEYS[i], kind) end

-- An allocation is guarded by the node's registry entry (commit.lua `hexists`), so once the entry is gone
-- nothing more lands in the crawl queue drained below.
if ARGV[2] == '1' then
  redis.call('HDEL', nodesKey, ARGV[1])
  redis.call('ZREM', seenKey, ARGV[1])
end
local n = 0
for i = 3, #ARGV, 3 do
  local id, token, priority = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local raw = redis.call('HGET', leaseInfoKey, id)
  local ok, lease = pcall(cjson.decode, raw or '')
  if raw and ok and type(lease) == 'table' and lease.token == token then
    redis.call('ZREM', leasesKey, id)
    redis.call('HDEL', leaseInfoKey, id)
    redis.call('ZADD', waitingKey, priority, id)
    n = n + 1
  end
end
local unreadable = {}
for _ = 1, redis.call('LLEN', crawlKey) do
  local raw = redis.call('RPOP', crawlKey)
  local ok, st = pcall(cjson.decode, raw)
  if ok and type(st) == 'table' and type(st.id) == 'string' then
    redis.call('HSET', subtasksKey, st.id, raw)
    local priority = tonumber(st.priority) or 0
    if priority ~= priority then priority = 0 end  -- NaN (cjson reads it): ZADD would fail after the RPOPs
    redis.call('ZADD', waitingKey, priority, st.id)
    redis.call('ZREM', queuedKey, st.id)
    n = n + 1
  else
    table.insert(unreadable, raw)
  end
end
for _, raw in ipairs(unreadable) do redis.call('LPUSH', crawlKey, raw) end
return n
