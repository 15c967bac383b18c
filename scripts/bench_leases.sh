#!/usr/bin/env bash
# Leases, run by `make bench` after its other rows, or alone. Two quotaplane-api
# processes on one fresh database and a private redis-server of their own (so INFO
# commandstats counts their scripts only): one with leases (the default), one with
# QUOTA_LEASES=false. wrk at 50 connections, alternated rounds of:
#   - /healthz of the leasing api (the baseline of the ratio);
#   - the hot path: every check on one org, team and user, limits far away, on each api;
#   - the spread path: 1,000 users, each cold (too slow to be leased), on each api;
#   - paced: /healthz and the hot path on each api again, each connection waiting
#     BENCH_LEASE_PACE_MS (10) between requests (wrk's delay()), so about 4,500
#     requests/s: p99 below saturation. At saturation wrk and the apis share 2 cores and
#     every p99, /healthz's too, is the run queue's, not the request's.
# Per run: requests/s, p50 and p99 ms, non-2xx, and Redis script calls (EVALSHA and
# EVAL, INFO commandstats delta) per admitted check. The summary takes the median
# round. Targets (docs/PERFORMANCE.md "Leases"): hot path >= 70 % of /healthz, p99 <=
# 2 ms (paced), <= 0.05 script calls per admitted check; spread no slower with leases.
# The apis run with GOGC=400 as deploy/k8s runs the api (BENCH_LEASE_GOGC changes it).
# BENCH_LEASE_ROUNDS (3), BENCH_LEASE_SECONDS (4), BENCH_LEASE_PORT tune it. Needs
# wrk, curl, psql, redis-server and redis-cli; load goes to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench/lib.sh
for tool in wrk curl psql redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "bench-leases: $tool is not installed"; exit 0; }
done
tmp=$(mktemp -d)
pids=()
bench_db=
trap private_cleanup EXIT
port=${BENCH_LEASE_PORT:-18271}
rport=$((port + 5))
rounds=${BENCH_LEASE_ROUNDS:-3}
secs=${BENCH_LEASE_SECONDS:-4}
pace=${BENCH_LEASE_PACE_MS:-10}
private_stack "qp_leases_$$" "$rport"
go build -o "$tmp/api" ./cmd/api
start_api() { # port leases
  DATABASE_URL=$db_url REDIS_URL=$redis_url QUOTA_HTTP_ADDR=127.0.0.1:$1 QUOTA_GRPC_ADDR=127.0.0.1:0 QUOTA_ADMIN_TOKEN=$token QUOTA_LEASES=$2 \
    QUOTA_LOG_LEVEL=warn QUOTA_MAX_INFLIGHT_PER_ORG=8192 QUOTA_ADMIN_RATE_LIMIT=off GOGC=${BENCH_LEASE_GOGC:-400} "$tmp/api" 2>> "$tmp/api.log" &
  pids+=($!)
}
start_api "$port" true
on=http://127.0.0.1:$port
for _ in $(seq 100); do curl -sf "$on/healthz" >/dev/null && break; sleep 0.2; done # migrated
start_api $((port + 1)) false
off=http://127.0.0.1:$((port + 1))
for _ in $(seq 100); do curl -sf "$off/healthz" >/dev/null && break; sleep 0.2; done
api_on=${pids[1]}
post() { curl -sf -X POST "$on$1" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d "$2"; }
lim() { echo "[{\"metric\":\"requests\",\"window\":\"month\",\"limit\":$1},{\"metric\":\"requests\",\"window\":\"minute\",\"limit\":$1}]"; }
post /v1/plans "{\"id\":\"bench\",\"name\":\"bench\",\"fail_mode\":\"closed\",\"limits\":$(lim 1000000000000)}" >/dev/null
org="qplease$$"
post /v1/orgs "{\"id\":\"$org\",\"name\":\"bench\",\"plan\":\"bench\"}" >/dev/null
post /v1/orgs/$org/teams "{\"id\":\"eng\",\"name\":\"Eng\",\"limits\":$(lim 500000000000),\"user_limits\":$(lim 250000000000)}" >/dev/null
key=$(post /v1/orgs/$org/api-keys '{"name":"bench","scopes":["check"]}' | sed 's/.*"secret":"\([^"]*\)".*/\1/')
cat > "$tmp/done.lua" <<'EOF'
done = function(summary, latency, requests)
  io.write(string.format("WRK %.0f %.2f %.2f %d %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout + summary.errors.status,
    summary.requests - summary.errors.status))
end
EOF
script() { # file users user-prefix
  cat > "$1" <<EOF
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $key"
local reqs, n = {}, 0
init = function()
  for i = 0, $2 - 1 do
    reqs[i] = wrk.format(nil, "/v1/check", nil, '{"org":"$org","team":"eng","user":"$3' .. i .. '"}')
  end
end
request = function()
  n = n + 1
  return reqs[n % $2]
end
EOF
  cat "$tmp/done.lua" >> "$1"
}
# Each api its own users: the two never share a path.
script "$tmp/hot_on.lua" 1 hot-on-
script "$tmp/hot_off.lua" 1 hot-off-
script "$tmp/spread_on.lua" 1000 on-
script "$tmp/spread_off.lua" 1000 off-
for s in done hot_on hot_off; do # the paced variants: the same requests, $pace ms apart on each connection
  { cat "$tmp/$s.lua"; echo "delay = function() return $pace end"; } > "$tmp/${s}_paced.lua"
