-- renew.lua: extend a lease by lease_ms from now. It never re-creates a lease
-- that is gone (ZADD XX), and a renewal also claims a fair grant.
-- KEYS: the nine keys of lib.lua.
-- ARGV: [1] channel base, [2] client limit, [3] lease id, [4] lease_ms (>= 1).
-- Reply: {1, lease_ms, now} renewed; {0, 0, now} the lease is gone (lost).
local client_limit, err = int_arg(2, 'limit', 1)
if err then return err end
local id; id, err = str_arg(3, 'id')
if err then return err end
local lease_ms; lease_ms, err = int_arg(4, 'lease_ms', 1)
if err then return err end

local now, now_us = clock()
local held = tonumber(redis.call('ZSCORE', H, id))
if not held or held <= now then
  -- Lost. Clean up and hand any freed slot on.
  if expire(now) > 0 then
    local limit = limit_in_force(client_limit)
    local _, free = admit(now, now_us, limit)
    notify_free(free)
  end
  return {0, 0, now}
end
redis.call('ZADD', H, 'XX', now + lease_ms, id)
claim(id)
touch(lease_ms, H, L, M)
return {1, lease_ms, now}
