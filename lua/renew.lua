-- renew.lua: extend a lease to now + lease_ms. It never re-creates a lease
-- that is gone (ZADD XX).
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] lease id, [5] lease_ms (>= 1).
-- Reply: {1, now, deadline_ms} renewed; {0, now} the lease is gone (lost).
local client_limit, err = client_arg()
if err then return err end
local id; id, err = id_arg(4, 'id')
if err then return err end
local lease_ms; lease_ms, err = int_arg(5, 'lease_ms', 1)
if err then return err end

local now, now_us = clock()
local held = tonumber(redis.call('ZSCORE', holders_key, id))
if not held or held <= now then
  -- Lost. Clean up and hand any freed slot on.
  load()
  if not get('_hz') then
    return {0, now}
  end
  -- Its own entry, if still listed past its deadline, goes now (expire()
  -- takes only the earliest BATCH).
  local freed = held and drop_holders({id}) or 0
  if expire(now) + freed > 0 or fam_tot_key then
    local limit = limit_in_force(client_limit)
    if fam_tot_key then
      admit_total(now, now_us, {})
    elseif num('_q') > 0 then
      admit(now, now_us, limit)
    end
    notify_free(now, limit)
  end
  return finish({0, now})
end
redis.call('ZADD', holders_key, 'XX', fmt(now + lease_ms), id)
load_horizon() -- a live renewal needs only the horizon (extend)
extend(now, now + lease_ms)
if fam_tot_key then
  -- A family's total counts the lease until the same deadline.
  redis.call('ZADD', fam_leases_key, 'XX', fmt(now + lease_ms), id)
  fam_load()
  fam_extend(now, now + lease_ms)
end
return finish({1, now, now + lease_ms})
