-- fence.lua: check a fencing token for (resource, slot) and record it.
-- KEYS: [1] the resource's fence HASH (slot -> highest token).
-- ARGV: [1] slot, [2] token (see fence_lib.lua).
-- Reply: {1, token}    accepted; token is now the highest recorded for slot
--                      (it was lower, equal or absent before)
--        {0, highest}  stale: highest > token is recorded; nothing written
-- Errors: "ERR fencing: ..." for bad arguments, before any write.
local slot, token, err = fence_args()
if err then return err end
local ok, recorded = fence_check(KEYS[1], slot, token)
if ok then
  return {1, recorded}
end
return {0, recorded}
