-- lib.lua: shared functions of the semaphore scripts: prepended to each
-- for EVAL, and the head of the FUNCTION library that holds them all (see
-- lua.go). It defines no reply of its own; every script first calls
-- bind(KEYS, ARGV) (the end of this file).
--
-- KEYS (the same nine for every script, all in one {hash-tag} slot):
--   KEYS[1] holders  ZSET  lease id -> deadline (server ms)
--   KEYS[2] queue    ZSET  waiter id -> arrival number (fair)
--   KEYS[3] sessions ZSET  session id -> deadline (server ms) (fair); the
--                          members of a keyed family share one (its TTL is
--                          only ever extended, see flush)
--   KEYS[4] free     ZSET  slot -> slot: the slots below the high-water mark
--                          "_hw" that no holder entry holds
--   KEYS[5] ended    ZSET  id -> until (server ms): ids whose record in meta
--                          is a tombstone (released or cancelled), for pruning
--   KEYS[6] meta     HASH  counters (fields that start with "_") and one
--                          record per id (see below)
--   KEYS[7] limit    STRING the limit set by SetLimit; never expires
--   KEYS[8] window   ZSET  "token:n" -> token: one record per grant made
--                          under a rate (Options.Rate), n slots at server
--                          time token (µs; tokens are never below the
--                          server clock), while it may still count in the
--                          rate's window
--   KEYS[9] rate     STRING the rate set by SetRate, "limit/per_ms" ("0/0":
--                          none); never expires
-- The six sets each keep a sentinel member "~" scored +inf (the window from
-- the first grant under a rate on), so that none
-- of them ever becomes empty (Redis would delete it and its TTL with it):
-- every key but "limit" expires at the horizon "_hz", which is extended
-- only when an entry outlives it, so a key's TTL is set about once per
-- lease TTL rather than on every call.
--
-- meta counters: _hz horizon (server ms), _limit limit established by live
--   clients, _fixed SetLimit's limit (mirror of KEYS[7]), _token last fencing
--   token, _used slots held by holder entries (expired ones included until
--   removed), _hw high-water mark of slots ever handed out, _seq last arrival
--   number, _q queue entries (dead ones included until evicted), _next a
--   lower bound of every holder deadline (expiry work runs only once it has
--   passed), _want until when unfair waiters want freed-slot notices, _prune
--   when tombstones and dead sessions are pruned next. Rate (all absent
--   while no rate was ever used; _rx "1" once any of the others may be
--   set, so that a call without a rate reads that one field only, and the
--   others are read by rate_load when needed): _rate the rate established by live
--   clients ("limit/per_ms"; absent: none), _frate SetRate's rate (mirror of
--   KEYS[9]), _rsum the slots of the window's records not trimmed yet, _rold
--   a lower bound of the window records' times ("inf": none), _rwake the
--   latest time (server µs) at which the rate frees room for the head waiter
--   that its session was told of. _pad: a constant text that keeps meta a
--   hash table once it is large (keep_hashed).
-- meta records, one field per lease or waiter id (ids never start with "_"):
--   "L|token|s1,s2,...|owner"           a holder entry's lease
--   "W|session|weight|lease_ms|owner"   a queue entry's waiter
--   "R"                                 released by its holder (tombstone)
--   "C"                                 cancelled: an acquire that runs
--                                       later (e.g. a request delayed in
--                                       flight) must not grant or queue it
--   "S"                                 a SetLimit call id that ran (a
--                                       re-sent copy changes nothing)
--
-- ARGV common prefix:
--   ARGV[1] channel base ("prefix:{name}:ch"); grants go to
--           base..":s:"..session, freed-slot notices to base..":free"
--   ARGV[2] publish command: "PUBLISH", or "SPUBLISH" on a cluster
--   ARGV[3] the calling client's limit (integer >= 1), and its rate if it
--           has one: "limit" or "limit:rate_limit:per_ms" (client_arg)

-- Per-call state. lib.lua is loaded two ways (lua.go): prepended to each
-- script for EVAL, where it runs on every call, and as a FUNCTION library,
-- where it runs once per server and each function is called many times. So
-- nothing here may keep a value from one call to the next: everything that
-- depends on the call (its KEYS and ARGV, the keys' names, the meta cache,
-- the clock) is declared here and set by bind(), which every script runs
-- first (see the end of this file).
local KEYS, ARGV
local H, Q, S, F, E, M, O, W, R
local CHAN, PUB
local SENTINEL = '~'
-- Keys outlive the longest entry by at least this much.
local MARGIN_MS = 1000
-- Tombstones live at most this long: a request retried after a lost reply
-- comes back well within it.
local TOMB_MS = 15000
-- How many entries one expiry or prune step handles at most.
local BATCH = 64
-- How many arguments one variadic command of a script gets at most. Lua's
-- unpack fails past about 8 000 values (LUAI_MAXCSTACK), and Redis keeps
-- every write a script made before such an error: a script that writes
-- thousands of fields (one release admitting thousands of waiters) writes
-- them in chunks of this many arguments.
local CHUNK = 1000
-- The largest limit and weight (core.MaxLimit).
local MAX_LIMIT = 1048576

local function fail(msg)
  return redis.error_reply('ERR redsem: ' .. msg)
end

