-- acquire.lua: one attempt to take a slot; in queue mode (fair) it also
-- joins the queue, or reports the place it already has.
-- KEYS: the nine keys of lib.lua.
-- ARGV: [1] channel base, [2] client limit,
--       [3] id (lease/waiter UUID, reused on retries: the script is idempotent),
--       [4] lease_ms (>= 1), [5] mode: "try" or "queue",
--       [6] session id (queue mode), [7] queue_ms: session TTL (queue mode).
-- Reply: {1, slot, token, lease_ms_left, now}   granted (or already held)
--        {0, hint_ms, position, 0, now}        not granted; hint_ms is the time
--                                              to the earliest holder deadline
--                                              (-1: none); position in the queue
--                                              (0 = head) or -1 if not queued
--        {-1, established, 0, 0, now}          the client's limit disagrees
-- Errors: "ERR redsem: ..." for bad arguments, before any write.
local client_limit, err = int_arg(2, 'limit', 1)
if err then return err end
local id; id, err = str_arg(3, 'id')
if err then return err end
local lease_ms; lease_ms, err = int_arg(4, 'lease_ms', 1)
if err then return err end
local mode = ARGV[5]
if mode ~= 'try' and mode ~= 'queue' then return fail('bad mode: ' .. tostring(mode)) end
local sid, queue_ms
if mode == 'queue' then
  sid, err = str_arg(6, 'session')
  if err then return err end
  if string.find(sid, '[|%s]') then return fail('bad session: ' .. sid) end
  queue_ms, err = int_arg(7, 'queue_ms', 1)
  if err then return err end
end

local now, now_us = clock()

-- Already held (a retried request, or a fair grant this waiter now claims).
local held = tonumber(redis.call('ZSCORE', H, id))
if held and held > now then
  local slot, token = lease_of(id)
  claim(id)
  return {1, slot, token, held - now, now}
end

expire(now)
local limit, established = establish(client_limit)
if not limit then
  return {-1, established, 0, 0, now}
end
local queued = false
if mode == 'queue' then
  redis.call('ZADD', S, now + queue_ms, sid)
  queued = redis.call('ZRANK', Q, id) ~= false -- asked again while queued
end
local _, free = admit(now, now_us, limit)

if queued then
  held = tonumber(redis.call('ZSCORE', H, id))
  if held then -- admitted just now from the queue
    touch(queue_ms, S, Q, W, B, M)
    local slot, token = lease_of(id)
    claim(id)
    return {1, slot, token, held - now, now}
  end
  local pos = redis.call('ZRANK', Q, id)
  if pos then
    touch(queue_ms, S, Q, W, B, M)
    return {0, hint(now), pos, 0, now}
  end
  -- evicted by admit (its session was gone): queue again below
end

-- Free slots after admit mean the queue is empty: nobody is jumped.
if free > 0 then
  local slot, token = grant(id, now, now_us, lease_ms, limit)
  if slot ~= nil then
    if mode == 'queue' then
      touch(queue_ms, S, M)
    end
    return {1, slot, token, lease_ms, now}
  end
end

if mode == 'try' then
  return {0, hint(now), -1, 0, now}
end
local seq = (tonumber(meta('seq')) or 0) + 1
meta_set('seq', seq)
redis.call('ZADD', Q, seq, id)
redis.call('HSET', W, id, sid .. ' ' .. lease_ms)
redis.call('ZADD', B, 0, sid .. '|' .. id)
touch(queue_ms, S, Q, W, B, M)
return {0, hint(now), redis.call('ZCARD', Q) - 1, 0, now}
