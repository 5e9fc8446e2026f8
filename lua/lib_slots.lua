-- lib_slots.lua: the records of leases and waiters and the slots they
-- hold: slot_list, parse_lease, lease_shared, lease_slots and parse_waiter read a
-- record; give_back returns slots to the free set (or keeps them in
-- call.freed for a grant of the same call); drop_holders removes holder
-- entries and frees their slots.
-- Uses from lib_args.lua: holders_key, call (freed, freed_next,
-- freed_sorted), fam_tot_key, CHUNK; from lib_records.lua: get, num, set,
-- del, records, add_free; from lib_family.lua: fam_drop.

-- slot_list returns the slots of a record's "s1,s2,..." as a list.
local function slot_list(slots)
  if not string.find(slots, ',', 1, true) then
    return {tonumber(slots)} -- one slot: most leases
  end
  local list = {}
  for s in string.gmatch(slots, '%d+') do
    list[#list + 1] = tonumber(s)
  end
  return list
end

-- parse_lease returns token, slots (a list) and owner of a lease record
-- "L|token|s1,s2,...|owner", or "L|token|s1,s2,...|owner|r" once another
-- process took a handle of it (Resume: lease_shared). An owner holds no '|'.
local function parse_lease(rec)
  local token, slots, owner = string.match(rec, '^L|(%d+)|([%d,]+)|([^|]*)')
  return tonumber(token), slot_list(slots), owner
end

-- lease_shared reports whether a lease record is marked as resumed by a
-- process (renew.lua's "resume" mode): a give-up at one handle's deadline
-- (release.lua's "expire" mode) then leaves the lease to its deadline.
local function lease_shared(rec)
  return string.sub(rec, -2) == '|r'
end

-- lease_slots returns the slots (a list) of a lease record.
local function lease_slots(rec)
  return slot_list(string.match(rec, '^L|%d+|([%d,]+)|'))
end

-- parse_waiter returns session, weight, lease_ms and owner of a waiter
-- record, and whether a client built without a total queued it (a
-- trailing "|n", see lib_args.lua: admit never grants it in a family that
-- counts a total).
local function parse_waiter(rec)
  local sid, n, lease_ms, owner, mark = string.match(rec, '^W|([^|]+)|(%d+)|(%d+)|([^|]*)(.*)$')
  return sid, tonumber(n), tonumber(lease_ms), owner, mark == '|n'
end

-- give_back returns slots to the free set (see call.freed, lib_records.lua).
local function give_back(slots)
  if #slots == 0 then
    return
  end
  local c = call
  local freed = c.freed
  if freed then
    for _, s in ipairs(slots) do
      freed[#freed + 1] = s
    end
    c.freed_sorted = false
  elseif num('_hw') == num('_used') then
    -- The free set holds no slot: keep them for a grant of this call
    -- (the list is call.freed from now on: callers pass one they drop).
    c.freed, c.freed_next, c.freed_sorted = slots, 1, #slots == 1
  else
    add_free(slots, 1)
  end
  set('_used', num('_used') - #slots)
end

-- drop_holders removes holder entries and frees their slots. It returns
-- how many of the ids had a holder entry.
local function drop_holders(ids)
  local k = #ids
  if k == 0 then
    return 0
  end
  records(ids)
  local removed
  if k == 1 then
    removed = redis.call('ZREM', holders_key, ids[1])
  else
    removed = 0
    for i = 1, k, CHUNK do
      removed = removed + redis.call('ZREM', holders_key, unpack(ids, i, math.min(i + CHUNK - 1, k)))
    end
  end
  local slots
  for i = 1, k do
    local id = ids[i]
    local rec = get(id)
    if rec and string.sub(rec, 1, 1) == 'L' then
      local list = lease_slots(rec)
      if fam_tot_key then
        fam_drop(id, #list) -- a family's total counts it no more
      end
      if not slots then
        slots = list
      else
        for _, s in ipairs(list) do
          slots[#slots + 1] = s
        end
      end
      del(id)
    end
  end
  if slots then
    give_back(slots)
  end
  return removed
end
