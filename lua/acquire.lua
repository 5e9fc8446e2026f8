-- acquire.lua: one attempt to take n slots at once; in queue mode (fair) it
-- also joins the queue, or reports the place it already has.
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua; eleven for a member of
-- a family of one shard whose client has no total: the family's f:tot and
-- f:total follow, to refuse it while the family counts one).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] id (lease/waiter UUID, reused on retries: the script is idempotent),
--       [5] n: slots wanted (>= 1), [6] lease_ms (>= 1),
--       [7] mode: "try" (one attempt), "wait" (one attempt of an unfair
--           waiter: on failure it asks releases to publish freed-slot
--           notices for want_ms), or "queue" (fair: queue when not granted),
--       [8] session id (queue mode; "-" otherwise), [9] want_ms (wait mode),
--       [10] owner label, [11] max queue entries (queue mode; 0: no bound),
--       [12] optional: refuse_after, server ms after which the caller has
--           certainly given up (its context's deadline, mapped to server
--           time, plus a margin); 0 or absent: none. A request that runs
--           later (held in the network, or behind a paused server) writes
--           nothing and replies -2, however long ago its undo's
--           cancellation record was pruned.
-- Reply: {1, now, token, deadline_ms, slot, ...}  granted (or held already)
--        {0, now, hint_ms, position, rate_ms}    not granted; hint_ms is the
--                                                time until the earliest
--                                                holder may expire, or the
--                                                rate lets in the request
--                                                (or head waiter) it held
--                                                back, if sooner (-1:
--                                                neither); position in the
--                                                queue (0 = head) or -1 if
--                                                not queued; rate_ms: n
--                                                slots were free and nobody
--                                                queued, but the rate's
--                                                window was full: ms until
--                                                it has room (-1: not so);
--                                                with rate_ms >= 0 the reply
--                                                goes on with the rate in
--                                                force: rate_limit, per_ms
--        {0, now, hint_ms, position, rate_ms, rate_limit, per_ms, floor}
--                                                the same in queue mode,
--                                                always this long (rate_limit
--                                                and per_ms 0 unless
--                                                rate_ms >= 0), where rate_ms
--                                                is also >= 0 when the queue
--                                                is not empty but the rate
--                                                holds back its head waiter
--                                                while slots are free for it
--                                                (ms until the window has
--                                                room for the head); floor is
--                                                max(_token, now_us - 1):
--                                                every grant made before
--                                                this call has a token at
--                                                most floor, every grant
--                                                made after it a greater
--                                                one, so a waiter tells a
--                                                grant that answers this
--                                                queue attempt from an older
--                                                one (delayed, or from
--                                                before a data loss)
--        {-1, now, established}                  the client's limit disagrees
--        {-2, now}                               the id was cancelled (undo
--                                                ran first) or released, or
--                                                the request came after
--                                                refuse_after
--        {-3, now, limit, rate_limit[, total]}   n is above the limit in
--                                                force, or above the rate's
--                                                limit (0: no rate), or
--                                                (total given) above the
--                                                family's total in force
--        {-4, now, entries}                      the queue is full
--        {-5, now}                               queue mode: the session is
--                                                not live (it expired while
--                                                its process was busy or
--                                                paused); nothing written:
--                                                make a new session, then
--                                                ask again
--        {-6, now, established}                  the client's rate disagrees
--                                                with the one live clients
--                                                established ("limit/per_ms",
--                                                "0/0": none)
--        {-7, now, established}                  a member of a family with a
--                                                total: the client's total
--                                                disagrees with the one live
--                                                clients established (or
--                                                SetTotal set; "0": none);
--                                                with eleven keys, the family
--                                                counts a total and the
--                                                client has none (a waiter
--                                                of this id leaves the
--                                                queue)
-- A member of a family with a total (KEYS[10..13], lib_family.lua) is
-- granted only when its member and the family's total both have room, and
-- (fair) no earlier head of the family that fits in its member waits for
-- the total (admit_total, lib_total.lua); its queue entries take the
-- family's arrival numbers.
-- Errors: "ERR redsem: ..." for bad arguments, a wrong number of keys, or a
-- stored limit that is not an integer in [1, 2^20], before any write.
local client_limit, err = client_arg()
if err then return err end
local id; id, err = id_arg(4, 'id')
if err then return err end
local n; n, err = int_arg(5, 'n', 1, MAX_LIMIT)
if err then return err end
local lease_ms; lease_ms, err = int_arg(6, 'lease_ms', 1)
if err then return err end
local mode = ARGV[7]
if mode ~= 'try' and mode ~= 'wait' and mode ~= 'queue' then return fail('bad mode: ' .. tostring(mode)) end
local sid, want_ms, max_q
if mode == 'queue' then
  sid, err = id_arg(8, 'session')
  if err then return err end
  max_q, err = int_arg(11, 'max_waiters', 0)
  if err then return err end
elseif mode == 'wait' then
  want_ms, err = int_arg(9, 'want_ms', 1)
  if err then return err end
end
local owner = ARGV[10] or ''
if string.find(owner, '[|\n]') then return fail('bad owner: ' .. owner) end
local refuse_after = 0
if ARGV[12] ~= nil then
  refuse_after, err = int_arg(12, 'refuse_after', 0)
  if err then return err end
end

local now, now_us = clock()
if refuse_after > 0 and now > refuse_after then
  return {-2, now} -- the caller gave up long ago: nothing is written
