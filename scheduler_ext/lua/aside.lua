--[[
aside: set a key of another type than the schema gives it aside, under a name a person can find, and count it.

A key of the wrong type (a hand `SET`) makes every command on it fail with WRONGTYPE: one such key stopped every
control tick, or every take of a node, until a person deleted it. The client calls this script for each key a
pipeline of TYPE found wrong (Store.set_aside), only after such an error.

  KEYS[1] key          the key found of the wrong type
  KEYS[2] asideKey     garbage:<name>:<Redis time>: where it goes (the same prefix, and so the same hash tag)
  KEYS[3] countersKey  count:cluster: counts garbage_keys

  ARGV[1] kind         the type the schema gives the key, as TYPE names it (list, hash, zset, set, string, stream)
  ARGV[2] keepSeconds  how long the key set aside is kept (then Redis expires it: a person had the warning and the
                       counter meanwhile, and a deployment whose keys are set by hand again and again does not fill
                       its Redis with them)

Returns the type the key had if it was set aside; false if it is of its type or gone (checked here, in the same
atomic step as the rename, so that a key of the right type is never moved), or if asideKey is taken.
]]
--@include counter

local key, asideKey, countersKey = KEYS[1], KEYS[2], KEYS[3]
local kind, keepSeconds = ARGV[1], ARGV[2]

local found = redis.call('TYPE', key).ok
if found == 'none' or found == kind or redis.call('EXISTS', asideKey) == 1 then
  return false
end
redis.call('RENAME', key, asideKey)
redis.call('EXPIRE', asideKey, keepSeconds)
hincr(countersKey, 'garbage_keys', 1)
return found
