-- settle.lua: settle one reservation (commit, release) or sweep an org's due ones
-- (expire), atomically; see ../KEYS.md and reserve.lua for the record's fields.
--
-- KEYS[1] open reservations <p>:{<org>}|x    KEYS[2] changed ids <p>:{<org>}|rd
-- KEYS[3] the org's month counters of the current period (for its marker)
-- KEYS[4] the reservation <p>:{<org>}|r|<id> (commit and release)
-- KEYS[#KEYS] (5, or 4 for a sweep) the dirty-org index (check.lua's KEYS[3]): a
-- settled reservation is a change for the flush
-- ARGV[1] action: commit, release or sweep; ARGV[2] now (ms, the engine's clock);
-- ARGV[3] used (commit): a number, or per metric "metric=used,metric=used" (a metric
-- left out used 0; a multi-metric reservation takes only this form); ARGV[4] the
-- reservation id (commit, release);
-- ARGV[5] the org's key start <p>:{<org>}| and ARGV[6] the most to expire (sweep).
--
-- Only a held reservation moves, so whoever comes first (a commit, a release, a sweep
-- on any worker) settles it and every later attempt sees its state: one winner. A
-- reservation past its expires_at is settled by its on_expiry whoever asks, so the
-- outcome does not depend on when a sweep runs. Settling gives amount - used back to
-- the month counters and to each charged sliding-window bucket that is still the
-- current or previous bucket of its window (one that rolled out is left alone), never
-- below 0, and takes the amount off the held units; used > amount is counted in full
-- (month and current buckets, no limit looked at; a counter stops at 2^51, the
-- bound of check.lua) and reported as over-reserved. In a
-- precise window (record field ns) the units go back into the sub-bucket they were
-- taken from (bs<i>) as well as its bucket's total, and an excess goes into the current
-- sub-bucket too.
-- A token bucket the reservation took from (reserve.lua's gk<i>) gets the unused units
-- back as tokens: its TAT moves back by give x T, never before now (a bucket never holds
-- more than its burst; a TAT at or before now is a full bucket, and its key goes); an
-- excess moves it forward by over x T from now at least, however far (no limit looked
-- at), but never past 2^52 microseconds ahead. Rounded up either way: never early.
--
-- Reply (commit, release): the answer "state;amount;used;released;over;settled_ms;
-- expires_ms;on_expiry;period;first counter field;last counter field", and for a
-- multi-metric reservation (record field nm, reserve.lua) ";" and per metric
-- "metric=amount/used/released/over" joined by "," (amount..over above are the first
-- metric's), when this call settled it; "U" and a metric when used names one the
-- reservation does not hold (or is a bare number for several metrics): nothing settled; "R" and the stored answer when it was already settled
-- the same way (a repeated commit or release); "S" and the state when it was settled
-- otherwise; "N" when there is no such reservation; "H" when there is none and the
-- org's counters are not hydrated (the engine hydrates, which restores open
-- reservations, and asks again). Sweep: an array of "id;answer" for those it expired.

local fmt, floor = string.format, math.floor
-- Bounded numbers (check.lua): a counter never passes MAXC = 2^51; a stored value
-- that is not a number reads as 0 here (a give-back cannot take it below 0).
local MAXC = 2251799813685248
local now = tonumber(ARGV[2])

local function settle(rkey, id, action, used)
  local h = redis.call('HGETALL', rkey)
  if #h == 0 then return nil end
  local r = {}
  for i = 1, #h, 2 do r[h[i]] = h[i + 1] end
  local state = r.s
  if state ~= 'held' then
    if action == 'commit' and state == 'committed' or action == 'release' and state == 'released' then
      return 'R' .. r.r
    end
    return 'S' .. state
  end
  local nl, nw = tonumber(r.nl), tonumber(r.nw)
  local fields = {}
  for l = 1, nl do fields[l] = r['f' .. l] end
  -- Per metric (one unless several, reserve.lua's nm): amount, used, given back, over;
  -- counter l is metric ceil(l / per)'s.
  local nm = tonumber(r.nm) or 1
  local per = nl / nm
  local amounts, useds, names = {}, {}, {}
  for m = 1, nm do
    amounts[m] = tonumber(r['a' .. m] or r.a)
    names[m] = string.match(fields[(m - 1) * per + 1], '^[^|]*')
  end
  if now >= tonumber(r.e) then
    state = 'expired'
    for m = 1, nm do if r.x == 'release' then useds[m] = 0 else useds[m] = amounts[m] end end
  elseif action == 'sweep' then
    return 'E' -- not due (the sorted set was behind)
  elseif action == 'commit' then
    state = 'committed'
    if string.find(used, '=', 1, true) then
      for m = 1, nm do useds[m] = 0 end
      for name, v in string.gmatch(used, '([^=,]+)=(%d+)') do
        local found = false
        for m = 1, nm do
          if names[m] == name then useds[m], found = tonumber(v), true end
        end
        if not found then return 'U' .. name end
      end
    elseif nm > 1 then
      return 'U'
    else
      useds[1] = tonumber(used)
    end
  else
    state = 'released'
    for m = 1, nm do useds[m] = 0 end
  end
  local gives, overs, give, over = {}, {}, 0, 0
  for m = 1, nm do
    gives[m], overs[m] = 0, 0
    if useds[m] < amounts[m] then gives[m] = amounts[m] - useds[m] else overs[m] = useds[m] - amounts[m] end
    give, over = give + gives[m], over + overs[m]
  end
  -- per counter: dg given back, dov over-reserved, dam held (in flight), dh held units
  local dg, dov, dam, dh, dmonth, cutany = {}, {}, {}, {}, {}, false
  -- A month count that stopped at 2^51 (reserve.lua's k<l>: the units not counted,
  -- not held) is given back only what it gained: the counter ends at its value before
  -- the reservation plus used, at most 2^51.
  for l = 1, nl do
    local m = math.ceil(l / per)
    local k = tonumber(r['k' .. l]) or 0
    if k > 0 then cutany = true end
    dg[l], dov[l], dam[l], dh[l] = -gives[m], overs[m], -amounts[m], k - amounts[m]
    dmonth[l] = overs[m] - gives[m] + k
  end
  local amount = amounts[1]
  used = useds[1]

  local hs = {}
  local function put(key, vals, delta, skipMissing)
    local n = 0
    for l = 1, nl do
      local v = vals[l]
      if v or not skipMissing then
        v = math.min(tonumber(v) or 0, MAXC) + delta[l]
        if not (v > 0) then v = 0 elseif v > MAXC then v = MAXC end
        hs[2 * n + 1], hs[2 * n + 2] = fields[l], fmt('%d', v)
        n = n + 1
      end
    end
    if n > 0 then redis.call('HSET', key, unpack(hs, 1, 2 * n)) end
  end
  if give > 0 or over > 0 or cutany then
    put(r.m, redis.call('HMGET', r.m, unpack(fields)), dmonth, false)
  end
  -- Always dirty: the drain persists counter - held (the committed units), which moves
  -- whenever a reservation settles, even when the counter does not.
  redis.call('SADD', r.d, unpack(fields))
  put(r.h, redis.call('HMGET', r.h, unpack(fields)), dh, true)
  -- Concurrency (reserve.lua): each counter's whole amount leaves flight, whatever was
  -- used, from exactly the fields the record charged, never below 0; a field at 0 is
  -- deleted, so the hash is gone when nothing is in flight. cf<l> is f<l>, holding its
  -- metric's amount (-dam[l]).
  -- (Read and written, not HINCRBY: a value that is not a number, which only a hand
  -- edit can leave, reads as 0 here instead of failing the script halfway.)
  if r.ck then
    for l = 1, tonumber(r.cn) do
      local f = r['cf' .. l]
      local v = math.min(tonumber(redis.call('HGET', r.ck, f)) or 0, MAXC) + (dam[l] or -amount)
      if v > 0 then redis.call('HSET', r.ck, f, fmt('%d', v)) else redis.call('HDEL', r.ck, f) end
    end
  end
  -- A precise window's sub-bucket counts (check.lua's "Precise windows"): putSub adds
  -- delta to sub-bucket s (0-based) of each counter's packed counts in key, never below
  -- 0; a counter without them is skipped unless create.
  local ns = tonumber(r.ns)
  local subfmt = ns and '<' .. string.rep('d', ns)
  local function putSub(key, s, delta, create)
    local sf = {}
    for l = 1, nl do sf[l] = fields[l] .. '#' end
    local vals = redis.call('HMGET', key, unpack(sf))
    local n = 0
    for l = 1, nl do
      local v = vals[l]
      if v and #v ~= 8 * ns then v = false end -- another N's counts: rewritten
      if v or create then
        local c = {}
        if v then c = {struct.unpack(subfmt, v)} else for x = 1, ns do c[x] = 0 end end
        c[s + 1] = math.max(0, c[s + 1] + delta[l])
        hs[2 * n + 1], hs[2 * n + 2] = sf[l], struct.pack(subfmt, unpack(c, 1, ns))
        n = n + 1
      end
    end
    if n > 0 then redis.call('HSET', key, unpack(hs, 1, 2 * n)) end
  end
  for i = 1, nw do
    local bp, bn, bm = r['bp' .. i], tonumber(r['bn' .. i]), tonumber(r['bm' .. i])
    local cur = floor(now / bm)
    if give > 0 and (bn == cur or bn == cur - 1) then
      local key = bp .. r['bn' .. i]
      put(key, redis.call('HMGET', key, unpack(fields)), dg, true)
      if ns then putSub(key, tonumber(r['bs' .. i]), dg, false) end
    end
    if over > 0 then
      local key = bp .. fmt('%d', cur)
      put(key, redis.call('HMGET', key, unpack(fields)), dov, false)
      if ns then putSub(key, floor((now - cur * bm) / (bm / ns)), dov, true) end
      if redis.call('TTL', key) == -1 then redis.call('EXPIREAT', key, (cur + 2) * bm / 1000 + 1) end
    end
  end
  -- the buckets' clock, as the check's (reserve.lua's gc): Redis TIME unless the engine's
  local gnow = false
  if tonumber(r.ng) and tonumber(r.ng) > 0 then
    if r.gc == '1' then
      gnow = now * 1000
    else
      local t = redis.call('TIME')
      gnow = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
  end
  for i = 1, tonumber(r.ng) or 0 do
    local key, t, l = r['gk' .. i], tonumber(r['gt' .. i]), tonumber(r['gl' .. i])
    local m = math.ceil(l / per)
    local g, o = gives[m], overs[m]
    if g > 0 or o > 0 then
      local nowu = gnow
      -- '<TAT>:<T>:<written>' (check.lua): units move the TAT at the T it was written
      -- with, the bucket's rate unless its limit changed since the reservation
      local v = redis.call('GET', key)
      local tat = false
      if v then
        local x, y = string.match(v, '^([^:]*):([^:]*):')
        if x then tat, t = tonumber(x), tonumber(y) or t else tat = tonumber(v) end
      end
      tat = tat or nowu
      if tat < nowu then tat = nowu end
      local d = math.ceil(tat - nowu + (o - g) * t)
      if d > 4503599627370496 then d = 4503599627370496 end
      if d <= 0 then
        redis.call('DEL', key)
      else
        redis.call('SET', key, fmt('%.17g:%.17g:%.17g', nowu + d, t, nowu), 'PX', fmt('%d', math.ceil(d / 1000) + 60000))
      end
    end
  end
  local ans = fmt('%s;%d;%d;%d;%d;%d;%s;%s;%s;%s;%s', state, amount, used, gives[1], overs[1], now, r.e, r.x, r.p,
    fields[1], fields[nl])
  if r.nm then
    local ms = {}
    for m = 1, nm do ms[m] = fmt('%s=%d/%d/%d/%d', names[m], amounts[m], useds[m], gives[m], overs[m]) end
    ans = ans .. ';' .. table.concat(ms, ',')
  end
  redis.call('HSET', rkey, 's', state, 'u', fmt('%d', used), 'g', fmt('%d', gives[1]), 'o', fmt('%d', overs[1]),
    't', fmt('%d', now), 'r', ans)
  -- A lease's record (id l_...) is read by nobody once settled: kept 10 minutes for the
  -- drain (leaseRecordRetention in reserve.go), not the day a reservation's is.
  if string.sub(id, 1, 2) == 'l_' then redis.call('EXPIRE', rkey, 600) end
  redis.call('ZREM', KEYS[1], id)
  redis.call('SADD', KEYS[2], id)
  redis.call('SADD', KEYS[#KEYS], string.match(KEYS[1], ':{([^}]*)}|'))
  return ans
end

local action = ARGV[1]
if action == 'sweep' then
  local out = {}
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[6])
  for _, id in ipairs(ids) do
    local ans = settle(ARGV[5] .. 'r|' .. id, id, 'sweep', 0)
    if ans == nil or string.byte(ans) == 83 then -- gone or settled already: stale
      redis.call('ZREM', KEYS[1], id)
    elseif ans ~= 'E' then
      out[#out + 1] = id .. ';' .. ans
    end
  end
  return out
end

local ans = settle(KEYS[4], ARGV[4], action, ARGV[3])
if ans then return ans end
if redis.call('HEXISTS', KEYS[3], '|p') == 0 then return 'H' end
return 'N'
