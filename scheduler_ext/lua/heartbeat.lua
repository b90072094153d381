--[[
heartbeat: register a node and renew the leases it still holds.

  KEYS[1] nodesKey     nodes: node id -> node JSON (stored as sent; cjson would turn [] into {})
  KEYS[2] nodeSeenKey  node_seen: node id -> last heartbeat (server time)
  KEYS[3] leasesKey    leases: subtask id -> lease deadline
  KEYS[4] leaseInfoKey lease_info: subtask id -> lease JSON

  ARGV[1] node         the node's id
  ARGV[2] nodeJson     the node's registry entry
  ARGV[3] leaseTtl     seconds a renewed lease lasts (never past the lease's hard deadline)
  ARGV[4..] id, token pairs of the leases the node holds

Returns the ids whose lease is gone or holds another token (recalled: the node stops working on them).
]]
--@include now
--@include types

local nodesKey, nodeSeenKey, leasesKey, leaseInfoKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local node, nodeJson, leaseTtl = ARGV[1], ARGV[2], tonumber(ARGV[3])

expect(nodesKey, 'hash'); expect(nodeSeenKey, 'zset'); expect(leasesKey, 'zset'); expect(leaseInfoKey, 'hash')

redis.call('HSET', nodesKey, node, nodeJson)
redis.call('ZADD', nodeSeenKey, now, node)
local lost = {}
for i = 4, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local raw = redis.call('HGET', leaseInfoKey, id)
  local ok, lease = pcall(cjson.decode, raw or '')
  if raw and ok and type(lease) == 'table' and lease.token == token then
    redis.call('ZADD', leasesKey, 'XX', math.min(now + leaseTtl, tonumber(lease.hard) or now), id)
  else
    table.insert(lost, id)
  end
end
return lost
