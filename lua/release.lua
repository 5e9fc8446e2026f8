-- release.lua: give back a slot or leave the queue, by id; then admit the
-- waiters that may now enter and tell unfair waiters about free slots.
-- KEYS: the nine keys of lib.lua.
-- ARGV: [1] channel base, [2] client limit, [3] lease or waiter id,
--       [4] optional: "owner" when the lease's holder releases it
--           (Lease.Release). Such a release leaves a tombstone in the
--           released key until the lease's deadline, and a rerun of it
--           (go-redis retries a command whose reply was lost) finds the
--           tombstone and reports the release again. Undoing an acquire and
--           a forced release by an operator leave none, so the holder of a
--           force-released lease still learns that it was lost.
-- Reply: {kind, now, grants...} where kind is 1 (a live lease was released,
--        by this call or, for an owner, by an earlier run of it), 2 (a queue
--        entry was removed), 0 (nothing live had that id: the lease was
--        lost), and grants is a flat list id, slot, token, lease_ms for each
--        waiter admitted by this call (so the caller can wake local ones at once).
local client_limit, err = int_arg(2, 'limit', 1)
if err then return err end
local id; id, err = str_arg(3, 'id')
if err then return err end
local owner = ARGV[4] == 'owner'
if ARGV[4] ~= nil and not owner then return fail('bad mode: ' .. tostring(ARGV[4])) end

local now, now_us = clock()
local kind = 0
local held = tonumber(redis.call('ZSCORE', H, id))
if held then
  if held > now then
    kind = 1
    if owner then
      redis.call('ZREMRANGEBYSCORE', R, '-inf', now)
      redis.call('ZADD', R, held, id)
      -- The tombstone lives no longer than the lease did, which touch's
      -- horizon already covers; meta orders nothing in this key.
      touch(held - now, R)
    end
  end
  drop_holder(id)
elseif redis.call('ZSCORE', Q, id) then
  kind = 2
  drop_waiter(id)
else
  claim(id)
  if owner then
    local until_ms = tonumber(redis.call('ZSCORE', R, id))
    if until_ms and until_ms > now then
      kind = 1 -- released by an earlier run of this request
    end
  end
end
expire(now)
local limit = limit_in_force(client_limit)
local out = {kind, now}
local grants, free = admit(now, now_us, limit)
append(out, grants)
notify_free(free)
return out
