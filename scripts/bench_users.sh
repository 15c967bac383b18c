#!/usr/bin/env bash
# `make bench-users` (and the end of `make bench`): checks over 1,000,000 distinct user
# ids against the same load over 1,000 repeating users, wrk at 50 connections against
# quotaplane-api started in its own process on a fresh database. Prints, per kind of
# load, the Postgres transactions the api's database committed (pg_stat_database
# deltas, read from another database so the reads do not count), requests/s, the CPU
# per check of the api and Redis, and the api's RSS (from /proc), and a summary of
# ratios with pass/fail:
#   - Postgres queries per check after warm-up: 0 (what remains is the TTL refresh of
#     the org and the API key, a few queries per 30 s whatever the load; the bound is
#     1 per 1,000 checks, a thousand times below one query per new id);
#   - distinct ids at >= 90 % of the repeating users' checks/s (median round);
#   - the api's peak RSS under BENCH_USERS_RSS_MB (default 64), and grown by less than
#     BENCH_USERS_RSS_GROWTH_MB (8) from the first run to the last: new ids must not
#     cost memory (docs/PERFORMANCE.md says why these bounds).
# Bounded: about 1.7 minutes; load goes to 127.0.0.1 only. REDIS_URL and DATABASE_URL
# as for the tests; BENCH_USERS_ROUNDS (5), BENCH_USERS_SECONDS (4), BENCH_USERS_PORT
# tune it. Needs wrk, curl and psql.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in wrk curl psql; do
  command -v "$tool" >/dev/null || { echo "bench-users: $tool is not installed"; exit 1; }