-- int_arg returns ARGV[i] as an integer in [min, max] (max: 2^53 - 1 when
-- not given), or nil and an error reply. Only plain decimal digits count:
-- "1e3", "0x10", "inf" and "nan" are refused, not converted.
local function int_arg(i, name, min, max)
  local s = ARGV[i]
  local v = s and string.find(s, '^%d+$') and #s <= 16 and tonumber(s) -- ARGV: strings or nil
  if not v or v < min or v > (max or 9007199254740991) then
    return nil, fail('bad ' .. name .. ': ' .. tostring(s))
  end
  return v
end

-- stored_limit returns a limit read from Redis (the SetLimit override, or
-- a meta counter) as a number: nil when absent, false when it is not an
-- integer in [1, MAX_LIMIT] (an outside write: "inf", "1e9", "2.5" must not
-- make the semaphore unlimited, shut or rounded).
local function stored_limit(v)
  if v == nil or v == false then
    return nil
  end
  local n = string.find(v, '^%d+$') and #v <= 8 and tonumber(v) -- v: a text read from Redis
  if not n or n < 1 or n > MAX_LIMIT then
    return false
  end
  return n
end

-- The longest rate period, ms (core.MaxRatePer): about a year, so that
-- times plus a period stay exact in Lua's doubles.
local MAX_PER_MS = 31622400000

-- parse_rate returns the rate limit and period (ms) of "limit/per_ms", or
-- nil when v is not one: both zero (no rate), or limit in [1, MAX_LIMIT]
-- and per_ms in [1, MAX_PER_MS].
local function parse_rate(v, sep)
  local l, p = string.match(v, '^(%d+)' .. sep .. '(%d+)$')
  if not l or #l > 8 or #p > 12 then
    return nil
  end
  l, p = tonumber(l), tonumber(p)
  if (l == 0) ~= (p == 0) or l > MAX_LIMIT or p > MAX_PER_MS then
    return nil
  end
  return l, p
end

-- stored_rate is stored_limit for a rate read from Redis (the SetRate
-- override, or the meta counters _frate and _rate): nil when absent, false
-- when malformed, else its limit and period (0, 0: no rate).
local function stored_rate(v)
  if v == nil or v == false then
    return nil
  end
  if type(v) ~= 'string' then
    return false
  end
  local l, p = parse_rate(v, '/')
  if not l then
    return false
  end
  return l, p
end

-- id_arg returns ARGV[i] as a lease, waiter or session id.
local function id_arg(i, name)
  local v = ARGV[i]
  if v == nil or v == '' or #v > 128 or not string.find(v, '^[%w%-]+$') or v == SENTINEL then
    return nil, fail('bad ' .. name .. ': ' .. tostring(v))
  end
  return v
end

-- client_arg returns the calling client's limit from ARGV[3] ("limit", or
-- "limit:rate_limit:per_ms" for a client built with a rate), or nil and an
-- error reply; it keeps the client's rate in CRL, CRP (0, 0: none).
local CRL, CRP
local function client_arg()
  local s = ARGV[3]
  if s and string.find(s, ':', 1, true) then
    local l, r = string.match(s, '^(%d+):(%d+:%d+)$')
    local rl, rp
    if l and #l <= 8 then
      rl, rp = parse_rate(r, ':')
    end
    if not rl then
      return nil, fail('bad limit: ' .. s)
    end
    CRL, CRP = rl, rp
    ARGV[3] = l
  end
  return int_arg(3, 'limit', 1, MAX_LIMIT)
end

-- clock returns the server time in milliseconds and in microseconds.
local CLOCK_MS -- the server time of the latest clock() call
local CLOCK_US
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  CLOCK_MS = s * 1000 + (us - us % 1000) / 1000
  CLOCK_US = s * 1000000 + us
  return CLOCK_MS, CLOCK_US
end

-- fmt formats a number as Redis and the clients read it: digits, never
-- an exponent. Integers (every count, time and token) go through C's %d,
-- which costs half of %.0f (whose arbitrary-precision path is for
-- fractions: kept for anything else, inf and nan included).
local function fmt(n)
  if n % 1 == 0 and n > -9007199254740992 and n < 9007199254740992 then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end

-- The meta hash is read once per script (HMGET of the counters and of the
-- records a script needs) and written once at the end (flush). The
-- counters (see the top of this file): _hz, _limit, _fixed, _token, _used,
-- _hw, _seq, _q, _next, _want, _prune, _rx.
local META, DIRTY, GONE

-- load reads the counters and, if given, the record of one id, into a
-- new META built by one table constructor (sized once: filling an empty
-- table field by field grew it four times). The HMGET's fields are spelled
-- out: building its argument list in a table on every call cost more.
local RATE_LOADED
local function load(id)
  local v
  if CRL > 0 then
    -- A client with a rate: the rate's counters too, in the same call.
    v = redis.call('HMGET', M, '_hz', '_limit', '_fixed', '_token', '_used', '_hw', '_seq', '_q', '_next', '_want', '_prune', '_rx',
      '_rate', '_frate', '_rsum', '_rold', '_rwake', id or '_')
    META = {_hz = v[1], _limit = v[2], _fixed = v[3], _token = v[4], _used = v[5], _hw = v[6], _seq = v[7], _q = v[8],
      _next = v[9], _want = v[10], _prune = v[11], _rx = v[12],
      _rate = v[13], _frate = v[14], _rsum = v[15], _rold = v[16], _rwake = v[17]}
    RATE_LOADED = true
    if id then
      META[id] = v[18]
    end
  elseif id then
    v = redis.call('HMGET', M, '_hz', '_limit', '_fixed', '_token', '_used', '_hw', '_seq', '_q', '_next', '_want', '_prune', '_rx', id)
    META = {_hz = v[1], _limit = v[2], _fixed = v[3], _token = v[4], _used = v[5], _hw = v[6], _seq = v[7], _q = v[8],
      _next = v[9], _want = v[10], _prune = v[11], _rx = v[12], [id] = v[13]}
  else
    v = redis.call('HMGET', M, '_hz', '_limit', '_fixed', '_token', '_used', '_hw', '_seq', '_q', '_next', '_want', '_prune', '_rx')
    META = {_hz = v[1], _limit = v[2], _fixed = v[3], _token = v[4], _used = v[5], _hw = v[6], _seq = v[7], _q = v[8],
      _next = v[9], _want = v[10], _prune = v[11], _rx = v[12]}
  end
