--[[
ids: reserve a block of fresh ids from the seq counter (tasks, subtasks, dead letters).

  KEYS[1] seqKey  seq: the counter
  ARGV[1] n       ids to reserve

Returns the last id of the block (the block is last - n + 1 .. last). A counter that a hand edit left unreadable
starts above any value it can have held (counter.lua), so that no id is ever given twice.
]]
--@include counter

return incr(KEYS[1], tonumber(ARGV[1]))
