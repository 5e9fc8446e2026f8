-- heartbeat.lua: one call per process session keeps all of its fair waiters
-- alive, and admits waiters whose turn came (e.g. after a holder expired).
-- Its cost does not depend on how many waiters the process has.
-- KEYS: the nine keys laid out at the top of lib_args.lua (thirteen for a
-- member of a family with a total: lib_family.lua).
-- ARGV: [1] channel base, [2] publish command, [3] client limit (and rate),
--       [4] session id, [5] queue_ms (>= 1): the session lives that long
--       from now, [6] "new" for a session's first beat, else "old".
-- Reply: {now, alive, hint_ms, grants...}: alive is 1 when the session was
--        live (or new) and is extended; 0 when it had died: it is not
--        revived (its waiters' places are forfeit) and the caller must
--        queue its waiters again under a new session. hint_ms is the time
--        until the earliest holder may expire (-1: none); grants as in
--        release.lua.
local client_limit, err = client_arg()
if err then return err end
local sid; sid, err = id_arg(4, 'session')
if err then return err end
local queue_ms; queue_ms, err = int_arg(5, 'queue_ms', 1)
if err then return err end
local fresh = ARGV[6] == 'new'
if not fresh and ARGV[6] ~= 'old' then return fail('bad age: ' .. tostring(ARGV[6])) end

local now, now_us = clock()
load()
init(now)
local alive = 1
local sdl = tonumber(redis.call('ZSCORE', sessions_key, sid))
if fresh or (sdl and sdl > now) then
  redis.call('ZADD', sessions_key, fmt(now + queue_ms), sid)
  extend(now, now + queue_ms)
else
  alive = 0
end
expire(now)
prune(now)
local out = {now, alive, 0}
if fam_tot_key then
  admit_total(now, now_us, out) -- every member's, in the family's order
elseif num('_q') > 0 then
  append(out, admit(now, now_us, limit_in_force(client_limit)))
end
out[3] = hint(now)
return finish(out)