end

-- rate_load reads the rate's counters (_rate, _frate, _rsum, _rold,
-- _rwake), once per call, if the semaphore may have any (_rx) or force
-- (load read them already for a client with a rate); fields this call set
-- already keep their value.
local function rate_load(force)
  if RATE_LOADED or not (force or META['_rx']) then
    return
  end
  RATE_LOADED = true
  local v = redis.call('HMGET', M, '_rate', '_frate', '_rsum', '_rold', '_rwake')
  local f = {'_rate', '_frate', '_rsum', '_rold', '_rwake'}
  for i = 1, 5 do
    if META[f[i]] == nil then
      META[f[i]] = v[i]
    end
  end
end

-- check_limits returns an error reply when a stored limit (meta's _fixed
-- or _limit, or the SetLimit key of a semaphore whose other keys expired)
-- is not an integer in [1, MAX_LIMIT]; scripts call it after load and
-- before their first write, and SetLimit, which overwrites them, does not.
local function check_limits()
  rate_load()
  local fixed, frate = META['_fixed'], META['_frate']
  if not META['_hz'] then
    fixed = redis.call('GET', O)
    META['_o'] = fixed or false -- init reads it from here
    frate = redis.call('GET', R)
    META['_r'] = frate or false
  end
  if stored_limit(fixed) == false then
    return fail('the stored limit ' .. O .. ' is ' .. string.format('%q', fixed) ..
      ', not an integer in [1, ' .. MAX_LIMIT .. ']: set it again with SetLimit')
  end
  if META['_hz'] and stored_limit(META['_limit']) == false then
    return fail('the stored counter _limit of ' .. M .. ' is ' .. string.format('%q', META['_limit']) ..
      ', not an integer in [1, ' .. MAX_LIMIT .. ']')
  end
  if frate and stored_rate(frate) == false then
    return fail('the stored rate ' .. R .. ' is ' .. string.format('%q', frate) ..
      ', not "limit/per_ms": set it again with SetRate')
  end
  if META['_hz'] and META['_rate'] and stored_rate(META['_rate']) == false then
    return fail('the stored counter _rate of ' .. M .. ' is ' .. string.format('%q', META['_rate']) ..
      ', not "limit/per_ms"')
  end
  return nil
end

-- get returns a meta field as loaded or since set; records not loaded are
-- read on demand (one HMGET for many with records()).
local function get(f)
  return META[f]
end

-- num returns a meta field as a number (0 when absent). Each field is
-- converted once per call: NUMS keeps what num read and what set wrote as a
-- number (a conversion runs strtod, and the scripts read _used, _q and the
-- like many times per call).
local NUMS
local function num(f)
  local v = NUMS[f]
  if v == nil then
    v = tonumber(META[f]) or 0
    NUMS[f] = v
  end
  return v
end

-- next_expiry is _next as a number: math.huge when no holder is known.
local function next_expiry()
  local v = NUMS['_next']
  if v then
    return v
  end
  v = META['_next']
  if not v or v == 'inf' then
    v = math.huge
  else
    v = tonumber(v) or 0
  end
  NUMS['_next'] = v
  return v
end

-- set writes the number v to a meta field (flush sends it): kept as one in
-- NUMS, written as fmt(v), or as text when the caller formatted it
-- already. put writes a text. (Two functions rather than a type() test in
-- one: each C function a script calls costs more than the test saves.)
local function set(f, v, text)
  NUMS[f] = v
  META[f] = text or fmt(v) -- Lua's own conversion prints 1e+14 for large numbers
  DIRTY[f] = true
  if GONE then
    GONE[f] = nil
  end
end

local function put(f, v)
  NUMS[f] = nil
  META[f] = v
  DIRTY[f] = true
  if GONE then
    GONE[f] = nil
  end
end

local function del(f)
  NUMS[f] = nil
  META[f] = false
  DIRTY[f] = nil
  GONE = GONE or {}
  GONE[f] = true
end

