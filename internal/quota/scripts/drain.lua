-- drain.lua: take up to ARGV[1] counters out of an org's dirty set for a period and
-- return them with their committed values, and (with KEYS[4]) the reservations of the
-- period changed since the last drain, atomically (see ../KEYS.md): one snapshot, so
-- the ledger's committed units and the reservations held are never from two moments.
--
-- KEYS[1] dirty set <p>:{<org>}|d|<period>   KEYS[2] month counters <p>:{<org>}|m|<period>
-- KEYS[3] held units <p>:{<org>}|h|<period>  KEYS[4] changed reservations <p>:{<org>}|rd (optional)
-- ARGV[1] the most to take, ARGV[2] the period, ARGV[3] the org's key start <p>:{<org>}|
-- Reply: flat array field, value, field, value...; a counter that changes after the
-- drain is marked dirty again by check.lua (and settle.lua). A value is the counter
-- less the units held by open reservations: the committed units, which never fall
-- (a settlement gives back only what was held). With KEYS[4], then '|r' and each
-- changed reservation of the period as a JSON object of its record's fields and "id";
-- ids of other periods are put back for their period's drain.

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
    local v = (tonumber(redis.call('HGET', KEYS[2], f)) or 0) - (tonumber(redis.call('HGET', KEYS[3], f)) or 0)
    -- bounded (check.lua's MAXC, 2^51): a value stored out of range is read as the bound
    if not (v > 0) then v = 0 elseif v > 2251799813685248 then v = 2251799813685248 end
    out[#out + 1] = f
    out[#out + 1] = string.format('%d', v)
  end
end
if KEYS[4] then
  out[#out + 1] = '|r'
  local keep = {}
  for _, id in ipairs(redis.call('SPOP', KEYS[4], ARGV[1])) do
    local h = redis.call('HGETALL', ARGV[3] .. 'r|' .. id)
    if #h > 0 then
      local rec = {id = id}
      for i = 1, #h, 2 do rec[h[i]] = h[i + 1] end
      if rec.p == ARGV[2] then out[#out + 1] = cjson.encode(rec) else keep[#keep + 1] = id end
    end
  end
  if #keep > 0 then redis.call('SADD', KEYS[4], unpack(keep)) end
end
return out
