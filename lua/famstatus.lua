-- famstatus.lua: read a keyed family's total and its use; writes nothing
-- (run it with FCALL_RO or EVALSHA_RO).
-- KEYS: the family's four keys laid out at the top of lib_family.lua, then
-- [5] the sessions key of its members (prefix:{tag}:f:sessions).
-- ARGV: [1] channel base, [2] publish command, [3] client limit and total
--       ("limit+total:f" or ":u", as in client_arg, lib_args.lua).
-- Reply: {total, held, waiting, now}: the total in force (0: none), the
--        slots of the family's live leases (deadline after now), and the
--        entries of every member's fair queue (those of dead processes
--        included until they are evicted).
local client_limit, err = client_arg()
if err then return err end
local now = clock()
local v = redis.call('HMGET', fam_tot_key, '_total', '_ftotal')
local total
if v[2] then
  total = tonumber(v[2]) or 0
else
  total = redis.call('GET', fam_total_key)
  total = total and tonumber(total) or stored_limit(v[1]) or fam_client_total
end
local held = 0
local ids = redis.call('ZRANGE', fam_leases_key, '(' .. now, '(inf', 'BYSCORE')
if #ids > 0 then
  for i = 1, #ids, CHUNK do
    local part = {unpack(ids, i, math.min(i + CHUNK - 1, #ids))}
    local w = redis.call('HMGET', fam_tot_key, unpack(part))
    for k = 1, #part do
      held = held + (tonumber(w[k]) or 1)
    end
  end
end
local waiting = 0
local heads = redis.call('ZRANGE', fam_heads_key, 0, -1)
for _, base in ipairs(heads) do
  if base ~= SENTINEL then
    -- A member's queue: its keys share the family's tag (one slot).
    waiting = waiting + math.max(redis.call('ZCARD', base .. 'queue') - 1, 0)
  end
end
return {total, held, waiting, now}
