-- lib_args.lua: the first part of the lib, the functions that the
-- semaphore scripts share. The lib is the lib_*.lua files concatenated in
-- this order (lua.go): lib_args, lib_records, lib_family, lib_slots,
-- lib_prune, lib_limit, lib_rate, lib_queue, lib_admit, lib_total; it is prepended to each
-- script for EVAL, and is the head of the FUNCTION library that holds them
-- all. Each file uses only what the files before it define (Lua's locals
-- are seen only below their declaration). The lib defines no reply of its
-- own; every script first calls bind(KEYS, ARGV) (below).
--
-- This file holds the layout of the keys (below), the constants, the
-- per-call state, bind, which sets it, and the member switch of a family
-- with a total (save_member, restore_member, switch_member), argument parsing (fail,
-- int_arg, parse_rate, id_arg, client_arg), the checks of limits and rates
-- read from Redis (stored_limit, stored_rate), clock and fmt. It uses
-- nothing from another file.
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
--   latest time (server µs) at which the rate frees room that waiters were
--   told of, with the id of the fair head waiter told ("~": the unfair
--   waiters, on the free channel, notify_free). _pad: a constant text that keeps meta a
--   hash table once it is large (keep_hashed).
-- meta records, one field per lease or waiter id (ids never start with "_"):
--   "L|token|s1,s2,...|owner"           a holder entry's lease
--   "W|session|weight|lease_ms|owner"   a queue entry's waiter; "|n" at
--                                       its end when a client without a
--                                       total queued it on a member of a
--                                       family of one shard (eleven KEYS):
--                                       never admitted by a family's total
--                                       (admit, lib_admit.lua), which would
--                                       count a lease its renewals do not
--                                       keep counted
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
--           has one: "limit" or "limit:rate_limit:per_ms" (client_arg);
--           a member of a family with a total appends "+total:f" (fair)
--           or "+total:u" (unfair): the total its client was built with

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

-- Per-call state. The lib is loaded two ways (lua.go): prepended to each
-- script for EVAL, where it runs on every call, and as a FUNCTION library,
-- where it runs once per server and each function is called many times. So
-- nothing may keep a value from one call to the next: everything that
-- depends on the call is declared here, and set by bind (below), the first
-- statement of every script. Three kinds:
--
-- The call's inputs: its ARGV and the names it gives. Only bind assigns
-- them, all of them, every call (client_arg rewrites argv[3] in place),
-- but for the member's keys, which switch_member and restore_member (below
-- bind) move from member to member of a family with a total.
local argv
-- The nine keys' names (KEYS[1..9], laid out at the top of this file).
local holders_key, queue_key, sessions_key, free_key, ended_key, meta_key, limit_key, window_key, rate_key
-- channel: the channel base (ARGV[1]); publish_cmd: PUBLISH or SPUBLISH
-- (ARGV[2]).
local channel, publish_cmd
--
-- meta's cache (lib_records.lua, the only file that uses these four):
-- meta holds the fields read (load, records) or written (set, put, del:
-- false) in this call, meta_nums those converted to numbers (num, set),
-- meta_dirty the fields to write and meta_gone (nil until del) those to
-- delete (flush). They stay plain locals, not fields of call (below),
-- because every get, num, set and put uses them: as fields they cost 2-4%
-- of Redis's instructions per FCALL (TestScriptInstructions).
local meta, meta_nums, meta_dirty, meta_gone
--
-- Everything else the call works with: the fields of call, a table that
-- bind makes afresh, so that no field can outlive its call (a call that
-- fails half-way, a Lua error, leaves its table to be replaced whole).
local call
--
-- A member of a keyed family with a total (FamilyOptions.Total) gets four
-- more keys, KEYS[10..13] (lib_family.lua lays them out; settotal.lua and
-- famstatus.lua get those four as KEYS[1..4], and the members' sessions
-- key); without a total they stay nil, and every script runs and stores
-- exactly as it did before totals existed. fam is their cache (lib_family.lua, nil until loaded),
-- fam_client_total, fam_client_limit and fam_fair the client's total, limit and
-- variant (from ARGV[3], client_arg).
local fam_tot_key, fam_leases_key, fam_heads_key, fam_total_key
local fam, fam_client_total, fam_client_limit, fam_fair
-- A member of a family of one shard whose client was built without a
-- total gets the family's f:tot and f:total as KEYS[10..11] instead:
-- while the family counts a total, whose count its leases would bypass,
-- such a client is refused leases (acquire.lua) and resumes (renew.lua),
-- and its calls admit no waiter (counted_total, lib_family.lua;
-- fam_check_tot_key, fam_check_total_key; nil otherwise).
local fam_check_tot_key, fam_check_total_key
-- fam_finish (lib_total.lua) runs at finish, before meta is written, in a
-- call with the family's keys.
local fam_finish

