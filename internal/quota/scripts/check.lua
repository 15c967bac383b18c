-- check.lua: one quota decision, all or nothing (see ../KEYS.md for the key layout).
--
-- KEYS[1] month counters  <p>:{<org>}|m|<period>  hash, one field per counter, plus the
--         period marker field "|p": without it the counters are not known to be complete
--         (Redis lost them, or the period just began), so the reply is "H" and nothing is
--         decided until the engine has hydrated them.
-- KEYS[2] dirty set       <p>:{<org>}|d|<period>  month fields changed since the last drain,
--         and the member '|', which keeps the set from disappearing when drained
-- KEYS[3] idempotency     <p>:{<org>}|i|<key>     optional
-- Sliding-window buckets <p>:{<org>}|w|<seconds>|<bucket> are named from Redis TIME, so
-- they cannot be declared in KEYS; they share the org's hash tag (same cluster slot).
--
-- ARGV[1] "<p>:{<org>}|"   ARGV[2] cost   ARGV[3] "1" = count even over a limit (shadow, warn)
-- ARGV[4] month keys expire at (unix s)   ARGV[5] period end (unix ms)
-- ARGV[6] idempotency TTL (s)   ARGV[7] nw, then nw sliding window lengths in seconds:
--   every window that any level limits; each is counted at every level.
-- Then nl, and per level: letter (o|t|u), counter field, id, n, then n pairs
--   (window index: 0 = month, i = i-th sliding window; limit).
--
-- Reply: "H" (hydrate first), or "R" .. stored for an idempotent replay, or the decision:
--   without an idempotency key, an array: status, now_ms (0 if not read), retry_ms,
--     blocked_row, then the used value of every row (the engine knows the rest of a row
--     from its request, and Redis, not Lua, turns the numbers into text);
--   with one, one string, stored as is for replays (a later request may carry other limits):
--     status;now_ms;retry_ms;blocked_row;row;row...    row = letter|id|window|limit|used|reset_ms
--   status: A allowed, D denied, W over a limit but counted (shadow, warn).
--   Rows: every level in order, each limit of the level in ARGV order; window is the
--   length in seconds or M (month); blocked_row is 1-based, 0 = none.
--
-- Redis time is the budget (docs/PERFORMANCE.md): every redis.call costs about a
-- microsecond and every string.format about as much, so the script makes one HMGET per
-- hash read, one HSET per hash written (values read just before: the script runs
-- alone), TTL only for a new field, and formats numbers only for a stored reply.
-- Numbers given to redis.call or returned are converted exactly by Redis (counters are
-- at most 2^53).

local idem = KEYS[3]
if idem then
  local first = redis.call('GET', idem)
  if first then return 'R' .. first end
end

local cost = tonumber(ARGV[2])
local nw = tonumber(ARGV[7])
local first = 9 + nw -- ARGV index of the first level
local nl = tonumber(ARGV[first - 1])

-- the levels' counter fields, for HMGET, HSET and SADD; the rest is read from ARGV when needed
local fields = {}
local p = first
for l = 1, nl do
  fields[l] = ARGV[p + 1]
  p = p + 4 + 2 * tonumber(ARGV[p + 3])
end

local month = redis.call('HMGET', KEYS[1], '|p', unpack(fields))
if not month[1] then return 'H' end

-- Redis's clock, read only when needed: by sliding windows, or to say when a denied
-- month limit resets.
local now
local wcur, wms, wel, cur, prev = {}, {}, {}, {}, {}
if nw > 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local prefix = ARGV[1]
  for i = 1, nw do
    local sec = ARGV[7 + i]
    local ms = tonumber(sec) * 1000
    local b = math.floor(now / ms)
    wms[i], wel[i] = ms, now - b * ms
    -- b < 2^31 for second buckets: Lua's own number-to-text is exact here
    wcur[i] = prefix .. 'w|' .. sec .. '|' .. b
    cur[i] = redis.call('HMGET', wcur[i], unpack(fields))
    prev[i] = redis.call('HMGET', prefix .. 'w|' .. sec .. '|' .. (b - 1), unpack(fields))
  end
end

