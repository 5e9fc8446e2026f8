-- lib_bind.lua: bind, which every script calls first: it sets the
-- per-call state that the files before it declare.
-- Uses the state of lib_args.lua (KEYS, ARGV, the key names, CHAN, PUB,
-- CLOCK_MS, CLOCK_US, CRL, CRP), of lib_records.lua (META, DIRTY, GONE,
-- NUMS, RATE_LOADED, FREED, HZ_MOVED), of lib_rate.lua (RL, RP_US,
-- RATE_AT) and of lib_queue.lua (SDL), and fail (lib_args.lua).

-- bind starts a call: it sets the per-call state declared above from the
-- call's keys and arguments, and returns an error reply when they do not
-- have the shape every script needs (nil when they do).
local function bind(keys, argv)
  KEYS, ARGV = keys, argv
  if #keys ~= 9 then
    return fail('want 9 keys, got ' .. #keys)
  end
  -- holders, queue, sessions, free, ended, meta, limit, window, rate
  H, Q, S, F, E, M, O, W, R = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7], keys[8], keys[9]
  CHAN, PUB = argv[1], argv[2]
  if PUB ~= 'PUBLISH' and PUB ~= 'SPUBLISH' then
    return fail('bad publish command: ' .. tostring(PUB))
  end
  CLOCK_MS, CLOCK_US = 0, 0
  CRL, CRP = 0, 0
  RL, RP_US, RATE_AT, RATE_LOADED = nil, nil, nil, false
  META, DIRTY, GONE, NUMS = nil, {}, nil, {} -- META: load makes it; GONE: del
  FREED = nil
  HZ_MOVED = false
  SDL = nil
  return nil
end
