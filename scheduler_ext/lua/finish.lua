--[[
finish: end a leased subtask: run record, aggregates, moving estimates, report. Refused if the token is stale.

  KEYS[1]  leasesKey      leases
  KEYS[2]  leaseInfoKey   lease_info
  KEYS[3]  subtasksKey    subtasks (the record is removed: the report carries the subtask)
  KEYS[4]  reportsKey     sleeping (ok) or failed (not ok): where the report goes
  KEYS[5]  runsKey        runs stream
  KEYS[6]  aggSiteNodeKey agg:sn:<site>|<node> counters
  KEYS[7]  aggTripleKey   agg:psn:<product>|<site>|<node> counters
  KEYS[8]  aggIndexKey    agg:pairs set
  KEYS[9]  nodeCountKey   count:node:<node> (stale_finish)
  KEYS[10] progressKey    progress
  KEYS[11] aggTriplesKey  agg:triples set
  KEYS[12] estSiteKey     est:site:<site>, a field per node {c, spp, runs, last, n, pg, got, sec, fl, err, xp,
                          cp, bl}
  KEYS[13] estGroupKey    est:gs:<product>|<site>, a field per node {spp, runs, last, n, pg, got, sec, fl, err,
                          xp, cp, bl}
  KEYS[14] estDirtyKey    est:dirty: set of the estimates changed since the control last read them
  KEYS[15] estGroupsKey   est:groups: set of the "<product>|<site>" pairs that have an est:gs hash

  ARGV[1]  id          subtask id
  ARGV[2]  token       lease token
  ARGV[3]  report      report JSON
  ARGV[4]  runsMaxlen  approximate length of the runs stream
  ARGV[5]  alpha       weight of the newest run in the moving estimates
  ARGV[6]  pair        "site|node"
  ARGV[7]  offered     results offered
  ARGV[8]  collected   results collected
  ARGV[9]  pages       pages crawled
  ARGV[10] seconds     crawl seconds
  ARGV[11] ok          1 done or timeout, 0 failed
  ARGV[12] group       product
  ARGV[13] node        node id
  ARGV[14] attempted   pages attempted, as the bandit's sums charge them (the report's ``charged``: pages crawled,
                       blocked, failed and cut short by the time limit)
  ARGV[15] failCost    seconds the bandit's sums charge a failed run beyond its own (the recall: 1.5 control ticks)
  ARGV[16] errors      pages attempted that gave nothing without being blocked (errors, in flight, cut short)
  ARGV[17] nodeSecs    the run's node time (Report.node_seconds), charged to the sums instead of seconds and
                       failCost; '' if the node did not measure it (posterior.py, run_seconds)
  ARGV[18] groupNodes  nodes whose figures estGroupKey keeps at most (posterior.py, GROUP_NODES; 0: all)

Returns 1 if finished, 0 if the lease is gone or holds another token (counted as stale_finish on the node).
]]
--@include now
--@include counter
--@include types

local leasesKey, leaseInfoKey, subtasksKey, reportsKey, runsKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local aggSiteNodeKey, aggTripleKey, aggIndexKey, nodeCountKey = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local progressKey, aggTriplesKey, estSiteKey, estGroupKey = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local estDirtyKey, estGroupsKey = KEYS[14], KEYS[15]
local id, token, report, runsMaxlen, alpha = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local pair, offered, collected = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local pages, seconds, ok = tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11] == '1'
local group, node, attempted, failCost = ARGV[12], ARGV[13], tonumber(ARGV[14]), tonumber(ARGV[15]) or 0
local errors = tonumber(ARGV[16]) or 0
local nodeSeconds = tonumber(ARGV[17] or '')
local groupNodes = tonumber(ARGV[18] or '') or 0
if nodeSeconds and (nodeSeconds ~= nodeSeconds or nodeSeconds < 0 or nodeSeconds == math.huge) then
  nodeSeconds = nil  -- not a time: charge the run's seconds, as for a node that did not measure it
end

