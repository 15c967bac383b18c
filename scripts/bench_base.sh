#!/usr/bin/env bash
# Base against current, interleaved: two api binaries, each with GOMAXPROCS=1 on core
# 0 (the load, wrk or loadgen, on core 1), on their own databases and one Redis,
# driven in alternated rounds (A B, B A, ...) by wrk (/healthz and /v1/check over 1,000
# users) and by loadgen (HTTP /v1/check and gRPC ShouldRateLimit, spread over 1,000
# users and hot on one, and gRPC's three descriptors of a path); each row gives
# requests/s and the api's CPU µs per request from /proc/<pid>/stat. A shared machine's
# speed drifts: compare the two binaries' rows of the same round, and the medians.
#
#   BASE_API=/tmp/base-api NEW_API=/tmp/new-api bash scripts/bench_base.sh
#
# BASE_API defaults to a build of the previous commit (git worktree-free: git archive
# into a temporary directory); NEW_API to a build of the working tree. ROUNDS (3),
# SECS (4), MODES (loadgen's: http hot grpc grpchot grpc3), PORT (18600: the apis take
# PORT..PORT+3), REDIS_URL, DATABASE_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench/lib.sh
tmp=$(mktemp -d)
pids=()
dbs=()
base=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
admin_url=$(sed -E "s#/[^/?]*(\\?|\$)#/postgres\\1#" <<< "${base%%\?*}")${base#"${base%%\?*}"}
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  for d in "${dbs[@]}"; do psql -q "$admin_url" -c "drop database if exists $d" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
redis_url=${REDIS_URL:-redis://127.0.0.1:6379/0}
if [ -z "${BASE_API:-}" ]; then
  mkdir "$tmp/base" && git archive HEAD~1 | tar -x -C "$tmp/base"
  (cd "$tmp/base" && go build -o "$tmp/base-api" ./cmd/api)
  BASE_API=$tmp/base-api
fi
if [ -z "${NEW_API:-}" ]; then go build -o "$tmp/new-api" ./cmd/api; NEW_API=$tmp/new-api; fi
go build -o "$tmp/loadgen" ./cmd/loadgen
port=${PORT:-18600} secs=${SECS:-4}
hz=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
start() { # name http grpc: starts an api, prints its pid
  local db="qp_bb_$1_$$" url token
  url=$(sed -E "s#/[^/?]*(\\?|\$)#/$db\\1#" <<< "${base%%\?*}")${base#"${base%%\?*}"}
  dbs+=("$db")
  token="bench-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  echo "$token" > "$tmp/$1.token"
  GOMAXPROCS=1 DATABASE_URL=$url REDIS_URL=$redis_url QUOTA_HTTP_ADDR=127.0.0.1:$2 QUOTA_GRPC_ADDR=127.0.0.1:$3 \
    QUOTA_ADMIN_TOKEN=$token QUOTA_LOG_LEVEL=warn QUOTA_MAX_INFLIGHT_PER_ORG=8192 QUOTA_ADMIN_RATE_LIMIT=off \
    QUOTA_REDIS_TIMEOUT=2s QUOTA_REDIS_PREFIX="qbb$1$$" QUOTA_METRICS_ADDR=off $pin_api "$4" 2> "$tmp/$1.log" &
  pids+=($!)
  echo $! > "$tmp/$1.pid"
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$2/healthz" >/dev/null && return; sleep 0.2; done
  echo "api $1 did not start:" >&2; tail "$tmp/$1.log" >&2; exit 1
}
# Both apis on core 0 and the load on core 1, where taskset and a second core exist;
# the apis run one at a time, so they never share core 0's time.
pin_api= pin_load=
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin_api="taskset -c 0" pin_load="taskset -c 1"; fi
start base "$port" $((port + 1)) "$BASE_API"
start new $((port + 2)) $((port + 3)) "$NEW_API"
setup() { # name http: a plan, org, team of 1,000 users' limits and a check key; the wrk script
  local u="http://127.0.0.1:$2" token key org="qpbb$$"
  token=$(cat "$tmp/$1.token")
  key=$(bench_org "$u" "$token" "$org")
  check_lua "$key" "$org" > "$tmp/$1.lua"
}
setup base "$port"
setup new $((port + 2))
run() { # name label command...: one measured run, "label name rps µs/request"
  local name=$1 label=$2 pid a0 a1 n
  pid=$(cat "$tmp/$name.pid")
  shift 2
  a0=$(ticks "$pid")
  n=$("$@")
  a1=$(ticks "$pid")
  awk -v l="$label" -v nm="$name" -v n="$n" -v a=$((a1 - a0)) -v hz="$hz" -v s="$secs" \
    'BEGIN { printf "%-14s %-5s %9.0f /s %8.1f µs of api CPU per request\n", l, nm, n / s, a * 1e6 / hz / n }'
}
wrk_n() { $pin_load wrk -t1 -c50 -d"${secs}s" "$@" | awk '/requests in/ { print $1 }'; }
lg_n() { # name http grpc mode
  local args=(-url "http://127.0.0.1:$2" -token "$(cat "$tmp/$1.token")" -orgs 1 -teams 1 -users 1000 -prefix "qbblg$$"
    -user-month 1000000000 -team-month 100000000000 -org-month 200000000000 -c 50 -duration "${secs}s" -json "$tmp/lg.json")
  [ "$4" = grpc ] && args+=(-grpc "127.0.0.1:$3")
  [ "$4" = grpc3 ] && args+=(-grpc "127.0.0.1:$3" -grpc-path)
  # hot: every check on one user, whose path the api leases (the later -users wins)
  [ "$4" = hot ] && args+=(-users 1)
  [ "$4" = grpchot ] && args+=(-grpc "127.0.0.1:$3" -users 1)
  $pin_load "$tmp/loadgen" "${args[@]}" > /dev/null 2> "$tmp/lg.err" || { tail -3 "$tmp/lg.err" >&2; echo 1; return; }
  awk -v s="$secs" '/"requests_per_second"/ { gsub(/[,]/, "", $2); printf "%.0f\n", $2 * s }' "$tmp/lg.json"
}
for round in $(seq "${ROUNDS:-3}"); do
  order="base new" # alternated, so neither binary always runs on the warmer machine
  [ $((round % 2)) = 0 ] && order="new base"
  for name in $order; do
    if [ $name = base ]; then h=$port g=$((port + 1)); else h=$((port + 2)) g=$((port + 3)); fi
    echo "round $round: $(run $name /healthz wrk_n "http://127.0.0.1:$h/healthz")" | tee -a "$tmp/rows"
    echo "round $round: $(run $name /v1/check wrk_n -s "$tmp/$name.lua" "http://127.0.0.1:$h/v1/check")" | tee -a "$tmp/rows"
    for mode in ${MODES:-http hot grpc grpchot grpc3}; do
      echo "round $round: $(run $name "loadgen-$mode" lg_n $name $h $g $mode)" | tee -a "$tmp/rows"
    done
  done
done
# Each path's rounds summed up, current against base: the medians, and the best
# rounds (the least CPU per request), which a busy neighbour cannot make look better
# than they are and so are the steadier estimate on a shared machine.
echo
awk 'NF < 7 || $5 + 0 == 0 { next } # a run that failed prints no figures
  { k = $3 SUBSEP $4; n[k]++; rps[k, n[k]] = $5; us[k, n[k]] = $7; if (!($3 in seen)) { seen[$3] = 1; order[++m] = $3 } }
  function med(a, k, c,   i, j, t, v) { for (i = 1; i <= c; i++) v[i] = a[k, i]
    for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2 }
  function least(a, k, c,   i, v) { v = a[k, 1]; for (i = 2; i <= c; i++) if (a[k, i] < v) v = a[k, i]; return v }
  END { printf "%-16s %10s %10s %7s %10s %10s %7s %9s\n", "path", "base med", "new med", "ratio", "base best", "new best", "ratio", "req/s med"
    printf "%-16s %10s %10s %7s %10s %10s %7s %9s\n", "", "µs/req", "µs/req", "", "µs/req", "µs/req", "", "new/base"
    for (i = 1; i <= m; i++) { l = order[i]; b = l SUBSEP "base"; c = l SUBSEP "new"
      if (!n[b] || !n[c]) continue
      bu = med(us, b, n[b]); cu = med(us, c, n[c]); bl = least(us, b, n[b]); cl = least(us, c, n[c])
      printf "%-16s %10.1f %10.1f %7.2f %10.1f %10.1f %7.2f %9.2f\n", l, bu, cu, cu / bu, bl, cl, cl / bl, med(rps, c, n[c]) / med(rps, b, n[b]) } }' "$tmp/rows"
