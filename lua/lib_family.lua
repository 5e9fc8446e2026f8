-- lib_family.lua: the total of a keyed family (FamilyOptions.Total): the
-- slots held across all of its members, kept exact by the scripts that
-- grant, renew, release and expire a member's leases. fam_load reads the
-- family's counters once per call (fam), fam_put changes one, fam_extend
-- moves the family's horizon, fam_add and fam_drop count a lease in and
-- out, fam_expire drops the leases past their deadline whatever their
-- member, fam_bound is the total in force and fam_room what is left of it,
-- fam_establish settles the total for an acquiring client, fam_write
-- writes what changed. Only calls with the family's keys (fam_tot_key set)
-- use any of it, but counted_total (below).
-- Uses from lib_args.lua: the family's keys, fam, fam_client_total,
-- call (clock_ms), SENTINEL, MARGIN_MS, BATCH, CHUNK, MAX_LIMIT, fmt,
-- stored_limit.
--
-- The family's keys (KEYS[10..13] of a member's call, KEYS[1..4] of
-- settotal.lua and famstatus.lua, whose KEYS[5] is the members' sessions
-- key), under the family's own tag (a family
-- with a total has one shard, so every member shares it):
--   f:tot    HASH   counters: _held the slots of the leases in f:leases,
--                   _total the total established by live clients, _ftotal
--                   SetTotal's total (mirror of f:total; "0": no bound),
--                   _seq the last family arrival number (fair: every
--                   member's queue is ordered by it), _want until when
--                   unfair waiters refused by the total want notices, _next
--                   a lower bound of f:leases' deadlines, _hz the horizon,
--                   _calls the recent SetTotal call ids (settotal.lua),
--                   _recheck "1" once leases expired (fair: admit_total then
--                   looks again at the heads passed over at their limit);
--                   and "id" -> n for each lease of n > 1 slots
--   f:leases ZSET   lease id -> deadline (server ms): every lease of every
--                   member, with the deadline of its holder entry
--   f:heads  ZSET   member base ("prefix:{tag}:m:KEY:") -> the family
--                   arrival number of its queue's head (fair): positive
--                   while the head fits in its member's limit, negated
--                   while it does not (admit_total visits the positive ones)
--   f:total  STRING SetTotal's total; never expires
-- The sets keep the sentinel "~" (+inf), and every key but f:total expires
-- at _hz, as a member's do (extend, lib_records.lua).

-- counted_total is for the other kind of member: one of a family of one
-- shard whose client was built without a total (the eleven-key form,
-- fam_check_tot_key and fam_check_total_key: lib_args.lua). It returns the
-- total the family counts (SetTotal's f:total, else the one live clients
-- established, f:tot's _total; "0" counts with no bound), or nil when it
-- counts none. While it counts one, such a client's calls grant nothing,
-- admit nothing and take over no lease: the family's count would miss
-- them (acquire.lua, renew.lua, heartbeat.lua, wake in lib_total.lua).
local function counted_total()
  if not fam_check_tot_key then
    return nil
  end
  return redis.call('GET', fam_check_total_key) or redis.call('HGET', fam_check_tot_key, '_total') or nil
end

-- fam_put sets a counter ("_" field) of f:tot (a number, or a text).
local function fam_put(f, v)
  fam[f] = v
  fam.dirty[f] = true
end

-- fam_extend is extend (lib_records.lua) for the family's keys.
local function fam_extend(now, until_ms)
  local hz = fam._hz
  if until_ms + MARGIN_MS <= hz then
    return
  end
  fam_put('_hz', until_ms + MARGIN_MS + math.max(until_ms - now, MARGIN_MS))
  fam.moved = true
end

-- fam_load reads the family's counters, once per call, and creates its
-- keys when they are missing (first use, or expired while idle).
local function fam_load()
  if fam then
    return fam
  end
  local v = redis.call('HMGET', fam_tot_key, '_held', '_total', '_ftotal', '_seq', '_want', '_next', '_hz', '_recheck')
  fam = {
    _held = tonumber(v[1]) or 0, _total = v[2], _ftotal = v[3], _seq = tonumber(v[4]) or 0,
    _want = tonumber(v[5]) or 0, _next = (v[6] and v[6] ~= 'inf' and tonumber(v[6])) or math.huge,
    _hz = tonumber(v[7]), _recheck = v[8],
    -- dirty: counters to write; wt: weights to write (id -> n); gone:
    -- weights to delete; moved: the horizon moved; freed: a lease left the
    -- count; bound: fam_bound's cache. (Counters start with "_", so no
    -- lease id names one of these.)
    dirty = {}, wt = nil, gone = nil, moved = false, freed = false, bound = nil,
  }
  if not fam._hz then
    redis.call('ZADD', fam_leases_key, 'inf', SENTINEL)
    redis.call('ZADD', fam_heads_key, 'inf', SENTINEL)
    local t = redis.call('GET', fam_total_key)
    if t then
      fam._ftotal = t
      fam.dirty._ftotal = true
    end
    fam_put('_hz', 0)
    fam_put('_next', math.huge)
    fam_extend(call.clock_ms, call.clock_ms)
  end
  return fam
end

-- fam_add counts a new lease id of n slots until deadline. The id may
-- have left the count earlier in the same call (a retried acquire whose
-- lease expired meanwhile is granted again: fam_drop marked its weight for
-- deletion): the new weight stands, so the mark goes.
local function fam_add(id, n, now, deadline)
  fam_load()
  redis.call('ZADD', fam_leases_key, fmt(deadline), id)
  fam_put('_held', fam._held + n)
  if fam.gone then
    fam.gone[id] = nil
  end
  if n > 1 then
    fam.wt = fam.wt or {}
    fam.wt[id] = n
  end
  if deadline < fam._next then
    fam_put('_next', deadline)
  end
  fam_extend(now, deadline)
end

-- fam_drop takes lease id of n slots out of the count, if it is still in
-- (fam_expire may have taken it out at its deadline already).
local function fam_drop(id, n)
  fam_load()
  if redis.call('ZREM', fam_leases_key, id) == 1 then
    fam_put('_held', fam._held - n)
    if n > 1 then
      fam.gone = fam.gone or {}
      fam.gone[id] = true
      if fam.wt then
        fam.wt[id] = nil
      end
    end
    fam.freed = true
  end
end

-- fam_expire drops the leases past their deadline, of any member, from the
-- count (their member's own holder entries go when a call on that member
-- expires them: fam_drop then finds them gone). At most 16 batches.
local function fam_expire(now)
  fam_load()
  for _ = 1, 16 do
    if now < fam._next then
      return
    end
    local dead = redis.call('ZRANGE', fam_leases_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, BATCH)
    if #dead > 0 then
      local w = redis.call('HMGET', fam_tot_key, unpack(dead))
      local n = 0
      fam.gone = fam.gone or {}
      for i, id in ipairs(dead) do
        n = n + (tonumber(w[i]) or 1)
        if w[i] then
          fam.gone[id] = true
        end
      end
      redis.call('ZREM', fam_leases_key, unpack(dead))
      fam_put('_held', fam._held - n)
      fam.freed = true
      if fam_fair and not fam._recheck then
        -- A member whose head was passed over at its limit may fit now
        -- (admit_total looks again).
        fam_put('_recheck', '1')
        fam.gone = fam.gone or {}
        fam.gone._recheck = nil
      end
    end
    if #dead < BATCH then
      local first = redis.call('ZRANGE', fam_leases_key, 0, 0, 'WITHSCORES')
      fam_put('_next', tonumber(first[2]) or math.huge)
      return
    end
  end
end

-- fam_bound is the total in force: SetTotal's (0: none, math.huge), else
-- the one live clients established, else the client's.
local function fam_bound()
  local b = fam.bound
  if b then
    return b
  end
  local f = fam._ftotal
  if f then
    b = tonumber(f) or 0
    if b == 0 then
      b = math.huge
    end
  else
    b = stored_limit(fam._total) or fam_client_total
  end
  fam.bound = b
  return b
end

-- fam_room is how many slots the total has room for now.
local function fam_room()
  return fam_bound() - fam._held
end

-- fam_establish is establish (lib_limit.lua) for the total: it returns nil
-- and the established total when the client's differs from the one live
-- clients established (and no SetTotal settled it) while anything is held
-- or queued in the family.
local function fam_establish()
  if fam._ftotal then
    return true
  end
  local e = stored_limit(fam._total)
  if e ~= fam_client_total then
    if e and (fam._held > 0 or redis.call('ZCARD', fam_heads_key) > 1) then
      return nil, e
    end
    fam_put('_total', fmt(fam_client_total))
    fam.bound = nil
  end
  return true
end

-- fam_write writes what changed in f:tot, and the family keys' TTLs when
-- the horizon moved.
local function fam_write()
  local hset = {}
  for f in pairs(fam.dirty) do
    local v = fam[f]
    hset[#hset + 1] = f
    hset[#hset + 1] = type(v) == 'number' and (v == math.huge and 'inf' or fmt(v)) or v
  end
  if fam.wt then
    for id, n in pairs(fam.wt) do
      hset[#hset + 1] = id
      hset[#hset + 1] = fmt(n)
    end
    fam.wt = nil
  end
  for i = 1, #hset, CHUNK do
    redis.call('HSET', fam_tot_key, unpack(hset, i, math.min(i + CHUNK - 1, #hset)))
  end
  fam.dirty = {}
  if fam.gone then
    local hdel = {}
    for f in pairs(fam.gone) do
      hdel[#hdel + 1] = f
    end
    for i = 1, #hdel, CHUNK do
      redis.call('HDEL', fam_tot_key, unpack(hdel, i, math.min(i + CHUNK - 1, #hdel)))
    end
    fam.gone = nil
  end
  if fam.moved then
    local hz = fmt(fam._hz)
    redis.call('PEXPIREAT', fam_tot_key, hz)
    redis.call('PEXPIREAT', fam_leases_key, hz)
    redis.call('PEXPIREAT', fam_heads_key, hz)
    fam.moved = false
  end
end
