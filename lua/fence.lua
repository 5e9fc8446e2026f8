-- fence.lua: check a fencing token for (resource, slots) and record it for
-- every slot, or for none.
-- KEYS: [1] the resource's fence HASH (slot -> highest token).
-- ARGV: [1] slots ("3" or "0,3,4"), [2] token, [3] max_ahead_us (see
--       fence_lib.lua).
-- Reply: {1, token}          accepted; token is now the highest recorded
--                            for every slot (it was lower, equal or absent
--                            before)
--        {0, highest, slot}  stale: highest > token is recorded for slot
--                            (the lowest such slot); nothing written
--        {-1, now_us}        from the future: token > now_us + max_ahead_us,
--                            now_us this server's TIME; nothing read or
--                            written
-- Errors: "ERR fencing: ..." for bad arguments, before any write.
local slots, token, ahead, err = fence_args()
if err then return err end
local future, now = fence_future(token, ahead)
if future then
  return {-1, now}
end
local ok, recorded, slot = fence_check(KEYS[1], slots, token)
if ok then
  return {1, recorded}
end
return {0, recorded, slot}
