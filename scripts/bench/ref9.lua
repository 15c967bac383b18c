-- ref9.lua: the baseline make bench measures check.lua against, in the same run. The
-- plainest cascade script of the same shape: three levels x (month + two minute
-- buckets) = 9 string keys, one MGET, the weighted sliding-window estimate, all or
-- nothing, then INCRBY of the month and current-bucket key of each level. No period
-- marker, dirty set, TTLs, idempotency or usage in the reply: what check.lua does
-- beyond this is the price of durability and of its answer.
--
-- KEYS: per level (org, team, user): month, current bucket, previous bucket
-- ARGV[1] cost, ARGV[2] weight of the previous bucket (0..1), then per level: month
-- limit, minute limit. Reply: 1 admitted, 0 denied.
local v = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
local cost, weight = tonumber(ARGV[1]), tonumber(ARGV[2])
for l = 0, 2 do
  local m = tonumber(v[l * 3 + 1]) or 0
  local c = tonumber(v[l * 3 + 2]) or 0
  local p = tonumber(v[l * 3 + 3]) or 0
  if m + cost > tonumber(ARGV[3 + l * 2]) then return 0 end
  if c + math.floor(p * weight) + cost > tonumber(ARGV[4 + l * 2]) then return 0 end
end
for l = 0, 2 do
  redis.call('INCRBY', KEYS[l * 3 + 1], ARGV[1])
  redis.call('INCRBY', KEYS[l * 3 + 2], ARGV[1])
end
return 1
