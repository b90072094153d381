--[[
resign: give the control leader lease up, if (and only if) this control holds it.

  KEYS[1] leaderKey  leader

  ARGV[1] controlId  this control's id

Returns 1 if the lease was ours and is now free, 0 if another control (or none) held it. A key of another type
(set by hand) is no lease of ours: it is left for the next lead script to take over (lead.lua), where GET failed.
]]

local leaderKey = KEYS[1]
local controlId = ARGV[1]

if redis.call('TYPE', leaderKey).ok == 'string' and redis.call('GET', leaderKey) == controlId then
  redis.call('DEL', leaderKey)
  return 1
end
return 0
