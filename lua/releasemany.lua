-- releasemany.lua: release.lua's "owner" mode for many leases of one
-- semaphore at once: the releases a process asks for while one of its
-- release calls of the semaphore is in flight go together in its next
-- (core's releases). Each id is released as release.lua releases it, in
-- ARGV order; then the waiters that the freed slots let in are admitted,
-- and unfair waiters told, once for all of them.
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] ms the tombstones live (>= 1), [5..] the lease ids (at least
--       one, at most 4096: ids_arg).
-- Reply: {now, k1, ..., kn, grants...}: one kind per id in ARGV order, as
--        release.lua's owner mode answers it (1: the lease was released,
--        by this call or an earlier run of it; 0: nothing live had that id,
--        the lease was lost; 2: the id was a queue entry, removed), then
--        release.lua's grants (id, token, deadline_ms, "slots") of the
--        waiters this call admitted.
local client_limit, err = client_arg()
if err then return err end
local keep_ms; keep_ms, err = int_arg(4, 'record_ms', 1)
if err then return err end
if keep_ms > TOMB_MS then
  keep_ms = TOMB_MS
end
local ids; ids, err = ids_arg(5)
if err then return err end
local n = #ids

local now, now_us = clock()
local out = {now}
load()
if not get('_hz') then
  -- Nothing of this semaphore exists (never used, or expired while idle).
  for i = 1, n do
    out[i + 1] = 0
  end
  return finish(out)
end
records(ids)
-- Holders past their deadline go first (at most BATCH of them per call).
expire(now)
prune(now)
for i = 1, n do
  out[i + 1] = release_id(ids[i], 'owner', now, keep_ms)
end
wake(now, now_us, limit_in_force(client_limit), out)
return finish(out)
