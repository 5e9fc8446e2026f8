-- lib_queue.lua: grant (a holder entry: slots, fencing token, window
-- record; it comes after the rate, whose window it writes), publish and
-- publish_sessions, and
-- the fair queue's parts: session_deadline (sessions), drop_waiter,
-- evict_heavier (waiters that can never be admitted) and requeue_session
-- (a session's waiters told to ask again).
-- Uses from lib_args.lua: holders_key, queue_key, sessions_key, channel,
-- publish_cmd, call (session_deadlines), MARGIN_MS, SENTINEL, fmt; from lib_records.lua:
-- get, num, next_expiry, set, put, del, records, extend; from
-- lib_slots.lua: parse_waiter; from lib_limit.lua: take_slots; from
-- lib_rate.lua: rate_record; from lib_family.lua: fam_add.

-- grant makes id a holder of n slots until deadline, with the next fencing
-- token: never less than the server clock in microseconds, so tokens keep
-- increasing even when the counter is lost. Returns the token, the slots
-- (a list) and the slots as the record and the messages write them ("s1,s2").
local function grant(id, n, now, now_us, deadline, owner)
  local slots = take_slots(n)
  local token = num('_token') + 1
  if token < now_us then
    token = now_us
  elseif token > (num('_hz') - MARGIN_MS) * 1000 then
    -- The clock is behind the counter (stepped back, with grants enough
    -- since to pass the horizon): the keys, and _token with them, live
    -- until the clock has passed the token, so that once they expire the
    -- clock's floor alone is above every token granted.
    extend(now, math.ceil(token / 1000))
  end
  local t = fmt(token)
  set('_token', token, t)
  -- table.concat would format a number with "%.14g" (C's slow path for
  -- fractions): one slot, as most leases hold, goes through fmt.
  local list = n == 1 and fmt(slots[1]) or table.concat(slots, ',')
  put(id, 'L|' .. t .. '|' .. list .. '|' .. owner)
  redis.call('ZADD', holders_key, fmt(deadline), id)
  if deadline < next_expiry() then
    set('_next', deadline)
  end
  extend(now, deadline)
  rate_record(token, n, now)
  if fam_tot_key then
    fam_add(id, n, now, deadline) -- a family's total counts it
  end
  return token, slots, list
end

local function publish(channel, msg)
  redis.call(publish_cmd, channel, msg)
end

-- publish_sessions publishes msg on the channel of every session listed
-- (live, or dead and not pruned yet): news for every process with fair
-- waiters, whichever waiter it concerns ("n", "h").
local function publish_sessions(msg)
  local sids = redis.call('ZRANGE', sessions_key, 0, -1)
  for i = 1, #sids do
    if sids[i] ~= SENTINEL then
      publish(channel .. ':s:' .. sids[i], msg)
    end
  end
end

-- session_deadline returns a live session's deadline, or nil (each
-- session's read once per call: call.session_deadlines).
local function session_deadline(sid, now)
  local known = call.session_deadlines
  if not known then
    known = {}
    call.session_deadlines = known
  end
  local d = known[sid]
  if d == nil then
    d = tonumber(redis.call('ZSCORE', sessions_key, sid)) or 0
    known[sid] = d
  end
  if d > now then
    return d
  end
  return nil
end

local function drop_waiter(id)
  redis.call('ZREM', queue_key, id)
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
  local ids = redis.call('ZRANGE', queue_key, 0, -1)
  ids[#ids] = nil -- the sentinel
  records(ids)
  for _, id in ipairs(ids) do
    local rec = get(id)
    if rec and string.sub(rec, 1, 1) == 'W' then
      local sid, n = parse_waiter(rec)
      if n > max then
        drop_waiter(id)
        publish(channel .. ':s:' .. sid, 'x ' .. id .. ' ' .. max .. note)
      end
    end
  end
end

-- requeue_session tells each waiter that session sid queued here to ask
-- again ("r id"), and leaves its entry: heartbeat.lua's for a client built
-- without a total while its family counts one (counted_total,
-- lib_family.lua), whose waiters nobody may admit; asked again,
-- acquire.lua refuses each (a total mismatch) and takes its entry out.
local function requeue_session(sid)
  local ids = redis.call('ZRANGE', queue_key, 0, -1)
  ids[#ids] = nil -- the sentinel
  records(ids)
  for _, id in ipairs(ids) do
    local rec = get(id)
    if rec and string.sub(rec, 1, 1) == 'W' and parse_waiter(rec) == sid then
      publish(channel .. ':s:' .. sid, 'r ' .. id)
    end
  end
end
