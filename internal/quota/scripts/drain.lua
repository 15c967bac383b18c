-- drain.lua: take up to ARGV[1] counters out of an org's dirty set for a period and
-- return them with their current values, atomically (see ../KEYS.md).
--
-- KEYS[1] dirty set <p>:{<org>}|d|<period>   KEYS[2] month counters <p>:{<org>}|m|<period>
-- Reply: flat array field, value, field, value...; a counter that changes after the
-- drain is marked dirty again by check.lua.

-- The member '|' is not a counter: check.lua keeps it in the set so that the set
-- lives as long as the month counters (see there); it goes back if popped.

local ttl = redis.call('PTTL', KEYS[1])
local fields = redis.call('SPOP', KEYS[1], ARGV[1])
local out = {}
for _, f in ipairs(fields) do
  if f == '|' then
    -- Popping the last member deleted the set, and its TTL with it.
    redis.call('SADD', KEYS[1], '|')
    if ttl > 0 and redis.call('PTTL', KEYS[1]) == -1 then redis.call('PEXPIRE', KEYS[1], ttl) end
  else
    out[#out + 1] = f
    out[#out + 1] = redis.call('HGET', KEYS[2], f) or '0'
  end
end
return out