end
load(id)
err = check_limits()
if err then return err end
local counted = counted_total()
if counted then
  -- A client built without a total, on a member of a family that counts
  -- one: its leases would not be counted, and so bypass it. A waiter of
  -- this id that it queued before the family counted one leaves the queue
  -- (nobody may admit it: its lease would not be counted either).
  local rec = get(id)
  if rec and string.sub(rec, 1, 1) == 'W' then
    drop_waiter(id)
  end
  return finish({-7, now, tonumber(counted) or 0})
end
init(now)

local function granted(token, deadline, slots)
  local out = {1, now, token, deadline}
  return finish(append(out, slots))
end

-- Seen before: held, queued, or finished.
local rec = get(id)
if rec then
  local kind = string.sub(rec, 1, 1)
  if kind == 'C' or kind == 'R' then
    return finish({-2, now})
  elseif kind == 'L' then
    local held = tonumber(redis.call('ZSCORE', holders_key, id))
    if held and held > now then
      local token, slots = parse_lease(rec)
      return granted(token, held, slots)
    end
    -- Expired meanwhile (a request re-sent or delayed past its lease):
    -- remove it here, whatever its place among the expired (expire() below
    -- handles only the earliest BATCH), so that its slots go back before
    -- the attempt goes on and overwrites the record.
    drop_holders({id})
  elseif kind == 'W' then
    local qsid = parse_waiter(rec)
    local pos = redis.call('ZRANK', queue_key, id)
    if mode == 'queue' and qsid == sid and pos then
      if session_deadline(sid, now) then
        return finish({0, now, hint(now), pos, -1, 0, 0, math.max(num('_token'), now_us - 1)})
      end
      drop_waiter(id) -- its session died: the entry would be evicted unseen
      return finish({-5, now})
    end
    -- queued under another session (the process's session died and it
    -- queues again under a new one), or asked without queueing: leave
    if pos then
      drop_waiter(id)
    else
      del(id)
    end
  end
end

expire(now)
-- More than one batch expired together (a mass expiry): a few more batches
-- while this request still lacks slots, so that a TryAcquire sees the
-- slots of every expired holder, at a bounded cost (16 batches at most).
for _ = 1, 15 do
  if now < next_expiry() or limit_in_force(client_limit) - num('_used') >= n then
    break
  end
  expire(now)
end
prune(now)
local limit, established = establish(client_limit)
if not limit then
  return finish({-1, now, established})
end
local ok; ok, established = establish_rate()
if not ok then
  return finish({-6, now, established})
end
if n > limit or (rate() > 0 and n > call.rate_limit) then
  return finish({-3, now, limit, call.rate_limit})
end
-- total_blocked: a member of a family with a total, whose earliest waiting
-- head (of any member) that fits in its member finds the total full: a new
-- request must not go before it.
local total_blocked = false
if fam_tot_key then
  fam_expire(now)
  local ok; ok, established = fam_establish()
  if not ok then
    return finish({-7, now, established})
  end
  if n > fam_bound() then
    return finish({-3, now, limit, call.rate_limit or 0, fam_bound()})
  end
  local _, stop = admit_total(now, now_us, {})
  total_blocked = stop == 'total'
elseif num('_q') > 0 then
  admit(now, now_us, limit)
end

-- Free slots with nobody queued: nobody is jumped. The rate may still hold
-- the request back (rate_ms tells for how long).
local wait_ms = -1
if num('_q') == 0 and limit - num('_used') >= n and
    (not fam_tot_key or (not total_blocked and n <= fam_room())) then
  if rate_fits(n, now_us) then
    local token, slots = grant(id, n, now, now_us, now + lease_ms, owner)
    return granted(token, now + lease_ms, slots)
  end
  wait_ms = rate_ms(now_us)
end

local function refused(pos)
  if mode == 'queue' then
    if wait_ms < 0 and call.rate_room_at_us then
      wait_ms = rate_ms(now_us) -- admit stopped at a head that the rate holds back
    end
    local rl, per = 0, 0
    if wait_ms >= 0 then
      rl, per = call.rate_limit, call.rate_per_us / 1000
    end
    return finish({0, now, hint(now), pos, wait_ms, rl, per, math.max(num('_token'), now_us - 1)})
  end
  if wait_ms < 0 then
    return finish({0, now, hint(now), pos, -1})
  end
  return finish({0, now, hint(now), pos, wait_ms, call.rate_limit, call.rate_per_us / 1000})
end
if mode == 'try' then
  return refused(-1)
elseif mode == 'wait' then
  if num('_want') < now + want_ms / 2 then -- refreshed at most twice per want_ms
    set('_want', now + want_ms)
  end
  if fam_tot_key and limit - num('_used') >= n then
    fam_want(now, want_ms) -- the member had room: the family's total wake it
  end
  return refused(-1)
end
-- Queueing under a dead session would leave an entry that admit and prune
-- evict without telling its process: refuse, and let the process make a
-- new session first.
local sdl = session_deadline(sid, now)
if not sdl then
  return finish({-5, now})
end
if max_q > 0 and num('_q') >= max_q then
  return finish({-4, now, num('_q')})
end
local seq
if fam_tot_key then
  seq = fam._seq + 1 -- the family's arrival order, across its members
  fam_put('_seq', seq)
else
  seq = num('_seq') + 1
  set('_seq', seq)
end
redis.call('ZADD', queue_key, fmt(seq), id)
put(id, 'W|' .. sid .. '|' .. fmt(n) .. '|' .. fmt(lease_ms) .. '|' .. owner .. (fam_check_tot_key and '|n' or ''))
set('_q', num('_q') + 1)
-- The keys, and the entry with them, live at least as long as its session:
-- each of the session's beats extends them again (in a family, its process
-- beats every member where it waits), so no entry expires under a waiter.
extend(now, sdl)
return refused(num('_q') - 1)
