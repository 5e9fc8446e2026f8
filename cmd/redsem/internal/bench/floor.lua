#!lua name=redsem_floor
-- floor.lua: a benchmark only, never loaded by the library: redsem bench's
-- "floor" variant (floor_acquire, floor_release: the ceiling of a Go client
-- that keeps a lease's records, one call at a time), and lua's
-- BenchmarkFloor (both pairs, pipelined). The leanest script pair that
-- still keeps what a lease of redsem's unfair semaphore promises (server
-- clock, a fencing token, a slot number, a record per id so that a re-sent
-- request finds its answer, a tombstone on release), on a packed layout
-- that this library does not use: all counters in one meta field "c"
-- ("token:used:hw:next"), and nothing else read or written. No argument checks beyond a type, no limit
-- agreement between clients, no queue, rate, key expiry, pruning or
-- notices. What it costs per call is a floor for any layout that keeps those
-- records: docs/benchmarks.md compares it with the library's scripts. The
-- two floors below are written out in full, not through a shared helper,
-- so that each measures only its own steps.
--
-- KEYS: [1] holders ZSET id -> deadline (server ms), [2] free ZSET
--       slot -> slot, [3] ended ZSET id -> until, [4] meta HASH: "c" and
--       one record per id ("L|token|slot" or "R")
-- floor_acquire ARGV: [1] limit, [2] id, [3] lease_ms
--   Reply: {1, now, token, deadline, slot} granted (or held already),
--          {0, now} refused (full), {-2, now} released before
-- floor_release ARGV: [1] id, [2] ms the tombstone lives
--   Reply: {1, now} released, {0, now} nothing held that id

local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function counters(c)
  if not c then
    return 0, 0, 0, math.huge
  end
  local token, used, hw, nxt = string.match(c, '^(%d+):(%d+):(%d+):(%w+)$')
  return tonumber(token), tonumber(used), tonumber(hw), tonumber(nxt)
end

local function pack(token, used, hw, nxt)
  if nxt == math.huge then
    return string.format('%d:%d:%d:inf', token, used, hw)
  end
  return string.format('%d:%d:%d:%d', token, used, hw, nxt)
end

redis.register_function('floor_acquire', function(keys, argv)
  local H, F, M = keys[1], keys[2], keys[4]
  local limit, id, lease_ms = tonumber(argv[1]), argv[2], tonumber(argv[3])
  if not limit or not lease_ms or not id or id == '' then
    return redis.error_reply('ERR floor: bad arguments')
  end
  local now = clock()
  local v = redis.call('HMGET', M, 'c', id)
  local rec = v[2]
  if rec then
    if rec == 'R' then
      return {-2, now}
    end
    local token, slot = string.match(rec, '^L|(%d+)|(%d+)$')
    return {1, now, tonumber(token), tonumber(redis.call('ZSCORE', H, id)), tonumber(slot)}
  end
  local token, used, hw, nxt = counters(v[1])
  if now >= nxt then
    -- expiry (never reached by the benchmark: its leases outlive it)
    return redis.error_reply('ERR floor: expiry is not modelled')
  end
  if used >= limit then
    return {0, now}
  end
  local slot
  if hw > used then
    slot = tonumber(redis.call('ZPOPMIN', F)[1])
  else
    hw = hw + 1
    slot = hw
  end
  token, used = token + 1, used + 1
  local deadline = now + lease_ms
  if deadline < nxt then
    nxt = deadline
  end
  redis.call('ZADD', H, deadline, id)
  redis.call('HSET', M, 'c', pack(token, used, hw, nxt), id, string.format('L|%d|%d', token, slot))
  return {1, now, token, deadline, slot}
end)

