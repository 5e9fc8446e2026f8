-- status.lua: read the live state; writes nothing (run it with EVALSHA_RO).
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate).
-- Reply: {limit, now, n_holders, (id, "slots", token, deadline_ms, owner) x
--         n_holders, n_waiters, (id, weight, deadline_ms, owner) x n_waiters,
--         rate_limit, per_ms, granted}
--        holders ordered by deadline, live waiters in admission order; the
--        rate in force (0, 0: none) and the slots granted in the window
--        that ends now.
local client_limit, err = client_arg()
if err then return err end
local now, now_us = clock()
load()
err = check_limits()
if err then return err end
local out = {limit_in_force(client_limit), now}

local hs = redis.call('ZRANGE', holders_key, '(' .. now, '(inf', 'BYSCORE', 'WITHSCORES')
local ids = {}
for i = 1, #hs, 2 do
  ids[#ids + 1] = hs[i]
end
records(ids)
local holders = {}
for i = 1, #hs, 2 do
  local rec = get(hs[i])
  if rec and string.sub(rec, 1, 1) == 'L' then
    local token, slots, owner = parse_lease(rec)
    append(holders, {hs[i], table.concat(slots, ','), token, tonumber(hs[i + 1]), owner})
  end
end
out[#out + 1] = #holders / 5
append(out, holders)

local ws = redis.call('ZRANGE', queue_key, 0, -1)
if ws[#ws] == SENTINEL then
  ws[#ws] = nil
end
records(ws)
local live = {}
for _, id in ipairs(ws) do
  local rec = get(id)
  if rec and string.sub(rec, 1, 1) == 'W' then
    local sid, n, _, owner = parse_waiter(rec)
    local sdl = session_deadline(sid, now)
    if sdl then
      append(live, {id, n, sdl, owner})
    end
  end
end
out[#out + 1] = #live / 4
append(out, live)

local granted = 0
if rate() > 0 then
  local recs = redis.call('ZRANGE', window_key, '(' .. fmt(now_us - call.rate_per_us), '(inf', 'BYSCORE')
  for _, m in ipairs(recs) do
    granted = granted + rec_weight(m)
  end
end
return append(out, {call.rate_limit, call.rate_per_us / 1000, granted})