-- Every key this script reads or writes as a whole is checked for its type before anything is written (types.lua):
-- a write that failed after the lease went lost the report (the node's retry found no lease: a stale finish). The
-- counters (hincr) start over by themselves (counter.lua).
for _, kk in ipairs({{leasesKey, 'zset'}, {leaseInfoKey, 'hash'}, {subtasksKey, 'hash'}, {reportsKey, 'list'},
                     {runsKey, 'stream'}, {estSiteKey, 'hash'}, {estGroupKey, 'hash'}, {estDirtyKey, 'set'},
                     {estGroupsKey, 'set'}, {aggIndexKey, 'set'}, {aggTriplesKey, 'set'}}) do
  expect(kk[1], kk[2])
end

local raw = redis.call('HGET', leaseInfoKey, id)
local decoded, lease = pcall(cjson.decode, raw or '')
if not raw or not decoded or type(lease) ~= 'table' or lease.token ~= token then
  hincr(nodeCountKey, 'stale_finish', 1)
  return 0
end

-- Everything that could fail on what another program wrote (the estimate entries: JSON that cjson reads but
-- cannot write back) is done first, before the first write: a script that fails half-way keeps its writes, and one
-- that failed after pushing the report froze the pair's estimates and skipped the rest.

-- The moving estimates (recent runs weigh more): one hash per site and one per (product, site), a field per
-- node, so that the control reads every node's figures for a site in one command.
local function ewma(old, x) if old then return old + alpha * (x - old) end return x end
-- The bandit's sums (scheduler_ext/strategies/posterior.py, update_sums, does the same): pages attempted (every
-- blocked, failed or cut page included), page-equivalents collected, node time (else seconds) of every outcome,
-- runs, failed runs;
-- older runs
-- weigh (1 - alpha) less with each new run.
local keep = 1 - alpha
local got = 0
if pages > 0 and offered > 0 then got = pages * math.min(1, collected / offered)
elseif pages > 0 and collected > 0 then got = pages end
local function sums(e)
  local n, pg, gt, sec = tonumber(e.n) or 0, tonumber(e.pg) or 0, tonumber(e.got) or 0, tonumber(e.sec) or 0
  local fl = tonumber(e.fl) or 0
  local k = keep
  -- A change point (posterior.py, changed): the run is more than 3 binomial standard deviations off the pair's
  -- share over at least 3 pages attempted; the sums restart from this run.
  if attempted >= 3 and pg > 0 then
    local share = math.min(0.98, math.max(0.02, (gt + 0.5) / (pg + 1)))
    if math.abs(got - attempted * share) > 3 * math.sqrt(attempted * share * (1 - share)) then
      k = 0
      -- A change of treatment (the run's share 0.5 or more from the pair's, CHANGE_SHIFT): its time, so that the
      -- bandit re-examines the site's other pairs.
      if math.abs(got / attempted - (gt + 0.5) / (pg + 1)) >= 0.5 then e.cp = now end
    end
  end
  -- A blank run: no page crawled, every page attempted failed from errors. It measured no pace: its pages and
  -- seconds are left out of it (posterior.py, update_sums, xp), and its time is kept (bl).
  local blank = (not ok) and pages <= 0 and attempted > 0 and errors >= attempted
  e.n = k * n + 1
  e.pg = k * pg + attempted
  e.got = k * gt + got
  local charged = nodeSeconds or (math.max(0, seconds) + (ok and 0 or failCost))
  if blank then e.sec = k * sec else e.sec = k * sec + math.max(0, charged) end
  e.fl = k * fl + (ok and 0 or 1)
  -- A run that crawled no page and failed from errors: the pages in flight with the one that failed are left out
  -- of the served share (posterior.py, update_sums, err).
  local err = 0
  if pages <= 0 then err = math.max(0, math.min(errors, attempted - pages) - 1) end
  e.err = k * (tonumber(e.err) or 0) + err
  e.xp = k * (tonumber(e.xp) or 0) + (blank and attempted or 0)
  if blank then e.bl = now end
