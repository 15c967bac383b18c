#!/usr/bin/env bash
# `make run`: build both binaries, migrate, seed the demo org, print how to use it,
# then run the worker in the background and the api in the foreground. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."

state=.quotaplane
mkdir -p "$state"
chmod 700 "$state"
if [ -z "${QUOTA_ADMIN_TOKEN:-}" ]; then
  if [ ! -s "$state/admin-token" ]; then
    (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=\n' > "$state/admin-token")
  fi
  QUOTA_ADMIN_TOKEN=$(cat "$state/admin-token")
  export QUOTA_ADMIN_TOKEN
fi

# Each org's webhook signing secret derives from this; api and worker need the same one.
if [ -z "${QUOTA_WEBHOOK_SECRET:-}" ]; then
  if [ ! -s "$state/webhook-secret" ]; then
    (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=\n' > "$state/webhook-secret")
  fi
  QUOTA_WEBHOOK_SECRET=$(cat "$state/webhook-secret")
  export QUOTA_WEBHOOK_SECRET
fi

echo "Building..."
go build -o bin/quotaplane-api ./cmd/api
go build -o bin/quotaplane-worker ./cmd/worker

# Fail fast with a clear message when Postgres is not there, instead of waiting a minute.
QUOTA_STARTUP_TIMEOUT=${QUOTA_STARTUP_TIMEOUT:-10s} bin/quotaplane-api demo --state-dir "$state" 2> "$state/demo.log" || {
  echo "Could not prepare the database:" >&2
  tail -n 1 "$state/demo.log" >&2
  echo "Is Postgres running at the URL above? Start it, or set DATABASE_URL to point elsewhere." >&2
  exit 1
}
redis_url=${REDIS_URL:-redis://127.0.0.1:6379/0}
if command -v redis-cli >/dev/null && [[ "$redis_url" == redis://* ]] && ! redis-cli -u "$redis_url" ping >/dev/null 2>&1; then
  echo "Warning: Redis at $redis_url does not answer; /readyz will say so until it does." >&2
fi

bin/quotaplane-worker 2> >(sed 's/^/[worker] /' >&2) &
worker=$!
trap 'kill $worker 2>/dev/null; wait $worker 2>/dev/null' EXIT
trap 'exit 130' INT TERM
echo "Worker started (pid $worker); API logs follow. Ctrl-C stops both."
bin/quotaplane-api
