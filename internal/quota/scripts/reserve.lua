-- reserve.lua: a reservation is a check that holds its cost (see ../KEYS.md). This is
-- not a script of its own: the engine makes the reserve script from check.lua by putting
-- this fragment in place of check.lua's line "local reserve, idem, argc = ...", so the
-- decision (all or nothing over every limit of every level) is check.lua's own code and
-- never a copy. check.lua counts the cost as it counts a check's, then calls reserve,
-- which records what it held and where, and answers instead of check.lua.
--
-- KEYS[1] month counters, KEYS[2] dirty set (as check.lua)
-- KEYS[3] the reservation   <p>:{<org>}|r|<id>         hash (fields below)
-- KEYS[4] open reservations <p>:{<org>}|x              sorted set: id by expires_at (ms)
-- KEYS[5] held units        <p>:{<org>}|h|<period>     hash: counter field -> units held
-- KEYS[6] changed           <p>:{<org>}|rd             set: ids changed since the last drain
-- KEYS[7] dirty-org index (as check.lua's KEYS[3]): a reservation is a change to drain
-- KEYS[8] idempotency       <p>:{<org>}|i|<key>        optional
-- ARGV: check.lua's (with an idempotency key: its TTL and the fingerprint, no labels;
--   then the org's bounds, check.lua's "Shared Redis bounds", and the packed numbers),
--   then five of the reservation: id, on_expiry (commit|release), expires_at (ms), the
--   record's expiry (unix s), the period id.
--
-- Reply: the id (empty when denied: nothing held), ';', then check.lua's packed decision.
-- With an idempotency key, an admitted reservation's reply is stored under it (a denial is
-- not: a retry later may fit), and a repeat answers 'R' and the stored reply.
--
-- The record: s state (held, committed, released, expired), a amount, e expires_at (ms),
-- x on_expiry, p period, m month key, d dirty key, h held key, c created (ms), nl and
-- f1..f<nl> the counter fields, nw and per charged sliding window i: bp<i> its bucket
-- keys' prefix, bn<i> the bucket number charged, bm<i> the window's length (ms); for a
-- precise check (check.lua's "Precise windows") also ns, the sub-buckets per window, and
-- bs<i>, the sub-bucket charged, so that settle.lua gives units back there. settle.lua
-- adds u used, g given back, o over-reserved, t settled at (ms) and r its answer.
-- A multi-metric reservation (check.lua's "Several metrics") also has nm, its number of
-- metrics, and a1..a<nm> each metric's amount (a is the first's); its counters f<i> are
-- nl / nm per metric, metric by metric, each holding its own metric's amount.
-- Concurrency: when any row is concurrent (window -1), each counter's amount is also held
-- in the in-flight hash <p>:{<org>}|c, and the record says where: ck the hash's key, cn
-- and cf1..cf<cn> the fields charged (cf<i> is f<i>: it holds f<i>'s amount); settle.lua
-- takes those amounts off exactly those fields, once.
-- Token buckets (check.lua's "Token buckets"): the record has ng, the bucket rows that
-- took tokens, and per row i gk<i> its TAT key, gt<i> its microseconds per unit and gl<i>
-- its counter's index, so that settle.lua gives the unused units back as tokens there;
-- gc 1 when the buckets' clock is the engine's now rather than Redis TIME.
local idem, idx, argc = KEYS[8], KEYS[7], #ARGV - 5
-- sat, cut (check.lua's "Bounded numbers"): the check saturated a counter no row
-- limits; cut[l], when set, is the units of counter l's month count not counted (it
-- stopped at 2^51). Only what was counted is held (k<l> in the record: the cut), so
-- that settle.lua gives back no more than the reservation added.
local function reserve(a, status, retry, blocked, out, last, add, sat, cut, brows, gk, gt)
  local fmt = string.format
  local id = ARGV[argc + 1]
  if status ~= 3 then
    local nl, nw, now = a[6], a[7], a[3]
    local amount = fmt('%d', a[1])
    -- the numbers after the rows: N (precise), the counters' costs (several metrics)
    local base = 8 + 2 * nw + 3 * a[8]
    -- with buckets: their clock and a pair per bucket row (check.lua's "Token buckets")
    local tail = #ARGV[argc] / 8 - base - (brows and 2 * #brows + 1 or 0)
    local cs = tail > 1 and {unpack(a, base + tail - nl + 1, base + tail)}
    if cs then amount = fmt('%d', cs[1]) end
    local rec = {'s', 'held', 'a', amount, 'e', ARGV[argc + 3], 'x', ARGV[argc + 2], 'p', ARGV[argc + 5],
      'm', KEYS[1], 'd', KEYS[2], 'h', KEYS[5], 'c', fmt('%d', now), 'nl', nl, 'nw', nw}
    for l = 1, nl do
      rec[#rec + 1], rec[#rec + 2] = 'f' .. l, ARGV[l]
      local k = cut and cut[l]
      if k then
        rec[#rec + 1], rec[#rec + 2] = 'k' .. l, fmt('%d', k)
        redis.call('HINCRBY', KEYS[5], ARGV[l], fmt('%d', (cs and cs[l] or a[1]) - k))
      else
        redis.call('HINCRBY', KEYS[5], ARGV[l], cs and fmt('%d', cs[l]) or amount)
      end
    end
    if cs then
      -- metrics: the org counters (field metric|o); per: counters per metric
      local nm = 0
      for l = 1, nl do if string.match(ARGV[l], '^[^|]*|(.)') == 'o' then nm = nm + 1 end end
      local per = nl / nm
      rec[#rec + 1], rec[#rec + 2] = 'nm', fmt('%d', nm)
      for m = 1, nm do rec[#rec + 1], rec[#rec + 2] = 'a' .. m, fmt('%d', cs[(m - 1) * per + 1]) end
    end
    for i = 1, nw do
      local key, ms = ARGV[nl + 2 * i - 1], a[7 + 2 * i]
      rec[#rec + 1], rec[#rec + 2] = 'bp' .. i, string.match(key, '^(.*|)')
      rec[#rec + 1], rec[#rec + 2] = 'bn' .. i, fmt('%d', (now - a[8 + 2 * i]) / ms)
      rec[#rec + 1], rec[#rec + 2] = 'bm' .. i, fmt('%d', ms)
    end
    if tail == 1 or cs and tail > nl then -- precise: N follows the rows
      local subs = a[base + 1]
      rec[#rec + 1], rec[#rec + 2] = 'ns', fmt('%d', subs)
      for i = 1, nw do
        rec[#rec + 1], rec[#rec + 2] = 'bs' .. i, fmt('%d', math.floor(a[8 + 2 * i] / (a[7 + 2 * i] / subs)))
      end
    end
    if brows then
      local ng = 0
      for _, r in ipairs(brows) do
        local l = a[2 * nw + 3 * r - 3] -- the row's counter
        if gt[r] and (cs and cs[l] or a[1]) > 0 then
          ng = ng + 1
          rec[#rec + 1], rec[#rec + 2] = 'gk' .. ng, gk[r]
          rec[#rec + 1], rec[#rec + 2] = 'gt' .. ng, fmt('%.17g', gt[r])
          rec[#rec + 1], rec[#rec + 2] = 'gl' .. ng, fmt('%d', l)
        end
      end
      rec[#rec + 1], rec[#rec + 2] = 'ng', fmt('%d', ng)
      -- the buckets' clock: settle.lua gives tokens back on the same one
      if a[#ARGV[argc] / 8 - 2 * #brows] == 1 then rec[#rec + 1], rec[#rec + 2] = 'gc', '1' end
    end
    -- Concurrency: hold the amount in flight at every level (check.lua's "Concurrency").
    local q, conc = 8 + 2 * nw, false
    for _ = 1, a[8] do
      if a[q + 2] == -1 then conc = true end
      q = q + 3
    end
    if conc then
      local ck = string.match(KEYS[1], '^(.*|)m|') .. 'c'
      rec[#rec + 1], rec[#rec + 2], rec[#rec + 3], rec[#rec + 4] = 'ck', ck, 'cn', nl
      for l = 1, nl do
        rec[#rec + 1], rec[#rec + 2] = 'cf' .. l, ARGV[l]
        redis.call('HINCRBY', ck, ARGV[l], cs and fmt('%d', cs[l]) or amount)
      end
    end
    redis.call('HSET', KEYS[3], unpack(rec))
    redis.call('EXPIREAT', KEYS[3], ARGV[argc + 4])
    if redis.call('TTL', KEYS[5]) == -1 then redis.call('EXPIREAT', KEYS[5], a[5]) end
    redis.call('ZADD', KEYS[4], ARGV[argc + 3], id)
    redis.call('SADD', KEYS[6], id)
    redis.call('SADD', idx, string.match(KEYS[1], ':{([^}]*)}|'))
  else
    id = ''
  end
  out[1], out[2], out[3] = status, retry, blocked
  if sat then out[1] = status + 3 end -- check.lua's packed reply
  for i = 4, last do out[i] = out[i] + add end
  local reply = id .. ';' .. struct.pack('<' .. string.rep('d', last), unpack(out, 1, last))
  if idem and status ~= 3 then
    redis.call('SET', idem, '#' .. ARGV[argc - 2] .. reply, 'EX', ARGV[1 + a[6] + 2 * a[7]])
  end
  return reply
end
