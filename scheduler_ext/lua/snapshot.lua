--[[
snapshot: what one control tick reads first, in one call: the server time, the oldest entries of the input lists,
lapsed leases, stale crawl-queue entries, silent and live nodes, the registry entry and crawl-queue length of the
nodes expected to be live, the first ids of `waiting`, and the estimates changed since the last tick. It only
reads, but for popping `est:dirty` (the control re-reads what it names).

Input lists come back as peek would: an entry longer than maxBytes is cut to showBytes, with its size and SHA-1, so
that one hostile entry cannot make the control read megabytes (the control consumes it with the `tail_sha1_is`
guard of commit.lua); a list stops after budget bytes (at least one entry).

  KEYS[1]    virtualKey   virtual   (input lists: entries LPUSHed, consumed from the right: the tail is oldest)
  KEYS[2]    sleepingKey  sleeping
  KEYS[3]    failedKey    failed
  KEYS[4]    leasesKey    leases: subtask id -> lease deadline
  KEYS[5]    queuedKey    queued: subtask id -> time it entered a crawl queue
  KEYS[6]    seenKey      node_seen: node id -> time of its last heartbeat
  KEYS[7]    nodesKey     nodes: node id -> node JSON
  KEYS[8]    waitingKey   waiting: subtask id -> priority
  KEYS[9]    dirtyKey     est:dirty: the estimate fields changed since the control last read them
  KEYS[10..] crawlKeys    crawl:<node> of each node in ARGV[10..], in the same order

  ARGV[1]    batch        entries to read of each input list, lapsed leases, stale entries, silent nodes, at most
  ARGV[2]    maxBytes     an input entry longer than this comes back cut to showBytes, with its size and SHA-1
  ARGV[3]    showBytes    bytes of an oversized entry to return
  ARGV[4]    budget       bytes of one input list to return, at most (at least one entry)
  ARGV[5]    recallAge    seconds after which a crawl-queue entry is stale
  ARGV[6]    nodeTimeout  seconds without a heartbeat after which a node is silent; also how far ahead of now a
                          heartbeat may be (a clock gone back that far): one further ahead is silent too
  ARGV[7]    window       ids of `waiting` to return, at most (the first ones, in priority order)
  ARGV[8]    dirtyLimit   members of `est:dirty` to pop, at most
  ARGV[9]    leaseHorizon seconds ahead of now beyond which a lease deadline is none a script wrote (a deadline is
                          at most SCHEDEXT_LEASE_TTL ahead when written): it counts as lapsed
  ARGV[10..] nodes        the nodes expected to be live (those of the last tick)

Returns {time, virtual, sleeping, failed, lapsed, stale, silent, live, entries, window, dirty}:
  time        {seconds, microseconds} of the server's TIME (the times compared above are from it)
  virtual, sleeping, failed
              flat, oldest first: raw, size, sha1 per entry (sha1 is '' for an entry returned whole)
  lapsed      ids whose lease deadline is not after now (score order), then those whose deadline is after
              now + leaseHorizon (+inf included)
  stale       ids queued at or before now - recallAge, or more than recallAge ahead of now (no time the control writes)
  silent      nodes whose last heartbeat is at or before now - nodeTimeout, then those after now + nodeTimeout
  live        every node whose last heartbeat is from now - nodeTimeout to now + nodeTimeout
  entries     JSON text: [node JSON (false if none), crawl-queue length] per node of ARGV[10..], in order
  window      JSON text: the first ids of `waiting` (an empty list may come as {})
  dirty       the members popped from `est:dirty`
]]

local virtualKey, sleepingKey, failedKey = KEYS[1], KEYS[2], KEYS[3]
local leasesKey, queuedKey, seenKey, nodesKey = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local waitingKey, dirtyKey = KEYS[8], KEYS[9]
local batch, maxBytes, showBytes = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local budget, recallAge, nodeTimeout = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local window, dirtyLimit, leaseHorizon = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])

local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1e6
-- Scores as text with every microsecond (a Lua number would be formatted with 14 digits only).
local function score(t) return string.format('%.6f', t) end

local function peek(listKey)
  local out, used = {}, 0
  for i = 1, batch do
    local raw = redis.call('LINDEX', listKey, -i)
    if not raw then break end
    local size = string.len(raw)
    if size > maxBytes then
      table.insert(out, string.sub(raw, 1, showBytes)); table.insert(out, size)
      table.insert(out, redis.sha1hex(raw))
      used = used + showBytes
    else
      table.insert(out, raw); table.insert(out, size); table.insert(out, '')
      used = used + size
    end
    if used >= budget then break end
  end
  return out
end

-- The two long parts go as one JSON text each: one reply element instead of thousands to parse.
local entries = {}
for i = 10, #ARGV do
  table.insert(entries, {redis.call('HGET', nodesKey, ARGV[i]), redis.call('LLEN', KEYS[i])})
end

-- The members of a sorted set scored at or before `upTo`, then (up to batch in all) those scored after `beyond`.
-- The scripts write times: a lease deadline at most SCHEDEXT_LEASE_TTL ahead of now, a heartbeat and a queue
-- time at now. A score
-- far further ahead (+inf or 1e300 set by hand, or a server clock gone back) would never come due and would hold a
-- subtask, or keep a ghost node alive, for ever: it counts as due (commit.lua's zscore_le agrees).
local function due(key, upTo, beyond)
  local out = redis.call('ZRANGEBYSCORE', key, '-inf', score(upTo), 'LIMIT', 0, batch)
  if #out < batch then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. score(beyond), '+inf', 'LIMIT', 0, batch - #out)) do
      table.insert(out, id)
    end
  end
  return out
end

local waiting = {}
if window > 0 then
  waiting = redis.call('ZRANGE', waitingKey, 0, window - 1)
end

return {
  time,
  peek(virtualKey), peek(sleepingKey), peek(failedKey),
  due(leasesKey, now, now + leaseHorizon),
  due(queuedKey, now - recallAge, now + recallAge),
  due(seenKey, now - nodeTimeout, now + nodeTimeout),
  redis.call('ZRANGEBYSCORE', seenKey, score(now - nodeTimeout), score(now + nodeTimeout)),
  cjson.encode(entries),
  cjson.encode(waiting),
  redis.call('SPOP', dirtyKey, dirtyLimit),
}
