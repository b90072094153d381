--[[
peek: read (without removing) the oldest entries of an input list, for the control's snapshot. Oversized entries
come back cut, with their size and SHA-1, so that one hostile entry cannot make the control read megabytes; the
control consumes such an entry with the `tail_sha1_is` guard of commit.lua.

  KEYS[1] listKey   virtual, sleeping or failed (entries LPUSHed, consumed from the right: the tail is oldest)

  ARGV[1] count     entries to read, at most
  ARGV[2] maxBytes  an entry longer than this is returned cut to `showBytes`, with its size and SHA-1
  ARGV[3] showBytes bytes of an oversized entry to return
  ARGV[4] budget    stop after this many bytes in all (at least one entry is always returned)

Returns a flat list, oldest first: raw, size, sha1 per entry (sha1 is '' for an entry returned whole).
]]

local listKey = KEYS[1]
local count, maxBytes = tonumber(ARGV[1]), tonumber(ARGV[2])
local showBytes, budget = tonumber(ARGV[3]), tonumber(ARGV[4])

local out, used = {}, 0
for i = 1, count do
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
