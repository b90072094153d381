-- Shared helper (included, not copied): Redis server time in seconds, as a float.
-- Defines: now
local _time = redis.call('TIME')
local now = tonumber(_time[1]) + tonumber(_time[2]) / 1e6
