-- capacity.lua: one draw on a capacity (capacity.go), or a read of its window.
--
-- A capacity counts units in a precise sliding window: S = N + 1 sub-buckets of
-- window/N ms each, on this Redis's TIME (one clock whichever replica asks). At
-- sub-bucket k the window holds sub-buckets k - N .. k, so units counted in a
-- sub-bucket and admitted before it ends never make any real span of one window hold
-- more than the limit (docs/ARCHITECTURE.md "Sliding windows", precise).
--
-- KEYS (one hash tag: one slot)
--   1 m: hash; t = the capacity's packed counts, W = the sum of the active members'
--        weights, x = the last sub-bucket a member was refused in or cut short
--   2 u: hash; member -> the member's packed counts
--   3 a: sorted set; member -> the last sub-bucket it drew or was refused in: a member
--        is active while that is in the window
--   4 w: hash; member -> its weight
--   5 r: hash; member -> the last sub-bucket it was refused in or given less than it
--        asked for: a member that was, in the window, wants more than it has; one that
--        was not is content with what it uses (as is one its own limit caps, once
--        given all it asked: ARGV 13)
-- ARGV
--   1 mode: 'd' draw, 'r' give back only, 'v' view
--   2 N (sub-buckets a window), 3 window ms, 4 limit, 5 saturation units (limit x
--   saturation, floored), 6 member, 7 weight, 8 min: the units a draw must get or be
--   refused (the check's cost), 9 want: the most it takes (its grant), 10 the
--   sub-bucket of units given back (-1: none), 11 the units given back, 12 the keys'
--   TTL in ms, 13 capped: 1 when checks the member drew for were refused by a limit of
--   its own level (the org's, or for a fair-share org limit the team's) since its
--   last draw
-- Reply (draw): {granted, ms left in the sub-bucket, sub-bucket, used in the window,
--   the member's used, the member's share (-1: not computed), retry ms, refusal: '' |
--   'c' (the capacity is full) | 'f' (past the member's fair share)}
-- Reply (give back): {}
-- Reply (view): {used, then member, weight, used, share ... for each active member}
--
-- Packed counts: the last sub-bucket index written, then S counts, as S + 1 doubles
-- (struct '<d'); count j is at slot j mod S and holds for the indices last - N .. last.

local mode = ARGV[1]
local N = tonumber(ARGV[2])
local S = N + 1
local wms = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local sat = tonumber(ARGV[5])
local member = ARGV[6]
local weight = tonumber(ARGV[7])
local ttl = tonumber(ARGV[12])
local floor = math.floor

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local sms = wms / N
local k = floor(now / sms)
local left = floor((k + 1) * sms - now)
if left < 1 then left = 1 end

local FMT = '<' .. string.rep('d', S + 1)

-- unpack returns the last index and the counts (1-based: slot j mod S at j mod S + 1),
-- or nil for no (or malformed) counts.
local function unpack_(v)
  if not v or #v ~= 8 * (S + 1) then return nil end
  local r = {struct.unpack(FMT, v)}
  local last = r[1]
  local c = {}
  for i = 1, S do c[i] = r[i + 1] end
  return last, c
end

local function pack(last, c)
  return struct.pack(FMT, last, unpack(c))
end

-- sum is what v holds in the window of sub-bucket k: indices k - N .. last (a last
-- beyond k, after this Redis's clock went back, is counted whole).
local function sum(v)
  local last, c = unpack_(v)
  if not last then return 0 end
  local from = math.max(k - N, last - N)
  local s = 0
  for j = from, last do s = s + c[j % S + 1] end
  return s
end

-- lastOf is the last sub-bucket v was written at (k for none).
local function lastOf(v)
  local last = unpack_(v)
  return last or k
end

-- add is v with x counted at sub-bucket j >= every sub-bucket v was written at.
local function add(v, x, j)
  local last, c = unpack_(v)
  if not last then
    last, c = j, {}
    for i = 1, S do c[i] = 0 end
  elseif j > last then
    for i = last + 1, math.min(j, last + S) do c[i % S + 1] = 0 end
    last = j
  end
  c[j % S + 1] = c[j % S + 1] + x
  return pack(last, c)
end

-- take is v with x taken back from sub-bucket j, when j is still held; never below 0.
local function take(v, j, x)
  local last, c = unpack_(v)
  if not last or j > last or j < last - N then return v end
  local i = j % S + 1
  c[i] = math.max(0, c[i] - x)
  return pack(last, c)
end

-- wait is the ms until units of v leaving the window free need units: sub-buckets
-- leave oldest first, at each sub-bucket's start; past them all, the window's length.
local function wait(v, need)
  local last, c = unpack_(v)
  if last and need > 0 then
    local freed = 0
    for m = 1, S do
      local j = k - N + m - 1
      if j >= last - N and j <= last then freed = freed + c[j % S + 1] end
      if freed >= need then return floor((k + m) * sms - now) end
    end
  end
  return floor((k + S) * sms - now)
end

-- Members not seen in the window leave it: their weight, counts and entry go.
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. (k - N), 'LIMIT', 0, 128)
if #gone > 0 then
  local W = tonumber(redis.call('HGET', KEYS[1], 'W') or 0) or 0
  for _, g in ipairs(gone) do
    W = W - (tonumber(redis.call('HGET', KEYS[4], g) or 0) or 0)
  end
  redis.call('HDEL', KEYS[4], unpack(gone))
  redis.call('HDEL', KEYS[2], unpack(gone))
  redis.call('HDEL', KEYS[5], unpack(gone))
  redis.call('ZREM', KEYS[3], unpack(gone))
  redis.call('HSET', KEYS[1], 'W', math.max(0, W))
end

-- actives reads every active member once, as {id, weight, used, content}, sorted by
-- used / weight, and the sum of their weights. A member's demand is not known, only
-- whether it was refused or cut short in the window: one that was not is content.
local function actives()
  local ws = redis.call('HGETALL', KEYS[4])
  local list, Wall = {}, 0
  for i = 1, #ws, 2 do
    local id, wt = ws[i], tonumber(ws[i + 1])
    Wall = Wall + wt
    local content = (tonumber(redis.call('HGET', KEYS[5], id) or -1) or -1) < k - N
    list[#list + 1] = {id, wt, sum(redis.call('HGET', KEYS[2], id)), content}
  end
  table.sort(list, function(x, y) return x[3] / x[2] < y[3] / y[2] end)
  return list, Wall
end

-- shareOf is the weighted max-min fair share of member who of weight wt among list
-- (actives) of weights Wall, unrounded: the content members (who aside, which is
-- asking) that use less than their weight's part of what is left keep what they use;
-- the others share the rest by weight.
local function shareOf(list, Wall, who, wt)
  local R, Wr = limit, Wall
  for _, e in ipairs(list) do
    if e[1] ~= who and e[4] then
      if e[3] < R / Wr * e[2] then
        R, Wr = R - e[3], Wr - e[2]
      else
        break
      end
    end
  end
  return R * wt / Wr
end

-- fair is member's share (shareOf) floored, the active members' weights, and the
-- share unrounded. Past 512 active members it reads none of them: each gets its
-- weight's part of the limit, never more than max-min would give it.
local function fair(W)
  if redis.call('HLEN', KEYS[4]) > 512 then
    return floor(limit * weight / W), W, limit * weight / W
  end
  local list, Wall = actives()
  local x = shareOf(list, Wall, member, weight)
  return floor(x), Wall, x
end

-- The view reads each member once (a fair per member would read them all for each:
-- 1.2 s of Redis at 512 members).
if mode == 'v' then
  local out = {sum(redis.call('HGET', KEYS[1], 't'))}
  if redis.call('HLEN', KEYS[4]) > 512 then
    local ws = redis.call('HGETALL', KEYS[4])
    local W = 0
    for i = 2, #ws, 2 do W = W + tonumber(ws[i]) end
    for i = 1, #ws, 2 do
      local wt = tonumber(ws[i + 1])
      out[#out + 1] = ws[i]
      out[#out + 1] = wt
      out[#out + 1] = sum(redis.call('HGET', KEYS[2], ws[i]))
      out[#out + 1] = floor(limit * wt / W)
    end
    return out
  end
  local list, Wall = actives()
  for _, e in ipairs(list) do
    out[#out + 1] = e[1]
    out[#out + 1] = e[2]
    out[#out + 1] = e[3]
    out[#out + 1] = floor(shareOf(list, Wall, e[1], e[2]))
  end
  return out
end

local min, want = tonumber(ARGV[8]), tonumber(ARGV[9])
local tv = redis.call('HGET', KEYS[1], 't')
local uv = redis.call('HGET', KEYS[2], member)
local back, backn = tonumber(ARGV[10]), tonumber(ARGV[11])
if back >= 0 and backn > 0 then
  tv, uv = take(tv, back, backn), take(uv, back, backn)
  if tv then redis.call('HSET', KEYS[1], 't', tv) end
  if uv then redis.call('HSET', KEYS[2], member, uv) end
end
if mode == 'r' then return {} end

-- the member is active from this draw on, with its weight
local W = tonumber(redis.call('HGET', KEYS[1], 'W') or 0) or 0
local ow = redis.call('ZSCORE', KEYS[3], member) and tonumber(redis.call('HGET', KEYS[4], member) or 0) or 0
if ow ~= weight then
  W = W - ow + weight
  redis.call('HSET', KEYS[4], member, weight)
  redis.call('HSET', KEYS[1], 'W', W)
end
redis.call('ZADD', KEYS[3], k, member)
-- expire sets every key's TTL once the draw wrote what it writes: a key made after it
-- (the first refusal's, the first grant's counts) would never expire
local function expire()
  for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ttl) end
end

local used, mine = sum(tv), sum(uv)
local room = limit - used
local g, share, exact, why = want, -1, 0, ''
-- Shares hold above the saturation point, and for a window after any member was
-- refused or cut short (x): under contention a window's units come free in bursts
-- (those of the window before, sub-bucket by sub-bucket), and below the point whoever
-- asked first at each burst would take them.
local contended = (tonumber(redis.call('HGET', KEYS[1], 'x') or -1) or -1) >= k - N
if used + want > sat or contended then
  share, exact = floor(limit * weight / W), limit * weight / W
  if mine + want > share then share, W, exact = fair(W) end
  g = math.min(want, room, math.max(contended and 0 or sat - used, share - mine))
  -- A share is met in whole checks: a member under it may take one check past it.
  -- Otherwise a check costing more than the member's share, or any check of a share
  -- under one unit, would never pass, and members all refused by their shares would
  -- keep the window contended and empty.
  if g < min and mine < exact and room >= min then g = min end
end
if g < min then
  local retry
  if room < min then
    why, retry = 'c', wait(tv, min - room)
  else
    -- past its share (mine >= exact): until it is under it again
    why, retry = 'f', wait(uv, floor(mine - exact) + 1)
  end
  redis.call('HSET', KEYS[5], member, k)
  redis.call('HSET', KEYS[1], 'x', k)
  expire()
  return {0, left, k, used, mine, share, math.max(1, retry), why}
end
-- counted at k, or, after this Redis's clock went back, at the latest sub-bucket
-- either count was written at: a later sub-bucket leaves the window later, so that
-- errs toward counting longer, and both counts take the units at the same index
if g < want then
  redis.call('HSET', KEYS[5], member, k)
  redis.call('HSET', KEYS[1], 'x', k)
elseif ARGV[13] == '1' then
  -- Its own limit refuses checks it draws for, and it was given all it asked: it
  -- wants what that limit lets it use, not its share, until it is refused again. Held
  -- wanting for the window, its unused share would be kept from the others (an org
  -- capped at 20 of 200 by its own limit, weight 3 of 4: the other held to 50).
  redis.call('HDEL', KEYS[5], member)
end
local at = math.max(k, lastOf(tv), lastOf(uv))
if g > 0 then
  redis.call('HSET', KEYS[1], 't', add(tv, g, at))
  redis.call('HSET', KEYS[2], member, add(uv, g, at))
end
expire()
return {g, left, at, used + g, mine + g, share, 0, ''}
