#!/usr/bin/env bash
# Client leases under a Zipf load, run by `make bench` after the leases section, or
# alone: one quotaplane-api (GOGC=400 as deploy/k8s) on a fresh database and a private
# redis-server, and `loadgen -mode zipf`: paths drawn by a Zipf law (s = 1.1) over
# 100,000 users, many cold and a few hot, in three phases of BENCH_ZIPF_SECONDS (5) at
# 50 workers each, in the same run: the tool's own HTTP client (the server's plain
# /v1/check figure, the baseline), the Go client as it comes, and the Go client with
# WithLeases and WithBatching (2 ms). It prints checks/s and the ratio of each to the
# baseline, the share decided in the client's process, checks per request, and the
# verification (nothing admitted past a limit; the api counted what was allowed, once
# the leasing clients closed). docs/PERFORMANCE.md "Client leases" states the figures.
# BENCH_ZIPF_ROUNDS (1), BENCH_ZIPF_SECONDS, BENCH_ZIPF_WORKERS (50), BENCH_ZIPF_PORT tune it. Needs curl, psql
# and redis-server; load goes to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench/lib.sh
for tool in curl psql redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "bench-zipf: $tool is not installed"; exit 0; }
done
tmp=$(mktemp -d)
pids=()
bench_db=
trap private_cleanup EXIT
port=${BENCH_ZIPF_PORT:-18291}
rport=$((port + 5))
secs=${BENCH_ZIPF_SECONDS:-5}
rounds=${BENCH_ZIPF_ROUNDS:-1}
private_stack "qp_zipf_$$" "$rport"
go build -o "$tmp/api" ./cmd/api
go build -o "$tmp/loadgen" ./cmd/loadgen
DATABASE_URL=$db_url REDIS_URL=$redis_url QUOTA_HTTP_ADDR=127.0.0.1:$port QUOTA_GRPC_ADDR=127.0.0.1:0 QUOTA_ADMIN_TOKEN=$token \
  QUOTA_LOG_LEVEL=warn QUOTA_MAX_INFLIGHT_PER_ORG=8192 QUOTA_ADMIN_RATE_LIMIT=off GOGC=${BENCH_ZIPF_GOGC:-400} "$tmp/api" 2>> "$tmp/api.log" &
pids+=($!)
url=http://127.0.0.1:$port
for _ in $(seq 100); do curl -sf "$url/healthz" >/dev/null && break; sleep 0.2; done
echo "Client leases, Zipf load: one api on a private redis-server :$rport, loadgen -mode zipf, ${BENCH_ZIPF_WORKERS:-50} workers, 3 phases of ${secs}s, $rounds round(s)..."
for round in $(seq "$rounds"); do
  "$tmp/loadgen" -mode zipf -url "$url" -token "$token" -prefix "zipf$$r$round" -c "${BENCH_ZIPF_WORKERS:-50}" -duration "${secs}s" 2> "$tmp/lg.err" ||
    { echo "loadgen -mode zipf failed:" >&2; tail -n 5 "$tmp/lg.err" "$tmp/api.log" >&2; exit 1; }
done
