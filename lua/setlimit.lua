-- setlimit.lua: set the limit for every client of this name; the setting
-- never expires. Raising it admits waiters at once; lowering it below a
-- queued waiter's weight ends that waiter's wait (an "x" message), wherever
-- it stands in the queue (a scan of the queue: SetLimit is rare).
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] the new limit (>= 1),
--           with the caller's rate as in client_arg (lib_args.lua),
--       [4] call id (a UUID per SetLimit call): a copy of the call that runs
--           again (go-redis re-sends a command whose reply was lost) finds
--           its record and changes nothing, so it cannot undo a later
--           SetLimit of another client,
--       [5] optional: refuse_after, server ms after which the caller has
--           certainly given up (its context's deadline, plus a margin); 0:
--           none. A request that runs later (held in the network) writes
--           nothing: it cannot undo a SetLimit made after its caller gave up,
--       [6] optional: "cancel": the caller gave up without a deadline;
--           only the call's record is written, so that the call, should it
--           run later, changes nothing.
-- Reply: {now, grants...}: grants as in release.lua; {-1, now}: refused by
--        refuse_after, nothing written.
local limit, err = client_arg()
if err then return err end
local call_id; call_id, err = id_arg(4, 'call id')
if err then return err end
local now, now_us, done = start_setting(call_id, 5)
if done then return done end
-- The record keeps every key alive as long as itself (tombstone extends the
-- horizon): a copy re-sent within TOMB_MS always finds it, even on an idle
-- semaphore whose keys would otherwise have expired, and so never undoes a
-- later SetLimit of another call.
tombstone(call_id, 'S', now, now + TOMB_MS)
redis.call('SET', limit_key, limit)
set('_fixed', limit)
expire(now)
-- Waiters heavier than the new limit can never be admitted: they leave the
-- queue wherever they stand, and their processes are told (an "x" message).
evict_heavier(limit, '')
local out = {now}
wake(now, now_us, limit, out)
return finish(out)
