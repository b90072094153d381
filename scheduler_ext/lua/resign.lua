--[[
resign: give the control leader lease up, if (and only if) this control holds it.

  KEYS[1] leaderKey  leader

  ARGV[1] controlId  this control's id

Returns 1 if the lease was ours and is now free, 0 if another control (or none) held it.
]]

local leaderKey = KEYS[1]
local controlId = ARGV[1]

if redis.call('GET', leaderKey) == controlId then
  redis.call('DEL', leaderKey)
  return 1
end
return 0