redis.register_function('floor_release', function(keys, argv)
  local H, F, E, M = keys[1], keys[2], keys[3], keys[4]
  local id, keep_ms = argv[1], tonumber(argv[2])
  if not keep_ms or not id or id == '' then
    return redis.error_reply('ERR floor: bad arguments')
  end
  local now = clock()
  local v = redis.call('HMGET', M, 'c', id)
  local rec = v[2]
  if not rec or rec == 'R' then
    return {rec and 1 or 0, now}
  end
  local slot = string.match(rec, '^L|%d+|(%d+)$')
  redis.call('ZREM', H, id)
  redis.call('ZADD', F, slot, slot)
  local token, used, hw, nxt = counters(v[1])
  redis.call('HSET', M, 'c', pack(token, used - 1, hw, nxt), id, 'R')
  redis.call('ZADD', E, now + keep_ms, id)
  return {1, now}
end)

-- The same floor on the library's own layout and call shape: its nine KEYS
-- and ARGV (acquire.lua's and release.lua's), the counters read in the
-- library's 13-field HMGET and written as separate fields, records in the
-- library's format. Nothing is checked or done beyond floor_acquire and
-- floor_release.
redis.register_function('floor1_acquire', function(keys, argv)
  local H, F, M = keys[1], keys[4], keys[6]
  local limit, id, lease_ms, owner = tonumber(argv[3]), argv[4], tonumber(argv[6]), argv[10]
  if not limit or not lease_ms or not id or id == '' then
    return redis.error_reply('ERR floor: bad arguments')
  end
  local now = clock()
  local v = redis.call('HMGET', M, '_hz', '_limit', '_fixed', '_token', '_used', '_hw', '_seq', '_q', '_next', '_want', '_prune', '_rx', id)
  local rec = v[13]
  if rec then
    if rec == 'R' then
      return {-2, now}
    end
    local token, slot = string.match(rec, '^L|(%d+)|(%d+)|')
    return {1, now, tonumber(token), tonumber(redis.call('ZSCORE', H, id)), tonumber(slot)}
  end
  local token, used, hw = tonumber(v[4]) or 0, tonumber(v[5]) or 0, tonumber(v[6]) or 0
  local nxt = tonumber(v[9]) or math.huge
  if now >= nxt then
    return redis.error_reply('ERR floor: expiry is not modelled')
  end
  if used >= limit then
    return {0, now}
  end
  local slot
  if hw > used then
    slot = tonumber(redis.call('ZPOPMIN', F)[1])
  else
    hw = hw + 1
    slot = hw
  end
  token, used = token + 1, used + 1
  local deadline = now + lease_ms
  local hset = {'_token', string.format('%d', token), '_used', string.format('%d', used), '_hw', string.format('%d', hw),
    id, string.format('L|%d|%d|%s', token, slot, owner)}
  if deadline < nxt then
    hset[#hset + 1] = '_next'
    hset[#hset + 1] = string.format('%d', deadline)
  end
  redis.call('ZADD', H, deadline, id)
  redis.call('HSET', M, unpack(hset))
  return {1, now, token, deadline, slot}
end)

redis.register_function('floor1_release', function(keys, argv)
  local H, F, E, M = keys[1], keys[4], keys[5], keys[6]
  local id, keep_ms = argv[4], tonumber(argv[6])
  if not keep_ms or not id or id == '' then
    return redis.error_reply('ERR floor: bad arguments')
  end
  local now = clock()
  local v = redis.call('HMGET', M, '_hz', '_limit', '_fixed', '_token', '_used', '_hw', '_seq', '_q', '_next', '_want', '_prune', '_rx', id)
  local rec = v[13]
  if not rec or rec == 'R' then
    return {rec and 1 or 0, now}
  end
  local slot = string.match(rec, '^L|%d+|(%d+)|')
  redis.call('ZREM', H, id)
  redis.call('ZADD', F, slot, slot)
  redis.call('HSET', M, '_used', string.format('%d', tonumber(v[5]) - 1), id, 'R')
  redis.call('ZADD', E, now + keep_ms, id)
  return {1, now}
end)
