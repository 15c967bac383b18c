-- extend.lua: move a held reservation's expiry (a heartbeat for long work); see
-- ../KEYS.md and reserve.lua for the record's fields.
--
-- KEYS[1] open reservations <p>:{<org>}|x    KEYS[2] changed ids <p>:{<org>}|rd
-- KEYS[3] the org's month counters of the current period (for its marker)
-- KEYS[4] the reservation <p>:{<org>}|r|<id>
-- KEYS[5] the dirty-org index (check.lua's KEYS[3]): the changed expiry is flushed
-- ARGV[1] now (ms, the engine's clock), ARGV[2] the new expires_at (ms), ARGV[3] the
-- record's new expiry (unix s), ARGV[4] the reservation id.
--
-- Only a held reservation not yet past its expiry moves: its e, its score in x and its
-- record's TTL, and it is marked changed so the drain persists the new expiry. Reply:
-- "OK"; "S" and the state when settled; "X" when held but past its expiry (its
-- on_expiry settles it: the engine asks settle.lua, which the sweep would run anyway);
-- "N" when there is no such reservation; "H" when there is none and the org's counters
-- are not hydrated (the engine hydrates, which restores held reservations, and asks
-- again).

local h = redis.call('HMGET', KEYS[4], 's', 'e')
if not h[1] then
  if redis.call('HEXISTS', KEYS[3], '|p') == 0 then return 'H' end
  return 'N'
end
if h[1] ~= 'held' then return 'S' .. h[1] end
if tonumber(ARGV[1]) >= tonumber(h[2]) then return 'X' end
redis.call('HSET', KEYS[4], 'e', ARGV[2])
redis.call('EXPIREAT', KEYS[4], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[4])
redis.call('SADD', KEYS[5], string.match(KEYS[1], ':{([^}]*)}|'))
return 'OK'
