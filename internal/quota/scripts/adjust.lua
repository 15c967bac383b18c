-- adjust.lua: an operator's correction of one month counter (see ../KEYS.md and
-- adjust.go): set its committed units to a value, or add to them (a negative amount
-- lowers them), atomically, within 0..2^51 (check.lua's MAXC).
--
-- KEYS[1] month counters <p>:{<org>}|m|<period>   KEYS[2] dirty set <p>:{<org>}|d|<period>
-- KEYS[3] held units <p>:{<org>}|h|<period>  KEYS[4] the dirty-org index (check.lua's KEYS[3])
-- ARGV[1] the counter field, ARGV[2] set or add, ARGV[3] the amount, ARGV[4] the month
-- keys' expiry (unix s).
--
-- The committed units are the counter less the units held by open reservations (as
-- drain.lua persists them); the held units stay in the counter. A value stored out of
-- range, or not a number, reads as MAXC (as check.lua reads it), so it can be fixed.
-- Reply: "H" when the period is not hydrated (nothing changed), else "before;after"
-- (committed units). The field goes into the dirty set: the next drain persists it.

if redis.call('HEXISTS', KEYS[1], '|p') == 0 then return 'H' end
local MAXC = 2251799813685248
local function num(v, missing)
  if not v then return missing end
  v = tonumber(v)
  if not v or v ~= v or v > MAXC then return MAXC end
  if v < 0 then return 0 end
  return math.floor(v)
end
local f = ARGV[1]
local have = num(redis.call('HGET', KEYS[1], f), 0)
local held = num(redis.call('HGET', KEYS[3], f), 0)
local before = have - held
if before < 0 then before = 0 end
local n = tonumber(ARGV[3])
local after = n
if ARGV[2] == 'add' then after = before + n end
if after < 0 then after = 0 end
if after + held > MAXC then after = MAXC - held end
redis.call('HSET', KEYS[1], f, string.format('%d', after + held))
if redis.call('SADD', KEYS[2], '|', f) > 1 then redis.call('EXPIREAT', KEYS[2], ARGV[4]) end
redis.call('SADD', KEYS[4], string.match(KEYS[1], ':{([^}]*)}|'))
return string.format('%d;%d', before, after)
