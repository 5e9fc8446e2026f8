-- release.lua: give back a slot or leave the queue, by id; then admit the
-- waiters that may now enter and tell unfair waiters about free slots.
-- KEYS: the eight keys of lib.lua.
-- ARGV: [1] channel base, [2] client limit, [3] lease or waiter id.
-- Reply: {kind, now, grants...} where kind is 1 (a live lease was released),
--        2 (a queue entry was removed), 0 (nothing live had that id: the lease
--        was lost), and grants is a flat list id, slot, token, lease_ms for each
--        waiter admitted by this call (so the caller can wake local ones at once).
local client_limit, err = int_arg(2, 'limit', 1)
if err then return err end
local id; id, err = str_arg(3, 'id')
if err then return err end

local now, now_us = clock()
local kind = 0
local held = tonumber(redis.call('ZSCORE', H, id))
if held then
  if held > now then kind = 1 end
  drop_holder(id)
elseif redis.call('ZSCORE', Q, id) then
  kind = 2
  drop_waiter(id)
else
  claim(id)
end
expire(now)
local limit = limit_in_force(client_limit)
local out = {kind, now}
local grants, free = admit(now, now_us, limit)
append(out, grants)
notify_free(free)
return out