done
tmp=$(mktemp -d)
api_pid=
bench_db=
cleanup() {
  [ -n "$api_pid" ] && kill "$api_pid" 2>/dev/null && wait "$api_pid" 2>/dev/null || true
  if [ -n "${org:-}" ] && command -v redis-cli >/dev/null; then
    redis-cli -u "$redis_url" --scan --pattern "q:{$org}*" | xargs -r -n 100 redis-cli -u "$redis_url" unlink >/dev/null || true
  fi
  [ -n "$bench_db" ] && psql -q "$db_admin" -c "drop database if exists $bench_db" 2>/dev/null || true
  [ -n "${BENCH_USERS_LOG:-}" ] && cp "$tmp/api.log" "$BENCH_USERS_LOG"
  rm -rf "$tmp"
}
trap cleanup EXIT
redis_url=${REDIS_URL:-redis://127.0.0.1:6379/0}
port=${BENCH_USERS_PORT:-18191}
rounds=${BENCH_USERS_ROUNDS:-5}
secs=${BENCH_USERS_SECONDS:-4}
rss_bound=${BENCH_USERS_RSS_MB:-64}
rss_growth=${BENCH_USERS_RSS_GROWTH_MB:-8}
base=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/quotaplane?sslmode=disable}
bench_db="qp_users_$$"
db_url=$(sed -E "s#/[^/?]*(\\?|\$)#/$bench_db\\1#" <<< "${base%%\?*}")${base#"${base%%\?*}"}
db_admin=$(sed -E "s#/[^/?]*(\\?|\$)#/postgres\\1#" <<< "${base%%\?*}")${base#"${base%%\?*}"}
token="bench-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
go build -o "$tmp/api" ./cmd/api
DATABASE_URL=$db_url REDIS_URL=$redis_url QUOTA_HTTP_ADDR=127.0.0.1:$port QUOTA_GRPC_ADDR=127.0.0.1:0 QUOTA_ADMIN_TOKEN=$token \
  QUOTA_LOG_LEVEL=warn QUOTA_MAX_INFLIGHT_PER_ORG=8192 QUOTA_ADMIN_RATE_LIMIT=off QUOTA_REDIS_TIMEOUT=2s "$tmp/api" 2> "$tmp/api.log" &
api_pid=$!
u=http://127.0.0.1:$port
for _ in $(seq 100); do curl -sf "$u/healthz" >/dev/null && break; sleep 0.2; done
post() { curl -sf -X POST "$u$1" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d "$2"; }
lim() { echo "[{\"metric\":\"requests\",\"window\":\"month\",\"limit\":$1},{\"metric\":\"requests\",\"window\":\"minute\",\"limit\":$1}]"; }
post /v1/plans "{\"id\":\"bench\",\"name\":\"bench\",\"fail_mode\":\"closed\",\"limits\":$(lim 1000000000000)}" >/dev/null
org="qpusers$$"
post /v1/orgs "{\"id\":\"$org\",\"name\":\"bench\",\"plan\":\"bench\"}" >/dev/null
post /v1/orgs/$org/teams "{\"id\":\"eng\",\"name\":\"Eng\",\"limits\":$(lim 500000000000),\"user_limits\":$(lim 250000000000)}" >/dev/null
# Registered users too, so the org carries some: 100 of the repeating 1,000.
for i in $(seq 0 99); do post /v1/orgs/$org/teams/eng/users "{\"id\":\"u$i\"}" >/dev/null; done
key=$(post /v1/orgs/$org/api-keys '{"name":"bench","scopes":["check"]}' | sed 's/.*"secret":"\([^"]*\)".*/\1/')

# Both loads format one request per call in wrk's Lua, so wrk costs them the same.
# The distinct load gives each round and wrk thread its own 100,000 ids of a
# 1,000,000-id space (5 rounds x 2 threads): no id is checked twice within a run, as
# long as a thread sends fewer than 100,000 checks a round.
script() { # name id-expression
  cat > "$tmp/$1.lua" <<LUA
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $key"
wrk.headers["Content-Type"] = "application/json"
local n, tid, offset = 0, 0, 0
local threads = 0
setup = function(thread) thread:set("tid", threads); threads = threads + 1 end
init = function() tid = tid or 0; offset = ((round or 0) * 2 + tid) * 100000 end
request = function()
  n = n + 1
  return wrk.format(nil, "/v1/check", nil, '{"org":"$org","team":"eng","user":"' .. $2 .. '"}')
end
done = function(summary, latency, requests)
  io.write(string.format("WRK %.0f %.2f %.2f %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout + summary.errors.status))
end
LUA
}
script repeat '"u" .. (n % 1000)'
script distinct 'prefix .. ((offset + n) % 1000000)'
post /v1/check "{\"org\":\"$org\",\"team\":\"eng\",\"user\":\"u0\"}" >/dev/null # warm-up: the org, the key, Redis's script
post /v1/check "{\"org\":\"$org\",\"team\":\"eng\",\"user\":\"warm-up\"}" >/dev/null

# Postgres transactions committed and rows returned in the api's database so far.
# A backend reports its statistics when it goes idle, but at most once a second: one
# that reported less than a second before reports 10 s later (PGSTAT_IDLE_INTERVAL).
# So each run's delta is read 1.5 s after it (one refresh may land in the next run's),
# the first read comes 11 s after the set-up's last query, and the last after 11 s,
# so the total misses nothing.
pgstat() {
  sleep "${1:-1.5}"
  psql -Atq "$db_admin" -c "select xact_commit, tup_returned from pg_stat_database where datname = '$bench_db'"
}
rss() { awk '/^VmRSS/ { rss = $2 } /^VmHWM/ { hwm = $2 } END { printf "%d %d", rss / 1024, hwm / 1024 }' "/proc/$api_pid/status"; }
# CPU of a process so far (clock ticks), and EVALSHA calls and µs of Redis (INFO
# commandstats; a shared Redis is not reset, so deltas): where a check's cost goes,
# whatever this machine's speed that minute.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
evalsha() { if command -v redis-cli >/dev/null; then redis-cli -u "$redis_url" info commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2/p'; else echo "0 0"; fi; }
rows=$tmp/rows
: > "$rows"
echo "bench-users: quotaplane-api on 127.0.0.1:$port (database $bench_db), wrk -t2 -c50, $rounds rounds of ${secs}s over 1,000 repeating users and over distinct ids (alternating which goes first)..."
for kind in repeat distinct; do # warm-up: the Go runtime, connections, Redis's hashes
  sed -i "s/^local threads = .*/local threads = 0; round = 0; prefix = \"w\"/" "$tmp/$kind.lua"
  wrk -t2 -c50 -d2s -s "$tmp/$kind.lua" "$u/v1/check" >/dev/null
done
s0=$(pgstat 7)
for round in $(seq "$rounds"); do
  order="repeat distinct"
  [ $((round % 2)) = 0 ] && order="distinct repeat" # this machine drifts: alternate
  for kind in $order; do
    sed -i "s/^local threads = .*/local threads = 0; round = $round; prefix = \"d\"/" "$tmp/$kind.lua"
    c0=$(ticks "$api_pid"); r0=$(evalsha)
    res=$(wrk -t2 -c50 -d"${secs}s" -s "$tmp/$kind.lua" "$u/v1/check" | grep '^WRK')
    c1=$(ticks "$api_pid"); r1=$(evalsha)
    wait_s=1.5
    [ "$round" = "$rounds" ] && [ "$kind" = "${order#* }" ] && wait_s=11
    s1=$(pgstat $wait_s) # the next run's start: only the wait lies between
    m=$(rss)
    # kind round rps p50 p99 errors checks xacts tuples rss_mb hwm_mb api_µs redis_µs
    awk -v k="$kind" -v r="$round" -v s="$secs" -v a="$s0" -v b="$s1" -v m="$m" -v cpu=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" \
      -v r0="$r0" -v r1="$r1" '{
      split(a, x, "|"); split(b, y, "|"); split(m, z, " "); split(r0, p, " "); split(r1, q, " ")
      n = $2 * s
      printf "%s %d %s %s %s %s %.0f %d %d %d %d %.0f %s\n", k, r, $2, $3, $4, $5, n, y[1] - x[1], y[2] - x[2], z[1], z[2],
        (n > 0 ? cpu * 1e6 / hz / n : 0), (q[1] > p[1] ? sprintf("%.1f", (q[2] - p[2]) / (q[1] - p[1])) : "-") }' <<< "$res" >> "$rows"
    tail -1 "$rows" | awk '{ printf "round %d %-8s %8s checks/s  p50 %s ms  p99 %s ms  errors %s  Postgres: %d transactions, %d rows over %d checks  RSS %d MB (peak %d)  CPU per check: api %s µs, Redis %s µs\n", $2, $1, $3, $4, $5, $6, $8, $9, $7, $10, $11, $12, $13 }'
    s0=$s1
  done
done
awk -v bound="$rss_bound" -v growth="$rss_growth" -v cores="$(nproc)" -v loadavg="$(cut -d' ' -f1-3 /proc/loadavg)" '
function median_round(ratio, n,    i, j, t, ord) {
  for (i = 1; i <= n; i++) ord[i] = i
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (ratio[ord[j]] < ratio[ord[i]]) { t = ord[i]; ord[i] = ord[j]; ord[j] = t }
  return ord[int((n + 1) / 2)]
}
$1 == "repeat" { rep[$2] = $3; rc += $7; rx += $8; rcpu[$2] = $12; rred[$2] = $13 }
$1 == "distinct" { dis[$2] = $3; dc += $7; dx += $8; dt += $9; dcpu[$2] = $12; dred[$2] = $13 }
{ hwm = $11 > hwm ? $11 : hwm; if (NR == 1) first = $10; last = $10 }
END {
  n = 0
  for (r in dis) { n++; ratio[r] = dis[r] / rep[r] }
  m = median_round(ratio, n)
  all = ""
  for (i = 1; i <= n; i++) all = all sprintf("%s%.0f%%", i > 1 ? ", " : "", 100 * ratio[i])
  qd = dx / dc; qr = rx / rc
  print ""
  print "Distinct users (docs/PERFORMANCE.md), machine: " cores " cores, load average " loadavg ":"
  printf "  Postgres queries per check after warm-up:  %.5f over %d distinct-id checks (%d transactions, %d rows), %.5f over %d repeating (%d): %s (target 0; bound 0.001: the TTL refreshes only)\n", \
    qd, dc, dx, dt, qr, rc, rx, qd < 0.001 ? "PASS" : "FAIL"
  printf "  distinct ids vs 1,000 repeating users:     %.0f / %.0f checks/s = %.0f%% (target >= 90%%): %s; rounds %s\n", \
    dis[m], rep[m], 100 * ratio[m], ratio[m] >= 0.9 ? "PASS" : "FAIL", all
  printf "  CPU per check in that round:               api %s µs over distinct ids vs %s over repeating users, Redis %s vs %s µs\n", \
    dcpu[m], rcpu[m], dred[m], rred[m]
  printf "  api RSS:                                   peak %d MB (bound %d MB), %d MB after the first run, %d MB at the end (growth bound %d MB): %s\n", \
    hwm, bound, first, last, growth, (hwm < bound && last - first < growth) ? "PASS" : "FAIL"
}' "$rows"
