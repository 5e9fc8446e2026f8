-- lib_records.lua: the meta hash, read once per call into a cache (meta,
-- meta_nums, meta_dirty, meta_gone: no other file touches them) and
-- written back once at its end: load, load_horizon, rate_load and
-- check_limits read it; get, num and next_expiry read a field, set, put
-- and del change one, and records loads many records; extend moves the
-- horizon _hz; add_free and flush write (the slots held in call.freed, the
-- changed fields, the keys' TTLs), finish flushes and returns a reply;
-- init creates the keys of a new or expired semaphore; start_call begins a
-- SetLimit or SetRate call (once per call id).
-- Uses from lib_args.lua: the key names, meta's cache, call
-- (client_rate_limit, clock_ms, rate_loaded, limit_key_value,
-- rate_key_value, horizon_moved, freed, freed_next), SENTINEL, MARGIN_MS,
-- CHUNK, MAX_LIMIT, fail, stored_limit, stored_rate, clock, fmt.

-- The meta hash is read once per script (HMGET of the counters and of the
-- records a script needs) and written once at the end (flush). The
-- counters (see the top of lib_args.lua): _hz, _limit, _fixed, _token, _used,
-- _hw, _seq, _q, _next, _want, _prune, _rx.

-- load reads the counters and, if given, the record of one id, into a
-- new meta built by one table constructor (sized once: filling an
-- empty table field by field grew it four times). The HMGET's fields are
-- spelled out: building its argument list in a table on every call cost
-- more.
local function load(id)
  local v
  local m = meta_key
  if call.client_rate_limit > 0 then
    -- A client with a rate: the rate's counters too, in the same call.
    v = redis.call('HMGET', m, '_hz', '_limit', '_fixed', '_token', '_used', '_hw', '_seq', '_q', '_next', '_want', '_prune', '_rx',
      '_rate', '_frate', '_rsum', '_rold', '_rwake', id or '_')
    meta = {_hz = v[1], _limit = v[2], _fixed = v[3], _token = v[4], _used = v[5], _hw = v[6], _seq = v[7], _q = v[8],
      _next = v[9], _want = v[10], _prune = v[11], _rx = v[12],
      _rate = v[13], _frate = v[14], _rsum = v[15], _rold = v[16], _rwake = v[17]}
    call.rate_loaded = true
    if id then
      meta[id] = v[18]
    end
  elseif id then
    v = redis.call('HMGET', m, '_hz', '_limit', '_fixed', '_token', '_used', '_hw', '_seq', '_q', '_next', '_want', '_prune', '_rx', id)
    meta = {_hz = v[1], _limit = v[2], _fixed = v[3], _token = v[4], _used = v[5], _hw = v[6], _seq = v[7], _q = v[8],
      _next = v[9], _want = v[10], _prune = v[11], _rx = v[12], [id] = v[13]}
  else
    v = redis.call('HMGET', m, '_hz', '_limit', '_fixed', '_token', '_used', '_hw', '_seq', '_q', '_next', '_want', '_prune', '_rx')
    meta = {_hz = v[1], _limit = v[2], _fixed = v[3], _token = v[4], _used = v[5], _hw = v[6], _seq = v[7], _q = v[8],
      _next = v[9], _want = v[10], _prune = v[11], _rx = v[12]}
  end
end

-- load_horizon is load for a live renewal, which needs only the horizon
-- (extend): the other counters stay unread and unwritten.
local function load_horizon()
  meta = {_hz = redis.call('HGET', meta_key, '_hz')}
end

-- rate_load reads the rate's counters (_rate, _frate, _rsum, _rold,
-- _rwake), once per call, if the semaphore may have any (_rx) or force
-- (load read them already for a client with a rate); fields this call set
-- already keep their value.
local function rate_load(force)
  if call.rate_loaded or not (force or meta['_rx']) then
    return
  end
  call.rate_loaded = true
  local v = redis.call('HMGET', meta_key, '_rate', '_frate', '_rsum', '_rold', '_rwake')
  local f = {'_rate', '_frate', '_rsum', '_rold', '_rwake'}
  for i = 1, 5 do
    if meta[f[i]] == nil then
      meta[f[i]] = v[i]
    end
  end
end

