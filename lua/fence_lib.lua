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
-- A token is the semaphore's Redis TIME in microseconds (or the previous
-- token plus one, which stays behind it), so a token more than max_ahead_us
-- ahead of this Redis's own TIME is from the future (forged, or the two
-- clocks disagree by more than the bound) and is refused before anything is
-- read or written: recorded, it would make every real token of its slots
-- stale until this clock caught up with it.
--
-- ARGV common prefix:
--   ARGV[1] slots (one decimal integer in [0, 2^31), no sign, no leading
--           zeros, or several joined by commas, strictly ascending, no
--           spaces: "3" or "0,3,4")
--   ARGV[2] token (decimal integer >= 1, no sign, no leading zeros, <= 19 digits)
--   ARGV[3] max_ahead_us: how far the token may be ahead of TIME, in
--           microseconds (decimal integer >= 0, <= 16 digits), or -1 for no
--           bound

local function fence_fail(msg)
  return redis.error_reply('ERR fencing: ' .. msg)
end

-- fence_args returns the slots (a list of validated decimal strings,
-- ascending), the token and max_ahead_us (a number, -1 for no bound), or
-- nil, nil, nil and an error reply.
local function fence_args()
  local list, token, ahead = ARGV[1], ARGV[2], ARGV[3]
  if type(token) ~= 'string' or not string.match(token, '^[1-9]%d*$') or #token > 19 then
    return nil, nil, nil, fence_fail('bad token: ' .. tostring(token))
  end
  if type(list) ~= 'string' then
    return nil, nil, nil, fence_fail('bad slot: ' .. tostring(list))
  end
  local slots, pos, prev = {}, 1, -1
  while true do
    local comma = string.find(list, ',', pos, true)
    local slot = string.sub(list, pos, (comma or 0) - 1)
    if not (slot == '0' or string.match(slot, '^[1-9]%d*$')) or #slot > 10 or tonumber(slot) > 2147483647 then
      return nil, nil, nil, fence_fail('bad slot: ' .. slot)
    end
    local n = tonumber(slot)
    if n <= prev then
      return nil, nil, nil, fence_fail('bad slots: not strictly ascending: ' .. list)
    end
    prev = n
    slots[#slots + 1] = slot
    if not comma then
      break
    end
    pos = comma + 1
  end
  if type(ahead) ~= 'string' or not (ahead == '-1' or ahead == '0' or string.match(ahead, '^[1-9]%d*$')) or #ahead > 16 then
    return nil, nil, nil, fence_fail('bad max_ahead_us: ' .. tostring(ahead))
  end
  return slots, token, tonumber(ahead)
end

-- fence_future reports whether token is more than ahead microseconds ahead
-- of this server's clock (never when ahead is -1), and the clock it read
-- (microseconds since 1970). The comparison is in doubles: the clock plus
-- any bound below about 200 years is below 2^53 and exact, and a token at
-- or above 2^53, whose double may be rounded, is still above it.
local function fence_future(token, ahead)
  if ahead < 0 then
    return false
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return tonumber(token) > now + ahead, now
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
