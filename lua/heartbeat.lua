-- heartbeat.lua: one call per process session keeps all of its fair waiters
-- alive, and admits waiters whose turn came (e.g. after a holder expired).
-- A client built without a total, while its family counts one, admits
-- none: its own waiters here are told to ask again (requeue_session,
-- lib_queue.lua), and acquire.lua then refuses them.
-- Its cost does not depend on how many waiters the process has.
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] session id, [5] queue_ms (>= 1): the session lives that long
--       from now, [6] "new" for a session's first beat, else "old",
--       [7...] optional: the key bases ("prefix:{tag}:m:KEY:") of the other
--           members of the family (of this shard: the same slot) where the
--           session's process has waiters: their keys, and with them the
--           waiters' queue entries, are kept as long as the session (a
--           member that holds nothing has keys of its own that would
--           otherwise expire under its waiters). Members whose keys are
--           gone are left alone.
-- Reply: {now, alive, hint_ms, grants...}: alive is 1 when the session was
--        live (or new) and is extended; 0 when it had died: it is not
--        revived (its waiters' places are forfeit) and the caller must
--        queue its waiters again under a new session. hint_ms is the time
--        until the earliest holder may expire (-1: none); grants as in
--        release.lua.
-- Errors: "ERR redsem: ..." for bad arguments, or a stored limit that is
-- not an integer in [1, 2^20], before any write.
local client_limit, err = client_arg()
if err then return err end
local sid; sid, err = id_arg(4, 'session')
if err then return err end
local queue_ms; queue_ms, err = int_arg(5, 'queue_ms', 1)
if err then return err end
local fresh = ARGV[6] == 'new'
if not fresh and ARGV[6] ~= 'old' then return fail('bad age: ' .. tostring(ARGV[6])) end

local shard = string.match(holders_key, '^(.*}:m:)')
for i = 7, #argv do
  local base = argv[i]
  if not shard or string.sub(base, 1, #shard) ~= shard or string.sub(base, -1) ~= ':' then
    return fail('bad member base: ' .. tostring(base))
  end
end

local now, now_us = clock()
load()
err = check_limits()
if err then return err end
init(now)
local alive = 1
local sdl = tonumber(redis.call('ZSCORE', sessions_key, sid))
if fresh or (sdl and sdl > now) then
  redis.call('ZADD', sessions_key, fmt(now + queue_ms), sid)
  extend(now, now + queue_ms)
  if #argv >= 7 then
    local own = save_member()
    for i = 7, #argv do
      switch_member(argv[i])
      load()
      if get('_hz') then
        extend(now, now + queue_ms)
        flush()
      end
    end
    restore_member(own)
  end
else
  alive = 0
end
expire(now)
prune(now)
local out = {now, alive, 0}
if fam_tot_key then
  admit_total(now, now_us, out) -- every member's, in the family's order
elseif num('_q') > 0 then
  if counted_total() then
    requeue_session(sid) -- a client without a total: refused when it asks
  else
    append(out, admit(now, now_us, limit_in_force(client_limit)))
  end
end
out[3] = hint(now)
return finish(out)