-- Decide: used + cost <= limit for every limit of every level. Rows keep the used values.
local mreset = tonumber(ARGV[5])
local used = {}
local n, blocked, brank, retry = 0, 0, 0, 0
p = first
for l = 1, nl do
  local q = p + 4
  p = q + 2 * tonumber(ARGV[p + 3])
  while q < p do
    local w, limit = tonumber(ARGV[q]), tonumber(ARGV[q + 1])
    q = q + 2
    local u, wait, rank
    if w == 0 then
      u, rank = tonumber(month[l + 1]) or 0, 1e15
      if u + cost > limit then
        if not now then
          local t = redis.call('TIME')
          now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        end
        wait = math.max(mreset - now, 1)
      end
    else
      local c = tonumber(cur[w][l]) or 0
      local pv = tonumber(prev[w][l]) or 0
      local ms, el = wms[w], wel[w]
      u, rank = c + math.floor(pv * (ms - el) / ms), ms
      if u + cost > limit then
        -- how long until cost fits: the previous bucket's weight must fall, or, when the
        -- current bucket alone is too full, this bucket must become the previous one
        local room = limit - cost
        if room < 0 then
          wait = ms - el
        elseif c <= room then
          wait = math.max(math.ceil(ms * (1 - (room - c) / pv)) - el, 1)
        else
          wait = (ms - el) + math.ceil(ms * (1 - room / c))
        end
      end
    end
    n = n + 1
    if wait then
      -- broadest window wins; at equal windows the first (highest) level keeps it
      if rank > brank then brank, blocked = rank, n end
      if wait > retry then retry = wait end
    end
    used[n] = u
  end
end

local status = 'A'
if blocked > 0 then
  if ARGV[3] == '1' then status = 'W' else status = 'D' end
end
local add = 0
if cost > 0 and status ~= 'D' then
  -- Count at every level: month counters, the dirty set, every limited window's bucket.
  -- A TTL is set only when a counter creates its key (its first field).
  add = cost
  local hs, created = {}, false
  for l = 1, nl do
    local v = month[l + 1]
    if not v then created = true end
    hs[2 * l - 1], hs[2 * l] = fields[l], (tonumber(v) or 0) + cost
  end
  redis.call('HSET', KEYS[1], unpack(hs))
  if created and redis.call('TTL', KEYS[1]) == -1 then redis.call('EXPIREAT', KEYS[1], ARGV[4]) end
  -- The member '|' is never drained: the set outlives a drain, so the org's keys are
  -- either all present or all absent and a cluster slot migration never finds them
  -- split (the importing node answers TRYAGAIN to a script whose keys it lacks).
  if redis.call('SADD', KEYS[2], '|', unpack(fields)) > 0 and redis.call('TTL', KEYS[2]) == -1 then
    redis.call('EXPIREAT', KEYS[2], ARGV[4])
  end
  for i = 1, nw do
    created = false
    local c = cur[i]
    for l = 1, nl do
      local v = c[l]
      if not v then created = true end
      hs[2 * l] = (tonumber(v) or 0) + cost
    end
    redis.call('HSET', wcur[i], unpack(hs))
    if created and redis.call('TTL', wcur[i]) == -1 then
      local ms = wms[i]
      redis.call('EXPIREAT', wcur[i], (math.floor(now / ms) + 2) * (ms / 1000) + 1)
    end
  end
end

if not idem then
  local out = {status, now or 0, retry, blocked}
  for i = 1, n do out[i + 4] = used[i] + add end
  return out
end

-- The full reply, stored for replays.
local out = {string.format('%s;%d;%d;%d', status, now or 0, retry, blocked)}
p, n = first, 0
for l = 1, nl do
  local letter, id = ARGV[p], ARGV[p + 2]
  local q = p + 4
  p = q + 2 * tonumber(ARGV[p + 3])
  while q < p do
    local w = tonumber(ARGV[q])
    n = n + 1
    local wname, reset
    if w == 0 then
      wname, reset = 'M', mreset
    else
      wname, reset = ARGV[7 + w], now - wel[w] + wms[w]
    end
    out[n + 1] = string.format('%s|%s|%s|%s|%d|%d', letter, id, wname, ARGV[q + 1], used[n] + add, reset)
    q = q + 2
  end
end
local reply = table.concat(out, ';')
redis.call('SET', idem, reply, 'EX', ARGV[6])
return reply
