-- setlimit.lua: set the limit for every client of this name; the setting
-- never expires. Raising it admits waiters at once; lowering it below a
-- queued waiter's weight ends that waiter's wait (an "x" message).
-- KEYS: the seven keys of lib.lua.
-- ARGV: [1] channel base, [2] publish command, [3] the new limit (>= 1).
-- Reply: {now, grants...}: grants as in release.lua.
local limit, err = int_arg(3, 'limit', 1)
if err then return err end
local now, now_us = clock()
redis.call('SET', O, limit)
load()
init(now)
set('_fixed', limit)
expire(now)
local out = {now}
if num('_q') > 0 then
  append(out, admit(now, now_us, limit))
end
notify_free(now, limit)
return finish(out)
