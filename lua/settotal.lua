-- settotal.lua: set the total of a keyed family (FamilyOptions.Total) for
-- every client: the slots held across all of its members at once; 0
-- removes the bound (the family goes on counting, so that a later total
-- holds at once). The setting never expires. Raising it admits waiters
-- at once (fair) or tells unfair waiters refused by the total; lowering
-- it below what is held grants nothing until enough is released, and a
-- waiter heavier than it is told so when it reaches the head ("x id
-- total"). A copy of one call that runs twice sets it once (ARGV[5]).
-- KEYS: the family's four keys laid out at the top of lib_family.lua, then
-- [5] the sessions key of its members (prefix:{tag}:f:sessions).
-- ARGV: [1] channel base, [2] publish command, [3] client limit and total
--       ("limit+total:f" or ":u", as in client_arg, lib_args.lua),
--       [4] the total, in [0, 2^20] (0: no bound),
--       [5] call id (a UUID per SetTotal call): a copy of the call that runs
--           again (go-redis re-sends a command whose reply was lost) finds
--           its id among the recent calls (f:tot's _calls: "id:until_ms,...",
--           each kept TOMB_MS) and changes nothing, so it cannot undo a
--           later SetTotal of another client,
--       [6] optional: refuse_after, [7] optional: "cancel" (only the call
--           id is recorded), as in setlimit.lua.
-- Reply: {now, grants...}: grants as in release.lua; {-1, now}: refused by
--        refuse_after, nothing written.
local client_limit, err = client_arg()
if err then return err end
local total; total, err = int_arg(4, 'total', 0, MAX_LIMIT)
if err then return err end
local call_id; call_id, err = id_arg(5, 'call id')
if err then return err end
local refuse_after = 0
if ARGV[6] ~= nil then
  refuse_after, err = int_arg(6, 'refuse_after', 0)
  if err then return err end
end
local now, now_us = clock()
if refuse_after > 0 and now > refuse_after then
  return {-1, now} -- its caller gave up: nothing is written
end
fam_load()
local recent = {}
for cid, until_ms in string.gmatch(redis.call('HGET', fam_tot_key, '_calls') or '', '([^:,]+):(%d+)') do
  if tonumber(until_ms) > now then
    if cid == call_id then
      return finish({now}) -- this call ran already
    end
    recent[#recent + 1] = cid .. ':' .. until_ms
  end
end
recent[#recent + 1] = call_id .. ':' .. fmt(now + TOMB_MS)
fam_put('_calls', table.concat(recent, ','))
fam_extend(now, now + TOMB_MS) -- the keys outlive the record
if ARGV[7] == 'cancel' then
  return finish({now})
end
redis.call('SET', fam_total_key, total)
fam_put('_ftotal', fmt(total))
fam.bound = nil
fam.freed = true -- unfair waiters refused by the total may fit now
local out = {now}
admit_total(now, now_us, out)
return finish(out)