-- check_limits returns an error reply when a stored limit (meta's _fixed
-- or _limit, or the SetLimit key of a semaphore whose other keys expired)
-- is not an integer in [1, MAX_LIMIT]; scripts call it after load and
-- before their first write, and SetLimit, which overwrites them, does not.
local function check_limits()
  rate_load()
  local fixed, frate = meta['_fixed'], meta['_frate']
  if not meta['_hz'] then
    fixed = redis.call('GET', limit_key)
    call.limit_key_value = fixed or false -- init reads it from here
    frate = redis.call('GET', rate_key)
    call.rate_key_value = frate or false
  end
  if stored_limit(fixed) == false then
    return fail('the stored limit ' .. limit_key .. ' is ' .. string.format('%q', fixed) ..
      ', not an integer in [1, ' .. MAX_LIMIT .. ']: set it again with SetLimit')
  end
  if meta['_hz'] and stored_limit(meta['_limit']) == false then
    return fail('the stored counter _limit of ' .. meta_key .. ' is ' .. string.format('%q', meta['_limit']) ..
      ', not an integer in [1, ' .. MAX_LIMIT .. ']')
  end
  if frate and stored_rate(frate) == false then
    return fail('the stored rate ' .. rate_key .. ' is ' .. string.format('%q', frate) ..
      ', not "limit/per_ms": set it again with SetRate')
  end
  if meta['_hz'] and meta['_rate'] and stored_rate(meta['_rate']) == false then
    return fail('the stored counter _rate of ' .. meta_key .. ' is ' .. string.format('%q', meta['_rate']) ..
      ', not "limit/per_ms"')
  end
  return nil
end

-- get returns a meta field as loaded or since set; records not loaded are
-- read on demand (one HMGET for many with records()).
local function get(f)
  return meta[f]
end

-- num returns a meta field as a number (0 when absent). Each field is
-- converted once per call: meta_nums keeps what num read and what set
-- wrote as a number (a conversion runs strtod, and the scripts read _used,
-- _q and the like many times per call).
local function num(f)
  local v = meta_nums[f]
  if v == nil then
    v = tonumber(meta[f]) or 0
    meta_nums[f] = v
  end
  return v
end

-- next_expiry is _next as a number: math.huge when no holder is known.
local function next_expiry()
  local v = meta_nums['_next']
  if v then
    return v
  end
  v = meta['_next']
  if not v or v == 'inf' then
    v = math.huge
  else
    v = tonumber(v) or 0
  end
  meta_nums['_next'] = v
  return v
end

-- set writes the number v to a meta field (flush sends it): kept as one in
-- meta_nums, written as fmt(v), or as text when the caller formatted it
-- already. put writes a text. (Two functions rather than a type() test in
-- one: each C function a script calls costs more than the test saves.)
local function set(f, v, text)
  meta_nums[f] = v
  meta[f] = text or fmt(v) -- Lua's own conversion prints 1e+14 for large numbers
  meta_dirty[f] = true
  if meta_gone then
    meta_gone[f] = nil
  end
end

local function put(f, v)
  meta_nums[f] = nil
  meta[f] = v
  meta_dirty[f] = true
  if meta_gone then
    meta_gone[f] = nil
  end
end

local function del(f)
  meta_nums[f] = nil
  meta[f] = false
  meta_dirty[f] = nil
  meta_gone = meta_gone or {}
  meta_gone[f] = true
end

