--[[
take: move the next subtask of a node's crawl queue into a lease.

  KEYS[1] crawlKey     crawl:<node>, the node's crawl queue (taken from the right)
  KEYS[2] leasesKey    leases: subtask id -> lease deadline
  KEYS[3] leaseInfoKey lease_info: subtask id -> lease JSON {token, node, started, hard}
  KEYS[4] subtasksKey  subtasks: subtask id -> subtask JSON
  KEYS[5] failedKey    failed: where an unreadable entry goes, with the reason
  KEYS[6] queuedKey    queued: subtask id -> time it entered a crawl queue
  KEYS[7] seqKey       seq: counter that numbers lease tokens
  KEYS[8] countersKey  count:cluster: counts malformed_subtasks

  ARGV[1] node         the node's id
  ARGV[2] maxLook      crawl-queue entries to look at, at most (malformed ones are skipped)
  ARGV[3] leaseTtl     seconds a lease lasts unless renewed
  ARGV[4] grace        seconds a lease may outlive the subtask's time limit

Returns {subtask json, token, started} or nil (nothing readable in the first maxLook entries).
An entry that is not a JSON object of schema 1 with a string id and a finite time limit > 0 is moved to `failed` as a
malformed entry with the reason (the Python side validates the rest). Finite, and checked before any write: cjson
reads 1e999 as infinity, and the lease JSON could not hold it (cjson refuses to encode it, which once failed the
script after the RPOP and the ZADD: the entry vanished). Every key it writes is checked for its type first
(types.lua): a `leases` of another type once failed the script after the RPOP too.
]]
--@include now
--@include counter
--@include types

local crawlKey, leasesKey, leaseInfoKey, subtasksKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local failedKey, queuedKey, seqKey, countersKey = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local node, maxLook = ARGV[1], tonumber(ARGV[2])
local leaseTtl, grace = tonumber(ARGV[3]), tonumber(ARGV[4])

expect(crawlKey, 'list'); expect(leasesKey, 'zset'); expect(leaseInfoKey, 'hash'); expect(subtasksKey, 'hash')
expect(failedKey, 'list'); expect(queuedKey, 'zset')

for _ = 1, maxLook do
  local raw = redis.call('RPOP', crawlKey)
  if not raw then return nil end
  local ok, st = pcall(cjson.decode, raw)
  if ok and type(st) == 'table' and st.v == 1 and type(st.id) == 'string' and st.id ~= ''
      and type(st.time_limit) == 'number' and st.time_limit > 0 and st.time_limit < math.huge then
    local token = node .. ':' .. incr(seqKey, 1)
    local hard = now + st.time_limit + grace
    local deadline = math.min(now + leaseTtl, hard)
    redis.call('ZADD', leasesKey, deadline, st.id)
    redis.call('HSET', leaseInfoKey, st.id, cjson.encode({token = token, node = node, started = now, hard = hard}))
    redis.call('HSET', subtasksKey, st.id, raw)
    redis.call('ZREM', queuedKey, st.id)
    return {raw, token, tostring(now)}
  end
  local why = 'not a JSON object'
  if ok and type(st) == 'table' then why = 'missing or invalid v, id or time_limit' end
  local sid = cjson.null
  if ok and type(st) == 'table' and type(st.id) == 'string' then sid = st.id; redis.call('ZREM', queuedKey, st.id) end
  -- Shown safely: printable ASCII only, so that the failure entry is valid JSON whatever the bytes were.
  local shown = string.gsub(string.sub(raw, 1, 120), '[^%w%p ]', '?')
  redis.call('LPUSH', failedKey, cjson.encode({v = 1, malformed = true, id = sid, node = node, outcome = 'failed',
    reason = 'malformed subtask in ' .. crawlKey .. ': ' .. why, raw = shown, size = string.len(raw), at = now}))
  hincr(countersKey, 'malformed_subtasks', 1)
end
return nil
