-- status.lua: read the live state; writes nothing.
-- KEYS: the eight keys of lib.lua.
-- ARGV: [1] channel base, [2] client limit.
-- Reply: {limit, now, n_holders, (id, slot, token, deadline_ms) x n_holders,
--         n_waiters, (id, deadline_ms) x n_waiters}
--        holders ordered by deadline, live waiters in admission order.
local client_limit, err = int_arg(2, 'limit', 1)
if err then return err end
local now = clock()
local out = {limit_in_force(client_limit), now}
local hs = redis.call('ZRANGE', H, '(' .. now, '+inf', 'BYSCORE', 'WITHSCORES')
out[#out + 1] = #hs / 2
for i = 1, #hs, 2 do
  local slot, token = lease_of(hs[i])
  append(out, {hs[i], slot or -1, token or 0, tonumber(hs[i + 1])})
end
local ws = redis.call('ZRANGE', Q, 0, -1)
local live = {}
for _, id in ipairs(ws) do
  local w = redis.call('HGET', W, id)
  local sid = w and string.match(w, '^(%S+)')
  local sdl = sid and tonumber(redis.call('ZSCORE', S, sid))
  if sdl and sdl > now then
    append(live, {id, sdl})
  end
end
out[#out + 1] = #live / 2
return append(out, live)
