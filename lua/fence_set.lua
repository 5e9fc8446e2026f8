-- fence_set.lua: a guarded write: check a fencing token for (resource, slot)
-- exactly as fence.lua does and, only if it is not stale, SET a data key,
-- all in one script so that no stale write can slip in between.
-- KEYS: [1] the resource's fence HASH (slot -> highest token),
--       [2] the data key to SET (in Redis Cluster it must share KEYS[1]'s
--           hash slot, e.g. carry the same {hash-tag}).
-- ARGV: [1] slot, [2] token (see fence_lib.lua), [3] value,
--       [4] ttl_ms: 0 keeps no TTL (a plain SET drops an earlier one),
--           > 0 sets the key's TTL to ttl_ms milliseconds.
-- Reply: {1, token}    accepted: token recorded and KEYS[2] set to value
--        {0, highest}  stale: highest > token is recorded; nothing written
-- Errors: "ERR fencing: ..." for bad arguments, before any write.
local slot, token, err = fence_args()
if err then return err end
local value = ARGV[3]
if value == nil then return fence_fail('missing value') end
local ttl = ARGV[4]
if ttl == nil or not (ttl == '0' or string.match(ttl, '^[1-9]%d*$')) or #ttl > 15 then
  return fence_fail('bad ttl_ms: ' .. tostring(ttl))
end
local ok, recorded = fence_check(KEYS[1], slot, token)
if not ok then
  return {0, recorded}
end
if ttl == '0' then
  redis.call('SET', KEYS[2], value)
else
  redis.call('SET', KEYS[2], value, 'PX', ttl)
end
return {1, recorded}
