-- lib_release.lua: release_id, the release of one id by release.lua (any
-- mode) and releasemany.lua (many leases, "owner").
-- Uses from lib_args.lua: holders_key, channel; lib_records.lua: get,
-- next_expiry; lib_slots.lua: drop_holders, lease_shared, parse_waiter;
-- lib_queue.lua: drop_waiter, publish; lib_prune.lua: tombstone.

-- release_id gives back the slots of lease id, or removes waiter id from
-- the queue, as mode says (release.lua's header), and leaves the record
-- that mode leaves for keep_ms. The call's expire and prune ran already.
-- It returns release.lua's kind: 1 a live lease released (now, or by an
-- earlier run of an owner's request), 2 a queue entry removed, 0 nothing
-- live had that id, 3 and 4 (expire only) left to another handle, or
-- released by a holder already.
local function release_id(id, mode, now, keep_ms)
  local kind = 0
  local rec = get(id)
  local rk = rec and string.sub(rec, 1, 1)
  if rk == 'L' then
    -- expire() handles only the earliest BATCH: while it has more to do
    -- (_next not ahead of now), this lease may be past its deadline and
    -- still listed. Its slots go back either way; only a live one counts
    -- as released.
    local live, dl = true, nil
    if mode == 'expire' or now >= next_expiry() then
      dl = tonumber(redis.call('ZSCORE', holders_key, id))
      live = dl ~= nil and dl > now
    end
    if mode == 'expire' and live and lease_shared(rec) then
      kind = 3 -- another process resumed it: it lives on until its deadline
    elseif drop_holders({id}) > 0 and live then
      kind = 1
    end
  elseif rk == 'W' then
    kind = 2
    drop_waiter(id)
    if mode == 'force' then
      -- Its process still waits: tell it to ask again (it queues at the back).
      publish(channel .. ':s:' .. parse_waiter(rec), 'r ' .. id)
    end
  elseif rk == 'R' and mode == 'owner' then
    kind = 1 -- released by an earlier run of this request
  elseif rk == 'R' and mode == 'expire' then
    kind = 4 -- released by a holder (a process that resumed it)
  end
  if mode == 'owner' and kind == 1 then
    tombstone(id, 'R', now, now + keep_ms)
  elseif mode == 'undo' and rk ~= 'R' then
    tombstone(id, 'C', now, now + keep_ms)
  end
  return kind
end
