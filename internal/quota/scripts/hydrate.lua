-- hydrate.lua: restore an org's month counters and open reservations for a period from
-- durable storage and mark the period live, atomically (see ../KEYS.md).
--
-- KEYS[1] month counters <p>:{<org>}|m|<period>; its field "|p" is the period marker.
-- KEYS[2] open reservations <p>:{<org>}|x   KEYS[3] held units <p>:{<org>}|h|<period>
-- ARGV[1] expire at (unix s), ARGV[2] the org's key start <p>:{<org>}|, ARGV[3] n, then
-- n arguments in pairs: counter field, stored committed value; then each stored
-- reservation as a JSON object of its record's fields and "id".
-- A reservation missing from Redis is restored as it was stored: its record, and when
-- held its expiry in KEYS[2] and its amount in KEYS[3] (a settled one only answers
-- reads and repeated settlements); then each counter becomes max(in Redis, stored +
-- held): checks counted in Redis after the last persist are kept, and the held units
-- are in the counters as when they were persisted (drain.lua stores both at once).
-- Returns the number of held reservations restored plus one, or 0 when the marker was
-- already there (another replica hydrated first; nothing is changed).

if redis.call('HEXISTS', KEYS[1], '|p') == 1 then return 0 end
local n = tonumber(ARGV[3])
local want = {}
for i = 4, 3 + n, 2 do want[ARGV[i]] = tonumber(ARGV[i + 1]) end
local restored = 0
for i = 4 + n, #ARGV do
  local rec = cjson.decode(ARGV[i])
  local key = ARGV[2] .. 'r|' .. rec.id
  if redis.call('EXISTS', key) == 0 then
    local args = {}
    for k, v in pairs(rec) do
      if k ~= 'id' then args[#args + 1], args[#args + 2] = k, v end
    end
    redis.call('HSET', key, unpack(args))
    redis.call('EXPIREAT', key, math.floor(tonumber(rec.e) / 1000) + 86400)
    if rec.s == 'held' then
      redis.call('ZADD', KEYS[2], rec.e, rec.id)
      -- a multi-metric reservation (reserve.lua's nm) holds each metric's amount a<m>
      local nl, nm = tonumber(rec.nl), tonumber(rec.nm) or 1
      for l = 1, nl do
        redis.call('HINCRBY', KEYS[3], rec['f' .. l], rec['a' .. math.ceil(l / (nl / nm))] or rec.a)
      end
      restored = restored + 1
    end
  end
end
-- Concurrency (reserve.lua's ck, cn, cf<i>): when records came back, the in-flight hash
-- <p>:{<org>}|c (undeclared, like check.lua's) is rebuilt from every held reservation
-- in KEYS[2], so a slot is counted once whether the hash survived or went with them,
-- and none held in a restored record is lost. Leases never hold in flight.
if restored > 0 then
  local ck, sum = ARGV[2] .. 'c', {}
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    if string.sub(id, 1, 2) ~= 'l_' then
      local key = ARGV[2] .. 'r|' .. id
      local v = redis.call('HMGET', key, 's', 'a', 'cn', 'nl', 'nm')
      if v[1] == 'held' and v[3] then
        -- cf<l> holds its metric's amount: a<m> of a multi-metric reservation, else a
        local per = (tonumber(v[4]) or 1) / (tonumber(v[5]) or 1)
        for l = 1, tonumber(v[3]) do
          local f = redis.call('HGET', key, 'cf' .. l)
          local am = v[5] and redis.call('HGET', key, 'a' .. math.ceil(l / per)) or v[2]
          if f then sum[f] = (sum[f] or 0) + tonumber(am) end
        end
      end
    end
  end
  redis.call('DEL', ck)
  for f, v in pairs(sum) do
    if v > 0 then redis.call('HSET', ck, f, string.format('%d', v)) end
  end
end
local held = redis.call('HGETALL', KEYS[3])
for i = 1, #held, 2 do
  local f = held[i]
  want[f] = (want[f] or 0) + tonumber(held[i + 1])
end
for f, v in pairs(want) do
  local have = tonumber(redis.call('HGET', KEYS[1], f)) or 0
  if v > have then redis.call('HSET', KEYS[1], f, string.format('%d', v)) end
end
redis.call('HSET', KEYS[1], '|p', '1')
if redis.call('TTL', KEYS[1]) == -1 then redis.call('EXPIREAT', KEYS[1], ARGV[1]) end
if restored > 0 and redis.call('TTL', KEYS[3]) == -1 then redis.call('EXPIREAT', KEYS[3], ARGV[1]) end
return restored + 1
