--[[
polite: one node's share of a cluster-wide politeness limit (one site, or one site and source address).

  KEYS[1] slotsKey   polite:slots:<key>: node -> request slots it holds; field '|sum' = the total held
  KEYS[2] expiryKey  polite:seen:<key>: node -> when its holding lapses unless renewed (Redis time)
  KEYS[3] bucketKey  polite:bucket:<key>: token bucket {tokens, ts}

  ARGV[1] node        the node's id (never contains '|', so it cannot clash with '|sum')
  ARGV[2] limit       requests in flight allowed on this key, all nodes together; 0 = no concurrency limit
  ARGV[3] inflight    requests this node has in flight on this key now
  ARGV[4] want        slots this node would like to hold (in flight + waiting); 0 = give back what it holds
  ARGV[5] ttl         seconds a holding lasts without renewal (a node that stops syncing gives its slots back)
  ARGV[6] rate        requests per second allowed on this key, all nodes together; 0 = no rate limit
  ARGV[7] burst       bucket size: tokens that may pile up while nobody asks
  ARGV[8] wantTokens  tokens this node asks for now

Returns {slots, tokens}: the slots the node now holds (never fewer than it has in flight, so a node's record stays
true) and the tokens granted. Slots: the total held never exceeds the limit by a grant; a node gets at most its fair
share (limit / nodes holding or asking) so that a newcomer is served as the others' requests finish.
]]
--@include now
--@include counter

local slotsKey, expiryKey, bucketKey = KEYS[1], KEYS[2], KEYS[3]
local node = ARGV[1]
local limit, inflight, want, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rate, burst, wantTokens = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local slots, tokens = 0, 0

-- A holding or a sum that is not a whole number (a hand edit; or the key not a hash) must not stop every node's
-- requests to the site: a holding reads as none, and the sum is counted again from the holdings. The same for the
-- other two keys: one of another type is replaced. Holdings without their expiries could never lapse, so a spoiled
-- expiry key takes the holdings with it (each node claims its share again at its next sync, and never fewer slots
-- than it has in flight).
local function ofType(key, want)
  local kind = redis.call('TYPE', key).ok
  if kind ~= want and kind ~= 'none' then redis.call('DEL', key); return false end
  return true
end
ofType(slotsKey, 'hash')
if not ofType(expiryKey, 'zset') then redis.call('DEL', slotsKey) end
ofType(bucketKey, 'hash')
local function held(who)
  local v = tonumber(redis.call('HGET', slotsKey, who) or '0')
  if v == nil or v ~= math.floor(v) then redis.call('HSET', slotsKey, who, 0); return 0 end
  return v
end
local function total()
  local v = tonumber(redis.call('HGET', slotsKey, '|sum') or '0')
  if v ~= nil and v == math.floor(v) then return v end
  local sum, all = 0, redis.call('HGETALL', slotsKey)
  for i = 1, #all, 2 do
    if all[i] ~= '|sum' then sum = sum + held(all[i]) end
  end
  redis.call('HSET', slotsKey, '|sum', sum)
  return sum
end
local keep = math.ceil(ttl * 4)

if limit > 0 then
  total()  -- a spoiled sum is counted again before anything is added to it
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', expiryKey, '-inf', now)) do
    hincr(slotsKey, '|sum', -held(gone))
    redis.call('HDEL', slotsKey, gone)
    redis.call('ZREM', expiryKey, gone)
  end
  local mine = held(node)
  local others = total() - mine
  local holders = redis.call('ZCARD', expiryKey)
  if not redis.call('ZSCORE', expiryKey, node) then holders = holders + 1 end
  local fair = math.ceil(limit / holders)
  slots = math.max(inflight, math.min(want, limit - others, fair), 0)
  if slots > 0 or want > 0 then
    redis.call('HSET', slotsKey, node, slots)
    redis.call('ZADD', expiryKey, now + ttl, node)
  else
    redis.call('HDEL', slotsKey, node)
    redis.call('ZREM', expiryKey, node)
  end
  hincr(slotsKey, '|sum', slots - mine)
  redis.call('EXPIRE', slotsKey, keep)
  redis.call('EXPIRE', expiryKey, keep)
end

if rate > 0 and wantTokens > 0 then
  local b = redis.call('HMGET', bucketKey, 'tokens', 'ts')
  local have, ts = tonumber(b[1]) or burst, tonumber(b[2]) or now
  have = math.min(burst, have + math.max(0, now - ts) * rate)
  tokens = math.min(wantTokens, math.floor(have))
  redis.call('HSET', bucketKey, 'tokens', tostring(have - tokens), 'ts', tostring(now))
  redis.call('EXPIRE', bucketKey, keep)
end

return {slots, tokens}
