-- setrate.lua: set the rate for every client of this name (at most
-- rate_limit slots granted in any period of per_ms); the setting never
-- expires, and 0, 0 removes the bound for every client. Raising it (or
-- removing it) admits waiters at once; lowering it below a queued waiter's
-- weight ends that waiter's wait (an "x id rate_limit rate" message),
-- wherever it stands in the queue (a scan of the queue: SetRate is rare).
-- The window's records stay: grants made before the call count against the
-- new rate. While fair waiters are queued, every live session's channel
-- is told that the rate was set ("n now meta-key").
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] call id (a UUID per SetRate call): a copy of the call that runs
--           again finds its record and changes nothing,
--       [5] rate_limit, [6] per_ms: both 0 (no rate), or rate_limit in
--           [1, 2^20] and per_ms in [1, about a year],
--       [7] optional: refuse_after, [8] optional: "cancel", as in
--           setlimit.lua.
-- Reply: {now, grants...}: grants as in release.lua; {-1, now}: refused by
--        refuse_after, nothing written.
local client_limit, err = client_arg()
if err then return err end
local call_id; call_id, err = id_arg(4, 'call id')
if err then return err end
local rl, rp = parse_rate((ARGV[5] or '') .. '/' .. (ARGV[6] or ''), '/')
if not rl then
  return fail('bad rate: ' .. tostring(ARGV[5]) .. '/' .. tostring(ARGV[6]))
end
local now, now_us, done = start_setting(call_id, 7)
if done then return done end
rate_load(true)
tombstone(call_id, 'S', now, now + TOMB_MS)
local v = fmt(rl) .. '/' .. fmt(rp)
redis.call('SET', rate_key, v)
put('_frate', v)
put('_rx', '1')
if rl > 0 then
  rate_keep(rp) -- a longer period keeps the records it still counts
end
expire(now)
-- Waiters heavier than the new rate's limit can never be admitted.
if rl > 0 then
  evict_heavier(rl, ' rate')
end
local limit = limit_in_force(client_limit)
local out = {now}
wake(now, now_us, limit, out)
if num('_q') > 0 then
  -- Fair waiters are still queued, in this process or others: tell every
  -- live session that the rate was set at now ("n now meta"), so that what
  -- the former rate held back is no waiter's reason for giving up (a
  -- process without waiters of this semaphore ignores it).
  publish_sessions('n ' .. fmt(now) .. ' ' .. meta_key)
end
return finish(out)
