-- lib.lua: shared functions, prepended to every redsem script before it is
-- loaded (see lua.go). It defines no reply of its own.
--
-- KEYS (the same nine for every script, all in one {hash-tag} slot):
--   KEYS[1] holders  ZSET  lease id -> deadline (server ms)
--   KEYS[2] leases   HASH  lease id -> "slot token"
--   KEYS[3] queue    ZSET  waiter id -> arrival number (fair)
--   KEYS[4] waiters  HASH  waiter id -> "session lease_ms"; kept after a
--                          grant until the grantee claims it
--   KEYS[5] sessions ZSET  session id -> deadline (server ms)
--   KEYS[6] bysess   ZSET  "session|waiter" (score 0, ordered by lex)
--   KEYS[7] meta     HASH  token (last token), seq (last arrival number),
--                          limit (limit established by live clients)
--   KEYS[8] released ZSET  lease id -> the deadline it had (server ms): leases
--                          their holder released, until that deadline, so that
--                          a Release retried after a lost reply still reports
--                          success (see release.lua)
--   KEYS[9] override STRING limit set by SetLimit; never expires
-- ARGV common prefix:
--   ARGV[1] channel base ("prefix:{name}:ch"); grants go to base..":s:"..session,
--           freed-slot notices to base..":free"
--   ARGV[2] the calling client's limit (integer >= 1)

local H, L, Q, W, S, B, M, R, O = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
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

-- The meta hash is read once per script (HMGET) and written through.
local META
local function meta(field)
  if not META then
    local v = redis.call('HMGET', M, 'limit', 'token', 'seq', 'ttl')
    META = {limit = v[1], token = v[2], seq = v[3], ttl = v[4]}
  end
  return META[field]
end

local function meta_set(field, value)
  meta(field)
  META[field] = value
  redis.call('HSET', M, field, value)
end

-- touch keeps each key given alive while any entry in it may be: it sets the
-- key's TTL to the longest entry lifetime any script of this semaphore has
-- written (meta "ttl", which only grows) plus a margin. A key's TTL is thus
-- never set below the remaining life of an entry in it, and one PEXPIRE per
-- key suffices. A script touches exactly the keys it adds to or extends
-- entries in (removals need no touch), and always the meta key with them, so
-- meta outlives everything it orders and bounds.
local function touch(ms, ...)
  local horizon = tonumber(meta('ttl')) or 0
  if ms > horizon then
    horizon = ms
    meta_set('ttl', ms)
  end
  for _, key in ipairs({...}) do
    redis.call('PEXPIRE', key, horizon + MARGIN_MS)
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
  return tonumber(meta('limit')) or client_limit
end

-- establish returns the limit for an acquiring client, or nil and the limit
-- that live clients established when they disagree with client_limit.
local function establish(client_limit)
  local o = redis.call('GET', O)
  if o then
    return tonumber(o)
  end
  local e = tonumber(meta('limit'))
  if e and e ~= client_limit and
      (redis.call('ZCARD', H) > 0 or redis.call('ZCARD', Q) > 0) then
    return nil, e
  end
  if e ~= client_limit then
    meta_set('limit', client_limit)
    touch(0, M)
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
  local last = tonumber(meta('token')) or 0
  local token = math.max(last + 1, now_us)
  meta_set('token', fmt(token))
  redis.call('HSET', L, id, slot .. ' ' .. fmt(token))
  redis.call('ZADD', H, now + lease_ms, id)
  touch(lease_ms, H, L, M)
  return slot, token
end

-- admit grants free slots to the earliest live waiters, evicting dead ones it
-- meets at the head, and tells each grantee's session. It returns the grants
-- as a flat list (id, slot, token, lease_ms, ...) and how many slots are
-- still free: when that is more than 0, the queue is empty.
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
  return out, free
end

-- notify_free tells unfair waiters how many slots are free, if any; free is
-- what admit returned.
local function notify_free(free)
  if free > 0 then
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
