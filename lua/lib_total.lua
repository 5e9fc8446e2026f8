-- lib_total.lua: admission under a family's total (FamilyOptions.Total),
-- the last part of the lib: sync_head (a member's entry in f:heads),
-- admit_total (the fair heads of every member, in the family's arrival
-- order), fam_want and fam_finish (what a call on a member of such a
-- family does last), and wake, the admission every call that frees slots or
-- raises the limit ends with (family or not).
-- Uses from lib_args.lua: save_member, restore_member and switch_member
-- (admit_total moves between members), the per-call keys, the family's keys, fam, fam_client_limit, fam_fair,
-- fam_finish, SENTINEL, fmt; from lib_records.lua: load, get, num,
-- records, flush; from lib_family.lua: fam_load, fam_extend, fam_expire,
-- fam_room, fam_write, fam_put; from lib_slots.lua: parse_waiter; from
-- lib_prune.lua: expire; from lib_limit.lua: limit_in_force; from
-- lib_queue.lua: publish; from lib_admit.lua: admit, append, notify_free.
--
-- The rule (fair): a member's waiters are admitted in its queue's order,
-- and across members in the family's arrival order (every member's queue
-- is ordered by the family's counter _seq) among the heads that fit in
-- their own member: the earliest such head goes first, and when the total
-- has no room for it nobody behind it in the family goes either. A head
-- that does not fit in its own member (its tenant at its limit) is passed
-- over, so it blocks nobody of another member. f:heads holds each member's
-- head (its arrival number, negated while the head does not fit in its
-- member), so that admit_total visits only the heads that may go, in
-- order, with one ZRANGE each.

-- member_base is the prefix of the current member's keys
-- ("prefix:{tag}:m:KEY:"), the name of its entry in f:heads.
local function member_base()
  return string.sub(holders_key, 1, -8) -- holders_key is base .. 'holders'
end

-- sync_head writes the current member's entry in f:heads: none while its
-- queue is empty, else its head's arrival number, negated when the head
-- does not fit in the member's limit (limit) now.
local function sync_head(now, limit)
  local base = member_base()
  local h = num('_q') > 0 and redis.call('ZRANGE', queue_key, 0, 0, 'WITHSCORES')
  if not h or h[1] == nil or h[1] == SENTINEL then
    redis.call('ZREM', fam_heads_key, base)
    return
  end
  local id, seq = h[1], tonumber(h[2])
  records({id})
  local rec, n = get(id), 1
  if rec and string.sub(rec, 1, 1) == 'W' then
    local _, w = parse_waiter(rec)
    n = w
  end
  if n > limit - num('_used') then
    seq = -seq
  end
  redis.call('ZADD', fam_heads_key, fmt(seq), base)
  fam_extend(now, num('_hz')) -- the entry lives as long as the member's keys
end

-- enter makes the member whose keys start with base current
-- (switch_member, lib_args.lua) with its meta loaded.
local function enter(base)
  switch_member(base)
  load()
end

-- admit_total drops the family's expired leases from its count, then (fair)
-- admits waiters of every member by the rule above: the member the call
-- runs on (if any: settotal.lua runs on none) first has its head's entry
-- brought up to date; when leases expired since (f:tot's _recheck, set by
-- fam_expire), so do the members whose heads were passed over at their
-- limit (their entries negated: an expired holder of theirs may have made
-- room, and no call on them told f:heads); then the heads are visited in
-- arrival order. It appends the grants to out and returns out, and "total"
-- when the earliest head that fits in its member found no room in the total
-- (so that a new request must not go before it).
local function admit_total(now, now_us, out)
  fam_expire(now)
  if not fam_fair then
    return out, nil
  end
  local own = holders_key and member_base()
  if own then
    call.fam_sync = true -- fam_finish writes its head again
    sync_head(now, limit_in_force(fam_client_limit))
  end
  local own_state, cur = nil, own
  -- visit makes the member of base current, its expired holders gone;
  -- false (its entry removed) when its keys expired: nothing waits there.
  local function visit(base)
    if base ~= cur then
      if cur == own then
        own_state = save_member()
      else
        flush() -- the member visited before: written out
      end
      if base == own then
        restore_member(own_state)
      else
        enter(base)
      end
      cur = base
    end
    if not get('_hz') then
      redis.call('ZREM', fam_heads_key, base)
      return false
    end
    if base ~= own then
      expire(now) -- its expired holders' slots, so that its room is exact
    end
    return true
  end
  if fam._recheck then
    local passed = redis.call('ZRANGE', fam_heads_key, '-inf', '(0', 'BYSCORE')
    for i = 1, #passed do
      if visit(passed[i]) then
        sync_head(now, limit_in_force(fam_client_limit))
      end
    end
    fam._recheck, fam.dirty._recheck = nil, nil
    fam.gone = fam.gone or {}
    fam.gone._recheck = true
  end
  local from, stop = '(0', nil
  while true do
    local h = redis.call('ZRANGE', fam_heads_key, from, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
    local base = h[1]
    if base == nil or base == SENTINEL then
      break
    end
    from = '(' .. h[2]
    if visit(base) then
      local limit = limit_in_force(fam_client_limit)
      local got
      got, stop = admit(now, now_us, limit, true)
      append(out, got)
      sync_head(now, limit)
      if stop then
        break
      end
    end
  end
  if cur ~= own then
    flush()
    restore_member(own_state)
  end
  return out, stop
end

-- fam_want asks for freed-total notices for want_ms (an unfair waiter was
-- refused), refreshed at most twice per want_ms.
local function fam_want(now, want_ms)
  if fam._want < now + want_ms / 2 then
    fam_put('_want', now + want_ms)
  end
end

-- fam_finish (declared in lib_args.lua, called by finish) writes the
-- member's head again if admit_total ran (the call may have queued or
-- removed a waiter since), tells unfair waiters refused by the total that
-- leases left it ("n f:tot-key" on the shard's freed-slot channel: each
-- process wakes its waiters of every member), and writes the family's
-- counters.
fam_finish = function()
  if not fam then
    return -- the call never read the family's counters: it changed none
  end
  local now = call.clock_ms
  if call.fam_sync and holders_key then
    sync_head(now, limit_in_force(fam_client_limit))
  end
  if not fam_fair and fam.freed and fam._want > now then
    local room = fam_room()
    if room > 0 then
      publish(channel .. ':free', (room == math.huge and 1000000 or room) .. ' ' .. fam_tot_key)
    end
  end
  fam_write()
end

-- wake admits what slots freed or a raised limit let in: every member's
-- waiters in the family's order in a family with a total (admit_total),
-- else this queue's earliest that fit in limit, their grants appended to
-- out (none from a client without a total while its family counts one:
-- counted_total, lib_family.lua); then tells unfair waiters how many slots
-- are free (notify_free).
-- setlimit.lua, setrate.lua, release.lua and renew.lua end with it.
local function wake(now, now_us, limit, out)
  if fam_tot_key then
    admit_total(now, now_us, out) -- every member's, in the family's order
  elseif num('_q') > 0 and not counted_total() then
    append(out, admit(now, now_us, limit))
  end
  notify_free(now, limit)
end
