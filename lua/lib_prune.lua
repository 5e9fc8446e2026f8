-- lib_prune.lua: the work that removes what is over: expire (holders past
-- their deadline), keep_hashed (meta's "_pad", whose value PAD is stored
-- in Redis as it is written here: it names lib.lua and stays so), prune
-- (tombstones past their time, dead sessions and their waiters) and
-- tombstone, which writes one.
-- Uses from lib_args.lua: the key names, argv, BATCH, CHUNK, TOMB_MS, fmt,
-- int_arg, clock; from lib_records.lua: get, num, next_expiry, set, put,
-- del, records, extend, start_call, finish;
-- from lib_slots.lua: parse_waiter, drop_holders.

-- expire removes holders past their deadline, once the earliest deadline
-- may have passed (_next is a lower bound of every holder deadline).
-- Returns how many holders it removed.
local function expire(now)
  if now < next_expiry() then
    return 0
  end
  local dead = redis.call('ZRANGE', holders_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, BATCH)
  drop_holders(dead)
  if #dead == BATCH then
    set('_next', now) -- more may be due: the next call goes on
  else
    local first = redis.call('ZRANGE', holders_key, 0, 0, 'WITHSCORES')
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
  if redis.call('HLEN', meta_key) > HASHED_AT then
    redis.call('HSETNX', meta_key, '_pad', PAD)
  end
end

-- prune drops tombstones past their time, and dead sessions with their
-- waiters wherever they stand in the queue (admit also evicts dead waiters
-- it meets at the head). It runs at most every PRUNE_MS (sooner while a
-- batch was full), so its cost is spread thin, and its scan of the queue
-- when a session died is rare. A next time further ahead than that means
-- that the server's clock stepped back: it runs then, rather than not
-- until the clock is back where it was.
local PRUNE_MS = 100
local function prune(now)
  local at = num('_prune')
  if now < at and at <= now + PRUNE_MS then
    return
  end
  keep_hashed()
  local due = redis.call('ZRANGE', ended_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, BATCH)
  if #due > 0 then
    redis.call('ZREM', ended_key, unpack(due))
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
  local dead = redis.call('ZRANGE', sessions_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, BATCH)
  if #dead > 0 then
    redis.call('ZREM', sessions_key, unpack(dead))
    if num('_q') > 0 then
      local gone = {}
      for _, sid in ipairs(dead) do
        gone[sid] = true
      end
      local ids = redis.call('ZRANGE', queue_key, 0, -1)
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
        redis.call('ZREM', queue_key, unpack(evict, i, math.min(i + CHUNK - 1, #evict)))
      end
      set('_q', num('_q') - #evict)
    end
  end
  if #due == BATCH or #dead == BATCH then
    set('_prune', now)
  else
    set('_prune', now + PRUNE_MS)
  end
end

-- tombstone marks id as released ("R"), cancelled ("C") or a SetLimit call
-- that ran ("S") until until_ms.
local function tombstone(id, kind, now, until_ms)
  put(id, kind)
  redis.call('ZADD', ended_key, fmt(until_ms), id)
  extend(now, until_ms)
end

-- start_setting begins a SetLimit or SetRate call whose id is call_id:
-- ARGV[i] is its optional refuse_after (server ms after which its caller
-- has certainly given up: the call then writes nothing and replies {-1,
-- now}), ARGV[i+1] its optional "cancel" (the caller gave up without a
-- deadline: only the call's record is written, so that the call, should it
-- run later, changes nothing). It returns now, now_us and the reply to
-- return at once (refused, run already, cancelled, or a bad argument), or
-- nil to go on.
local function start_setting(call_id, i)
  local refuse_after = 0
  if argv[i] ~= nil then
    local err
    refuse_after, err = int_arg(i, 'refuse_after', 0)
    if err then return nil, nil, err end
  end
  if refuse_after > 0 then
    local t = clock()
    if t > refuse_after then
      return nil, nil, {-1, t} -- its caller gave up: nothing is written
    end
  end
  local now, now_us, ran = start_call(call_id)
  if ran then
    return now, now_us, ran
  end
  if argv[i + 1] == 'cancel' then
    tombstone(call_id, 'S', now, now + TOMB_MS)
    return now, now_us, finish({now})
  end
  return now, now_us, nil
end
