-- fence_lib.lua: the fencing check shared by fence.lua and fence_set.lua,
-- prepended to each before it is loaded (see lua.go). These scripts run in
-- the store-side Redis that a fencing guard protects, which may be another
-- Redis than the semaphore's; they touch no semaphore key.
--
-- A fence key is a HASH: slot (decimal) -> highest token recorded for that
-- slot (decimal). Tokens are compared as decimal strings (length, then
-- bytes), so every int64 compares exactly, also above 2^53.
--
-- A fence names one slot or, for a weighted lease, every slot the lease
-- holds. The check is all or nothing: the token is recorded for every slot
-- when no slot has a higher one, and for none otherwise.
--
-- ARGV common prefix:
--   ARGV[1] slots (one decimal integer in [0, 2^31), no sign, no leading
--           zeros, or several joined by commas, strictly ascending, no
--           spaces: "3" or "0,3,4")
--   ARGV[2] token (decimal integer >= 1, no sign, no leading zeros, <= 19 digits)

local function fence_fail(msg)
  return redis.error_reply('ERR fencing: ' .. msg)
end

-- fence_args returns the slots (a list of validated decimal strings,
-- ascending) and the token, or nil, nil and an error reply.
local function fence_args()
  local list, token = ARGV[1], ARGV[2]
  if type(token) ~= 'string' or not string.match(token, '^[1-9]%d*$') or #token > 19 then
    return nil, nil, fence_fail('bad token: ' .. tostring(token))
  end
  if type(list) ~= 'string' then
    return nil, nil, fence_fail('bad slot: ' .. tostring(list))
  end
  local slots, pos, prev = {}, 1, -1
  while true do
    local comma = string.find(list, ',', pos, true)
    local slot = string.sub(list, pos, (comma or 0) - 1)
    if not (slot == '0' or string.match(slot, '^[1-9]%d*$')) or #slot > 10 or tonumber(slot) > 2147483647 then
      return nil, nil, fence_fail('bad slot: ' .. slot)
    end
    local n = tonumber(slot)
    if n <= prev then
      return nil, nil, fence_fail('bad slots: not strictly ascending: ' .. list)
    end
    prev = n
    slots[#slots + 1] = slot
    if not comma then
      break
    end
    pos = comma + 1
  end
  return slots, token
end

-- below reports whether decimal a < decimal b (both without leading zeros).
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- FENCE_CHUNK bounds the arguments of one HMGET or HSET (unpack has a limit).
local FENCE_CHUNK = 1000

-- fence_check records token for every slot in the fence hash key unless a
-- higher token is recorded for any of them. It returns true and the token
-- now recorded, or false, the higher token that makes this one stale and
-- the (lowest) slot it is recorded for; then nothing was written. An equal
-- token is accepted: a holder may write many times with its own token.
-- All reads come before any write, so the check is all or nothing.
local function fence_check(key, slots, token)
  local writes = {}
  for i = 1, #slots, FENCE_CHUNK do
    local got = redis.call('HMGET', key, unpack(slots, i, math.min(i + FENCE_CHUNK - 1, #slots)))
    for k, highest in ipairs(got) do
      local slot = slots[i + k - 1]
      if highest and below(token, highest) then
        return false, highest, slot
      end
      if highest ~= token then
        writes[#writes + 1] = slot
        writes[#writes + 1] = token
      end
    end
  end
  for i = 1, #writes, 2 * FENCE_CHUNK do
    redis.call('HSET', key, unpack(writes, i, math.min(i + 2 * FENCE_CHUNK - 1, #writes)))
  end
  return true, token
end
