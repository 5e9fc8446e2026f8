-- heartbeat.lua: one call per process session keeps all of its fair waiters
-- alive, claims its grants, admits waiters whose turn came (e.g. after a
-- holder expired) and reports on the waiters named.
-- KEYS: the nine keys of lib.lua.
-- ARGV: [1] channel base, [2] client limit, [3] session id,
--       [4] queue_ms (>= 1): the session lives that long from now,
--       [5...] waiter ids of this session to report on.
-- Reply: {now, hint_ms, then per waiter id: state, a, b, c} where state is
--        1 (holder: a = slot, b = token, c = ms left), 0 (queued: a = position),
--        -1 (gone: evicted or never queued).
local client_limit, err = int_arg(2, 'limit', 1)
if err then return err end
local sid; sid, err = str_arg(3, 'session')
if err then return err end
if string.find(sid, '[|%s]') then return fail('bad session: ' .. sid) end
local queue_ms; queue_ms, err = int_arg(4, 'queue_ms', 1)
if err then return err end

local now, now_us = clock()
expire(now) -- a session that missed its deadline loses its waiters first
redis.call('ZADD', S, now + queue_ms, sid)
touch(queue_ms, S, Q, W, B, M) -- this session's waiters live as long as it
local limit = limit_in_force(client_limit)
admit(now, now_us, limit)

-- Claim every grant of this session: the process is alive.
local lo, hi = '[' .. sid .. '|', '[' .. sid .. '}'
for _, m in ipairs(redis.call('ZRANGE', B, lo, hi, 'BYLEX')) do
  local id = string.sub(m, #sid + 2)
  if redis.call('ZSCORE', H, id) then
    claim(id)
  end
end

local out = {now, hint(now)}
for i = 5, #ARGV do
  local id = ARGV[i]
  local held = tonumber(redis.call('ZSCORE', H, id))
  local pos = redis.call('ZRANK', Q, id)
  if held and held > now then
    local slot, token = lease_of(id)
    append(out, {1, slot, token, held - now})
  elseif pos then
    append(out, {0, pos, 0, 0})
  else
    append(out, {-1, 0, 0, 0})
  end
end
return out
