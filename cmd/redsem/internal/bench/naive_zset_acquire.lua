-- naive_zset_acquire.lua: BASELINE ONLY, not used by redsem. The seed's
-- sorted-set acquire, kept so that the bench tool (redsem bench
-- --variant naive-zset) can show what redsem's design buys over it. It has
-- the seed's weaknesses on purpose: no fencing token, no slot index, no
-- wake-up (callers poll at a fixed interval), no fairness. One change from
-- the seed: it takes the time from the server (TIME), not from the client,
-- as every script here does; that does not change its cost.
-- It does not include the Lua library and takes its own single key.
-- KEYS: [1] holders ZSET: holder id -> acquire time (server ms).
-- ARGV: [1] timeout_ms (>= 1): a holder older than this is dropped,
--       [2] limit (>= 1), [3] holder id.
-- Reply: 1 acquired, 0 no slot. Release is a plain ZREM of the id.
-- Errors: "ERR naive: ..." for bad arguments, before any write.
local timeout = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local id = ARGV[3]
if not timeout or timeout < 1 then return redis.error_reply('ERR naive: bad timeout_ms') end
if not limit or limit < 1 then return redis.error_reply('ERR naive: bad limit') end
if not id or id == '' then return redis.error_reply('ERR naive: missing id') end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now - timeout)
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now, id)
  redis.call('PEXPIRE', KEYS[1], timeout + 1000)
  return 1
end
return 0
