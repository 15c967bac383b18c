-- check.lua: one quota decision, all or nothing (see ../KEYS.md for the key layout).
--
-- KEYS[1] month counters  <p>:{<org>}|m|<period>  hash, one field per counter, plus the
--         period marker field "|p": without it the counters are not known to be complete
--         (Redis lost them, or the period just began), so the reply is "H" and nothing is
--         decided until the engine has hydrated them.
-- KEYS[2] dirty set       <p>:{<org>}|d|<period>  month fields changed since the last drain,
--         and the member '|', which keeps the set from disappearing when drained
-- KEYS[3] dirty-org index <p>:{<slot tag>}|o (a cluster) or <p>:|o: the org goes in
--         when a counter field is new in its dirty set (../dirtyorgs.go), so the worker's
--         flush visits only orgs with new usage
-- KEYS[4] idempotency     <p>:{<org>}|i|<key>     optional
-- Sliding-window buckets <p>:{<org>}|w|<seconds>|<bucket> are passed in ARGV, not KEYS:
-- a bucket often does not exist yet, and a declared key that is missing makes a cluster
-- slot migration refuse the script (KEYS.md). They share the org's hash tag.
--
-- ARGV[1 .. nl] the counter fields: the levels' (org, team, user), metric by metric for
--   a multi-metric request (see "Several metrics" below); nl counts counters, not levels
-- then per sliding window: the current bucket's key, the previous bucket's key
-- with an idempotency key, then: its TTL (s), per row its label
--   "letter|id|window|limit" (window: length in seconds, or M for the month), and
--   the request's fingerprint (the engine's fingerprint: org, team, user, metric, cost)
-- then the org's bounds (see "Shared Redis bounds" below): '<records> <bucket ms> <users>'
-- the last ARGV: the numbers, packed as little-endian doubles (the engine's
--   appendNumbers; last, so that redis-cli --pipe and redis-benchmark -x can send them):
--   cost, force (1 = count even over a limit: shadow, warn), now (ms, the engine's clock
--   corrected to Redis TIME), period end (ms), month keys' expiry (unix s), nl (counters),
--   nw (sliding windows), rows; then per window: length (ms), time elapsed in its
--   current bucket (ms); then per row: its counter's index (1 org, 2 team, 3 user for
--   one metric), window (0 = month, i = i-th sliding window, -1 = concurrent: see
--   "Concurrency" below, -1 - j = the j-th token bucket: see "Token buckets" below),
--   limit. Rows are every limit of every level, in order. Every window a sliding row
--   limits is counted at every counter. Then, only for a precise check (the org's
--   sliding_windows: precise), N: the sub-buckets per window (see "Precise windows"
--   below); then, only for a multi-metric request, each counter's cost (see "Several
--   metrics" below); then, with token buckets, the buckets' clock (0 Redis TIME, 1 the
--   engine's now: see "Token buckets") and per bucket j its window's length (ms) and
--   its burst.
--
-- Reply: "H" (hydrate first), or "R" .. stored for an idempotent replay, or "C" (the
--   idempotency key was first used with another request: nothing counted), or the decision:
--   without an idempotency key, little-endian doubles (one C call packs them; Redis
--     would format a table's numbers one by one): status (1 allowed, 2 over a limit but
--     counted: shadow, warn, 3 denied), retry_ms, blocked_row, then the used value of
--     every row (the engine knows the rest of a row from its request);
--   with one, one string, stored as is for replays (a later request may carry other limits):
--     status;now_ms;retry_ms;blocked_row;row;row...    row = label|used|reset_ms
--     (a multi-metric request's labels start with "metric|")
--     status: A allowed, W over a limit but counted, D denied.
--   A check that saturated a counter no row limits (see "Bounded numbers" below) says
--   so: packed, its status is 3 more (4 allowed, 5 over a limit but counted); as a
--   string, 'B' comes first (not stored: a replay counted nothing).
--   Rows: every level in order, each limit of the level in its order; blocked_row is
--   1-based, 0 = none.
--
-- Redis time is the budget (docs/PERFORMANCE.md, measured in instructions with
-- callgrind): a redis.call costs about 4,000 instructions, an EVALSHA argument 1,300,
-- a number Redis parses 700 or formats 2,500 (string.format('%d') 1,600), a table that
-- grows 1,000 per resize, TIME 7,000, a Lua instruction about 100. So: the numbers
-- arrive as one packed argument and leave as one packed string, the clock and the
-- bucket names come from the engine, counters are parsed once, tables are built at
-- their size, the script makes one HMGET per hash read and one HSET per hash written
-- (values read just before: the script runs alone), and a TTL is looked at only for a
-- new field. Counters are at most 2^51 (MAXC below), exact as doubles.

-- reserve.lua replaces the next line, defining reserve, for a reservation (see there);
-- argc is the ARGV that belong to the check.
local reserve, idem, idx, argc = false, KEYS[4], KEYS[3], #ARGV
if idem then
  -- Stored: '#', the fingerprint of the first request, its decision. The same key with
  -- another request is refused ('C'), counting nothing. A value stored before
  -- fingerprints (no '#') is replayed as it is.
  local first = redis.call('GET', idem)
  if first then
    if string.byte(first) ~= 35 then return 'R' .. first end
    local fp = ARGV[argc - 2]
    if string.sub(first, 2, #fp + 1) ~= fp then return 'C' end
    return 'R' .. string.sub(first, #fp + 2)
  end
end

local floor, fmt = math.floor, string.format
-- Bounded numbers (quota.MaxCounter, docs/ARCHITECTURE.md): a counter never passes
-- MAXC = 2^51. A stored value above it, or one that is not a number (old data), reads
-- as MAXC, over every limit (so every sum below stays under 2^53); top is the largest
-- counter read, for the guard before counting.
local MAXC, top, tonumber = 2251799813685248, 0, tonumber
local packed = ARGV[argc]
local a = {struct.unpack('<' .. string.rep('d', #packed / 8), packed)}
local cost, now, nl, nw = a[1], a[3], a[6], a[7]

-- Several metrics (docs/ARCHITECTURE.md "Several metrics in one decision"): a request
-- naming m metrics has nl = m x levels counters, ARGV[1 .. nl] metric by metric, and
-- each counter's cost after the rows (and N); cost (a[1]) is then the largest. One run
-- decides every counter's every row: all or nothing. cs: the counters' costs, or false
-- for one metric (every counter costs cost). tail: the numbers after the rows.
-- nb: the token buckets (their clock and two numbers each come last, after the tail)
local nb = 0
do
  local q = 10 + 2 * nw -- the first row's window
  for _ = 1, a[8] do
    if a[q] < -1 - nb then nb = -1 - a[q] end
    q = q + 3
  end
end
local tail = #packed / 8 - (8 + 2 * nw + 3 * a[8]) - 2 * nb
if nb > 0 then tail = tail - 1 end
local cs = tail > 1 and {unpack(a, tail - nl + 9 + 2 * nw + 3 * a[8], tail + 8 + 2 * nw + 3 * a[8])}

-- Precise windows. The estimate (current + previous x the part of the window it still
-- covers) can admit up to twice a limit in a real span of one window (docs/ARCHITECTURE.md
-- "Sliding windows"). A precise check also counts, in the same bucket hashes, each
-- counter per sub-bucket: field <counter># holds the bucket's N sub-bucket counts
-- (length / N each) packed as little-endian doubles, so one field per counter is read
-- and written, whatever N. It counts the current bucket whole and the previous one less
-- its sub-buckets 0 .. j-1 (j: the current sub-bucket's index): the current sub-bucket
-- and the N before it, a span from one window to one window and a sub-bucket long that
-- always holds the real window ending now, so nothing is ever admitted past a limit in
-- any real span of a window; the price is at most one sub-bucket's units counted
-- longer than a window (under-admission). Units a bucket holds outside <counter>#
-- (counted by an estimate check before the org became precise) stay counted until
-- their bucket leaves: conservative too.
-- N, or false: the estimate (a's last element is struct.unpack's next position)
local subs = (tail == 1 or cs and tail > nl) and a[9 + 2 * nw + 3 * a[8]]
-- per window: the current sub-bucket's index; per window and level: the current and
-- previous bucket's packed counts as read (or false); the functions below. All made
-- only for a precise check, so the estimate's path costs nothing more.
local jsub, csub, psub, subadd, preciseRead, preciseWait
if subs then
  jsub, csub, psub = {}, {}, {}
  local fmts = {} -- struct formats of n doubles, made once each
  local function dfmt(n)
    local f = fmts[n]
    if not f then
      f = '<' .. string.rep('d', n)
      fmts[n] = f
    end
    return f
  end
  -- subsum is the sum of sub-buckets from .. to (1-based) of packed counts v (false: none).
  local function subsum(v, from, to)
    local t = 0
    if v and to >= from then
      local x = {struct.unpack(dfmt(to - from + 1), v, 8 * from - 7)}
      for i = 1, to - from + 1 do t = t + x[i] end
    end
    return t
  end
  -- subadd is packed counts v (false: none yet) with cost added to sub-bucket j (0-based):
  -- one double unpacked and packed, the rest copied.
  subadd = function(v, j, cost)
    local o = 8 * j
    if not v then
      return string.rep('\0', o) .. struct.pack('<d', cost) .. string.rep('\0', 8 * (subs - j - 1))
    end
    return string.sub(v, 1, o) .. struct.pack('<d', struct.unpack('<d', v, o + 1) + cost) .. string.sub(v, o + 9)
  end
  -- preciseRead returns window i's current bucket's totals and the previous bucket's
  -- counted units, as numbers.
  preciseRead = function(i, ck, pk)
    local ms, el = a[7 + 2 * i], a[8 + 2 * i]
    local j = floor(el / (ms / subs))
    jsub[i] = j
    local f = {}
    for l = 1, nl do f[l], f[nl + l] = ARGV[l], ARGV[l] .. '#' end
    local c = redis.call('HMGET', ck, unpack(f, 1, 2 * nl))
    local p = redis.call('HMGET', pk, unpack(f, 1, 2 * nl))
    local cs, ps, pv = {}, {}, {}
    for l = 1, nl do
      c[l] = tonumber(c[l] or 0) or MAXC
      cs[l], ps[l] = c[nl + l], p[nl + l]
      -- counts of another length (another N) are read as none: their units stay in the
      -- totals, counted until their bucket leaves
      if cs[l] and #cs[l] ~= 8 * subs then cs[l] = false end
      if ps[l] and #ps[l] ~= 8 * subs then ps[l] = false end
      local v = (tonumber(p[l] or 0) or MAXC) - subsum(ps[l], 1, j)
      if v < 0 then v = 0 end
      pv[l] = v
    end
    csub[i], psub[i] = cs, ps
    return c, pv
  end
  -- preciseWait is how long until cost fits at level l of precise window w, whose count
  -- (c + pv) is over room = limit - cost: the counted sub-buckets leave the count one by
  -- one, oldest first, at each sub-bucket boundary.
  preciseWait = function(w, l, room, c, pv)
    local ms, el = a[7 + 2 * w], a[8 + 2 * w]
    if room < 0 then return ms - el end
    local sms, j, p, cs = ms / subs, jsub[w], psub[w][l], csub[w][l]
    local need, left = c + pv - room, 0
    for m = 0, subs - 1 - j do
      left = left + subsum(p, j + m + 1, j + m + 1)
      if m == subs - 1 - j then left = pv end -- the bucket has left whole, rest included
      if left >= need then return (j + 1 + m) * sms - el end
    end
    for x = 0, j do
      left = left + subsum(cs, x + 1, x + 1)
      if left >= need then return (subs + 1 + x) * sms - el end
    end
    return 2 * ms - el -- the current bucket's rest leaves with it
  end
end

-- Concurrency (window -1, vocab.Concurrent): a row bounds the units held at once by open
-- reservations of its level, counted in the in-flight hash <p>:{<org>}|c (no period: a
-- reservation held across a period's end still holds), one field per counter (the
-- counter fields ARGV[l]). Its key is the month key's org part + 'c': like a bucket it
-- is not declared (it is often missing: nothing in flight). A row admits when held +
-- cost <= limit; a check holds nothing (its row reports held, not held + cost), a
-- reservation adds its amount at every level (reserve.lua) and settle.lua takes it all
-- back. inflight(l) reads the hash once, only when a row asks.
local cvals, crows = false, false
local function inflight(l)
  if not cvals then
    cvals = redis.call('HMGET', string.match(KEYS[1], '^(.*|)m|') .. 'c', unpack(ARGV, 1, nl))
    for i = 1, nl do
      local v = tonumber(cvals[i] or 0) or MAXC
      if not (v >= 0) then v = 0 elseif v > MAXC then v = MAXC end
      cvals[i] = v
    end
  end
  return cvals[l]
end

local month = redis.call('HMGET', KEYS[1], '|p', unpack(ARGV, 1, nl))
if not month[1] then return 'H' end
-- counters in place, as numbers: month[l + 1] is level l's (a missing field reads false)
local mnew = false
for l = 2, nl + 1 do
  local v = month[l]
  if v then
    v = tonumber(v) or MAXC
    if not (v <= MAXC) then v = MAXC end
    if v > top then top = v end
    month[l] = v
  else
    month[l], mnew = 0, true
  end
end

-- Buckets: the current one's values as numbers, the previous one's as read.
local cur, prev = {false, false, false, false}, {false, false, false, false}
local k = 1 + nl -- ARGV index of the first window's current bucket key
for i = 1, nw do
  if subs then
    local c, pv = preciseRead(i, ARGV[k], ARGV[k + 1])
    for l = 1, nl do
      local v = c[l]
      if not (v <= MAXC) then v = MAXC end
      if v > top then top = v end
      c[l] = v
      if not (pv[l] <= MAXC) then pv[l] = MAXC end
    end
    cur[i], prev[i] = c, pv
  else
    local c = redis.call('HMGET', ARGV[k], unpack(ARGV, 1, nl))
    for l = 1, nl do
      local v = c[l]
      if v then
        v = tonumber(v) or MAXC
        if not (v <= MAXC) then v = MAXC end
        if v > top then top = v end
        c[l] = v
      else
        c[l] = 0
      end
    end
    cur[i], prev[i] = c, redis.call('HMGET', ARGV[k + 1], unpack(ARGV, 1, nl))
  end
  k = k + 2
end

-- Token buckets (vocab.Limit.Burst; docs/ARCHITECTURE.md "Token buckets"): a row of
-- window -1 - j is a bucket refilling limit units per window of length ms and holding
-- at most burst (the j-th pair after the tail), decided with GCRA. Its counter keeps
-- one theoretical arrival time (TAT, whole microseconds of the buckets' clock) in
-- <p>:{<org>}|g|<window s>|<counter field>, a string that expires after the bucket is
-- full again (a missing key is a full bucket). Each unit moves the TAT by T = ms x 1000
-- / limit microseconds; the bucket holds (burst x T - debt) / T tokens, debt = TAT - now
-- (at least 0). A cost fits when debt + cost x T <= burst x T; it then moves the TAT to
-- now + debt + cost x T, rounded up, so the stored debt is never below the exact one
-- and no rounding admits a unit early. A row's reply value is the debt after the check
-- (microseconds): the engine turns it into tokens, used and reset exactly. A cost above
-- burst, or any cost at rate 0, never fits: retry NEVER, no Retry-After. Forced
-- (shadow, warn), a bucket is emptied at most, never below 0 tokens.
-- The buckets' clock is this Redis's TIME, in microseconds: one clock for every
-- decision of a bucket whichever replica asks (the engines' clocks agree only within a
-- few ms, and a bucket's bound is on real time: 6 ms apart at 10,000/s would be 60
-- units over it). The engine's now is used only when the engine says so (1 before the
-- pairs): simulations at chosen times (quota.CheckCommand) and tests of a fake clock.
-- The key holds '<TAT>:<T>:<written>': the T and the time it was written with. When the
-- rate changed since (a plan upgraded or throttled), the units owed then are owed at
-- the new rate, paid off since at the new rate: debt = (TAT - written) x T now / T then
-- - (now - written), rounded up. An upgrade from 1 a day to 100 a second owes 10 ms a
-- unit, not the old rate's days. A value of the TAT alone is read as it is.
-- Values: a debt is kept at most GCAP = 2^52 us (142 years), so a TAT stays exact as a
-- double; a bucket whose burst x T is more holds at most GCAP / T tokens (a cost above
-- that never fits), so the cap never forgives a unit.
local NEVER, GCAP, gk, gd, gt, brows, gnow = 9007199254740992, 4503599627370496, false, false, false, false, 0
if nb > 0 then
  local pre, keys = string.match(KEYS[1], '^(.*|)m|'), {}
  gk, gd, gt, brows = {}, {}, {}, {}
  local q, bb = 8 + 2 * nw, #packed / 8 - 2 * nb -- bb: before the buckets' pairs
  for r = 4, a[8] + 3 do
    local l, w, limit = a[q + 1], a[q + 2], a[q + 3]
    if w < -1 then
      local j = -1 - w
      gk[r] = pre .. 'g|' .. fmt('%d', a[bb + 2 * j - 1] / 1000) .. '|' .. ARGV[l]
      keys[#keys + 1], brows[#brows + 1] = gk[r], r
      if limit > 0 then gt[r] = a[bb + 2 * j - 1] * 1000 / limit end
    end
    q = q + 3
  end
  local v = redis.call('MGET', unpack(keys))
  if a[bb] == 1 then
    gnow = now * 1000
  else
    local t = redis.call('TIME')
    gnow = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  for i, r in ipairs(brows) do
    local tat, was, at = false, false, false
    if v[i] then
      local x, y, z = string.match(v[i], '^([^:]*):([^:]*):(.*)$')
      if x then tat, was, at = tonumber(x), tonumber(y), tonumber(z) else tat = tonumber(v[i]) end
    end
    local d = tat and tat > gnow and tat - gnow or 0
    if tat and was and at and was > 0 and gt[r] and was ~= gt[r] and tat > at then
      d = math.ceil((tat - at) * gt[r] / was) - (gnow - at)
      if d < 0 then d = 0 elseif d > GCAP then d = GCAP end
    end
    gd[r] = d
  end
end

-- Decide: used + cost <= limit for every row. out keeps the reply: status, retry,
-- blocked row, then the used value of every row (3 levels x 5 windows, per metric).
local out = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local blocked, brank, retry = 0, 0, 0
local last = a[8] + 3 -- index in out of the last row
local q = 8 + 2 * nw -- index in a before the first row
for r = 4, last do
  local l, w, limit = a[q + 1], a[q + 2], a[q + 3]
  q = q + 3
  local u, wait, rank
  local cost = cs and cs[l] or cost -- this row's counter's
  if w < -1 then -- a token bucket (above)
    local bb = #packed / 8 - 2 * nb
    local ms, burst = a[bb + 2 * (-1 - w) - 1], a[bb + 2 * (-1 - w)]
    u, rank = gd[r], ms
    if cost > 0 then
      if limit <= 0 or cost > burst or cost * gt[r] > GCAP then
        wait = NEVER
      else
        local need = u + (cost - burst) * gt[r]
        -- the debt is kept under GCAP: a bucket holds at most GCAP / T tokens
        local over = u + cost * gt[r] - GCAP
        if over > need then need = over end
        if need > 0 then wait = math.ceil(need / 1000) end
      end
    end
  elseif w < 0 then -- concurrency: held at once; a slot frees when a holder settles
    u, rank = inflight(l), 1e14
    if u + cost > limit then wait = 1000 end
    crows = crows or {}
    crows[#crows + 1] = r
  elseif w == 0 then
    u, rank = month[l + 1], 1e15
    if u + cost > limit then
      wait = a[4] - now
      if wait < 1 then wait = 1 end
    end
  else
    local c, pv = cur[w][l], prev[w][l]
    local ms, el = a[7 + 2 * w], a[8 + 2 * w]
    u, rank = c, ms
    if subs then
      u = c + pv
      if u + cost > limit then wait = preciseWait(w, l, limit - cost, c, pv) end
    elseif pv then
      pv = tonumber(pv) or MAXC
      if not (pv <= MAXC) then pv = MAXC end
      u = c + floor(pv * (ms - el) / ms)
    end
    if not subs and u + cost > limit then
      -- how long until cost fits: the previous bucket's weight must fall, or, when the
      -- current bucket alone is too full, this bucket must become the previous one
      local room = limit - cost
      if room < 0 then
        wait = ms - el
      elseif c <= room then
        wait = math.ceil(ms * (1 - (room - c) / pv)) - el
        if wait < 1 then wait = 1 end
      else
        wait = (ms - el) + math.ceil(ms * (1 - room / c))
      end
    end
  end
  out[r] = u
  if wait then
    -- broadest window wins; at equal windows the first (highest) level keeps it
    if rank > brank then brank, blocked = rank, r - 3 end
    if wait > retry then retry = wait end
  end
end

local status = 1
if blocked > 0 then
  if a[2] == 1 then status = 2 else status = 3 end
end
-- Bounded numbers: a count that would take a LIMITED counter (one a row limits: its
-- level, metric and window) past MAXC counts nothing, even when forced (shadow, warn:
-- allowed, as those modes never deny); enforce (and any reservation) denies it, retry at
-- the period's end, blocked by that counter's row. A counter no row limits (counted for
-- usage and billing only) never denies: it saturates, stopping at MAXC (the units past
-- it are not counted there), and sat says so in the reply (the engine counts it in
-- quotaplane_counters_at_bound_total). cut: per counter, the month units not counted.
-- Only when top says some counter might pass, so the common path costs nothing more.
local sat, cut = false, false
if cost > 0 and status ~= 3 and top + cost > MAXC then
  local lim, over = {}, false -- lim[w * nl + l]: the first row limiting counter l, window w
  q = 8 + 2 * nw
  for r = 4, last do
    local l, w = a[q + 1], a[q + 2]
    if w >= 0 and not lim[w * nl + l] then lim[w * nl + l] = r end
    q = q + 3
  end
  for l = 1, nl do
    local c = cs and cs[l] or cost
    for w = 0, nw do
      local v
      if w == 0 then v = month[l + 1] else v = cur[w][l] end
      if c > 0 and v + c > MAXC then
        if lim[w * nl + l] then
          over = over or lim[w * nl + l]
        else
          sat = true
          if w == 0 then
            cut = cut or {}
            cut[l] = v + c - MAXC
          end
        end
      end
    end
  end
  if over then
    sat, cut = false, false
    if a[2] == 1 and not reserve then
      cost = 0
    else
      status, retry = 3, math.max(retry, a[4] - now, 1)
      if blocked == 0 then blocked = over - 3 end
    end
  end
end
-- Shared Redis bounds (KEYS.md "Bounds"): what one org may make the shared Redis hold.
-- ARGV[argc - 1] is '<records> <bucket ms> <users>': the most idempotency records the
-- org may hold, the length of the buckets their count is kept in, and the most distinct
-- unregistered users it may name in a period (0: no bound, or the request names no
-- unregistered user). Only a check that counts is bounded (one that counts nothing
-- stores no record: a denial's retry is harmless), and one past a bound is refused
-- ('Q', the bound's letter, its value) before anything is written.
if cost > 0 and status ~= 3 then
  local bounds, pre = ARGV[argc - 1], string.match(KEYS[1], '^(.*|)m|')
  local ucap = tonumber(string.match(bounds, '(%d+)$'))
  local uk, um, ik, ib = false, false, false, false
  if ucap > 0 and mnew then
    -- the period's set of unregistered users who counted: <p>:{<org>}|u|<period>
    uk, um = pre .. 'u|' .. string.sub(KEYS[1], #pre + 3), string.match(ARGV[3], '|u|(.*)$')
    if redis.call('SISMEMBER', uk, um) == 1 then
      uk = false
    elseif redis.call('SCARD', uk) >= ucap then
      return 'Qu' .. ucap
    end
  end
  local icap, bms = string.match(bounds, '^(%d+) (%d+)')
  icap, bms = tonumber(icap), tonumber(bms)
  if idem and icap > 0 then
    -- <p>:{<org>}|n counts the org's records by the bucket they were stored in: field
    -- <bucket> (now / bms), n their sum, lo the oldest bucket counted. A bucket whose
    -- records have all expired (older than the TTL) leaves the sum, so the sum is at
    -- least the records held, at most a bucket's more.
    ik, ib = pre .. 'n', floor(now / bms)
    local cut = ib - math.ceil(ARGV[1 + nl + 2 * nw] * 1000 / bms)
    local v = redis.call('HMGET', ik, 'n', 'lo')
    local n, lo = tonumber(v[1]) or 0, tonumber(v[2])
    if lo and lo < cut then
      local all, old, low = redis.call('HGETALL', ik), {}, false
      for i = 1, #all, 2 do
        local b = tonumber(all[i]) -- n and lo are not numbers
        if b and b < cut then
          n, old[#old + 1] = n - tonumber(all[i + 1]), all[i]
        elseif b and (not low or b < low) then
          low = b
        end
      end
      if low then
        if #old > 0 then redis.call('HDEL', ik, unpack(old)) end
        redis.call('HSET', ik, 'n', fmt('%d', n), 'lo', fmt('%d', low))
      else
        redis.call('DEL', ik)
        n = 0
      end
    end
    if n >= icap then return 'Qi' .. icap end
  end
  if uk then
    if redis.call('SADD', uk, um) == 1 and redis.call('TTL', uk) == -1 then redis.call('EXPIREAT', uk, a[5]) end
  end
  if ik then
    redis.call('HINCRBY', ik, 'n', 1)
    redis.call('HINCRBY', ik, fmt('%d', ib), 1)
    redis.call('HSETNX', ik, 'lo', fmt('%d', ib))
    -- refreshed at every record (not only when created): the count must live as long
    -- as the newest record it counts
    redis.call('PEXPIRE', ik, ARGV[1 + nl + 2 * nw] * 1000 + bms)
  end
end

local add = 0
if cost > 0 and status ~= 3 then
  -- Count at every level: month counters, the dirty set, every limited window's bucket.
  -- A TTL is set only when a counter creates its key (its first field). Values go to
  -- Redis as text made by string.format: cheaper than Redis formatting a Lua number.
  add = cost
  local hs = {false, false, false, false, false, false}
  for l = 1, nl do
    local v = month[l + 1] + (cs and cs[l] or cost)
    if sat and v > MAXC then v = MAXC end
    hs[2 * l - 1], hs[2 * l] = ARGV[l], fmt('%d', v)
  end
  redis.call('HSET', KEYS[1], unpack(hs, 1, 2 * nl))
  if mnew and redis.call('TTL', KEYS[1]) == -1 then redis.call('EXPIREAT', KEYS[1], a[5]) end
  -- The member '|' is never drained: the set outlives a drain, so the org's keys are
  -- either all present or all absent and a cluster slot migration never finds them
  -- split (the importing node answers TRYAGAIN to a script whose keys it lacks). So
  -- when '|' is new too, the set is new and gets its TTL.
  -- A field new in the set puts the org in the dirty-org index; one already there is
  -- drained by the flush that popped the org, or the org is still in the index.
  local nd = redis.call('SADD', KEYS[2], '|', unpack(ARGV, 1, nl))
  if nd > nl then redis.call('EXPIREAT', KEYS[2], a[5]) end
  if nd > 0 then redis.call('SADD', idx, string.match(KEYS[1], ':{([^}]*)}|')) end
  k = 1 + nl
  for i = 1, nw do
    local c, created = cur[i], false
    for l = 1, nl do
      local v = c[l]
      if v == 0 then created = true end -- a counter's field is written only with cost > 0
      local n = v + (cs and cs[l] or cost)
      if sat and n > MAXC then n = MAXC end -- saturated (a counter no row limits)
      hs[2 * l] = fmt('%d', n)
    end
    local nf = 2 * nl
    if subs then
      -- and the current sub-bucket's count (what its total gained)
      for l = 1, nl do
        local n = cs and cs[l] or cost
        if sat and c[l] + n > MAXC then n = MAXC - c[l] end
        hs[nf + 1], hs[nf + 2], nf = ARGV[l] .. '#', subadd(csub[i][l], jsub[i], n), nf + 2
      end
    end
    redis.call('HSET', ARGV[k], unpack(hs, 1, nf))
    if created and redis.call('TTL', ARGV[k]) == -1 then
      -- the end of the next bucket, plus a second
      local ms = a[7 + 2 * i]
      redis.call('EXPIREAT', ARGV[k], (now - a[8 + 2 * i] + 2 * ms) / 1000 + 1)
    end
    k = k + 2
  end
  if brows then
    -- each bucket row's TAT moves by its counter's cost (a counter of cost 0 keeps it)
    for _, r in ipairs(brows) do
      local q = 2 * nw + 3 * r - 3 -- a[q]: the row's counter, a[q + 1] its window
      local c, t = cs and cs[a[q]] or cost, gt[r]
      if c > 0 and t then
        local bb = #packed / 8 - 2 * nb
        local d = math.ceil(gd[r] + c * t)
        local full = math.ceil(a[bb + 2 * (-1 - a[q + 1])] * t)
        -- forced past the bucket: empty, not below; a debt already past it (the burst
        -- lowered, the rate raised) stays, as a forced check never gives tokens
        if d > full then d = math.max(full, gd[r]) end
        if d > GCAP then d = GCAP end -- forced past GCAP / T tokens: empty
        gd[r] = d
        redis.call('SET', gk[r], fmt('%.17g:%.17g:%.17g', gnow + d, t, gnow), 'PX', fmt('%d', math.ceil(d / 1000) + 60000))
      end
    end
  end
  if cs then
    -- each row's used value gains its own counter's cost, here, so add is 0 below;
    -- a check's concurrent rows do not (a check holds nothing: they report what is held)
    q = 8 + 2 * nw
    for r = 4, last do
      if a[q + 2] >= 0 or reserve and a[q + 2] == -1 then out[r] = out[r] + cs[a[q + 1]] end
      q = q + 3
    end
    add = 0
  end
end
-- A bucket row answers its debt after the check (the replies below add add to every row).
if brows then
  for _, r in ipairs(brows) do out[r] = gd[r] - add end
end

-- Concurrency: a check holds nothing, so its concurrent rows report what is held (the
-- replies below add add to every row).
if crows and not reserve then
  for _, r in ipairs(crows) do out[r] = out[r] - add end
end

if reserve then return reserve(a, status, retry, blocked, out, last, add, sat, cut, brows, gk, gt) end

-- A saturated check's status (packed) is 3 more: 4 allowed, 5 over a limit but counted.
if not idem then
  out[1], out[2], out[3] = status, retry, blocked
  if sat then out[1] = status + 3 end
  for i = 4, last do out[i] = out[i] + add end
  return struct.pack('<' .. string.rep('d', last), unpack(out, 1, last))
end

-- The full reply, stored for replays.
local st = 'A'
if status == 2 then st = 'W' elseif status == 3 then st = 'D' end
local rows = {fmt('%s;%d;%d;%d', st, now, retry, blocked)}
q = 8 + 2 * nw
local label = 2 + nl + 2 * nw -- ARGV index of the first row's label
for r = 4, last do
  local w = a[q + 2]
  local reset = a[4]
  if w < 0 then reset = now end -- concurrency: nothing resets on a clock
  if w > 0 then
    reset = now - a[8 + 2 * w] + a[7 + 2 * w]
    -- a precise window's count next falls at the end of the current sub-bucket
    if subs then reset = now - a[8 + 2 * w] + (jsub[w] + 1) * a[7 + 2 * w] / subs end
  end
  rows[r - 2] = fmt('%s|%d|%d', ARGV[label], out[r] + add, reset)
  label, q = label + 1, q + 3
end
local reply = table.concat(rows, ';')
-- stored only when the check counted: one that counted nothing (denied, cost 0, or
-- over the bound of numbers) is harmless to decide again
if cost > 0 and status ~= 3 then
  redis.call('SET', idem, '#' .. ARGV[argc - 2] .. reply, 'EX', ARGV[1 + nl + 2 * nw])
end
-- saturated: 'B' before the reply, not stored (a replay counts nothing)
if sat then return 'B' .. reply end
return reply
