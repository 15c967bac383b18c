-- hydrate.lua: restore an org's month counters for a period from durable storage and
-- mark the period live, atomically (see ../KEYS.md).
--
-- KEYS[1] month counters <p>:{<org>}|m|<period>; its field "|p" is the period marker.
-- ARGV[1] expire at (unix s), then pairs: counter field, stored value.
-- Each counter becomes max(in Redis, stored): checks counted in Redis after the last
-- persist are kept. Returns 1, or 0 when the marker was already there (another replica
-- hydrated first; nothing is changed).

if redis.call('HEXISTS', KEYS[1], '|p') == 1 then return 0 end
for i = 2, #ARGV, 2 do
  local have = tonumber(redis.call('HGET', KEYS[1], ARGV[i])) or 0
  if tonumber(ARGV[i + 1]) > have then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
redis.call('HSET', KEYS[1], '|p', '1')
if redis.call('TTL', KEYS[1]) == -1 then redis.call('EXPIREAT', KEYS[1], ARGV[1]) end
return 1