end
-- The fields of an entry; it is rebuilt from these alone, so a field this script does not know (one cjson reads
-- as NaN or infinity, which it refuses to write back) goes.
local FIELDS = {'n', 'pg', 'got', 'sec', 'fl', 'err', 'xp', 'c', 'spp', 'runs', 'last', 'cp', 'bl'}
local function finite(v) return v ~= nil and v == v and v ~= math.huge and v ~= -math.huge end
-- An entry this script did not write (a number that is not finite and >= 0: cjson reads NaN and Infinity)
-- starts over, as an unreadable one does: else every finish of the pair would fail (`last` is replaced anyway).
local function known(e)
  local out = {}
  for _, name in ipairs(FIELDS) do
    if e[name] ~= nil and name ~= 'last' then
      local v = tonumber(e[name])
      if not finite(v) or v < 0 then return {} end
      out[name] = v
    end
  end
  return out
end
-- The entry as JSON: only finite numbers (a figure made non-finite by the arguments is left out: no data), so
-- that cjson.encode cannot fail.
local function encoded(e)
  local out = {}
  for _, name in ipairs(FIELDS) do
    if finite(e[name]) then out[name] = e[name] end
  end
  return cjson.encode(out)
end
local function estimate(key, withCompletion)
  local old = redis.call('HGET', key, node)
  local okOld, e = pcall(cjson.decode, old or '')
  if old and okOld and type(e) == 'table' then e = known(e) else e = {} end
  e.runs = (tonumber(e.runs) or 0) + 1
  e.last = now
  if withCompletion then
    if offered > 0 then e.c = ewma(tonumber(e.c), collected / offered) elseif not ok then e.c = ewma(tonumber(e.c), 0) end
  end
  if ok and pages > 0 then e.spp = ewma(tonumber(e.spp), seconds / pages) end
  sums(e)
  return encoded(e)
end
local siteEntry, groupEntry = estimate(estSiteKey, true), estimate(estGroupKey, false)

redis.call('ZREM', leasesKey, id)
redis.call('HDEL', leaseInfoKey, id)
redis.call('HDEL', subtasksKey, id)
redis.call('XADD', runsKey, 'MAXLEN', '~', runsMaxlen, '*', 'report', report)
redis.call('LPUSH', reportsKey, report)
for _, key in ipairs({aggSiteNodeKey, aggTripleKey}) do  -- counters, for status and experiments
  hincr(key, 'runs', 1)
  hincr(key, 'offered', offered)
  hincr(key, 'collected', collected)
  hincr(key, 'pages', pages)
  hincr(key, 'seconds', seconds, true)
  redis.call('HSET', key, 'last_run', string.format('%.3f', now))
  if not ok then hincr(key, 'failures', 1) end
end
redis.call('HSET', estSiteKey, node, siteEntry)
redis.call('HSET', estGroupKey, node, groupEntry)
-- Tell the control which estimates changed, so that it re-reads only those ("s|node|site", "g|node|site|group").
local site = string.sub(pair, 1, string.len(pair) - string.len(node) - 1)
redis.call('SADD', estDirtyKey, 's|' .. node .. '|' .. site, 'g|' .. node .. '|' .. site .. '|' .. group)
-- At most groupNodes nodes' figures per (product, site): past them, those of the node that ran the product there
-- least recently go (posterior.py, GROUP_NODES; an unreadable entry first, then the smallest node id of a tie).
if groupNodes > 0 and redis.call('HLEN', estGroupKey) > groupNodes then
  local all = redis.call('HGETALL', estGroupKey)
  local oldest, oldestLast = nil, math.huge
  for i = 1, #all, 2 do
    if all[i] ~= node then
      local okE, e = pcall(cjson.decode, all[i + 1])
      local last = okE and type(e) == 'table' and tonumber(e.last) or -1
      if last ~= last or last == math.huge or last == -math.huge then last = -1 end  -- not a time: first to go
      if oldest == nil or last < oldestLast or (last == oldestLast and all[i] < oldest) then
        oldest, oldestLast = all[i], last
      end
    end
  end
  if oldest then
    redis.call('HDEL', estGroupKey, oldest)
    redis.call('SADD', estDirtyKey, 'g|' .. oldest .. '|' .. site .. '|' .. group)
  end
end
redis.call('SADD', estGroupsKey, group .. '|' .. site)
redis.call('SADD', aggIndexKey, pair)
redis.call('SADD', aggTriplesKey, group .. '|' .. pair)
hincr(progressKey, group .. '|collected', collected)
hincr(progressKey, group .. '|pages', pages)
return 1
