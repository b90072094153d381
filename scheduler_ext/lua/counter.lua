-- Shared helper (included, not copied): counters that a hand edit cannot break.
-- Defines: incr(key, by), hincr(key, field, by, float)
-- A counter holding something that is not a number (or a key of another type) would make INCRBY / HINCRBY fail,
-- and with it every script that counts there: every take of the cluster, every finish of a pair. Such a value is
-- replaced instead. A hash field starts over from the increment (counters for status and experiments); a plain
-- counter, which numbers ids and tokens that must never repeat, starts above any count it can have held: the
-- server time in microseconds.
local function incr(key, by)
  local r = redis.pcall('INCRBY', key, by)
  if type(r) == 'table' and r.err then
    local t = redis.call('TIME')
    redis.call('DEL', key)
    redis.call('SET', key, t[1] .. string.format('%06d', tonumber(t[2])))
    r = redis.call('INCRBY', key, by)
  end
  return r
end

local function hincr(key, field, by, float)
  by = by + 0  -- a number, and never -0 (which Redis reads as no integer)
  local r = redis.pcall(float and 'HINCRBYFLOAT' or 'HINCRBY', key, field, by)
  if type(r) == 'table' and r.err then
    if redis.call('TYPE', key).ok ~= 'hash' then redis.call('DEL', key) end
    redis.call('HSET', key, field, by)
    r = by
  end
  return r
end
