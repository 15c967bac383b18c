#!/usr/bin/env bash
# `make bench`: the check engine's Go benchmarks, the HTTP benchmarks, then (when the
# tools are installed) Redis's own ceiling for check.lua and for a reference script
# (redis-cli --pipe, redis-benchmark), wrk against a separately started
# quotaplane-api, and one summary table with the ratios of docs/PERFORMANCE.md (among
# them a priced check's cost beside an unpriced one's).
# Figures drift between machines and runs; compare ratios against the baselines
# measured in the same run. Bounded: a few minutes, and bench-users on top.
#
# REDIS_URL and DATABASE_URL as for the tests; BENCH_GO=0 (skip the Go benchmarks),
# BENCH_CHECKS, BENCH_PAIRS (reserve+commit pairs), BENCH_WINDOW_CHECKS (estimate vs precise windows), BENCH_TIME (Go HTTP benchmarks), BENCH_REDIS_N, BENCH_WRK_SECONDS, BENCH_WRK_ROUNDS,
# BENCH_PORT, BENCH_GRPC_PORT, BENCH_GRPC_SECONDS, BENCH_LG_MODES (the loadgen modes of the
# gRPC section, default "http grpc multi pairs") tune it; BENCH_LEASES=0 and BENCH_ZIPF=0 skip
# scripts/bench_leases.sh and scripts/bench_zipf.sh; BENCH_USERS=0 skips bench-users (scripts/bench_users.sh), which
# runs last. Load goes to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench/lib.sh
tmp=$(mktemp -d)
api_pid=
ref_pid=
bench_db=
gapi_pid=
g_db=
cleanup() {
  [ -n "$gapi_pid" ] && kill "$gapi_pid" 2>/dev/null && wait "$gapi_pid" 2>/dev/null || true
  [ -n "$g_db" ] && command -v psql >/dev/null && psql -q "$g_admin" -c "drop database if exists $g_db" 2>/dev/null || true
  [ -n "${g_prefix:-}" ] && have redis-cli && drop_keys "q:{$g_prefix-*"
  [ -n "$api_pid" ] && kill "$api_pid" 2>/dev/null && wait "$api_pid" 2>/dev/null || true
  [ -n "${api1_pid:-}" ] && kill "$api1_pid" 2>/dev/null && wait "$api1_pid" 2>/dev/null || true
  [ -n "$ref_pid" ] && kill "$ref_pid" 2>/dev/null && wait "$ref_pid" 2>/dev/null || true
  [ -n "${ref_prefix:-}" ] && drop_keys "$ref_prefix:*"
  [ -n "$bench_db" ] && command -v psql >/dev/null && psql -q "$db_admin" -c "drop database if exists $bench_db" 2>/dev/null || true
  [ -n "${p:-}" ] && drop_pipe_keys
  rm -rf "$tmp"
}
trap cleanup EXIT
out=$tmp/go.txt
rows=$tmp/rows.txt
touch "$rows"
echo "# Go benchmark output" > "$out" # never empty: the summary's awk tells its two files apart by FNR == NR
redis_url=${REDIS_URL:-redis://127.0.0.1:6379/0}
have() { command -v "$1" >/dev/null; }

# evalsha calls and microseconds so far (INFO commandstats), for deltas: a shared
# Redis is not reset, and other clients' scripts would show in the figure.
evalsha_stats() { redis-cli -u "$redis_url" info commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2/p'; }
usec_per_call() { # before after
  awk -v b="$1" -v a="$2" 'BEGIN { split(b, x, " "); split(a, y, " "); n = y[1] - x[1];
    if (n > 0) printf "%.1f", (y[2] - x[2]) / n; else printf "-" }'
}

if [ "${BENCH_GO:-1}" != 0 ]; then
  echo "Engine: ${BENCH_CHECKS:-200000} checks at 64-way concurrency (BENCH_CHECKS=1000000 for the full run)..."
  s0=$(have redis-cli && evalsha_stats || true)
  go test -run '^$' -bench 'BenchmarkCheckParallel$' -benchmem -benchtime "${BENCH_CHECKS:-200000}x" ./internal/quota/ | tee -a "$out"
  if [ -n "$s0" ]; then
    echo "redis_usec_per_check_engine $(usec_per_call "$s0" "$(evalsha_stats)")" >> "$rows"
  fi
  echo
  echo "Engine: ${BENCH_PAIRS:-50000} reservations, each committed, at 64-way concurrency (beside the plain checks above)..."
  s0=$(have redis-cli && evalsha_stats || true)
  go test -run '^$' -bench 'BenchmarkReserveCommitParallel$' -benchmem -benchtime "${BENCH_PAIRS:-50000}x" ./internal/quota/ | tee -a "$out"
  if [ -n "$s0" ]; then
    echo "redis_usec_per_pair_engine $(usec_per_call "$s0" "$(evalsha_stats)")" >> "$rows"
  fi
  echo
  echo "Engine: ${BENCH_WINDOW_CHECKS:-100000} checks with a per-second limit, the two-bucket estimate then the precise window, at 64-way concurrency..."
  go test -run '^$' -bench 'BenchmarkCheckWindows$' -benchmem -benchtime "${BENCH_WINDOW_CHECKS:-100000}x" ./internal/quota/ | tee -a "$out"
  echo
  echo "Engine: ${BENCH_CAPACITY_CHECKS:-100000} checks without a capacity, then drawing on one (one org; 1,000 orgs), at 64-way concurrency..."
  go test -run '^$' -bench 'BenchmarkCheckCapacity$' -benchmem -benchtime "${BENCH_CAPACITY_CHECKS:-100000}x" ./internal/quota/ | tee -a "$out"
  echo
  # Several metrics: a requests+tokens decision as one two-metric check, then as two
  # one-metric checks; ns/decision and redis-ns/decision side by side
  echo "Engine: ${BENCH_METRIC_CHECKS:-100000} decisions of requests and tokens, one two-metric check vs two one-metric checks, at 64-way concurrency..."
  go test -run '^$' -bench 'BenchmarkCheckTwoMetrics(Apart)?$' -benchmem -benchtime "${BENCH_METRIC_CHECKS:-100000}x" ./internal/quota/ | tee -a "$out"
  echo
  echo "HTTP in process over loopback, 50 concurrent connections, ${BENCH_TIME:-5s} each..."
  go test -run '^$' -bench 'HTTP$' -benchmem -benchtime "${BENCH_TIME:-5s}" ./internal/httpapi/ | tee -a "$out"
fi

# Redis's own ceiling, in the same run, over 1,000 users (three levels, month + minute):
# - the reference cascade script scripts/bench/ref9.lua (9 plain keys, nothing but the
#   decision), by redis-benchmark (-P 16, 50 connections) and by redis-cli --pipe;
# - check.lua by redis-cli --pipe, sent exactly as the engine builds it (loadgen -resp):
#   its numbers travel packed in binary, which redis-benchmark cannot send (it cuts
#   arguments at a zero byte). --pipe keeps one connection full, so its rate is Redis's
#   ceiling for the script; for ref9 both tools are shown, to compare them.
pipe_run() { # name file: rate and µs per call of one redis-cli --pipe run
  local s0 s1 t0 t1
  s0=$(evalsha_stats); t0=$(date +%s%N)
  redis-cli -u "$redis_url" --pipe < "$2" > "$tmp/pipe.out"
  t1=$(date +%s%N); s1=$(evalsha_stats)
  grep -q 'errors: 0,' "$tmp/pipe.out" || { echo "redis-cli --pipe of $1: $(tail -1 "$tmp/pipe.out")" >&2; return 1; }
  pipe_rate=$(( n * 1000000000 / (t1 - t0) )) pipe_usec=$(usec_per_call "$s0" "$s1")
  echo "redis-cli --pipe $1: $pipe_rate EVALSHA/s, $pipe_usec µs of Redis per call"
  [ -n "${3:-}" ] || echo "pipe_$1 $pipe_rate $pipe_usec" >> "$rows"
}
drop_keys() { # patterns
  for k in "$@"; do
    redis-cli -u "$redis_url" --scan --pattern "$k" | xargs -r -n 100 redis-cli -u "$redis_url" del >/dev/null
  done
}
drop_pipe_keys() { drop_keys "$p:*" "q:{$p}*"; }
if have redis-benchmark && have redis-cli; then
  echo
  n=${BENCH_REDIS_N:-200000}
  p="qbench$$"
  echo "Redis alone: $n checks of 1,000 users (3 levels x month + minute), ref9.lua and check.lua..."
  ref=$(redis-cli -u "$redis_url" script load "$(cat scripts/bench/ref9.lua)")
  lv() { echo "$p:{r}$1m${2:-} $p:{r}$1c${2:-} $p:{r}$1p${2:-}"; }
  s0=$(evalsha_stats)
  # shellcheck disable=SC2046 # the arguments are split on purpose
  rps=$(redis-benchmark -u "$redis_url" -c 50 -n "$n" -r 1000 -P 16 -q evalsha "$ref" 9 $(lv o) $(lv t) $(lv u :__rand_int__) \
    1 0.5 1000000000000 1000000000000 500000000000 500000000000 250000000000 250000000000 2>&1 |
    tr '\r' '\n' | grep 'requests per second' | tail -1 | sed 's/.*: \([0-9.]*\) requests per second.*/\1/')
  echo "redis-benchmark -P 16 ref9: $rps EVALSHA/s, $(usec_per_call "$s0" "$(evalsha_stats)") µs of Redis per call"
  echo "redisbench_ref $rps $(usec_per_call "$s0" "$(evalsha_stats)")" >> "$rows"
  awk -v n="$n" -v sha="$ref" -v p="$p" 'function arg(s) { printf "$%d\r\n%s\r\n", length(s), s }
    BEGIN { for (i = 0; i < n; i++) { u = i % 1000; printf "*20\r\n"; arg("evalsha"); arg(sha); arg("9")
      split("o t u", lv, " "); for (l = 1; l <= 3; l++) { s = (l == 3) ? ":" u : ""
        arg(p ":{r}" lv[l] "m" s); arg(p ":{r}" lv[l] "c" s); arg(p ":{r}" lv[l] "p" s) }
      arg("1"); arg("0.5"); arg("1000000000000"); arg("1000000000000"); arg("500000000000"); arg("500000000000")
      arg("250000000000"); arg("250000000000") } }' > "$tmp/ref.resp"
  pipe_run ref9 "$tmp/ref.resp"
  redis-cli -u "$redis_url" hset "q:{$p}|m|$(date -u +%Y-%m)" "|p" 1 >/dev/null # the period marker
  go run ./cmd/loadgen -resp "$n" -prefix "$p" > "$tmp/check.resp" # starts with SCRIPT LOAD
  pipe_run check "$tmp/check.resp"
fi

# wrk against the api binary in its own process (the Go benchmarks above share the two
# processes' CPU with their client inside one process).
if have wrk && have curl; then
  echo
  port=${BENCH_PORT:-18181}
  base=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/quotaplane?sslmode=disable}
  bench_db="qp_bench_$$"
  db_url=$(sed -E "s#/[^/?]*(\\?|\$)#/$bench_db\\1#" <<< "${base%%\?*}")${base#"${base%%\?*}"}
  db_admin=$(sed -E "s#/[^/?]*(\\?|\$)#/postgres\\1#" <<< "${base%%\?*}")${base#"${base%%\?*}"}
  token="bench-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  go build -o "$tmp/api" ./cmd/api
  go build -o "$tmp/refserver" ./scripts/bench/refserver
  echo "wrk: quotaplane-api on 127.0.0.1:$port (database $bench_db), 50 connections, ${BENCH_WRK_ROUNDS:-3} rounds of /healthz and /v1/check, ${BENCH_WRK_SECONDS:-4}s each, then batches..."
  DATABASE_URL=$db_url REDIS_URL=$redis_url QUOTA_HTTP_ADDR=127.0.0.1:$port QUOTA_ADMIN_TOKEN=$token \
    QUOTA_LOG_LEVEL=warn QUOTA_MAX_INFLIGHT_PER_ORG=8192 "$tmp/api" 2> "$tmp/api.log" &
  api_pid=$!
  # /v1/check is measured against /healthz with the api on one core (GOMAXPROCS=1) and
  # the load on the other: a second api process on the same database and Redis (a
  # replica), pinned to core 0, serves the alternated rounds below, with wrk pinned to
  # core 1; the first (all cores) serves the batches. On a machine without taskset or
  # a second core both are the first.
  pin_api= pin_wrk= rounds_pid=$api_pid rounds_u=http://127.0.0.1:$port
  if have taskset && [ "$(nproc)" -ge 2 ]; then
    pin_api="taskset -c 0" pin_wrk="taskset -c 1" wrk_threads=1
    DATABASE_URL=$db_url REDIS_URL=$redis_url QUOTA_HTTP_ADDR=127.0.0.1:$((port + 1)) QUOTA_GRPC_ADDR=off QUOTA_METRICS_ADDR=off \
      QUOTA_LOG_LEVEL=warn QUOTA_MAX_INFLIGHT_PER_ORG=8192 GOMAXPROCS=1 taskset -c 0 "$tmp/api" 2> "$tmp/api1.log" &
    rounds_pid=$! rounds_u=http://127.0.0.1:$((port + 1))
    api1_pid=$rounds_pid
    echo "pin_note the api GOMAXPROCS=1 on core 0, wrk on core 1" >> "$rows"
  fi
  # The reference check service (scripts/bench/refserver): a straightforward go-redis
  # handler, one coalesced EVALSHA of ref9.lua per check, measured in the same rounds
  # as the api.
  ref_port=${BENCH_REF_PORT:-$((port + 9))} ref_prefix="qpref$$"
  REDIS_URL=$redis_url GOMAXPROCS=${pin_api:+1} $pin_api "$tmp/refserver" -addr "127.0.0.1:$ref_port" -prefix "$ref_prefix" -lifetime 15m 2> "$tmp/ref.log" &
  ref_pid=$!
  u=http://127.0.0.1:$port
  ru=http://127.0.0.1:$ref_port
  for _ in $(seq 100); do curl -sf "$u/healthz" >/dev/null && curl -sf "$rounds_u/healthz" >/dev/null && curl -sf "$ru/healthz" >/dev/null && break; sleep 0.2; done
  post() { curl -sf -X POST "$u$1" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d "$2"; }
  org="qpbench$$" # its own org: the api counts under the default key prefix on REDIS_URL
  key=$(bench_org "$u" "$token" "$org")
  cat > "$tmp/done.lua" <<'EOF'
done = function(summary, latency, requests)
  io.write(string.format("WRK %.0f %.2f %.2f %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout + summary.errors.status))
end
EOF
  check_lua "$key" "$org" > "$tmp/check.lua"
  batch=$(for i in $(seq 0 99); do printf '{"org":"%s","team":"eng","user":"u%d"},' "$org" "$i"; done)
  cat > "$tmp/batch.lua" <<EOF
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $key"
wrk.body = '{"checks":[${batch%,}]}'
EOF
  cat "$tmp/done.lua" >> "$tmp/check.lua"
  cat "$tmp/done.lua" >> "$tmp/batch.lua"
  post /v1/check "{\"org\":\"$org\",\"team\":\"eng\",\"user\":\"u0\"}" >/dev/null # hydrate
  # /healthz and /v1/check alternate, BENCH_WRK_ROUNDS pairs: this machine's speed
  # drifts within a minute, so each round's ratio compares runs seconds apart, and the
  # summary takes the round with the median ratio.
  # Each run also reports the CPU each process spent per request (µs, from /proc and
  # the shell's `times`): the api, Redis (when it runs on this machine) and wrk share
  # the cores, so these say where a check's cost goes whatever the machine's speed.
  secs=${BENCH_WRK_SECONDS:-4}
  d=${secs}s
  redis_pid=$(redis-cli -u "$redis_url" info server | tr -d '\r' | sed -n 's/^process_id://p')
  [ -r "/proc/$redis_pid/stat" ] || redis_pid=
  ticks() { [ -n "$1" ] && awk '{ print $14 + $15 }' "/proc/$1/stat" || echo 0; }
  wrk_cpu() { # connections script url [server pid]: "WRK rps p50 p99 errors server_µs redis_µs wrk_µs" per request
    local a0 r0 a1 r1 res pid=${4:-$api_pid}
    a0=$(ticks "$pid"); r0=$(ticks "$redis_pid")
    res=$( { $pin_wrk wrk -t"${wrk_threads:-2}" -c"$1" -d"$d" -s "$2" "$3" | grep '^WRK'; times; } ) # times: the shell's, then its children's
    a1=$(ticks "$pid"); r1=$(ticks "$redis_pid")
    awk -v a=$((a1 - a0)) -v r=$((r1 - r0)) -v hz="$(getconf CLK_TCK)" -v s="$secs" -v has_redis="$redis_pid" '
      /^WRK/ { line = $0; n = $2 * s }
      /s / { split($0, t, /[ms]+/); w = 60 * t[1] + t[2] + 60 * t[3] + t[4] }
      END { us = 1e6 / hz / n; printf "%s %.0f %s %.0f\n", line, a * us, has_redis ? sprintf("%.0f", r * us) : "-", w * 1e6 / n }' <<< "$res"
  }
  # Each round: the api's /healthz and /v1/check, then the reference's (refserver);
  # the rows end with Redis µs per EVALSHA during that server's checks.
  for round in $(seq "${BENCH_WRK_ROUNDS:-3}"); do
    for srv in api ref; do
      if [ $srv = api ]; then base=$rounds_u pid=$rounds_pid name=; else base=$ru pid=$ref_pid name="refserver "; fi
      h=$(wrk_cpu 50 "$tmp/done.lua" "$base/healthz" "$pid")
      s0=$(evalsha_stats)
      c=$(wrk_cpu 50 "$tmp/check.lua" "$base/v1/check" "$pid")
      s1=$(evalsha_stats)
      echo "round $round ${name}/healthz:  $h"
      echo "round $round ${name}/v1/check: $c"
      echo "${srv}_round ${h#WRK } ${c#WRK } $(usec_per_call "$s0" "$s1")" >> "$rows"
    done
  done
  # Batches of 100 alternate with check.lua alone (redis-cli --pipe) the same way.
  for round in $(seq "${BENCH_WRK_ROUNDS:-3}"); do
    if [ -s "$tmp/check.resp" ]; then
      printf 'round %s ' "$round"; pipe_run check "$tmp/check.resp" round
    fi
    s0=$(evalsha_stats)
    r=$(wrk -t2 -c16 -d"$d" -s "$tmp/batch.lua" "$u/v1/check/batch" | grep '^WRK')
    s1=$(evalsha_stats)
    echo "round $round /v1/check/batch: $r"
    echo "batch_round ${r#WRK } $(usec_per_call "$s0" "$s1") ${pipe_rate:-0}" >> "$rows"
  done
  echo "(columns: requests/s, p50 ms, p99 ms, errors and non-2xx; rounds: CPU µs per request of the api, Redis, wrk)"
  if have redis-cli; then
    redis-cli -u "$redis_url" --scan --pattern "q:{$org}*" | while read -r k; do redis-cli -u "$redis_url" del "$k" >/dev/null; done
  fi
fi

# Envoy's ShouldRateLimit over gRPC beside POST /v1/check over HTTP: one api process
# serving both, the same Go client (loadgen, 50 workers) and the same checks (one of
# 1,000 users of one team, limits never reached), alternated rounds. The wrk figures
# above use another client, so only these two compare the transports.
# In the same rounds, the same client and api: checks of two metrics
# (loadgen -mode multi: "costs": {"requests": 1, "tokens": 1000}, month limits of both)
# and acquire+release pairs (-mode pairs: POST /v1/reservations of 1 request against
# concurrent limits at every level, then DELETE it), each on its own orgs and plan, and
# compared with the one-metric HTTP checks of its round. BENCH_LG_MODES picks the modes
# (default "http grpc multi pairs"); an api that refuses a mode (loadgen exits 3: it
# lacks that part of API.md) is said so and skipped, and the bench goes on.
if have curl; then
  echo
  gport=${BENCH_GRPC_PORT:-18191}
  ghttp=$((gport + 1))
  gbase=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/quotaplane?sslmode=disable}
  g_db="qp_benchg_$$"
  g_url=$(sed -E "s#/[^/?]*(\\?|\$)#/$g_db\\1#" <<< "${gbase%%\?*}")${gbase#"${gbase%%\?*}"}
  g_admin=$(sed -E "s#/[^/?]*(\\?|\$)#/postgres\\1#" <<< "${gbase%%\?*}")${gbase#"${gbase%%\?*}"}
  gtoken="bench-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  g_prefix="qpg$$"
  go build -o "$tmp/gapi" ./cmd/api
  go build -o "$tmp/loadgen" ./cmd/loadgen
  gs=${BENCH_GRPC_SECONDS:-4}
  echo "gRPC vs HTTP: quotaplane-api on 127.0.0.1:$ghttp and gRPC 127.0.0.1:$gport (database $g_db), loadgen with 50 workers, ${BENCH_WRK_ROUNDS:-3} rounds of /v1/check and ShouldRateLimit, ${gs}s each..."
  DATABASE_URL=$g_url REDIS_URL=$redis_url QUOTA_HTTP_ADDR=127.0.0.1:$ghttp QUOTA_GRPC_ADDR=127.0.0.1:$gport QUOTA_ADMIN_TOKEN=$gtoken \
    QUOTA_LOG_LEVEL=warn QUOTA_MAX_INFLIGHT_PER_ORG=8192 QUOTA_ADMIN_RATE_LIMIT=off QUOTA_REDIS_TIMEOUT=2s "$tmp/gapi" 2> "$tmp/gapi.log" &
  gapi_pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ghttp/healthz" >/dev/null && break; sleep 0.2; done
  lg_modes=${BENCH_LG_MODES:-http grpc multi pairs}
  refused=" " # modes the api refused: skipped in later rounds
  for round in $(seq "${BENCH_WRK_ROUNDS:-3}"); do
    for mode in $lg_modes; do
      case $refused in *" $mode "*) continue ;; esac
      args=(-url "http://127.0.0.1:$ghttp" -token "$gtoken" -orgs 1 -teams 1 -users 1000
        -user-month 1000000000 -team-month 100000000000 -org-month 200000000000 -c 50 -duration "${gs}s" -json "$tmp/lg.json")
      unit=req/s field=requests_per_second
      case $mode in
        http) args+=(-prefix "$g_prefix") label="HTTP /v1/check:" ;;
        grpc) args+=(-prefix "$g_prefix" -grpc "127.0.0.1:$gport") label="gRPC ShouldRateLimit:" ;;
        multi) args+=(-prefix "$g_prefix-m" -mode multi -tokens 1000) label="HTTP 2-metric /v1/check:" ;;
        pairs) # concurrent limits never reached: 50 workers hold at most 50 slots
          args+=(-prefix "$g_prefix-p" -mode pairs -org-concurrent 1000000 -team-concurrent 1000000 -user-concurrent 1000000)
          label="acquire+release pairs:" unit=pairs/s field=pairs_per_second ;;
        *) echo "BENCH_LG_MODES: unknown mode $mode (http grpc multi pairs)" >&2; exit 1 ;;
      esac
      rm -f "$tmp/lg.json"
      rc=0
      "$tmp/loadgen" "${args[@]}" > "$tmp/lg.out" 2> "$tmp/lg.err" || rc=$?
      if [ $rc = 3 ]; then # the api does not take this mode's requests (loadgen's RefusedError)
        why=$(sed -n 's/^loadgen: REFUSED: //p' "$tmp/lg.err" | head -1)
        printf 'round %s %-26s REFUSED by this api, skipped in every round: %s\n' "$round" "$label" "$why"
        echo "lg_${mode}_refused $why" >> "$rows"
        refused+="$mode "
        continue
      elif [ $rc != 0 ]; then
        echo "loadgen ($mode) failed:" >&2; tail -n 5 "$tmp/lg.err" "$tmp/lg.out" "$tmp/gapi.log" >&2; exit 1
      fi
      rps=$(sed -n "s/^  \"$field\": \\([0-9.]*\\).*/\\1/p" "$tmp/lg.json")
      p99=$(sed -n 's/^    "p99": \([0-9.]*\).*/\1/p' "$tmp/lg.json")
      errs=$(sed -n 's/^  "errors": \([0-9]*\).*/\1/p' "$tmp/lg.json")
      [ "$errs" = 0 ] || grep -A3 "error_sample" "$tmp/lg.json" | head -4 >&2
      printf 'round %s %-26s %8.0f %s, p99 %s ms, %s errors\n' "$round" "$label" "$rps" "$unit" "$p99" "$errs"
      echo "lg_${mode}_round $rps $p99 $round" >> "$rows"
    done
  done
