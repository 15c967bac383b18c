-- drain.lua: for each of ARGV[3] periods of one org, take up to ARGV[1] counters out
-- of the org's dirty set of that period and return them with their committed values,
-- with the epoch and version of the period's would-block record, and (with the last
-- key) the reservations of those periods changed since the last drain, atomically
-- (see ../KEYS.md): one snapshot, so the ledger's committed units and the reservations
-- held are never from two moments.
--
-- KEYS, four per period i (i = 1..n):
--   KEYS[4i-3] dirty set <p>:{<org>}|d|<period>   KEYS[4i-2] month counters <p>:{<org>}|m|<period>
--   KEYS[4i-1] held units <p>:{<org>}|h|<period>  KEYS[4i]   would-block record <p>:{<org>}|b|<period>
-- and optionally KEYS[4n+1] changed reservations <p>:{<org>}|rd.
-- ARGV[1] the most to take of each set, ARGV[2] the org's key start <p>:{<org>}|,
-- ARGV[3] n, ARGV[3+i] period i.
-- Reply: for each period i, a flat array field, value, field, value..., then an array
-- of the record's epoch and version ('' and '0' when there is none); then, with the
-- last key, an array of each changed reservation of those periods as a JSON object of
-- its record's fields and "id" (ids of other periods are put back for their period's
-- drain). A value is the counter less the units held by open reservations: the
-- committed units, which never fall (a settlement gives back only what was held). A
-- counter that changes after the drain is marked dirty again by check.lua (and
-- settle.lua).

-- The member '|' is not a counter: check.lua keeps it in the set so that the set
-- lives as long as the month counters (see there); it goes back if popped.

local n = tonumber(ARGV[3])
local out = {}
local periods = {}
for i = 1, n do
  local dirty, month, held = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1]
  periods[ARGV[3 + i]] = true
  -- A set of at most one run is read whole and its fields removed, so the keeper
  -- stays and the set keeps its TTL; a bigger one is popped a run at a time.
  local size = redis.call('SCARD', dirty)
  local fs = {}
  if size > 0 and size <= tonumber(ARGV[1]) then
    for _, f in ipairs(redis.call('SMEMBERS', dirty)) do
      if f ~= '|' then fs[#fs + 1] = f end
    end
    if #fs > 0 then redis.call('SREM', dirty, unpack(fs)) end
  elseif size > 0 then
    local ttl = redis.call('PTTL', dirty)
    for _, f in ipairs(redis.call('SPOP', dirty, ARGV[1])) do
      if f == '|' then
        -- Popping the last member deleted the set, and its TTL with it.
        redis.call('SADD', dirty, '|')
        if ttl > 0 and redis.call('PTTL', dirty) == -1 then redis.call('PEXPIRE', dirty, ttl) end
      else
        fs[#fs + 1] = f
      end
    end
  end
  local got = {}
  if #fs > 0 then
    local have = redis.call('HMGET', month, unpack(fs))
    local hold = redis.call('HMGET', held, unpack(fs))
    for j, f in ipairs(fs) do
      local v = (tonumber(have[j]) or 0) - (tonumber(hold[j]) or 0)
      -- bounded (check.lua's MAXC, 2^51): a value stored out of range is read as the bound
      if not (v > 0) then v = 0 elseif v > 2251799813685248 then v = 2251799813685248 end
      got[#got + 1] = f
      got[#got + 1] = string.format('%d', v)
    end
  end
  out[#out + 1] = got
  local wb = redis.call('HMGET', KEYS[4 * i], 'e', 'v')
  out[#out + 1] = {wb[1] or '', wb[2] or '0'}
end
if #KEYS > 4 * n then
  local recs, keep = {}, {}
  for _, id in ipairs(redis.call('SPOP', KEYS[4 * n + 1], ARGV[1])) do
    local h = redis.call('HGETALL', ARGV[2] .. 'r|' .. id)
    if #h > 0 then
      local rec = {id = id}
      for i = 1, #h, 2 do rec[h[i]] = h[i + 1] end
      if periods[rec.p] then recs[#recs + 1] = cjson.encode(rec) else keep[#keep + 1] = id end
    end
  end
  if #keep > 0 then redis.call('SADD', KEYS[4 * n + 1], unpack(keep)) end
  out[#out + 1] = recs
end
return out
