-- lib_rate.lua: the rate (Options.Rate) and its window: the rate in force
-- for the call (rate, which sets call.rate_limit and call.rate_per_us),
-- establish_rate, rate_keep, and the window's records (rec_weight,
-- rate_trim, rate_fits, which sets call.rate_room_at_us, rate_record,
-- rate_ms).
-- Uses from lib_args.lua: window_key, call (client_rate_limit,
-- client_rate_per_ms, clock_ms, horizon_moved, rate_limit, rate_per_us,
-- rate_room_at_us), SENTINEL, CHUNK, stored_limit, stored_rate, fmt; from
-- lib_records.lua: rate_load, get, num, set, put, del, extend.

-- rate returns the rate limit in force (0: none) and sets call.rate_limit
-- and call.rate_per_us, once per call: SetRate's rate, else the one live
-- clients established (none, once they established a limit without a
-- rate), else the client's.
local function rate()
  local c = call
  if c.rate_limit then
    return c.rate_limit
  end
  if c.client_rate_limit == 0 and not get('_rx') then
    c.rate_limit, c.rate_per_us = 0, 0 -- no rate anywhere: nothing to read
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
    l, p = c.client_rate_limit, c.client_rate_per_ms
  end
  c.rate_limit, c.rate_per_us = l, p * 1000
  return l
end

-- rate_keep keeps every key (so the window's records) until the youngest
-- record leaves a window of per_ms: when the period in force grows
-- (SetRate, or an idle semaphore taking a client's rate), grants made
-- before must still count against it after the leases that kept the keys
-- alive have ended.
local function rate_keep(per_ms)
  local r = redis.call('ZREVRANGE', window_key, 1, 1, 'WITHSCORES') -- 0: the sentinel
  if r[2] then
    extend(call.clock_ms, math.floor(tonumber(r[2]) / 1000) + per_ms + 1)
  end
end

-- establish_rate is establish for the rate: true, or nil and the rate
-- that live clients established ("limit/per_ms") when it differs from the
-- client's while slots are held or waiters queued. An idle semaphore takes
-- the client's rate (its window's records still count).
local function establish_rate()
  local c = call
  local crl, crp = c.client_rate_limit, c.client_rate_per_ms
  if crl == 0 and not get('_rx') then
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
  if el ~= crl or ep ~= crp then
    if num('_used') > 0 or num('_q') > 0 then
      return nil, fmt(el) .. '/' .. fmt(ep)
    end
    if crl == 0 then
      del('_rate')
    else
      put('_rate', fmt(crl) .. '/' .. fmt(crp))
      put('_rx', '1')
      rate_keep(crp)
    end
    c.rate_limit = nil -- rate() reads it again
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
  local cutoff = now_us - call.rate_per_us
  local old = get('_rold')
  if not old or old == 'inf' or tonumber(old) > cutoff then
    return
  end
  local gone = redis.call('ZRANGE', window_key, '-inf', cutoff, 'BYSCORE', 'LIMIT', 0, CHUNK)
  if #gone > 0 then
    local sum = 0
    for _, m in ipairs(gone) do
      sum = sum + rec_weight(m)
    end
    redis.call('ZREM', window_key, unpack(gone))
    set('_rsum', math.max(num('_rsum') - sum, 0))
  end
  if #gone == CHUNK then
    set('_rold', cutoff) -- more may be due: the next call goes on
  else
    local first = redis.call('ZRANGE', window_key, 0, 0, 'WITHSCORES')
    put('_rold', first[2] or 'inf')
  end
end

-- rate_fits reports whether the rate lets n more slots be granted now: the
-- window's records younger than the period, plus n, stay within the rate's
-- limit. Records are trimmed only when the sum of all of them (an upper
-- bound) would not let n in, so a window with room costs no command. When
-- n does not fit, it sets call.rate_room_at_us to when it will (the time of
-- the record whose leaving makes room, plus the period).
local function rate_fits(n, now_us)
  if rate() == 0 then
    return true
  end
  local c = call
  local limit = c.rate_limit
  if num('_rsum') + n <= limit then
    return true
  end
  rate_trim(now_us)
  local sum = num('_rsum')
  if sum + n <= limit then
    return true
  end
  -- Each record holds at least one slot: the first `need` records may be
  -- enough (one, for the usual single slot), then more in batches.
  local need, acc, from = sum + n - limit, 0, 0
  local batch = math.min(need, 64)
  while true do
    local recs = redis.call('ZRANGE', window_key, from, from + batch - 1, 'WITHSCORES')
    for i = 1, #recs, 2 do
      if recs[i] == SENTINEL then
        break
      end
      acc = acc + rec_weight(recs[i])
      if acc >= need then
        c.rate_room_at_us = math.max(tonumber(recs[i + 1]) + c.rate_per_us, now_us)
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
  -- most the rate's limit), so that the wake time is the window's, not now.
  set('_rsum', acc)
  if acc + n <= limit then
    return true
  end
  if n <= limit then
    return rate_fits(n, now_us)
  end
  c.rate_room_at_us = now_us
  return false
end

-- rate_record adds a grant of n slots with token to the window, when a
-- rate is in force (rate_fits ran before every grant).
local function rate_record(token, n, now)
  local c = call
  if not c.rate_limit or c.rate_limit == 0 then
    return
  end
  local old = get('_rold')
  if not old then
    -- The first grant under a rate since the keys were made (init makes
    -- no window key): the window key's sentinel, and its TTL (every key's
    -- is set again).
    redis.call('ZADD', window_key, 'inf', SENTINEL)
    c.horizon_moved = true
  end
  local t = fmt(token)
  redis.call('ZADD', window_key, t, t .. ':' .. n)
  set('_rsum', num('_rsum') + n)
  if not old or old == 'inf' then
    set('_rold', token)
  end
  extend(now, now + c.rate_per_us / 1000)
end

-- rate_ms is call.rate_room_at_us as ms from now_us (rounded up), -1 when
-- not set.
local function rate_ms(now_us)
  local at = call.rate_room_at_us
  if not at then
    return -1
  end
  return math.max(math.ceil((at - now_us) / 1000), 0)
end