fi

echo
awk '
# median_round: the index of the round whose ratio is the median (odd counts have one)
function median_round(ratio, n,    i, j, t, ord) {
  for (i = 1; i <= n; i++) ord[i] = i
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (ratio[ord[j]] < ratio[ord[i]]) { t = ord[i]; ord[i] = ord[j]; ord[j] = t }
  return ord[int((n + 1) / 2)]
}
# vs_http: the figure of a loadgen mode per round (val, p99, by the round numbers rnd) against
# the one-metric HTTP checks of the same round (lhround): the ratio of the median round.
function vs_http(label, unit, note, n, rnd, val, p99,    i, k, ratio, idx, m, all) {
  k = 0
  for (i = 1; i <= n; i++) if ((rnd[i], 1) in lhround && lhround[rnd[i], 1] > 0) { k++; ratio[k] = val[i] / lhround[rnd[i], 1]; idx[k] = i }
  if (k == 0) { printf "  %s: no one-metric HTTP round to compare with (BENCH_LG_MODES needs http)\n", label; return }
  m = median_round(ratio, k)
  all = ""
  for (i = 1; i <= k; i++) all = all sprintf("%s%.0f%%", i > 1 ? ", " : "", 100 * ratio[i])
  printf "  %s vs one-metric HTTP /v1/check (loadgen, 50 workers, one api): %.0f %s / %.0f checks/s = %.0f%%%s; p99 %s vs %s ms\n", \
    label, val[idx[m]], unit, lhround[rnd[idx[m]], 1], 100 * ratio[m], note, p99[idx[m]], lhround[rnd[idx[m]], 2]
  printf "                                            the median of %d alternated rounds: %s\n", k, all
}
FNR == NR && /^Benchmark/ {
  name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
  for (i = 3; i < NF; i++) v[name, $(i+1)] = $i
  names[++n] = name
  next
}
FNR != NR && $1 == "batch_round" { brounds++; for (i = 2; i <= NF; i++) br[brounds, i - 1] = $i; next }
FNR != NR && $1 == "pin_note" { pinned = substr($0, 10); next }
FNR != NR && $1 == "api_round" { rounds++; for (i = 2; i <= NF; i++) rr[rounds, i - 1] = $i; next }
FNR != NR && $1 == "ref_round" { frounds++; for (i = 2; i <= NF; i++) fr[frounds, i - 1] = $i; next }
FNR != NR && $1 == "lg_http_round" { hrounds++; lh[hrounds, 1] = $2; lh[hrounds, 2] = $3; lhround[$4, 1] = $2; lhround[$4, 2] = $3; next }
FNR != NR && $1 == "lg_multi_round" { mrounds++; mval[mrounds] = $2; mp99[mrounds] = $3; mrnd[mrounds] = $4; next }
FNR != NR && $1 == "lg_pairs_round" { prounds++; pval[prounds] = $2; pp99[prounds] = $3; prnd[prounds] = $4; next }
FNR != NR && $1 ~ /^lg_.*_refused$/ { why = $0; sub(/^[^ ]* /, "", why); m = $1; sub(/^lg_/, "", m); sub(/_refused$/, "", m); lgrefused[m] = why; next }
FNR != NR && $1 == "lg_grpc_round" { grounds++; lgr[grounds, 1] = $2; lgr[grounds, 2] = $3; next }
FNR != NR { r[$1] = $0; f[$1, 2] = $2; f[$1, 3] = $3; f[$1, 4] = $4; f[$1, 5] = $5; f[$1, 6] = $6; f[$1, 7] = $7 }
END {
  base = v["HealthzHTTP", "req/s"]
  print "Go benchmarks (client and server in one process):"
  printf "  %-18s %12s %12s %10s %10s %12s %10s %14s\n", "benchmark", "req/s", "checks/s", "p50 µs", "p99 µs", "ns/check", "allocs/op", "vs /healthz"
  for (i = 1; i <= n; i++) {
    k = names[i]
    # one check per request only: a batch request is not comparable with one /healthz
    ratio = (base > 0 && v[k, "req/s"] > 0 && v[k, "checks/s"] == v[k, "req/s"]) ? sprintf("%.0f%%", 100 * v[k, "req/s"] / base) : "-"
    printf "  %-18s %12s %12s %10s %10s %12s %10s %14s\n", k, v[k, "req/s"] ? v[k, "req/s"] : "-", v[k, "checks/s"] ? v[k, "checks/s"] : "-", \
      v[k, "p50-µs"] ? v[k, "p50-µs"] : "-", v[k, "p99-µs"] ? v[k, "p99-µs"] : "-", v[k, "ns/op"], v[k, "allocs/op"], ratio
  }
  print ""
  print "Done-when ratios (docs/PERFORMANCE.md):"
  we = "CheckWindows/estimate"; wp = "CheckWindows/precise"
  if (v[we, "ns/check"] > 0 && v[wp, "ns/check"] > 0) {
    printf "  precise vs estimate window, per check:    %.0f / %.0f ns = %.2fx", v[wp, "ns/check"], v[we, "ns/check"], v[wp, "ns/check"] / v[we, "ns/check"]
    if (v[we, "redis-µs/check"] > 0 && v[wp, "redis-µs/check"] > 0)
      printf "; Redis %.1f / %.1f µs = %.2fx", v[wp, "redis-µs/check"], v[we, "redis-µs/check"], v[wp, "redis-µs/check"] / v[we, "redis-µs/check"]
    printf "\n"
  }
  wb = "CheckWindows/bucket"
  if (v[we, "ns/check"] > 0 && v[wb, "ns/check"] > 0) {
    printf "  token bucket vs estimate window, per check: %.0f / %.0f ns = %.2fx", v[wb, "ns/check"], v[we, "ns/check"], v[wb, "ns/check"] / v[we, "ns/check"]
    if (v[we, "redis-µs/check"] > 0 && v[wb, "redis-µs/check"] > 0)
      printf "; Redis %.1f / %.1f µs = %.2fx", v[wb, "redis-µs/check"], v[we, "redis-µs/check"], v[wb, "redis-µs/check"] / v[we, "redis-µs/check"]
    printf "\n"
  }
  cn = "CheckCapacity/none"
  for (ci = 1; ci <= 2; ci++) {
    cw = ci == 1 ? "CheckCapacity/one-org" : "CheckCapacity/1000-orgs"
    if (v[cn, "ns/check"] > 0 && v[cw, "ns/check"] > 0) {
      printf "  with a capacity (%s) vs without, per check: %.0f / %.0f ns = %.2fx", substr(cw, 15), v[cw, "ns/check"], v[cn, "ns/check"], v[cw, "ns/check"] / v[cn, "ns/check"]
      if (v[cn, "redis-µs/check"] > 0 && v[cw, "redis-µs/check"] > 0)
        printf "; Redis %.1f / %.1f µs = %.2fx, %.3f scripts a check", v[cw, "redis-µs/check"], v[cn, "redis-µs/check"], v[cw, "redis-µs/check"] / v[cn, "redis-µs/check"], v[cw, "scripts/check"]
      printf "\n"
    }
  }
  # Money: the same requests+tokens check, priced (spend counted and budgeted at every
  # level, a third metric of the same script run) beside unpriced, one run
  pu = "CheckUnpricedHTTP"; pp = "CheckPricedHTTP"
  if (v[pu, "ns/op"] > 0 && v[pp, "ns/op"] > 0)
    printf "  priced vs unpriced check (HTTP in process): %.0f / %.0f ns per check = %.2fx; p50 %s / %s µs; %s / %s allocs (requests+tokens, spend priced at 3 levels)\n", \
      v[pp, "ns/op"], v[pu, "ns/op"], v[pp, "ns/op"] / v[pu, "ns/op"], v[pp, "p50-µs"], v[pu, "p50-µs"], v[pp, "allocs/op"], v[pu, "allocs/op"]
  if (rounds > 0) {
    for (i = 1; i <= rounds; i++) cratio[i] = rr[i, 8] / rr[i, 1]
    m = median_round(cratio, rounds)
    all = ""
    for (i = 1; i <= rounds; i++) all = all sprintf("%s%.0f%%", i > 1 ? ", " : "", 100 * cratio[i])
    printf "  /v1/check vs /healthz (wrk, 50 conns, %s): %.0f / %.0f req/s = %.0f%% (target >= 45%%), p99 %s ms (target <= 4); /healthz p99 %s ms\n", \
      pinned ? pinned : "the api on every core", rr[m, 8], rr[m, 1], 100 * cratio[m], rr[m, 10], rr[m, 3]
    printf "                                            the median of %d alternated rounds: %s\n", rounds, all
    printf "  CPU per request in that round (µs):       /healthz api %s + wrk %s; /v1/check api %s + Redis %s + wrk %s\n", \
      rr[m, 5], rr[m, 7], rr[m, 12], rr[m, 13], rr[m, 14]
    am = m
  } else print "  /v1/check vs /healthz: wrk is not installed (apt-get install wrk); in-process figures above"
  if (frounds > 0) {
    for (i = 1; i <= frounds; i++) fratio[i] = fr[i, 8] / fr[i, 1]
    m = fm = median_round(fratio, frounds)
    all = ""; vs = ""
    for (i = 1; i <= frounds; i++) {
      all = all sprintf("%s%.0f%%", i > 1 ? ", " : "", 100 * fratio[i])
      vs = vs sprintf("%s%.0f%%", i > 1 ? ", " : "", 100 * rr[i, 8] / fr[i, 8])
    }
    printf "  the reference, refserver (ref9.lua):      /v1/check %.0f / /healthz %.0f req/s = %.0f%%, p99 %s ms; /healthz p99 %s ms\n", \
      fr[m, 8], fr[m, 1], 100 * fratio[m], fr[m, 10], fr[m, 3]
    printf "                                            the median of %d alternated rounds: %s\n", frounds, all
    printf "  CPU per request in that round (µs):       /healthz refserver %s + wrk %s; /v1/check refserver %s + Redis %s + wrk %s\n", \
      fr[m, 5], fr[m, 7], fr[m, 12], fr[m, 13], fr[m, 14]
    printf "  the api'"'"'s /v1/check vs the reference'"'"'s, by round: %s\n", vs
  }
  if (brounds > 0 && br[1, 6] > 0) {
    for (i = 1; i <= brounds; i++) bratio[i] = 100 * 100 * br[i, 1] / br[i, 6]
    m = median_round(bratio, brounds)
    all = ""
    for (i = 1; i <= brounds; i++) all = all sprintf("%s%.0f%%", i > 1 ? ", " : "", bratio[i])
    printf "  batch of 100 vs the ceiling of check.lua alone (redis-cli --pipe): %.0f / %.0f checks/s = %.0f%% (target >= 85%%)\n", \
      100 * br[m, 1], br[m, 6], bratio[m]
    printf "                                            the median of %d alternated rounds: %s\n", brounds, all
  } else if (("pipe_check") in r) {
    printf "  batch of 100 (in process) vs the ceiling of check.lua alone: %s / %.0f checks/s = %.0f%% (target >= 85%%)\n", \
      v["CheckBatchHTTP", "checks/s"], f["pipe_check", 2], 100 * v["CheckBatchHTTP", "checks/s"] / f["pipe_check", 2]
  } else print "  batch vs the ceiling of check.lua: redis-benchmark or redis-cli is not installed"
  if (("pipe_check") in r) {
    printf "  Redis alone, EVALSHA/s:                   check.lua %.0f (--pipe); ref9.lua %.0f (--pipe), %.0f (redis-benchmark -P 16)\n", \
      f["pipe_check", 2], f["pipe_ref9", 2], f["redisbench_ref", 2]
    printf "  Redis µs per check (INFO commandstats):   check.lua %s vs ref9.lua %s alone (--pipe) = %.2fx (target <= 12/11 = 1.09x); ref9.lua %s under redis-benchmark\n", \
      f["pipe_check", 3], f["pipe_ref9", 3], f["pipe_check", 3] / f["pipe_ref9", 3], f["redisbench_ref", 3]
    printf "  Redis µs per check under load:            %s under /v1/check, %s under the batch, %s in the engine benchmark; ref9.lua %s under refserver\n", \
      (rounds > 0) ? rr[am, 15] : "-", (brounds > 0) ? br[m, 5] : "-", \
      (("redis_usec_per_check_engine") in r) ? f["redis_usec_per_check_engine", 2] : "-", (frounds > 0) ? fr[fm, 15] : "-"
  }
  if (grounds > 0 && hrounds == grounds) {
    for (i = 1; i <= grounds; i++) gratio[i] = lgr[i, 1] / lh[i, 1]
    m = median_round(gratio, grounds)
    all = ""
    for (i = 1; i <= grounds; i++) all = all sprintf("%s%.0f%%", i > 1 ? ", " : "", 100 * gratio[i])
    printf "  gRPC ShouldRateLimit vs HTTP /v1/check (loadgen, 50 workers, one api): %.0f / %.0f checks/s = %.0f%%; p99 %s vs %s ms\n", \
      lgr[m, 1], lh[m, 1], 100 * gratio[m], lgr[m, 2], lh[m, 2]
    printf "                                            the median of %d alternated rounds: %s\n", grounds, all
  }
  if (mrounds > 0)
    vs_http("2-metric checks (requests+tokens)", "checks/s", " (> 50%: one check of 2 metrics costs less than two of 1)", mrounds, mrnd, mval, mp99)
  else if ("multi" in lgrefused)
    printf "  2-metric checks (requests+tokens): not measured, the api refused them: %s\n", lgrefused["multi"]
  if (prounds > 0)
    vs_http("acquire+release pairs (concurrent limits)", "pairs/s", " (a pair is 2 requests: 50% = a pair costs two checks)", prounds, prnd, pval, pp99)
  else if ("pairs" in lgrefused)
    printf "  acquire+release pairs (concurrent limits): not measured, the api refused them: %s\n", lgrefused["pairs"]
  if (("ReserveCommitParallel", "pairs/s") in v && v["CheckParallel", "ns/check"] > 0) {
    cps = 1e9 / v["CheckParallel", "ns/check"]
    printf "  reserve+commit pairs vs plain checks (engine, 64-way): %s pairs/s vs %.0f checks/s = %.0f%%; a pair is two script runs (Redis µs per run: %s, checks %s)\n", \
      v["ReserveCommitParallel", "pairs/s"], cps, 100 * v["ReserveCommitParallel", "pairs/s"] / cps, \
      (("redis_usec_per_pair_engine") in r) ? f["redis_usec_per_pair_engine", 2] : "-", \
      (("redis_usec_per_check_engine") in r) ? f["redis_usec_per_check_engine", 2] : "-"
  }
  printf "  engine allocations per check:             %s (BenchmarkCheckParallel)\n", (("CheckParallel", "allocs/op") in v) ? v["CheckParallel", "allocs/op"] : "- (BENCH_GO=0)"
}' "$out" "$rows"

# Leases: the hot path and the spread path with and without leases, on two apis of
# their own and a private redis-server (scripts/bench_leases.sh).
if [ "${BENCH_LEASES:-1}" != 0 ]; then
  echo
  bash scripts/bench_leases.sh
fi

# Client leases: a Zipf load through the Go client with and without leases and
# batching, against the server's HTTP figure (scripts/bench_zipf.sh).
if [ "${BENCH_ZIPF:-1}" != 0 ]; then
  echo
  bash scripts/bench_zipf.sh
fi

# Distinct user ids against repeating ones (its own api and database; ~1.7 minutes).
if [ "${BENCH_USERS:-1}" != 0 ] && have wrk && have curl && have psql; then
  echo
  bash scripts/bench_users.sh
fi
