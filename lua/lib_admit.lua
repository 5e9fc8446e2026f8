-- lib_admit.lua: what follows a change of the free slots: admit (the fair
-- queue's waiters, in arrival order), notify_free (unfair waiters), hint
-- (when to look again), and append for the scripts' replies.
-- Uses from lib_args.lua: queue_key, meta_key, channel, call (clock_us,
-- rate_room_at_us), SENTINEL, fmt; from lib_records.lua: get,
-- num, next_expiry, set, put, del, records; from lib_family.lua: fam,
-- fam_bound, fam_room; from lib_slots.lua:
-- parse_waiter; from lib_rate.lua: rate, rate_fits, rate_ms; from
-- lib_queue.lua: grant, publish, publish_sessions, session_deadline.

-- admit grants free slots to the earliest live waiters in arrival order,
-- evicting dead ones (their session is gone) it meets at the head, and
-- waiters heavier than the limit or the rate's limit (told with an "x"
-- message). A head waiter that needs more slots than are free, or than the
-- rate allows now, keeps its place and stops admission: nobody overtakes
-- it. When the rate holds it back, its session is told when the rate will
-- let it in ("w id ms", once per head and time), so that its process runs
-- the admission again then, and every live session that the window holds
-- the queue ("h now ms meta-key": the waiters behind the head, in any
-- process, were held back by the rate). A grant lasts until now + lease_ms, but no longer
-- than the grantee's session until the grantee renews it, so that it dies
-- with a process that never learned of it. Each grantee's session is told
-- "g id token deadline slots". Returns the grants as a flat list
-- (id, token, deadline, "slots", ...).
--
-- In a member of a family with a total (admit_total, lib_total.lua, calls
-- it with single set), a head waiter that a client without a total queued
-- is taken out and told to ask again ("r id"), a head waiter heavier than
-- the total in force is
-- evicted as one heavier than the limit ("x id total"), one that fits in
-- its member but not in what is left of the total keeps its place and
-- admit returns "total" besides the grants, and it returns after one
-- grant: the next head of the family may be another member's.
local function admit(now, now_us, limit, single)
  local out = {}
  local rate_limit = rate()
  while num('_q') > 0 and limit - num('_used') > 0 do
    local head = redis.call('ZPOPMIN', queue_key)
    local id, seq = head[1], head[2]
    if id == nil or id == SENTINEL then
      redis.call('ZADD', queue_key, 'inf', SENTINEL)
      set('_q', 0) -- the count drifted: nothing real is queued
      break
    end
    records({id})
    local rec = get(id)
    local sid, n, lease_ms, owner, untotalled
    if rec and string.sub(rec, 1, 1) == 'W' then
      sid, n, lease_ms, owner, untotalled = parse_waiter(rec)
    end
    local sdl = sid and session_deadline(sid, now)
    if not sdl then
      del(id) -- a dead waiter: evicted
      set('_q', num('_q') - 1)
    elseif fam_tot_key and untotalled then
      -- Queued by a client without a total (before the family counted
      -- one): its renewals would not keep its lease counted. It leaves the
      -- queue, and its process is told to ask again, which acquire.lua
      -- refuses (a total mismatch).
      del(id)
      set('_q', num('_q') - 1)
      publish(channel .. ':s:' .. sid, 'r ' .. id)
    elseif fam_tot_key and n > fam_bound() then
      del(id) -- heavier than the family's total: never admitted
      set('_q', num('_q') - 1)
      publish(channel .. ':s:' .. sid, 'x ' .. id .. ' ' .. fmt(fam_bound()))
    elseif n > limit or (rate_limit > 0 and n > rate_limit) then
      del(id)
      set('_q', num('_q') - 1)
      if n > limit then
        publish(channel .. ':s:' .. sid, 'x ' .. id .. ' ' .. limit)
      else
        publish(channel .. ':s:' .. sid, 'x ' .. id .. ' ' .. rate_limit .. ' rate')
      end
    elseif n > limit - num('_used') then
      redis.call('ZADD', queue_key, seq, id) -- not enough free yet: keep the place
      break
    elseif not rate_fits(n, now_us) then
      redis.call('ZADD', queue_key, seq, id) -- the rate's window is full: keep the place
      local wake = fmt(call.rate_room_at_us) .. ' ' .. id
      if get('_rwake') ~= wake then
        put('_rwake', wake)
        local ms = rate_ms(now_us)
        publish(channel .. ':s:' .. sid, 'w ' .. id .. ' ' .. ms)
        -- Every live session (the waiters behind the head may wait in
        -- other processes): the window holds this semaphore's queue for
        -- ms, as found at now ("h now ms meta-key").
        publish_sessions('h ' .. fmt(now) .. ' ' .. ms .. ' ' .. meta_key)
      end
      break
    elseif fam_tot_key and n > fam_room() then
      redis.call('ZADD', queue_key, seq, id) -- the family's total is full: keep the place
      return out, 'total'
    else
      set('_q', num('_q') - 1)
      local deadline = now + lease_ms
      if sdl < deadline then
        deadline = sdl
      end
      local token, _, list = grant(id, n, now, now_us, deadline, owner)
      publish(channel .. ':s:' .. sid, 'g ' .. id .. ' ' .. fmt(token) .. ' ' .. fmt(deadline) .. ' ' .. list)
      out[#out + 1] = id
      out[#out + 1] = token
      out[#out + 1] = deadline
      out[#out + 1] = list
      if single then
        break
      end
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
  local rate_limit = rate()
  if rate_limit > 0 then
    if not rate_fits(1, call.clock_us) then
      -- Slots are free but the window is full: tell the waiters so (once
      -- per time the window has room), without waking them ("0 META ms
      -- now": a waiter that gives up before then was held by the rate,
      -- not by the limit, unless the rate was set after now). An older
      -- client reads it as a notice of no slot.
      local wake = fmt(call.rate_room_at_us) .. ' ~'
      if get('_rwake') ~= wake then
        put('_rwake', wake)
        publish(channel .. ':free', '0 ' .. meta_key .. ' ' .. rate_ms(call.clock_us) .. ' ' .. fmt(now))
      end
      return
    end
    free = math.min(free, rate_limit - num('_rsum'))
    if free <= 0 then
      return
    end
  end
  publish(channel .. ':free', free .. ' ' .. meta_key)
end

-- hint returns ms until the earliest holder (of any member, in a family
-- with a total) may expire, or until the rate
-- lets in what it held back in this call (call.rate_room_at_us) if that is
-- sooner; -1 with neither.
local function hint(now)
  local n = next_expiry()
  local h = -1
  if n ~= math.huge then
    h = math.max(n - now, 0)
  end
  if call.rate_room_at_us then
    local r = rate_ms(call.clock_us)
    if h < 0 or r < h then
      h = r
    end
  end
  if fam_tot_key and fam_load()._next ~= math.huge then
    -- A member of a family with a total: a lease of any member that
    -- expires frees room in the total.
    local f = math.max(fam._next - now, 0)
    if h < 0 or f < h then
      h = f
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
