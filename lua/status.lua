-- status.lua: read the live state; writes nothing.
-- KEYS: the nine keys of lib.lua.
-- ARGV: [1] channel base, [2] client limit.
-- Reply: {limit, now, n_holders, (id, slot, token, deadline_ms) x n_holders,
--         n_waiters, (id, deadline_ms) x n_waiters}
--        holders ordered by deadline, live waiters in admission order; an
--        unclaimed grant counts as a holder only while its session lives.
local client_limit, err = int_arg(2, 'limit', 1)
if err then return err end
local now = clock()
local out = {limit_in_force(client_limit), now}
-- session_deadline is the deadline of the session that id waits (or holds
-- an unclaimed grant) for, or nil if none is live.
local function session_deadline(id)
  local w = redis.call('HGET', W, id)
  local sid = w and string.match(w, '^(%S+)')
  local sdl = sid and tonumber(redis.call('ZSCORE', S, sid))
  if sdl and sdl > now then
    return sdl
  end
  return nil
end

local hs = redis.call('ZRANGE', H, '(' .. now, '+inf', 'BYSCORE', 'WITHSCORES')
local holders = {}
for i = 1, #hs, 2 do
  -- An unclaimed grant of a dead session is revoked by the next write.
  if redis.call('HEXISTS', W, hs[i]) == 0 or session_deadline(hs[i]) then
    local slot, token = lease_of(hs[i])
    append(holders, {hs[i], slot or -1, token or 0, tonumber(hs[i + 1])})
  end
end
out[#out + 1] = #holders / 4
append(out, holders)
local ws = redis.call('ZRANGE', Q, 0, -1)
local live = {}
for _, id in ipairs(ws) do
  local sdl = session_deadline(id)
  if sdl then
    append(live, {id, sdl})
  end
end
out[#out + 1] = #live / 2
return append(out, live)