-- bind starts a call: it sets the state above from the call's KEYS and
-- ARGV, and returns an error reply when they do not have the shape every
-- script needs (nil when they do).
local function bind(keys, args, family_only)
  argv = args
  local nk = #keys
  if family_only then
    -- settotal.lua, famstatus.lua: the family's four keys and its
    -- sessions key (a family with a total has one shard), no member.
    if nk ~= 5 then
      return fail('want 5 keys, got ' .. nk)
    end
    holders_key, queue_key, sessions_key, free_key, ended_key, meta_key, limit_key, window_key, rate_key =
      nil, nil, keys[5], nil, nil, nil, nil, nil, nil
    fam_tot_key, fam_leases_key, fam_heads_key, fam_total_key = keys[1], keys[2], keys[3], keys[4]
    fam_check_tot_key = nil
  elseif nk == 9 or nk == 11 then
    holders_key, queue_key, sessions_key, free_key, ended_key, meta_key, limit_key, window_key, rate_key =
      keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7], keys[8], keys[9]
    fam_tot_key = nil
    fam_check_tot_key, fam_check_total_key = keys[10], keys[11]
  elseif nk == 13 then
    holders_key, queue_key, sessions_key, free_key, ended_key, meta_key, limit_key, window_key, rate_key =
      keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7], keys[8], keys[9]
    fam_tot_key, fam_leases_key, fam_heads_key, fam_total_key = keys[10], keys[11], keys[12], keys[13]
    fam_check_tot_key = nil
  else
    return fail('want 9 keys, got ' .. nk .. ' (11 for a member of a family without a total, 13 with one)')
  end
  fam = nil
  channel, publish_cmd = args[1], args[2]
  if publish_cmd ~= 'PUBLISH' and publish_cmd ~= 'SPUBLISH' then
    return fail('bad publish command: ' .. tostring(publish_cmd))
  end
  meta, meta_nums, meta_dirty, meta_gone = nil, {}, {}, nil -- meta: load makes it
  -- The constructor lists the fields that start with a value; the others
  -- start nil and are set on the way, each by one function:
  --   rate_limit, rate_per_us: the rate in force (rate(), lib_rate.lua):
  --     at most rate_limit slots granted in any rate_per_us µs (0: none);
  --   rate_room_at_us: the server time (µs) at which the window has room
  --     for the request or head waiter that the rate held back (rate_fits);
  --   limit_key_value, rate_key_value: the limit and rate keys as
  --     check_limits read them for init (false: absent; lib_records.lua);
  --   freed, freed_next, freed_sorted: slots given back while the free set
  --     held none (give_back, lib_slots.lua; see lib_records.lua), where the
  --     next grant takes from, and whether the rest is sorted;
  --   session_deadlines: session id -> deadline, as read by this call
  --     (session_deadline, lib_queue.lua).
  -- (They are not named here as nil: a constructor makes room for every
  -- field it names, which cost every call more than the growth of the
  -- table on the paths that set them.)
  call = {
    -- The client's rate, from ARGV[3] (client_arg): 0, 0 for none.
    client_rate_limit = 0, client_rate_per_ms = 0,
    -- The server time of the latest clock(), ms and µs.
    clock_ms = 0, clock_us = 0,
    -- Whether meta's rate counters were read (rate_load, lib_records.lua).
    rate_loaded = false,
    -- Whether the horizon _hz moved (extend), so that flush sets the TTLs.
    horizon_moved = false,
  }
  return nil
end

