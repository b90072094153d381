--[[
lead: take the control leader lease if it is free, or renew it if it is ours.

  KEYS[1] leaderKey  leader: the active control's id, with a TTL

  ARGV[1] controlId  this control's id
  ARGV[2] ttlMs      life of the lease, milliseconds (> 0)

Returns 1 if this control leads (now until ttlMs from now), 0 if another control does.
]]

local leaderKey = KEYS[1]
local controlId, ttlMs = ARGV[1], ARGV[2]

local current = redis.call('GET', leaderKey)
if current == controlId or not current then
  redis.call('SET', leaderKey, controlId, 'PX', ttlMs)
  return 1
end
return 0
