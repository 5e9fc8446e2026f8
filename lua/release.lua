-- release.lua: give back a lease's slots or leave the queue, by id; then
-- admit the waiters that may now enter and tell unfair waiters about free
-- slots.
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] lease or waiter id,
--       [5] mode: "owner" when the lease's holder releases it
--           (Lease.Release): it leaves a tombstone, so that a rerun (go-redis
--           retries a command whose reply was lost) reports the release
--           again; "undo" when an acquire is abandoned: it leaves a
--           cancellation record, so that the acquire, should it run later
--           (a request delayed in flight), grants and queues nothing;
--           "force" for an operator's forced release: no record, so the
--           holder of a force-released lease learns that it was lost (a
--           force-removed waiter's session is told "r id": its process
--           queues it again); "expire" when a process gives its handle
--           of a lease up at its local deadline, unrenewed (its holder
--           stopped then): as force, but not for a lease that another
--           process took a handle of (Resume: its record is marked shared),
--           whose holder may hold it until the deadline it was told: it
--           lives on untouched and expires at its own deadline, as does one
--           that a holder released already (its tombstone stays),
--       [6] ms the tombstone or cancellation record lives (owner, undo);
--           ignored (force, expire).
-- Reply: {kind, now, grants...} where kind is 1 (a live lease was released,
--        by this call or, for an owner, by an earlier run of it), 2 (a queue
--        entry was removed), 0 (nothing live had that id: the lease was
--        lost), 3 (expire only: another process took a handle of the lease
--        and may still hold it: nothing was changed), 4 (expire only: a holder released
--        it, its tombstone is there), and grants is a flat list (id, token,
--        deadline_ms, "slots") for each waiter admitted by this call.
local client_limit, err = client_arg()
if err then return err end
local id; id, err = id_arg(4, 'id')
if err then return err end
local mode = ARGV[5]
if mode ~= 'owner' and mode ~= 'undo' and mode ~= 'force' and mode ~= 'expire' then return fail('bad mode: ' .. tostring(mode)) end
local keep_ms = 0
if mode ~= 'force' and mode ~= 'expire' then
  keep_ms, err = int_arg(6, 'record_ms', 1)
  if err then return err end
  if keep_ms > TOMB_MS then
    keep_ms = TOMB_MS
  end
end

local now, now_us = clock()
load(id)
if not get('_hz') then
  -- Nothing of this semaphore exists (never used, or expired while idle).
  if mode == 'undo' then
    init(now)
    tombstone(id, 'C', now, now + keep_ms)
  end
  return finish({0, now})
end
-- Holders past their deadline go first (at most BATCH of them per call).
expire(now)
prune(now)

local kind = release_id(id, mode, now, keep_ms)

local limit = limit_in_force(client_limit)
local out = {kind, now}
wake(now, now_us, limit, out)
return finish(out)
