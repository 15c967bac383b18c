-- wouldblock.lua: add one replica's would-block counts of an org and period to the
-- org's record, keeping at most a cap of distinct rows (see ../KEYS.md).
--
-- KEYS[1] record hash <p>:{<org>}|b|<period>   KEYS[2] the replica's last batch <p>:{<org>}|s|<replica>
-- KEYS[3] the dirty-org index (check.lua's KEYS[3]): a record that changed is flushed
-- ARGV[1] cap on distinct rows, ARGV[2] the hash's expiry (unix ms), ARGV[3] the
-- epoch to give a new hash, ARGV[4] the batch's sequence number (rising per replica),
-- then per entry: day (YYYY-MM-DD), row, checks, units.
-- Reply: 1 applied, 0 already applied (the same batch sent again after a lost reply).
--
-- A row is <metric>|<window>|o, <metric>|<window>|t|<team> or
-- <metric>|<window>|u|<team>|<user>, or * for everything beyond the cap, so totals
-- stay exact however many ids would have been blocked. Fields: e (epoch: a new value
-- whenever the hash is created, so a hash lost with Redis is never mistaken for the
-- one persisted), v (applied batches), n (distinct rows), r|<row> (a row is known),
-- c|<day>|<row> (checks) and u|<day>|<row> (units).

local seq = tonumber(ARGV[4])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last >= seq then return 0 end
-- The replica's marker only has to outlive its retries of one batch.
redis.call('SET', KEYS[2], ARGV[4], 'PX', 3600000)
redis.call('SADD', KEYS[3], string.match(KEYS[1], ':{([^}]*)}|'))

local h = KEYS[1]
if redis.call('HSETNX', h, 'e', ARGV[3]) == 1 then
  redis.call('PEXPIREAT', h, ARGV[2])
end
local cap = tonumber(ARGV[1])
local n = tonumber(redis.call('HGET', h, 'n') or '0')
local n0 = n
for i = 5, #ARGV, 4 do
  local day, row = ARGV[i], ARGV[i + 1]
  if row ~= '*' and redis.call('HEXISTS', h, 'r|' .. row) == 0 then
    if n < cap then
      n = n + 1
      redis.call('HSET', h, 'r|' .. row, 1)
    else
      row = '*'
    end
  end
  redis.call('HINCRBY', h, 'c|' .. day .. '|' .. row, ARGV[i + 2])
  redis.call('HINCRBY', h, 'u|' .. day .. '|' .. row, ARGV[i + 3])
end
if n ~= n0 then redis.call('HSET', h, 'n', n) end
redis.call('HINCRBY', h, 'v', 1)
return 1
