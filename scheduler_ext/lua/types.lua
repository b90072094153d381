-- Shared helper (included, not copied): a key of another type than a script uses it as, refused before the
-- script's first write.
-- Defines: expect(key, kind)
-- Redis keeps the writes of a script that fails half-way. A write that met a key of another type (set by hand) once
-- failed after its script had popped an entry or removed a lease, and what it held was lost. So a script calls
-- expect on each key it writes, before its first write: the WRONGTYPE error names the key, nothing has changed, and
-- the client sets the keys of the wrong type aside (Store.set_aside) so that its next call runs normally.
local function expect(key, kind)
  local found = redis.call('TYPE', key).ok
  if found ~= kind and found ~= 'none' then
    error('WRONGTYPE ' .. key .. ' is a ' .. found .. ', not a ' .. kind)
  end
end
