-- fence_set.lua: a guarded write: check a fencing token for (resource,
-- slots) exactly as fence.lua does and, only if it is not stale, SET a data
-- key, all in one script so that no stale write can slip in between.
-- KEYS: [1] the resource's fence HASH (slot -> highest token),
--       [2] the data key to SET (in Redis Cluster it must share KEYS[1]'s
--           hash slot, e.g. carry the same {hash-tag}).
-- ARGV: [1] slots ("3" or "0,3,4"), [2] token, [3] max_ahead_us (see
--       fence_lib.lua), [4] value,
--       [5] ttl_ms: 0 keeps no TTL (a plain SET drops an earlier one),
--           > 0 sets the key's TTL to ttl_ms milliseconds.
-- Reply: {1, token}          accepted: token recorded for every slot and
--                            KEYS[2] set to value
--        {0, highest, slot}  stale: highest > token is recorded for slot
--                            (the lowest such slot); nothing written
--        {-1, now_us}        from the future: token > now_us + max_ahead_us,
--                            now_us this server's TIME; nothing written
-- Errors: "ERR fencing: ..." for bad arguments, before any write.
local slots, token, ahead, err = fence_args()
if err then return err end
local value = ARGV[4]
if value == nil then return fence_fail('missing value') end
local ttl = ARGV[5]
if ttl == nil or not (ttl == '0' or string.match(ttl, '^[1-9]%d*$')) or #ttl > 15 then
  return fence_fail('bad ttl_ms: ' .. tostring(ttl))
end
local future, now = fence_future(token, ahead)
if future then
  return {-1, now}
end
local ok, recorded, slot = fence_check(KEYS[1], slots, token)
if not ok then
  return {0, recorded, slot}
end
if ttl == '0' then
  redis.call('SET', KEYS[2], value)
else
  redis.call('SET', KEYS[2], value, 'PX', ttl)
end
return {1, recorded}
