--[[
commit: the control's compare-and-apply, for a batch of decisions. Each decision is independent: its guards are
checked first, and only if all hold are the guards' own consumptions and then its writes applied. A decision is
applied whole or not at all; one that fails its guards (or is malformed) changes nothing and does not stop the
ones after it. Decisions are applied in order, so a later one sees what an earlier one wrote.

  KEYS[1..n]  every key a guard or a write names (so the script is legal on Redis Cluster)

  ARGV[1] decisionsJson  JSON list of decisions, each [guards, writes]:
    guards (built by scheduler_ext.store.Guard):
      ["tail_is", list, value]                      the list's last element is value; it is popped
      ["tail_sha1_is", list, sha1]                  the last element's SHA-1 is sha1 (an entry too big to
                                                    send back); it is popped
      ["lease_is", lease_info, leases, id, token]   the lease of id has this token; lease and deadline go
      ["zrem", zset, member]                        member is in the sorted set; it is removed
      ["lrem", list, value]                         value is in the list; one occurrence is removed
      ["lrem_or_lost", list, value, zset, member, x(, beyond)]
                                                    as lrem, or: value is not in the list and member's score in
                                                    zset is <= x or > beyond, as zscore_le (a queued entry gone
                                                    from its crawl queue without
                                                    being taken, which removes member: a hand edit lost it)
      ["zscore_le", zset, member, x(, beyond)]      member's score is <= x, or > beyond (default: +inf only;
                                                    checked, nothing removed): a time further ahead than any
                                                    script writes (a hand edit, a clock gone back) never comes
      ["hdel", hash, field]                         the field exists; it is removed
      ["hexists", hash, field]                      the field exists (checked, nothing removed)
      ["hfield_is", hash, field, raw]               the field holds raw, or is absent if raw is null (checked,
                                                    nothing removed): a record not changed since it was read
    writes (built by scheduler_ext.store.Write):
      ["hset", k, f, v] ["hdel", k, f] ["zadd", k, score, m] ["zrem", k, m] ["lpush", k, v]
      ["hincrby", k, f, n] ["del", k] ["sadd", k, m]

Returns a list with one code per decision: 1 applied, 0 a guard failed, -1 malformed (an unknown guard or
write; nothing of it applied). A key of another type than a decision uses it as fails the script with WRONGTYPE
before that decision changes anything (types.lua); the decisions before it stay applied, each whole.
]]
--@include counter
--@include types

local decisions = cjson.decode(ARGV[1])

local knownGuards = {tail_is = 1, tail_sha1_is = 1, lease_is = 1, zrem = 1, lrem = 1, lrem_or_lost = 1, zscore_le = 1,
                     hdel = 1, hexists = 1, hfield_is = 1}
local knownWrites = {hset = 1, hdel = 1, zadd = 1, zrem = 1, lpush = 1, hincrby = 1, del = 1, sadd = 1}

-- The type each guard and write uses its key as; lease_is also uses its third element, a zset, and lrem_or_lost
-- its fourth. Not checked: 'del' (any type), 'hincrby' (a counter of another type starts over by itself:
-- counter.lua).
local guardTypes = {tail_is = 'list', tail_sha1_is = 'list', lease_is = 'hash', zrem = 'zset', lrem = 'list',
                    lrem_or_lost = 'list', zscore_le = 'zset', hdel = 'hash', hexists = 'hash',
                    hfield_is = 'hash'}