-- records loads the meta records of ids not loaded yet, in one HMGET.
local function records(ids)
  local want
  for i = 1, #ids do -- numeric loops: ipairs calls a C function per element
    local id = ids[i]
    if meta[id] == nil then
      want = want or {}
      want[#want + 1] = id
    end
  end
  if not want then
    return
  end
  if #want == 1 then
    -- One record (a Release's own, admit's head waiter): no tables.
    meta[want[1]] = redis.call('HGET', meta_key, want[1])
    return
  end
  for i = 1, #want, CHUNK do
    local part = {unpack(want, i, math.min(i + CHUNK - 1, #want))}
    local v = redis.call('HMGET', meta_key, unpack(part))
    for k, id in ipairs(part) do
      meta[id] = v[k]
    end
  end
end

-- extend keeps every key alive until at least until_ms + MARGIN_MS. It only
-- writes when that is past the horizon, and then doubles the remaining
-- lifetime, so it runs about once per TTL, not once per call. The PEXPIREATs
-- themselves are sent by flush, after every write of the script.
local function extend(now, until_ms)
  local hz = num('_hz')
  if until_ms + MARGIN_MS <= hz then
    return
  end
  hz = until_ms + MARGIN_MS + math.max(until_ms - now, MARGIN_MS)
  set('_hz', hz)
  call.horizon_moved = true
end

-- call.freed holds the slots that this call gave back while the free set
-- held none (give_back), instead of writing them there at once: a grant
-- later in the same call (a Release that admits the next waiter) takes them
-- from there, which saves a ZADD and a ZPOPMIN of the free set per
-- handoff, and flush writes the rest. While call.freed holds slots the
-- free set holds none (give_back writes there only when it held some
-- already), so the lowest free slots are call.freed's. nil: none this
-- call. Grants take from call.freed_next on, and sort the slots not yet
-- taken only after more were given back (call.freed_sorted): one Release
-- may admit thousands of waiters, and sorting or copying the list on each
-- grant made that call quadratic (seconds for 4 500).

-- add_free writes slots[from..] into the free set.
local function add_free(slots, from)
  if from == #slots then
    local s = slots[from]
    redis.call('ZADD', free_key, s, s)
    return
  end
  for i = from, #slots, CHUNK / 2 do
    local args = {}
    for k = i, math.min(i + CHUNK / 2 - 1, #slots) do
      args[#args + 1] = slots[k]
      args[#args + 1] = slots[k]
    end
    redis.call('ZADD', free_key, unpack(args))
  end
end

local function flush()
  local c = call
  if c.freed then
    add_free(c.freed, c.freed_next)
    c.freed = nil
  end
  if next(meta_dirty) ~= nil then
    local hset, n = {}, 0
    for f in pairs(meta_dirty) do
      hset[n + 1] = f
      hset[n + 2] = meta[f]
      n = n + 2
    end
    if n <= CHUNK then
      redis.call('HSET', meta_key, unpack(hset))
    else
      for i = 1, n, CHUNK do
        redis.call('HSET', meta_key, unpack(hset, i, math.min(i + CHUNK - 1, n)))
      end
    end
    meta_dirty = {}
  end
  if meta_gone and next(meta_gone) ~= nil then
    local hdel, n = {}, 0
    for f in pairs(meta_gone) do
      n = n + 1
      hdel[n] = f
    end
    for i = 1, n, CHUNK do
      redis.call('HDEL', meta_key, unpack(hdel, i, math.min(i + CHUNK - 1, n)))
    end
    meta_gone = nil
  end
  if c.horizon_moved then
    local hz = meta['_hz']
    for _, k in ipairs({holders_key, queue_key, sessions_key, free_key, ended_key, window_key}) do
      if k ~= sessions_key then
        redis.call('PEXPIREAT', k, hz)
      else
        -- The sessions key may be shared by the members of a keyed family,
        -- whose horizons differ: it is never shortened (a plain
        -- semaphore's horizon only grows, so this changes nothing there).
        local ttl = redis.call('PTTL', sessions_key)
        if ttl == -1 or (ttl >= 0 and c.clock_ms + ttl < tonumber(hz)) then
          redis.call('PEXPIREAT', sessions_key, hz)
        end
      end
    end
    redis.call('PEXPIREAT', meta_key, hz)
    c.horizon_moved = false
  end
end

-- finish writes what the script changed in meta (and, for a member of a
-- family with a total, in the family's keys) and returns reply.
local function finish(reply)
  if fam_tot_key then
    fam_finish() -- a family with a total: its own keys (lib_total.lua)
  end
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
  local c = call
  for _, k in ipairs({holders_key, queue_key, sessions_key, free_key, ended_key}) do -- not the window (see above)
    redis.call('ZADD', k, 'inf', SENTINEL)
  end
  local o = c.limit_key_value
  if o == nil then
    o = redis.call('GET', limit_key)
  end
  if stored_limit(o) then
    put('_fixed', o)
  end
  local r = c.rate_key_value
  if r == nil then
    r = redis.call('GET', rate_key)
  end
  if r and stored_rate(r) then
    put('_frate', r)
    put('_rx', '1')
  end
  put('_hz', '0')
  put('_next', 'inf')
  extend(now, now)
end

-- start_call starts a SetLimit or SetRate call whose id is call_id: it
-- reads the clock, loads meta with the call's record and creates the keys
-- if they are missing (init). It returns now and now_us, and, when this
-- call ran already (a re-sent copy finds its "S" record), the reply to
-- return: {now}, with what init wrote flushed.
local function start_call(call_id)
  local now, now_us = clock()
  load(call_id)
  init(now)
  if get(call_id) then
    return now, now_us, finish({now}) -- this call ran already
  end
  return now, now_us, nil
end
