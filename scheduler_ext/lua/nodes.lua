--[[
nodes: read the registry entry and crawl-queue length of each live node, for the control's snapshot (read only).

  KEYS[1]    nodesKey   nodes: node id -> node JSON
  KEYS[2..]  crawlKeys  crawl:<node> of each node in ARGV, in the same order

  ARGV[1..]  node ids (the live ones: heartbeat within the node timeout)

Returns a flat list: node JSON (false if the node has no entry), crawl-queue length, per node.
]]

local nodesKey = KEYS[1]

local out = {}
for i = 1, #ARGV do
  table.insert(out, redis.call('HGET', nodesKey, ARGV[i]))
  table.insert(out, redis.call('LLEN', KEYS[i + 1]))
end
return out
