--[[
lead: take the control leader lease if it is free, or renew it if it is ours.

  KEYS[1] leaderKey  leader: the active control's id, with a TTL

  ARGV[1] controlId  this control's id
  ARGV[2] ttlMs      life of the lease, milliseconds (> 0)

Returns 1 if this control leads (now until ttlMs from now), 0 if another control does, 2 if this control took over
a key no lead script wrote: one with no expiry (a hand `SET`) or of another type. Such a key never lapses, so
honouring it would leave the cluster with no leader for ever; the client logs the takeover.
]]

local leaderKey = KEYS[1]
local controlId, ttlMs = ARGV[1], ARGV[2]

local kind = redis.call('TYPE', leaderKey).ok
local current = false
if kind == 'string' then current = redis.call('GET', leaderKey) end
if kind == 'none' or current == controlId then
  redis.call('SET', leaderKey, controlId, 'PX', ttlMs)
  return 1
end
if kind ~= 'string' or redis.call('PTTL', leaderKey) == -1 then
  redis.call('SET', leaderKey, controlId, 'PX', ttlMs)  -- SET replaces a key of any type
  return 2
end
return 0
