-- fence_lib.lua: the fencing check shared by fence.lua and fence_set.lua,
-- prepended to each before it is loaded (see lua.go). These scripts run in
-- the store-side Redis that a fencing guard protects, which may be another
-- Redis than the semaphore's; they touch no semaphore key.
--
-- A fence key is a HASH: slot (decimal) -> highest token recorded for that
-- slot (decimal). Tokens are compared as decimal strings (length, then
-- bytes), so every int64 compares exactly, also above 2^53.
--
-- ARGV common prefix:
--   ARGV[1] slot  (decimal integer >= 0, no sign, no leading zeros)
--   ARGV[2] token (decimal integer >= 1, no sign, no leading zeros, <= 19 digits)

local function fence_fail(msg)
  return redis.error_reply('ERR fencing: ' .. msg)
end

-- fence_args returns the slot and token as validated strings, or nil and an
-- error reply.
local function fence_args()
  local slot, token = ARGV[1], ARGV[2]
  if type(slot) ~= 'string' or not (slot == '0' or string.match(slot, '^[1-9]%d*$')) or #slot > 10 then
    return nil, nil, fence_fail('bad slot: ' .. tostring(slot))
  end
  if type(token) ~= 'string' or not string.match(token, '^[1-9]%d*$') or #token > 19 then
    return nil, nil, fence_fail('bad token: ' .. tostring(token))
  end
  return slot, token
end

-- below reports whether decimal a < decimal b (both without leading zeros).
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- fence_check records token for slot in the fence hash key unless a higher
-- token is recorded there. It returns true and the token now recorded, or
-- false and the higher token that makes this one stale. An equal token is
-- accepted: a holder may write many times with its own token.
local function fence_check(key, slot, token)
  local highest = redis.call('HGET', key, slot)
  if highest and below(token, highest) then
    return false, highest
  end
  if highest ~= token then
    redis.call('HSET', key, slot, token)
  end
  return true, token
end