-- save_member returns the current member's per-call state; restore_member
-- makes it current again; switch_member makes the member whose keys start
-- with base ("prefix:{tag}:m:KEY:") current, with a fresh state (meta not
-- loaded yet: load, lib_records.lua) that shares the call's clock, client
-- rate and session cache (the sessions key is the shard's). admit_total
-- (lib_total.lua) moves between the members of a family with a total with
-- them. They stand here, beside bind, because they and bind are all that
-- assign the member's keys above, and because a function's upvalues cost every
-- EVAL call in proportion to the lib's locals already captured above it
-- (Lua 5.1 finds each in a list of them): here, before the rest of the
-- lib, the thirteen each takes cost little.
local function save_member()
  return {holders_key, queue_key, free_key, ended_key, meta_key, limit_key, window_key, rate_key,
    meta, meta_nums, meta_dirty, meta_gone, call}
end

local function restore_member(s)
  holders_key, queue_key, free_key, ended_key, meta_key, limit_key, window_key, rate_key = s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]
  meta, meta_nums, meta_dirty, meta_gone, call = s[9], s[10], s[11], s[12], s[13]
end

local function switch_member(base)
  holders_key, queue_key, free_key, ended_key, meta_key, limit_key, window_key, rate_key =
    base .. 'holders', base .. 'queue', base .. 'free', base .. 'ended', base .. 'meta', base .. 'limit', base .. 'window', base .. 'rate'
  local c = call
  call = {
    client_rate_limit = c.client_rate_limit, client_rate_per_ms = c.client_rate_per_ms,
    clock_ms = c.clock_ms, clock_us = c.clock_us, rate_loaded = false, horizon_moved = false,
    session_deadlines = c.session_deadlines,
  }
  meta, meta_nums, meta_dirty, meta_gone = nil, {}, {}, nil
end

-- int_arg returns ARGV[i] as an integer in [min, max] (max: 2^53 - 1 when
-- not given), or nil and an error reply. Only plain decimal digits count:
-- "1e3", "0x10", "inf" and "nan" are refused, not converted.
local function int_arg(i, name, min, max)
  local s = argv[i]
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
  local v = argv[i]
  if v == nil or v == '' or #v > 128 or not string.find(v, '^[%w%-]+$') or v == SENTINEL then
    return nil, fail('bad ' .. name .. ': ' .. tostring(v))
  end
  return v
end

-- ids_arg returns ARGV[from..] as a list of lease ids, at least one and at
-- most 4096 (renewmany.lua, releasemany.lua), or nil and an error reply.
local function ids_arg(from)
  local n = #argv - from + 1
  if n < 1 or n > 4096 then
    return nil, fail('bad id count: ' .. n .. ' (1 to 4096)')
  end
  local ids = {}
  for i = 1, n do
    local id, err = id_arg(from + i - 1, 'id')
    if err then return nil, err end
    ids[i] = id
  end
  return ids
end

-- client_arg returns the calling client's limit from ARGV[3] ("limit", or
-- "limit:rate_limit:per_ms" for a client built with a rate), or nil and an
-- error reply; it keeps the client's rate in call.client_rate_limit and
-- call.client_rate_per_ms (0, 0: none).
local function client_arg()
  local s = argv[3]
  if fam_tot_key then
    -- A member of a family with a total: "...+total:f" (fair) or ":u".
    local head, t, kind = string.match(s or '', '^(.-)%+(%d+):([fu])$')
    t = t and #t <= 8 and tonumber(t)
    if not t or t < 1 or t > MAX_LIMIT then
      return nil, fail('bad total: ' .. tostring(s))
    end
    fam_client_total, fam_fair = t, kind == 'f'
    s = head
    argv[3] = head
  end
  if s and string.find(s, ':', 1, true) then
    local l, r = string.match(s, '^(%d+):(%d+:%d+)$')
    local rl, rp
    if l and #l <= 8 then
      rl, rp = parse_rate(r, ':')
    end
    if not rl then
      return nil, fail('bad limit: ' .. s)
    end
    call.client_rate_limit, call.client_rate_per_ms = rl, rp
    argv[3] = l
  end
  local v, err = int_arg(3, 'limit', 1, MAX_LIMIT)
  fam_client_limit = v
  return v, err
end

-- clock returns the server time in milliseconds and in microseconds, and
-- keeps them in call.clock_ms and call.clock_us.
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  local ms = s * 1000 + (us - us % 1000) / 1000
  us = s * 1000000 + us
  call.clock_ms, call.clock_us = ms, us
  return ms, us
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
