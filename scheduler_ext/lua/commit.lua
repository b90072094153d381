--[[
commit: the control's compare-and-apply. Every guard is checked first; only if all hold are the guards' own
consumptions and then the writes applied, all in this one script: a decision is applied once or not at all.

  KEYS[1..n]  every key a guard or a write names (so the script is legal on Redis Cluster)

  ARGV[1] guardsJson  JSON list of guards (built by scheduler_ext.store.Guard):
            ["tail_is", list, value]                      the list's last element is value; it is popped
            ["lease_is", lease_info, leases, id, token]   the lease of id has this token; lease and deadline go
            ["zrem", zset, member]                        member is in the sorted set; it is removed
            ["lrem", list, value]                         value is in the list; one occurrence is removed
            ["zscore_le", zset, member, x]                member's score is <= x (checked, nothing removed)
            ["hdel", hash, field]                         the field exists; it is removed
  ARGV[2] writesJson  JSON list of writes (built by scheduler_ext.store.Write):
            ["hset", k, f, v] ["hdel", k, f] ["zadd", k, score, m] ["zrem", k, m] ["lpush", k, v]
            ["hincrby", k, f, n] ["del", k] ["sadd", k, m]

Returns 1 if applied, 0 if a guard failed (nothing written). An unknown guard or write is an error reply, raised
before anything changes.
]]

local guards, writes = cjson.decode(ARGV[1]), cjson.decode(ARGV[2])

local knownWrites = {hset = 1, hdel = 1, zadd = 1, zrem = 1, lpush = 1, hincrby = 1, del = 1, sadd = 1}
for _, w in ipairs(writes) do  -- refuse a bad write before anything changes: never half-applied
  if not knownWrites[w[1]] then return redis.error_reply('unknown write ' .. tostring(w[1])) end
end

-- 1. Check every guard.
for _, g in ipairs(guards) do
  local op = g[1]
  if op == 'tail_is' then
    if redis.call('LINDEX', g[2], -1) ~= g[3] then return 0 end
  elseif op == 'lease_is' then
    local raw = redis.call('HGET', g[2], g[4])
    local ok, lease = pcall(cjson.decode, raw or '')
    if not raw or not ok or type(lease) ~= 'table' or lease.token ~= g[5] then return 0 end
  elseif op == 'zrem' then
    if not redis.call('ZSCORE', g[2], g[3]) then return 0 end
  elseif op == 'lrem' then
    if not redis.call('LPOS', g[2], g[3]) then return 0 end
  elseif op == 'hdel' then
    if redis.call('HEXISTS', g[2], g[3]) == 0 then return 0 end
  elseif op == 'zscore_le' then
    local score = redis.call('ZSCORE', g[2], g[3])
    if not score or tonumber(score) > tonumber(g[4]) then return 0 end
  else
    return redis.error_reply('unknown guard ' .. tostring(op))
  end
end

-- 2. Consume what the guards matched.
for _, g in ipairs(guards) do
  local op = g[1]
  if op == 'tail_is' then redis.call('RPOP', g[2])
  elseif op == 'lease_is' then redis.call('HDEL', g[2], g[4]); redis.call('ZREM', g[3], g[4])
  elseif op == 'zrem' then redis.call('ZREM', g[2], g[3])
  elseif op == 'lrem' then redis.call('LREM', g[2], 1, g[3])
  elseif op == 'hdel' then redis.call('HDEL', g[2], g[3]) end
end

-- 3. The writes.
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
