-- lib_limit.lua: the limit and taking slots within it: limit_in_force
-- (SetLimit's, else the established one, else the caller's), establish
-- (for an acquiring client) and take_slots (the n lowest free slots).
-- Uses from lib_args.lua: free_key, call (freed, freed_next,
-- freed_sorted), SENTINEL, stored_limit; from lib_records.lua: get, num,
-- set.

-- limit_in_force is SetLimit's limit, else the one live clients established,
-- else the caller's.
local function limit_in_force(client_limit)
  return stored_limit(get('_fixed')) or stored_limit(get('_limit')) or client_limit
end

-- establish returns the limit for an acquiring client, or nil and the limit
-- that live clients established when they disagree with client_limit. A
-- semaphore with nothing held and nothing queued is idle: a client with
-- another limit establishes its own.
local function establish(client_limit)
  local fixed = stored_limit(get('_fixed'))
  if fixed then
    return fixed
  end
  local e = stored_limit(get('_limit'))
  if e ~= client_limit then
    if e and (num('_used') > 0 or num('_q') > 0) then
      return nil, e
    end
    set('_limit', client_limit)
  end
  return client_limit
end

-- take_slots takes the n lowest free slots: from the free set, then above
-- the high-water mark. With _used + n <= limit they all lie below limit.
local function take_slots(n)
  local slots = {}
  local have = num('_hw') - num('_used')
  local c = call
  if c.freed then
    -- Given back by this call, the free set holding none: the lowest
    -- free slots are here (then above the high-water mark).
    if not c.freed_sorted then
      local rest = {}
      local freed = c.freed
      for i = c.freed_next, #freed do
        rest[#rest + 1] = freed[i]
      end
      table.sort(rest)
      c.freed, c.freed_next, c.freed_sorted = rest, 1, true
    end
    local freed, from = c.freed, c.freed_next
    local last = math.min(from + n - 1, #freed)
    for i = from, last do
      slots[#slots + 1] = freed[i]
    end
    c.freed_next = last + 1
  elseif have > 0 then
    local popped = redis.call('ZPOPMIN', free_key, n < have and n or have)
    for i = 1, #popped, 2 do
      if popped[i] == SENTINEL then
        redis.call('ZADD', free_key, 'inf', SENTINEL) -- never happens while the counters hold
      else
        slots[#slots + 1] = tonumber(popped[i])
      end
    end
  end
  if #slots < n then
    local hw = num('_hw')
    while #slots < n do
      slots[#slots + 1] = hw
      hw = hw + 1
    end
    set('_hw', hw)
  end
  set('_used', num('_used') + n)
  return slots
end