local writeTypes = {hset = 'hash', hdel = 'hash', zadd = 'zset', zrem = 'zset', lpush = 'list', sadd = 'set'}
local checked = {}  -- key -> type found right in this call (a decision's writes create keys of that type only)
local function expectOnce(key, kind)
  if kind and checked[key] ~= kind then expect(key, kind); checked[key] = kind end
end
local function typed(guards, writes)
  for _, g in ipairs(guards) do
    expectOnce(g[2], guardTypes[g[1]])
    if g[1] == 'lease_is' then expectOnce(g[3], 'zset') elseif g[1] == 'lrem_or_lost' then expectOnce(g[4], 'zset') end
  end
  for _, w in ipairs(writes) do expectOnce(w[2], writeTypes[w[1]]) end
end

local function wellFormed(guards, writes)
  for _, g in ipairs(guards) do if not knownGuards[g[1]] then return false end end
  for _, w in ipairs(writes) do if not knownWrites[w[1]] then return false end end
  return true
end

local function holds(g)
  local op = g[1]
  if op == 'tail_is' then
    return redis.call('LINDEX', g[2], -1) == g[3]
  elseif op == 'tail_sha1_is' then
    local tail = redis.call('LINDEX', g[2], -1)
    return tail and redis.sha1hex(tail) == g[3]
  elseif op == 'lease_is' then
    local raw = redis.call('HGET', g[2], g[4])
    local ok, lease = pcall(cjson.decode, raw or '')
    return raw and ok and type(lease) == 'table' and lease.token == g[5]
  elseif op == 'zrem' then
    return redis.call('ZSCORE', g[2], g[3]) ~= false
  elseif op == 'lrem' then
    return redis.call('LPOS', g[2], g[3]) ~= false
  elseif op == 'lrem_or_lost' then
    if redis.call('LPOS', g[2], g[3]) ~= false then return true end
    local score = tonumber(redis.call('ZSCORE', g[4], g[5]) or '')
    return score ~= nil and (score <= tonumber(g[6]) or score > (tonumber(g[7]) or math.huge) or score == math.huge)
  elseif op == 'hdel' or op == 'hexists' then
    return redis.call('HEXISTS', g[2], g[3]) == 1
  elseif op == 'hfield_is' then
    local value = redis.call('HGET', g[2], g[3])
    if g[4] == cjson.null then return value == false end
    return value == g[4]
  elseif op == 'zscore_le' then
    -- Every score this guards is a time (a lease deadline, a queue time, a heartbeat) that no script sets to +inf,
    -- nor further ahead than `beyond`: such a score (a hand edit, a clock gone back) would never come due
    -- (snapshot.lua reports such lease deadlines as lapsed and such heartbeats as silent).
    local score = tonumber(redis.call('ZSCORE', g[2], g[3]) or '')
    local beyond = tonumber(g[5]) or math.huge
    return score ~= nil and (score <= tonumber(g[4]) or score > beyond or score == math.huge)
  end
  return false
end

local function consume(g)
  local op = g[1]
  if op == 'tail_is' or op == 'tail_sha1_is' then redis.call('RPOP', g[2])
  elseif op == 'lease_is' then redis.call('HDEL', g[2], g[4]); redis.call('ZREM', g[3], g[4])
  elseif op == 'zrem' then redis.call('ZREM', g[2], g[3])
  elseif op == 'lrem' or op == 'lrem_or_lost' then redis.call('LREM', g[2], 1, g[3])
  elseif op == 'hdel' then redis.call('HDEL', g[2], g[3]) end
end

local function write(w)
  local op = w[1]
  if op == 'hset' then redis.call('HSET', w[2], w[3], w[4])
  elseif op == 'hdel' then redis.call('HDEL', w[2], w[3])
  elseif op == 'zadd' then redis.call('ZADD', w[2], w[3], w[4])
  elseif op == 'zrem' then redis.call('ZREM', w[2], w[3])
  elseif op == 'lpush' then redis.call('LPUSH', w[2], w[3])
  elseif op == 'hincrby' then hincr(w[2], w[3], w[4])
  elseif op == 'del' then redis.call('DEL', w[2])
  elseif op == 'sadd' then redis.call('SADD', w[2], w[3]) end
end

local results = {}
for i, decision in ipairs(decisions) do
  local guards, writes = decision[1], decision[2]
  if not wellFormed(guards, writes) then
    results[i] = -1
  else
    local ok = true
    for _, g in ipairs(guards) do
      if not holds(g) then ok = false; break end
    end
    if ok then
      typed(guards, writes)
      for _, g in ipairs(guards) do consume(g) end
      for _, w in ipairs(writes) do write(w) end
      results[i] = 1
    else
      results[i] = 0
    end
  end
end
return results