done
for s in hot_on spread_on; do curl -sf -X POST "$on/v1/check" -H "Authorization: Bearer $key" -d "{\"org\":\"$org\",\"team\":\"eng\",\"user\":\"x\"}" >/dev/null; done
scripts() { redis-cli -u "$redis_url" info commandstats | tr -d '\r' |
  awk -F'[=:,]' '/^cmdstat_(evalsha|eval):/ { n += $3 } END { print n + 0 }'; }
run() { # name script url: "name rps p50 p99 errors admitted script-calls"
  local s0 s1 r
  s0=$(scripts)
  r=$(wrk -t2 -c50 -d"${secs}s" -s "$2" "$3" | grep '^WRK')
  s1=$(scripts)
  echo "$1 ${r#WRK } $((s1 - s0))"
}
rows=$tmp/rows.txt
echo "Leases: two apis (leases on, off) on a private redis-server :$rport, 50 connections, $rounds rounds of ${secs}s runs..."
for round in $(seq "$rounds"); do
  for spec in "healthz $tmp/done.lua $on/healthz" "hot_on $tmp/hot_on.lua $on/v1/check" "hot_off $tmp/hot_off.lua $off/v1/check" \
    "spread_on $tmp/spread_on.lua $on/v1/check" "spread_off $tmp/spread_off.lua $off/v1/check" \
    "healthz_paced $tmp/done_paced.lua $on/healthz" "hot_on_paced $tmp/hot_on_paced.lua $on/v1/check" \
    "hot_off_paced $tmp/hot_off_paced.lua $off/v1/check"; do
    # shellcheck disable=SC2086 # split on purpose
    line=$(run $spec)
    echo "round $round $line"
    echo "$round $line" >> "$rows"
  done
done
if [ -s "$tmp/api.log" ]; then # errors: what the apis logged (warn and above), by message
  echo "api log, by message:"
  sed -n 's/.*"msg":"\([^"]*\)".*/\1/p' "$tmp/api.log" | sort | uniq -c | sort -rn | head -5 | sed 's/^/  /'
fi
curl -sf "$on/metrics" | grep -E '^quotaplane_(leases_total|lease_units_total|lease_checks_total)' | sed 's/^/  /' || true
echo "(columns: requests/s, p50 ms, p99 ms, errors and non-2xx, admitted, Redis script calls)"
awk -v rounds="$rounds" -v pace="$pace" '
{ r = $1; k = $2; rps[r, k] = $3; p99[r, k] = $5; adm[r, k] = $7; calls[r, k] = $8 }
function median(a, n,    i, j, t, o) {
  for (i = 1; i <= n; i++) o[i] = i
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[o[j]] < a[o[i]]) { t = o[i]; o[i] = o[j]; o[j] = t }
  return o[int((n + 1) / 2)]
}
END {
  for (i = 1; i <= rounds; i++) { hot[i] = rps[i, "hot_on"] / rps[i, "healthz"]; all = all sprintf("%s%.0f%%", i > 1 ? ", " : "", 100 * hot[i]) }
  m = median(hot, rounds)
  printf "Leases summary (median round %d; the machine is shared with other work, so rounds drift):\n", m
  printf "  hot path, leases on:  %.0f / %.0f req/s of /healthz = %.0f%% (target >= 70%%; rounds %s), p99 at saturation %s ms (/healthz %s ms)\n", \
    rps[m, "hot_on"], rps[m, "healthz"], 100 * hot[m], all, p99[m, "hot_on"], p99[m, "healthz"]
  for (i = 1; i <= rounds; i++) { pp[i] = p99[i, "hot_on_paced"]; pall = pall sprintf("%s%s", i > 1 ? ", " : "", pp[i]) }
  q = median(pp, rounds)
  printf "                        paced (%s ms between requests per connection): %.0f req/s, p99 %s ms (target <= 2; rounds %s), /healthz paced p99 %s ms, leases off paced p99 %s ms\n", \
    pace, rps[q, "hot_on_paced"], p99[q, "hot_on_paced"], pall, p99[q, "healthz_paced"], p99[q, "hot_off_paced"]
  printf "                        Redis script calls per admitted check: %.4f (%d / %d; target <= 0.05)\n", \
    calls[m, "hot_on"] / adm[m, "hot_on"], calls[m, "hot_on"], adm[m, "hot_on"]
  printf "  hot path, leases off: %.0f req/s = %.0f%% of /healthz, p99 %s ms, %.3f script calls per check\n", \
    rps[m, "hot_off"], 100 * rps[m, "hot_off"] / rps[m, "healthz"], p99[m, "hot_off"], calls[m, "hot_off"] / adm[m, "hot_off"]
  for (i = 1; i <= rounds; i++) { sp[i] = rps[i, "spread_on"] / rps[i, "spread_off"]; sall = sall sprintf("%s%.0f%%", i > 1 ? ", " : "", 100 * sp[i]) }
  s = median(sp, rounds)
  printf "  spread path (1,000 cold users): leases on %.0f vs off %.0f req/s = %.0f%% (rounds %s), p99 %s vs %s ms, %.3f vs %.3f script calls per check\n", \
    rps[s, "spread_on"], rps[s, "spread_off"], 100 * sp[s], sall, p99[s, "spread_on"], p99[s, "spread_off"], \
    calls[s, "spread_on"] / adm[s, "spread_on"], calls[s, "spread_off"] / adm[s, "spread_off"]
}' "$rows"
