-- lib.lua: shared functions, prepended to every redsem script before it is
-- loaded (see lua.go). It defines no reply of its own.
--
-- KEYS (the same eight for every script, all in one {hash-tag} slot):
--   KEYS[1] holders  ZSET  lease id -> deadline (server ms)
--   KEYS[2] leases   HASH  lease id -> "slot token"
--   KEYS[3] queue    ZSET  waiter id -> arrival number (fair)
--   KEYS[4] waiters  HASH  waiter id -> "session lease_ms"; kept after a
--                          grant until the grantee claims it
--   KEYS[5] sessions ZSET  session id -> deadline (server ms)
--   KEYS[6] bysess   ZSET  "session|waiter" (score 0, ordered by lex)
--   KEYS[7] meta     HASH  token (last token), seq (last arrival number),
--                          limit (limit established by live clients)
--   KEYS[8] override STRING limit set by SetLimit; never expires
-- ARGV common prefix:
--   ARGV[1] channel base ("prefix:{name}:ch"); grants go to base..":s:"..session,
--           freed-slot notices to base..":free"
--   ARGV[2] the calling client's limit (integer >= 1)

local H, L, Q, W, S, B, M, O = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local CHAN = ARGV[1]
-- Keys outlive the longest entry written by this much, so abandoned state
-- vanishes soon after its last deadline.
local MARGIN_MS = 1000

local function fail(msg)
  return redis.error_reply('ERR redsem: ' .. msg)
end

-- int_arg returns ARGV[i] as an integer >= min, or nil and an error reply.
local function int_arg(i, name, min)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= math.floor(v) or v < min or v > 9007199254740991 then
    return nil, fail('bad ' .. name .. ': ' .. tostring(ARGV[i]))
  end
  return v
end

local function str_arg(i, name)
  local v = ARGV[i]
  if v == nil or v == '' then
    return nil, fail('missing ' .. name)
  end
  return v
end

-- clock returns the server time in milliseconds and in microseconds.
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

local function fmt(n)
  return string.format('%.0f', n)
end

-- touch makes every key but the override outlive an entry that ends ms from now.
local function touch(ms)
  ms = ms + MARGIN_MS
  for i = 1, 7 do
    local p = redis.call('PTTL', KEYS[i])
    if p == -1 or (p >= 0 and p < ms) then
      redis.call('PEXPIRE', KEYS[i], ms)
    end
  end
end

local function lease_of(id)
  local v = redis.call('HGET', L, id)
  if not v then
    return nil, nil
  end
  local slot, token = string.match(v, '^(%d+) (%d+)$')
  return tonumber(slot), tonumber(token)
end

-- claim drops the record that a fair waiter was granted but has not claimed.
local function claim(id)
  local w = redis.call('HGET', W, id)
  if w then
    local sid = string.match(w, '^(%S+)')
    redis.call('ZREM', B, sid .. '|' .. id)
    redis.call('HDEL', W, id)
  end
end

local function drop_holder(id)
  redis.call('ZREM', H, id)
  redis.call('HDEL', L, id)
  claim(id)
end

local function drop_waiter(id)
  redis.call('ZREM', Q, id)
  claim(id)
end

