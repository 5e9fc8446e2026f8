-- renewmany.lua: renew.lua for many leases of one semaphore at once: the
-- watchdog of a process renews all its leases of a semaphore that are due
-- in one call (core's renewals), instead of one call per lease. Each lease
-- is treated as renew.lua treats it without "resume": extended to
-- max(its deadline, now + lease_ms), never re-created once gone, never
-- moved earlier.
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] lease_ms (>= 1), [5..] the lease ids (at least one, at most
--       4096: ids_arg).
-- Reply: {now, r1, r2, ...}, one r per id in ARGV order: the lease's
--        deadline_ms (> 0) when renewed; 0 when the lease is gone (lost);
--        -1 when it is gone because a holder released it (its "R"
--        tombstone is there), as renew.lua's codes 1, 0 and 2.
local client_limit, err = client_arg()
if err then return err end
local lease_ms; lease_ms, err = int_arg(4, 'lease_ms', 1)
if err then return err end
local ids; ids, err = ids_arg(5)
if err then return err end
local n = #ids

local now, now_us = clock()
local out = {now}
local scores = redis.call('ZMSCORE', holders_key, unpack(ids))
local writes = {} -- deadline, id, ...: the ZADD XX of the renewed
local latest = 0
local gone, stale -- ids that are gone; the gone ids still listed past their deadline
for i = 1, n do
  local held = tonumber(scores[i])
  if held and held > now then
    local deadline = math.max(held, now + lease_ms)
    if deadline > held then
      writes[#writes + 1] = fmt(deadline)
      writes[#writes + 1] = ids[i]
    end
    latest = math.max(latest, deadline)
    out[i + 1] = deadline
  else
    gone = gone or {}
    gone[#gone + 1] = i
    if held then
      stale = stale or {}
      stale[#stale + 1] = ids[i]
    end
    out[i + 1] = 0
  end
end
for i = 1, #writes, CHUNK do
  local last = math.min(i + CHUNK - 1, #writes)
  redis.call('ZADD', holders_key, 'XX', unpack(writes, i, last))
  if fam_tot_key then
    -- A family's total counts each lease until the same deadline.
    redis.call('ZADD', fam_leases_key, 'XX', unpack(writes, i, last))
  end
end

if gone then
  -- Some are lost: as renew.lua, clean up and hand any freed slot on.
  load(nil)
  if not get('_hz') then
    return out -- the semaphore's keys are gone: so is every lease
  end
  local unlisted = {}
  for _, i in ipairs(gone) do
    if not scores[i] then
      unlisted[#unlisted + 1] = ids[i]
    end
  end
  records(unlisted)
  for _, i in ipairs(gone) do
    if not scores[i] and get(ids[i]) == 'R' then
      out[i + 1] = -1 -- released by a holder, in this process or another
    end
  end
  local freed = stale and drop_holders(stale) or 0
  if latest > 0 then
    extend(now, latest)
  end
  if fam_tot_key and latest > 0 then
    fam_load()
    fam_extend(now, latest)
  end
  if expire(now) + freed > 0 or fam_tot_key then
    wake(now, now_us, limit_in_force(client_limit), {})
  end
  return finish(out)
end
load_horizon() -- live renewals need only the horizon (extend)
extend(now, latest)
if fam_tot_key then
  fam_load()
  fam_extend(now, latest)
end
return finish(out)