-- records loads the meta records of ids not loaded yet, in one HMGET.
local function records(ids)
  local want
  for i = 1, #ids do -- numeric loops: ipairs calls a C function per element
    local id = ids[i]
    if META[id] == nil then
      want = want or {}
      want[#want + 1] = id
    end
  end
  if not want then
    return
  end
  if #want == 1 then
    -- One record (a Release's own, admit's head waiter): no tables.
    META[want[1]] = redis.call('HGET', M, want[1])
    return
  end
  for i = 1, #want, CHUNK do
    local part = {unpack(want, i, math.min(i + CHUNK - 1, #want))}
    local v = redis.call('HMGET', M, unpack(part))
    for k, id in ipairs(part) do
      META[id] = v[k]
    end
  end
end

-- extend keeps every key alive until at least until_ms + MARGIN_MS. It only
-- writes when that is past the horizon, and then doubles the remaining
-- lifetime, so it runs about once per TTL, not once per call. The PEXPIREATs
-- themselves are sent by flush, after every write of the script.
local HZ_MOVED
local function extend(now, until_ms)
  local hz = num('_hz')
  if until_ms + MARGIN_MS <= hz then
    return
  end
  hz = until_ms + MARGIN_MS + math.max(until_ms - now, MARGIN_MS)
  set('_hz', hz)
  HZ_MOVED = true
end

-- FREED holds the slots that this call gave back while the free set held
-- none (give_back), instead of writing them there at once: a grant later in
-- the same call (a Release that admits the next waiter) takes them from here,
-- which saves a ZADD and a ZPOPMIN of the free set per handoff, and flush
-- writes the rest. While FREED holds slots the free set holds none (give_back
-- writes there only when it held some already), so the lowest free slots
-- are FREED's. nil: none this call. Grants take from FREED_I on, and sort
-- the slots not yet taken only after more were given back (FREED_SORTED):
-- one Release may admit thousands of waiters, and sorting or copying the
-- list on each grant made that call quadratic (seconds for 4 500).
local FREED, FREED_I, FREED_SORTED

-- add_free writes slots[from..] into the free set.
local function add_free(slots, from)
  if from == #slots then
    local s = slots[from]
    redis.call('ZADD', F, s, s)
    return
  end
  for i = from, #slots, CHUNK / 2 do
    local args = {}
    for k = i, math.min(i + CHUNK / 2 - 1, #slots) do
      args[#args + 1] = slots[k]
      args[#args + 1] = slots[k]
    end
    redis.call('ZADD', F, unpack(args))
  end
end

local function flush()
  if FREED then
    add_free(FREED, FREED_I)
    FREED = nil
  end
  if next(DIRTY) ~= nil then
    local hset, n = {}, 0
    for f in pairs(DIRTY) do
      hset[n + 1] = f
      hset[n + 2] = META[f]
      n = n + 2
    end
    if n <= CHUNK then
      redis.call('HSET', M, unpack(hset))
    else
      for i = 1, n, CHUNK do
        redis.call('HSET', M, unpack(hset, i, math.min(i + CHUNK - 1, n)))
      end
    end
    DIRTY = {}
  end
  if GONE and next(GONE) ~= nil then
    local hdel, n = {}, 0
    for f in pairs(GONE) do
      n = n + 1
      hdel[n] = f
    end
    for i = 1, n, CHUNK do
      redis.call('HDEL', M, unpack(hdel, i, math.min(i + CHUNK - 1, n)))
    end
    GONE = nil
  end
  if HZ_MOVED then
    local hz = META['_hz']
    for _, k in ipairs({H, Q, S, F, E, W}) do
      if k ~= S then
        redis.call('PEXPIREAT', k, hz)
      else
        -- The sessions key may be shared by the members of a keyed family,
        -- whose horizons differ: it is never shortened (a plain
        -- semaphore's horizon only grows, so this changes nothing there).
        local ttl = redis.call('PTTL', S)
        if ttl == -1 or (ttl >= 0 and CLOCK_MS + ttl < tonumber(hz)) then
          redis.call('PEXPIREAT', S, hz)
        end
      end
    end
    redis.call('PEXPIREAT', M, hz)
    HZ_MOVED = false
  end
end

-- finish writes what the script changed in meta and returns reply.
local function finish(reply)
  flush()
  return reply
end

-- init creates a semaphore's keys when meta is missing (first use, or all
-- keys expired after an idle period): the sentinels, and the limit that
-- SetLimit fixed, which outlives everything else. The window key is made
-- by the first grant under a rate (rate_record), so a semaphore without a
-- rate has none.
local function init(now)
  if get('_hz') then
    return
  end
  for _, k in ipairs({H, Q, S, F, E}) do -- not W (see above)
    redis.call('ZADD', k, 'inf', SENTINEL)
  end
  local o = META['_o']
  if o == nil then
    o = redis.call('GET', O)
  end
  if stored_limit(o) then
    put('_fixed', o)
  end
  local r = META['_r']
  if r == nil then
    r = redis.call('GET', R)
  end
  if r and stored_rate(r) then
    put('_frate', r)
    put('_rx', '1')
  end
  put('_hz', '0')
  put('_next', 'inf')
  extend(now, now)
end

-- slot_list returns the slots of a record's "s1,s2,..." as a list.
local function slot_list(slots)
  if not string.find(slots, ',', 1, true) then
    return {tonumber(slots)} -- one slot: most leases
  end
  local list = {}
  for s in string.gmatch(slots, '%d+') do
    list[#list + 1] = tonumber(s)
  end
  return list
end

-- parse_lease returns token, slots (a list) and owner of a lease record.
local function parse_lease(rec)
  local token, slots, owner = string.match(rec, '^L|(%d+)|([%d,]+)|(.*)$')
  return tonumber(token), slot_list(slots), owner
end

-- lease_slots returns the slots (a list) of a lease record.
local function lease_slots(rec)
  return slot_list(string.match(rec, '^L|%d+|([%d,]+)|'))
end

-- parse_waiter returns session, weight, lease_ms and owner of a waiter record.
local function parse_waiter(rec)
  local sid, n, lease_ms, owner = string.match(rec, '^W|([^|]+)|(%d+)|(%d+)|(.*)$')
  return sid, tonumber(n), tonumber(lease_ms), owner
end

-- give_back returns slots to the free set.
local function give_back(slots)
  if #slots == 0 then
    return
  end
  if FREED then
    for _, s in ipairs(slots) do
      FREED[#FREED + 1] = s
    end
    FREED_SORTED = false
  elseif num('_hw') == num('_used') then
    -- The free set holds no slot: keep them for a grant of this call
    -- (the list is FREED's from now on: callers pass one they drop).
    FREED, FREED_I, FREED_SORTED = slots, 1, #slots == 1
  else
    add_free(slots, 1)
  end
  set('_used', num('_used') - #slots)
end

-- drop_holders removes holder entries and frees their slots. It returns
-- how many of the ids had a holder entry.
local function drop_holders(ids)
  local k = #ids
  if k == 0 then
    return 0
  end
  records(ids)
  local removed
  if k == 1 then
    removed = redis.call('ZREM', H, ids[1])
  else
    removed = 0
    for i = 1, k, CHUNK do
      removed = removed + redis.call('ZREM', H, unpack(ids, i, math.min(i + CHUNK - 1, k)))
    end
  end
  local slots
  for i = 1, k do
    local id = ids[i]
    local rec = get(id)
    if rec and string.sub(rec, 1, 1) == 'L' then
      local list = lease_slots(rec)
      if not slots then
        slots = list
      else
        for _, s in ipairs(list) do
          slots[#slots + 1] = s
        end
      end
      del(id)
    end
  end
  if slots then
    give_back(slots)
  end
  return removed
end

-- expire removes holders past their deadline, once the earliest deadline
-- may have passed (_next is a lower bound of every holder deadline).
-- Returns how many holders it removed.
local function expire(now)
  if now < next_expiry() then
    return 0
  end
  local dead = redis.call('ZRANGE', H, '-inf', now, 'BYSCORE', 'LIMIT', 0, BATCH)
  drop_holders(dead)
  if #dead == BATCH then
    set('_next', now) -- more may be due: the next call goes on
  else
    local first = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
    put('_next', first[2] or 'inf')
  end
  return #dead
end

-- Redis stores a hash of at most hash-max-listpack-entries fields (512 by
-- default) whose values are all short as one flat listpack, and finds a
-- field in it by scanning from the front, to the end for a field it does
-- not hold (_fixed, _rx, a new id): with 300 records in meta (tombstones,
-- mostly) an unfair TryAcquire or Release took 30-32 µs instead of 19-20
-- (BenchmarkScripts unfair-try-release-300). Once meta holds more than HASHED_AT fields,
-- it gets a field "_pad" whose value is longer than
-- hash-max-listpack-value (64 by default), which makes Redis keep it as a
-- hash table for good (including after a restart from a snapshot). A
-- small semaphore stays a compact listpack.
local HASHED_AT = 32
local PAD = 'a value longer than hash-max-listpack-value keeps this hash a hash table: lookups are O(1) (redsem lib.lua)'

-- keep_hashed gives meta its "_pad" once it holds more than HASHED_AT fields
-- (prune calls it, at most every 100 ms).
local function keep_hashed()
  if redis.call('HLEN', M) > HASHED_AT then
    redis.call('HSETNX', M, '_pad', PAD)
  end
end

-- prune drops tombstones past their time, and dead sessions with their
-- waiters wherever they stand in the queue (admit also evicts dead waiters
-- it meets at the head). It runs at most every 100 ms (sooner while a
-- batch was full), so its cost is spread thin, and its scan of the queue
-- when a session died is rare.
local function prune(now)
  if now < num('_prune') then
    return
  end
  keep_hashed()
  local due = redis.call('ZRANGE', E, '-inf', now, 'BYSCORE', 'LIMIT', 0, BATCH)
  if #due > 0 then
    redis.call('ZREM', E, unpack(due))
    records(due)
    for _, id in ipairs(due) do
      -- Only a tombstone goes: an id is never granted or queued again once
      -- tombstoned by this library, but one written from outside (or a
      -- SetLimit call id reused as a lease id) keeps its live record.
      local rec = get(id)
      if rec == 'R' or rec == 'C' or rec == 'S' then
        del(id)
      end
    end
  end
  local dead = redis.call('ZRANGE', S, '-inf', now, 'BYSCORE', 'LIMIT', 0, BATCH)
  if #dead > 0 then
    redis.call('ZREM', S, unpack(dead))
    if num('_q') > 0 then
      local gone = {}
      for _, sid in ipairs(dead) do
        gone[sid] = true
      end
      local ids = redis.call('ZRANGE', Q, 0, -1)
      ids[#ids] = nil -- the sentinel
      records(ids)
      local evict = {}
      for _, id in ipairs(ids) do
        local rec = get(id)
        if not rec or (string.sub(rec, 1, 1) == 'W' and gone[parse_waiter(rec)]) then
          evict[#evict + 1] = id
          del(id)
        end
      end
      for i = 1, #evict, CHUNK do
        redis.call('ZREM', Q, unpack(evict, i, math.min(i + CHUNK - 1, #evict)))
      end
      set('_q', num('_q') - #evict)
    end
  end
  if #due == BATCH or #dead == BATCH then
    set('_prune', now)
  else
    set('_prune', now + 100)
  end
end

-- tombstone marks id as released ("R"), cancelled ("C") or a SetLimit call
-- that ran ("S") until until_ms.
local function tombstone(id, kind, now, until_ms)
  put(id, kind)
  redis.call('ZADD', E, fmt(until_ms), id)
  extend(now, until_ms)
end

-- limit_in_force is SetLimit's limit, else the one live clients established,
-- else the caller's.
local function limit_in_force(client_limit)
  return stored_limit(get('_fixed')) or stored_limit(get('_limit')) or client_limit
end

-- establish returns the limit for an acquiring client, or nil and the limit
-- that live clients established when they disagree with client_limit. A
-- semaphore with nothing held and nothing queued is idle: a client with
-- another limit establishes its own.
local function establish(client_limit)
  local fixed = stored_limit(get('_fixed'))
  if fixed then
    return fixed
  end
  local e = stored_limit(get('_limit'))
  if e ~= client_limit then
    if e and (num('_used') > 0 or num('_q') > 0) then
      return nil, e
    end
    set('_limit', client_limit)
  end
  return client_limit
end

-- take_slots takes the n lowest free slots: from the free set, then above
-- the high-water mark. With _used + n <= limit they all lie below limit.
local function take_slots(n)
  local slots = {}
  local have = num('_hw') - num('_used')
  if FREED then
    -- Given back by this call, the free set holding none: the lowest
    -- free slots are here (then above the high-water mark).
    if not FREED_SORTED then
      local rest = {}
      for i = FREED_I, #FREED do
        rest[#rest + 1] = FREED[i]
      end
      table.sort(rest)
      FREED, FREED_I, FREED_SORTED = rest, 1, true
    end
    local last = math.min(FREED_I + n - 1, #FREED)
    for i = FREED_I, last do
      slots[#slots + 1] = FREED[i]
    end
    FREED_I = last + 1
  elseif have > 0 then
    local popped = redis.call('ZPOPMIN', F, n < have and n or have)
    for i = 1, #popped, 2 do
      if popped[i] == SENTINEL then
        redis.call('ZADD', F, 'inf', SENTINEL) -- never happens while the counters hold
      else
        slots[#slots + 1] = tonumber(popped[i])
      end
    end
  end
  if #slots < n then
    local hw = num('_hw')
    while #slots < n do
      slots[#slots + 1] = hw
      hw = hw + 1
    end
    set('_hw', hw)
  end
  set('_used', num('_used') + n)
  return slots
end

-- The rate in force for this call (rate()): at most RL slots granted in any
-- RP_US µs (RL 0: no rate); and RATE_AT: the server time (µs) at which the
-- window has room for the request or head waiter that the rate held back in
-- this call (nil: none).
local RL, RP_US, RATE_AT

-- rate returns the rate limit in force (0: none) and sets RL and RP_US,
-- once per call: SetRate's rate, else the one live clients established
-- (none, once they established a limit without a rate), else the client's.
local function rate()
  if RL then
    return RL
  end
  if CRL == 0 and not META['_rx'] then
    RL, RP_US = 0, 0 -- no rate anywhere: nothing to read
    return 0
  end
  rate_load(true)
  local l, p = stored_rate(get('_frate'))
  if not l then
    l, p = stored_rate(get('_rate'))
    if not l and stored_limit(get('_limit')) then
      l, p = 0, 0
    end
  end
  if not l then
    l, p = CRL, CRP
  end
  RL, RP_US = l, p * 1000
  return RL
end

-- rate_keep keeps every key (so the window's records) until the youngest
-- record leaves a window of per_ms: when the period in force grows
-- (SetRate, or an idle semaphore taking a client's rate), grants made
-- before must still count against it after the leases that kept the keys
-- alive have ended.
local function rate_keep(per_ms)
  local r = redis.call('ZREVRANGE', W, 1, 1, 'WITHSCORES') -- 0: the sentinel
  if r[2] then
    extend(CLOCK_MS, math.floor(tonumber(r[2]) / 1000) + per_ms + 1)
  end
end

-- establish_rate is establish for the rate: true, or nil and the rate
-- that live clients established ("limit/per_ms") when it differs from the
-- client's while slots are held or waiters queued. An idle semaphore takes
-- the client's rate (its window's records still count).
local function establish_rate()
  if CRL == 0 and not META['_rx'] then
    return true -- no rate here, none established or set
  end
  rate_load(true)
  if stored_rate(get('_frate')) then
    return true
  end
  local el, ep = stored_rate(get('_rate'))
  if not el then
    el, ep = 0, 0
  end
  if el ~= CRL or ep ~= CRP then
    if num('_used') > 0 or num('_q') > 0 then
      return nil, fmt(el) .. '/' .. fmt(ep)
    end
    if CRL == 0 then
      del('_rate')
    else
      put('_rate', fmt(CRL) .. '/' .. fmt(CRP))
      put('_rx', '1')
      rate_keep(CRP)
    end
    RL = nil -- rate() reads it again
  end
  return true
end

-- rec_weight is the slots of a window record "token:n".
local function rec_weight(m)
  return tonumber(string.match(m, ':(%d+)$')) or 0
end

-- rate_trim drops the window's records that no longer count (their time
-- is at most now_us - period), once the oldest may have left (_rold is a
-- lower bound of their times): at most CHUNK per call, the sum staying an
-- upper bound meanwhile.
local function rate_trim(now_us)
  local cutoff = now_us - RP_US
  local old = get('_rold')
  if not old or old == 'inf' or tonumber(old) > cutoff then
    return
  end
  local gone = redis.call('ZRANGE', W, '-inf', cutoff, 'BYSCORE', 'LIMIT', 0, CHUNK)
  if #gone > 0 then
    local sum = 0
    for _, m in ipairs(gone) do
      sum = sum + rec_weight(m)
    end
    redis.call('ZREM', W, unpack(gone))
    set('_rsum', math.max(num('_rsum') - sum, 0))
  end
  if #gone == CHUNK then
    set('_rold', cutoff) -- more may be due: the next call goes on
  else
    local first = redis.call('ZRANGE', W, 0, 0, 'WITHSCORES')
    put('_rold', first[2] or 'inf')
  end
end

-- rate_fits reports whether the rate lets n more slots be granted now: the
-- window's records younger than the period, plus n, stay within the rate's
-- limit. Records are trimmed only when the sum of all of them (an upper
-- bound) would not let n in, so a window with room costs no command. When
-- n does not fit, it sets RATE_AT to when it will (the time of the record
-- whose leaving makes room, plus the period).
local function rate_fits(n, now_us)
  if rate() == 0 then
    return true
  end
  if num('_rsum') + n <= RL then
    return true
  end
  rate_trim(now_us)
  local sum = num('_rsum')
  if sum + n <= RL then
    return true
  end
  -- Each record holds at least one slot: the first `need` records may be
  -- enough (one, for the usual single slot), then more in batches.
  local need, acc, from = sum + n - RL, 0, 0
  local batch = math.min(need, 64)
  while true do
    local recs = redis.call('ZRANGE', W, from, from + batch - 1, 'WITHSCORES')
    for i = 1, #recs, 2 do
      if recs[i] == SENTINEL then
        break
      end
      acc = acc + rec_weight(recs[i])
      if acc >= need then
        RATE_AT = math.max(tonumber(recs[i + 1]) + RP_US, now_us)
        return false
      end
    end
    if #recs < 2 * batch then
      break
    end
    from = from + batch
    batch = 64
  end
  -- The records hold fewer slots than _rsum says (it drifted): it is
  -- corrected to what they hold, and the walk runs again on the true sum
  -- (once: it then finds the record whose leaving makes room, as n is at
  -- most RL), so that the wake time is the window's, not now.
  set('_rsum', acc)
  if acc + n <= RL then
    return true
  end
  if n <= RL then
    return rate_fits(n, now_us)
  end
  RATE_AT = now_us
  return false
end

-- rate_record adds a grant of n slots with token to the window, when a
-- rate is in force (rate_fits ran before every grant).
local function rate_record(token, n, now)
  if not RL or RL == 0 then
    return
  end
  local old = get('_rold')
  if not old then
    -- The first grant under a rate since the keys were made (init makes
    -- no window key): the window key's sentinel, and its TTL (every key's
    -- is set again).
    redis.call('ZADD', W, 'inf', SENTINEL)
    HZ_MOVED = true
  end
  local t = fmt(token)
  redis.call('ZADD', W, t, t .. ':' .. n)
  set('_rsum', num('_rsum') + n)
  if not old or old == 'inf' then
    set('_rold', token)
  end
  extend(now, now + RP_US / 1000)
end

-- rate_ms is RATE_AT as ms from now_us (rounded up), -1 when not set.
local function rate_ms(now_us)
  if not RATE_AT then
    return -1
  end
  return math.max(math.ceil((RATE_AT - now_us) / 1000), 0)
end

-- grant makes id a holder of n slots until deadline, with the next fencing
-- token: never less than the server clock in microseconds, so tokens keep
-- increasing even when the counter is lost. Returns the token, the slots
-- (a list) and the slots as the record and the messages write them ("s1,s2").
local function grant(id, n, now, now_us, deadline, owner)
  local slots = take_slots(n)
  local token = num('_token') + 1
  if token < now_us then
    token = now_us
  end
  local t = fmt(token)
  set('_token', token, t)
  -- table.concat would format a number with "%.14g" (C's slow path for
  -- fractions): one slot, as most leases hold, goes through fmt.
  local list = n == 1 and fmt(slots[1]) or table.concat(slots, ',')
  put(id, 'L|' .. t .. '|' .. list .. '|' .. owner)
  redis.call('ZADD', H, fmt(deadline), id)
  if deadline < next_expiry() then
    set('_next', deadline)
  end
  extend(now, deadline)
  rate_record(token, n, now)
  return token, slots, list
end

local function publish(channel, msg)
  redis.call(PUB, channel, msg)
end

-- session_deadline returns a live session's deadline, or nil.
local SDL -- session id -> deadline, as read by this call
local function session_deadline(sid, now)
  if not SDL then
    SDL = {}
  end
  local d = SDL[sid]
  if d == nil then
    d = tonumber(redis.call('ZSCORE', S, sid)) or 0
    SDL[sid] = d
  end
  if d > now then
    return d
  end
  return nil
end

local function drop_waiter(id)
  redis.call('ZREM', Q, id)
  del(id)
  set('_q', num('_q') - 1)
end

-- evict_heavier drops the queued waiters that ask for more than max slots
-- (SetLimit's limit, SetRate's rate: they can never be admitted), wherever
-- they stand, and tells their processes: "x id max" followed by note (""
-- for the limit, " rate" for the rate).
local function evict_heavier(max, note)
  if num('_q') == 0 then
    return
  end
  local ids = redis.call('ZRANGE', Q, 0, -1)
  ids[#ids] = nil -- the sentinel
  records(ids)
  for _, id in ipairs(ids) do
    local rec = get(id)
    if rec and string.sub(rec, 1, 1) == 'W' then
      local sid, n = parse_waiter(rec)
      if n > max then
        drop_waiter(id)
        publish(CHAN .. ':s:' .. sid, 'x ' .. id .. ' ' .. max .. note)
      end
    end
  end
end

-- admit grants free slots to the earliest live waiters in arrival order,
-- evicting dead ones (their session is gone) it meets at the head, and
-- waiters heavier than the limit or the rate's limit (told with an "x"
-- message). A head waiter that needs more slots than are free, or than the
-- rate allows now, keeps its place and stops admission: nobody overtakes
-- it. When the rate holds it back, its session is told when the rate will
-- let it in ("w id ms", once per head and time), so that its process runs
-- the admission again then. A grant lasts until now + lease_ms, but no longer
-- than the grantee's session until the grantee renews it, so that it dies
-- with a process that never learned of it. Each grantee's session is told
-- "g id token deadline slots". Returns the grants as a flat list
-- (id, token, deadline, "slots", ...).
local function admit(now, now_us, limit)
  local out = {}
  rate()
  while num('_q') > 0 and limit - num('_used') > 0 do
    local head = redis.call('ZPOPMIN', Q)
    local id, seq = head[1], head[2]
    if id == nil or id == SENTINEL then
      redis.call('ZADD', Q, 'inf', SENTINEL)
      set('_q', 0) -- the count drifted: nothing real is queued
      break
    end
    records({id})
    local rec = get(id)
    local sid, n, lease_ms, owner
    if rec and string.sub(rec, 1, 1) == 'W' then
      sid, n, lease_ms, owner = parse_waiter(rec)
    end
    local sdl = sid and session_deadline(sid, now)
    if not sdl then
      del(id) -- a dead waiter: evicted
      set('_q', num('_q') - 1)
    elseif n > limit or (RL > 0 and n > RL) then
      del(id)
      set('_q', num('_q') - 1)
      if n > limit then
        publish(CHAN .. ':s:' .. sid, 'x ' .. id .. ' ' .. limit)
      else
        publish(CHAN .. ':s:' .. sid, 'x ' .. id .. ' ' .. RL .. ' rate')
      end
    elseif n > limit - num('_used') then
      redis.call('ZADD', Q, seq, id) -- not enough free yet: keep the place
      break
    elseif not rate_fits(n, now_us) then
      redis.call('ZADD', Q, seq, id) -- the rate's window is full: keep the place
      local wake = fmt(RATE_AT) .. ' ' .. id
      if get('_rwake') ~= wake then
        put('_rwake', wake)
        publish(CHAN .. ':s:' .. sid, 'w ' .. id .. ' ' .. rate_ms(now_us))
      end
      break
    else
      set('_q', num('_q') - 1)
      local deadline = now + lease_ms
      if sdl < deadline then
        deadline = sdl
      end
      local token, _, list = grant(id, n, now, now_us, deadline, owner)
      publish(CHAN .. ':s:' .. sid, 'g ' .. id .. ' ' .. fmt(token) .. ' ' .. fmt(deadline) .. ' ' .. list)
      out[#out + 1] = id
      out[#out + 1] = token
      out[#out + 1] = deadline
      out[#out + 1] = list
    end
  end
  return out
end

-- notify_free tells unfair waiters how many slots are free, if any wait:
-- "n meta-key", so that on a channel that the members of a keyed family
-- share, a process wakes only the waiters of the member that has them.
-- Under a rate, no more than the window has room for (by its running sum,
-- an upper bound of what it holds), and nothing while it is full: a
-- waiter woken then would only be refused by the rate; each process's
-- waiters for the window wake when it has room (core's rate gate).
local function notify_free(now, limit)
  local free = limit - num('_used')
  if free <= 0 or num('_want') <= now then
    return
  end
  if rate() > 0 then
    if not rate_fits(1, CLOCK_US) then
      return
    end
    free = math.min(free, RL - num('_rsum'))
    if free <= 0 then
      return
    end
  end
  publish(CHAN .. ':free', free .. ' ' .. M)
end

-- hint returns ms until the earliest holder may expire, or until the rate
-- lets in what it held back in this call (RATE_AT) if that is sooner; -1
-- with neither.
local function hint(now)
  local n = next_expiry()
  local h = -1
  if n ~= math.huge then
    h = math.max(n - now, 0)
  end
  if RATE_AT then
    local r = rate_ms(CLOCK_US)
    if h < 0 or r < h then
      h = r
    end
  end
  return h
end

local function append(dst, src)
  local n = #dst
  for i = 1, #src do
    dst[n + i] = src[i]
  end
  return dst
end

-- bind starts a call: it sets the per-call state declared above from the
-- call's keys and arguments, and returns an error reply when they do not
-- have the shape every script needs (nil when they do).
local function bind(keys, argv)
  KEYS, ARGV = keys, argv
  if #keys ~= 9 then
    return fail('want 9 keys, got ' .. #keys)
  end
  H, Q, S, F, E, M, O, W, R = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7], keys[8], keys[9]
  CHAN, PUB = argv[1], argv[2]
  if PUB ~= 'PUBLISH' and PUB ~= 'SPUBLISH' then
    return fail('bad publish command: ' .. tostring(PUB))
  end
  CLOCK_MS, CLOCK_US = 0, 0
  CRL, CRP = 0, 0
  RL, RP_US, RATE_AT, RATE_LOADED = nil, nil, nil, false
  META, DIRTY, GONE, NUMS = nil, {}, nil, {} -- META: load makes it; GONE: del
  FREED = nil
  HZ_MOVED = false
  SDL = nil
  return nil
end