-- expire removes holders past their deadline and sessions past theirs; a
-- dead session's waiters leave the queue wherever they stand, and its
-- unclaimed grants are revoked. Returns how many holders were removed.
local function expire(now)
  local freed = 0
  local dead = redis.call('ZRANGE', H, '-inf', now, 'BYSCORE')
  for _, id in ipairs(dead) do
    drop_holder(id)
    freed = freed + 1
  end
  local sessions = redis.call('ZRANGE', S, '-inf', now, 'BYSCORE')
  for _, sid in ipairs(sessions) do
    local lo, hi = '[' .. sid .. '|', '[' .. sid .. '}'
    for _, m in ipairs(redis.call('ZRANGE', B, lo, hi, 'BYLEX')) do
      local id = string.sub(m, #sid + 2)
      redis.call('ZREM', Q, id)
      redis.call('HDEL', W, id)
      if redis.call('ZSCORE', H, id) then
        redis.call('ZREM', H, id)
        redis.call('HDEL', L, id)
        freed = freed + 1
      end
    end
    redis.call('ZREMRANGEBYLEX', B, lo, hi)
    redis.call('ZREM', S, sid)
  end
  return freed
end

-- limit_in_force is SetLimit's limit, else the one live clients established,
-- else the caller's.
local function limit_in_force(client_limit)
  local o = redis.call('GET', O)
  if o then
    return tonumber(o)
  end
  return tonumber(redis.call('HGET', M, 'limit')) or client_limit
end

-- establish returns the limit for an acquiring client, or nil and the limit
-- that live clients established when they disagree with client_limit.
local function establish(client_limit)
  local o = redis.call('GET', O)
  if o then
    return tonumber(o)
  end
  local e = tonumber(redis.call('HGET', M, 'limit'))
  if e and e ~= client_limit and
      (redis.call('ZCARD', H) > 0 or redis.call('ZCARD', Q) > 0) then
    return nil, e
  end
  if e ~= client_limit then
    redis.call('HSET', M, 'limit', client_limit)
  end
  return client_limit
end

-- free_slot returns the lowest slot in [0, limit) that no lease holds. Only
-- when none seems free does it check each lease against the holders, and
-- drop leases whose holder entry vanished (e.g. someone deleted the key).
local function free_slot(limit)
  for pass = 1, 2 do
    local used = {}
    local all = redis.call('HGETALL', L)
    for i = 1, #all, 2 do
      if pass == 1 or redis.call('ZSCORE', H, all[i]) then
        used[tonumber(string.match(all[i + 1], '^(%d+)'))] = true
      else
        redis.call('HDEL', L, all[i])
      end
    end
    for s = 0, limit - 1 do
      if not used[s] then
        return s
      end
    end
  end
  return nil
end

-- grant makes id a holder until now + lease_ms, with a free slot and the
-- next fencing token: never less than the server clock in microseconds, so
-- tokens keep increasing even when the counter is lost.
local function grant(id, now, now_us, lease_ms, limit)
  local slot = free_slot(limit)
  if slot == nil then
    return nil
  end
  local last = tonumber(redis.call('HGET', M, 'token')) or 0
  local token = math.max(last + 1, now_us)
  redis.call('HSET', M, 'token', fmt(token))
  redis.call('HSET', L, id, slot .. ' ' .. fmt(token))
  redis.call('ZADD', H, now + lease_ms, id)
  touch(lease_ms)
  return slot, token
end

-- admit grants free slots to the earliest live waiters, evicting dead ones it
-- meets at the head, and tells each grantee's session. It returns the grants
-- as a flat list: id, slot, token, lease_ms, ...
local function admit(now, now_us, limit)
  local out = {}
  local free = limit - redis.call('ZCARD', H)
  while free > 0 do
    local head = redis.call('ZRANGE', Q, 0, 0)
    if #head == 0 then
      break
    end
    local id = head[1]
    local w = redis.call('HGET', W, id)
    local sid, lease_ms
    if w then
      sid, lease_ms = string.match(w, '^(%S+) (%d+)$')
    end
    local sdl = sid and tonumber(redis.call('ZSCORE', S, sid))
    if not sdl or sdl <= now then
      drop_waiter(id) -- dead waiter (its session is gone): evict
    else
      lease_ms = tonumber(lease_ms)
      local slot, token = grant(id, now, now_us, lease_ms, limit)
      if slot == nil then
        break -- no free slot after all: the waiter keeps its place
      end
      redis.call('ZREM', Q, id)
      redis.call('SPUBLISH', CHAN .. ':s:' .. sid,
        'g ' .. id .. ' ' .. slot .. ' ' .. fmt(token) .. ' ' .. fmt(now) .. ' ' .. fmt(lease_ms))
      out[#out + 1] = id
      out[#out + 1] = slot
      out[#out + 1] = token
      out[#out + 1] = lease_ms
      free = free - 1
    end
  end
  return out
end

-- notify_free tells unfair waiters how many slots are free, if any.
local function notify_free(limit)
  local free = limit - redis.call('ZCARD', H)
  if free > 0 and redis.call('ZCARD', Q) == 0 then
    redis.call('SPUBLISH', CHAN .. ':free', free)
  end
end

-- hint returns ms until the earliest holder deadline, or -1 with no holders.
local function hint(now)
  local first = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
  if #first == 0 then
    return -1
  end
  return math.max(tonumber(first[2]) - now, 0)
end

local function append(dst, src)
  for _, v in ipairs(src) do
    dst[#dst + 1] = v
  end
  return dst
end
