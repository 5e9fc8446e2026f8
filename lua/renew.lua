-- renew.lua: extend a lease to now + lease_ms. It never re-creates a lease
-- that is gone (ZADD XX), and never moves a deadline earlier: a lease
-- resumed in another process (Resume) may be renewed by several processes
-- with different lease TTLs, and each keeps a Deadline that must not be
-- later than the one Redis holds.
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] lease id, [5] lease_ms (>= 1),
--       [6] optional: "resume" (Resume: the reply also carries the lease's
--           token and slots, from its record, and marks the record
--           shared: "|r" at its end, see lease_shared in lib_slots.lua),
--       [7] with "resume": the resuming process's owner label (Options.Owner),
--           which becomes the lease's owner (Status shows who holds it now).
-- Reply: {1, now, deadline_ms} renewed, deadline_ms the lease's deadline
--        now (with "resume": {1, now, deadline_ms, token, "s1,s2,..."});
--        {0, now} the lease is gone (lost); {2, now} the lease is gone
--        because a holder released it (its "R" tombstone is there: a
--        Release in this or another process); {-7, now, total} with
--        "resume" from a client built without a total (eleven keys) on a
--        member of a family that counts one (counted_total,
--        lib_family.lua): nothing written; {-8, now} with "resume" from a
--        client with the total on a live lease its family does not count
--        (granted before it counted one): nothing written.
local client_limit, err = client_arg()
if err then return err end
local id; id, err = id_arg(4, 'id')
if err then return err end
local lease_ms; lease_ms, err = int_arg(5, 'lease_ms', 1)
if err then return err end
local resume = ARGV[6] == 'resume'
if ARGV[6] ~= nil and not resume then return fail('bad renew mode: ' .. tostring(ARGV[6])) end
local resume_owner = ARGV[7]
if resume and (type(resume_owner) ~= 'string' or string.find(resume_owner, '[|\n]') or #resume_owner > 256) then
  return fail('bad owner: ' .. tostring(resume_owner))
end

local now, now_us = clock()
if resume then
  local counted = counted_total()
  if counted then
    -- A client without a total on a member of a family that counts one:
    -- its renewals would not move the family's copy of the deadline, which
    -- would count the lease out while it lives. Nothing is written.
    return {-7, now, tonumber(counted) or 0}
  end
end
local held = tonumber(redis.call('ZSCORE', holders_key, id))
local rec
if held and held > now and resume then
  rec = redis.call('HGET', meta_key, id)
  if not rec or string.sub(rec, 1, 1) ~= 'L' then
    held = nil -- listed without a lease record: not a lease to hand out
  elseif fam_tot_key and not redis.call('ZSCORE', fam_leases_key, id) then
    -- A lease granted before the family counted a total (by a client
    -- without one), not in its count: the handles that hold it renew and
    -- release it without the family's keys, so a handle of this client
    -- could not keep the count true (the count would outlive a release
    -- through them, or end while they renew it). Nothing is written.
    return {-8, now}
  end
end
if not held or held <= now then
  -- Lost. Clean up and hand any freed slot on.
  load(id)
  if not get('_hz') then
    return {0, now}
  end
  local gone = 0
  if not held and get(id) == 'R' then
    gone = 2 -- released by a holder, in this process or another
  end
  -- Its own entry, if still listed past its deadline, goes now (expire()
  -- takes only the earliest BATCH).
  local freed = held and drop_holders({id}) or 0
  if expire(now) + freed > 0 or fam_tot_key then
    wake(now, now_us, limit_in_force(client_limit), {})
  end
  return finish({gone, now})
end
local deadline = math.max(held, now + lease_ms)
if deadline > held then
  redis.call('ZADD', holders_key, 'XX', fmt(deadline), id)
end
load_horizon() -- a live renewal needs only the horizon (extend)
extend(now, deadline)
if fam_tot_key then
  -- A family's total counts the lease until the same deadline.
  redis.call('ZADD', fam_leases_key, 'XX', fmt(deadline), id)
  fam_load()
  fam_extend(now, deadline)
end
if resume then
  -- From now on several processes may hold handles of the lease: a give-up
  -- at one handle's deadline leaves it to the others (release.lua's
  -- "expire" mode); and the one that resumed it last is its owner.
  local token, slots, owner = parse_lease(rec)
  local new = 'L|' .. fmt(token) .. '|' .. table.concat(slots, ',') .. '|' .. resume_owner .. '|r'
  if new ~= rec then
    put(id, new)
  end
  return finish({1, now, deadline, token, table.concat(slots, ',')})
end
return finish({1, now, deadline})
