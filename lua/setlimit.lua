-- setlimit.lua: set the limit for every client of this name; the setting
-- never expires. Raising it admits waiters at once.
-- KEYS: the nine keys of lib.lua.
-- ARGV: [1] channel base, [2] the new limit (>= 1).
-- Reply: {now, grants...}: grants as in release.lua.
local limit, err = int_arg(2, 'limit', 1)
if err then return err end
local now, now_us = clock()
redis.call('SET', O, limit)
expire(now)
local out = {now}
local grants, free = admit(now, now_us, limit)
append(out, grants)
notify_free(free)
return out
