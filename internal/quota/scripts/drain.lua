-- drain.lua: take up to ARGV[1] counters out of an org's dirty set for a period and
-- return them with their current values, atomically (see ../KEYS.md).
--
-- KEYS[1] dirty set <p>:{<org>}|d|<period>   KEYS[2] month counters <p>:{<org>}|m|<period>
-- Reply: flat array field, value, field, value...; a counter that changes after the
-- drain is marked dirty again by check.lua.

local fields = redis.call('SPOP', KEYS[1], ARGV[1])
local out = {}
for _, f in ipairs(fields) do
  out[#out + 1] = f
  out[#out + 1] = redis.call('HGET', KEYS[2], f) or '0'
end
return out
