#!/usr/bin/env bash
# `make run`: build both binaries, migrate, seed the demo org, print how to use it,
# then run the worker and the api. Ctrl-C stops both; when either stops by itself,
# the other is stopped too and the run fails, saying which one and why.
#
# From a script: its pid is in $QUOTA_STATE_DIR/run.pid while it runs. SIGTERM to it
# stops both and exits 0 (a stop that was asked for); SIGINT stops both as Ctrl-C does.
# make's own pid is no substitute: make passes SIGTERM on to this script, but on
# SIGINT it waits for it, and in a script's background job it ignores SIGINT.
#
# Besides the binaries' own variables (DATABASE_URL, REDIS_URL, QUOTA_HTTP_ADDR,
# QUOTA_WORKER_HTTP_ADDR, ...) it reads QUOTA_STATE_DIR (where the demo's keys and
# secrets are kept, .quotaplane) and QUOTA_BIN_DIR (where the binaries are built, bin).
set -euo pipefail

# A shell started with SIGINT ignored (make in a script's background job: a shell
# without job control starts those with SIGINT ignored, and make keeps it so) can
# never trap it, nor un-ignore it; so kill -INT of this script would do nothing.
# Start again with SIGINT at its default, where env can do that (GNU coreutils 8.31+).
if [ "$(trap -p INT)" = "trap -- '' SIGINT" ] && [ -z "${QUOTA_RUN_REEXEC:-}" ] &&
  env --default-signal=INT true 2>/dev/null; then
  QUOTA_RUN_REEXEC=1 exec env --default-signal=INT bash "$0" "$@"
fi
unset QUOTA_RUN_REEXEC
cd "$(dirname "$0")/.."

state=${QUOTA_STATE_DIR:-.quotaplane}
bin=${QUOTA_BIN_DIR:-bin}
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

# A local run delivers webhooks to a local receiver (http://127.0.0.1:...); a
# deployment leaves this false, and the worker refuses private addresses.
export QUOTA_WEBHOOK_ALLOW_PRIVATE=${QUOTA_WEBHOOK_ALLOW_PRIVATE:-true}

api_addr=${QUOTA_HTTP_ADDR:-127.0.0.1:8080}
worker_addr=${QUOTA_WORKER_HTTP_ADDR:-127.0.0.1:8081}

# reason prints the "err" of the JSON line a binary stopped with, or the line itself.
reason() {
  local line
  line=$(grep -v '^[[:space:]]*$' "$1" | tail -n 1 || true)
  if [[ "$line" =~ \"err\":\"(.*)\"\}$ ]]; then
    printf '%b\n' "${BASH_REMATCH[1]//\\\"/\"}"
  else
    printf '%s\n' "$line"
  fi
}

# healthz_url turns a listen address into one to ask: 0.0.0.0 and [::] are any host.
healthz_url() {
  local host=${1%:*} port=${1##*:}
  case "$host" in "" | 0.0.0.0 | "[::]") host=127.0.0.1 ;; esac
  echo "http://$host:$port/healthz"
}

# Check the ports first: a run that fails on a busy port must fail before it builds
# or touches the database, or the demo seed would change another instance's data and
# the probes, reaching that instance, would say "started".
port_busy() { # addr: something accepts connections there
  local host=${1%:*} port=${1##*:}
  [[ "$1" == *:* ]] || host=
  case "$host" in "" | 0.0.0.0 | "[::]") host=127.0.0.1 ;; esac
  host=${host#[}
  host=${host%]}
  (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}
grpc_addr=${QUOTA_GRPC_ADDR:-127.0.0.1:8082}
# The api's /metrics listener (SECURITY.md): checked only when set, as the api itself
# only warns when its default, 127.0.0.1:8083, is busy (another api on this machine).
metrics_addr=${QUOTA_METRICS_ADDR:-off}
taken=0
for pair in "QUOTA_HTTP_ADDR=$api_addr" "QUOTA_WORKER_HTTP_ADDR=$worker_addr" "QUOTA_GRPC_ADDR=$grpc_addr" "QUOTA_METRICS_ADDR=$metrics_addr"; do
  addr=${pair#*=}
  [ "$addr" = off ] || [ "$addr" = public ] && continue
  if port_busy "$addr"; then
    echo "$pair is taken: another program listens there (another make run? ss -ltnp shows which)." >&2
    taken=1
  fi
done
if [ "$taken" = 1 ]; then
  echo "Stop it, or set the variables above to free addresses. Nothing was built, and the database was not touched." >&2
  exit 1
fi

# run.pid names this script while it runs, for a script to stop it (README.md). Checked
# after the ports, so a second run that stops there leaves the first one's in place.
pidfile="$state/run.pid"
drop_pidfile() { if [ "$(cat "$pidfile" 2>/dev/null)" = $$ ]; then rm -f "$pidfile"; fi; }
echo $$ > "$pidfile"
trap drop_pidfile EXIT

echo "Building..."
go build -o "$bin/quotaplane-api" ./cmd/api
go build -o "$bin/quotaplane-worker" ./cmd/worker

# Fail fast with a clear message when Postgres is not there, instead of waiting a minute.
QUOTA_STARTUP_TIMEOUT=${QUOTA_STARTUP_TIMEOUT:-10s} "$bin/quotaplane-api" demo --state-dir "$state" 2> "$state/demo.log" || {
  why=$(reason "$state/demo.log")
  if [[ "$why" == configuration:* ]]; then
    echo "The environment sets something the api cannot use:" >&2
    echo "$why" >&2
    echo "Fix or unset the variables named above." >&2
  else
    echo "Could not prepare the database:" >&2
    echo "$why" >&2
    echo "Is Postgres running at the URL above? Start it, or set DATABASE_URL to point elsewhere." >&2
  fi
  exit 1
}
redis_url=${REDIS_URL:-redis://127.0.0.1:6379/0}
if command -v redis-cli >/dev/null && [[ "$redis_url" == redis://* ]] && ! redis-cli -u "$redis_url" ping >/dev/null 2>&1; then
  echo "Warning: Redis at $redis_url does not answer; /readyz will say so until it does." >&2
fi

# Each binary's stderr is shown as it comes (sed -u: no buffering) and kept, so the
# reason it stopped can be repeated at the end.
worker_log="$state/worker.log"
api_log="$state/api.log"
: > "$worker_log"
: > "$api_log"
worker= api=
stop_all() {
  local pid
  for pid in $worker $api; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $worker $api; do wait "$pid" 2>/dev/null || true; done
  drop_pidfile
}
trap stop_all EXIT
# Ctrl-C: stop both, then die of SIGINT as the shell's convention wants (a caller
# such as make then knows it was interrupted and says "Interrupt", not "Error 130").
trap 'echo "Stopping..." >&2; stop_all; trap - INT; kill -INT $$' INT
# SIGTERM (kill <pid>, or make passing its own on): a stop that was asked for.
trap 'echo "Stopping..." >&2; stop_all; exit 0' TERM

# died name pid log: report that a binary stopped by itself, and exit.
died() {
  local status=0
  wait "$2" 2>/dev/null || status=$?
  sleep 0.2 # let its last lines through the pipe
  echo >&2
  if [ "$status" = 0 ]; then # it was asked to stop (a signal), and did so cleanly
    # Both stopping cleanly at once is Ctrl-C (SIGINT to the whole process group)
    # that this shell could not trap: started with SIGINT ignored where env could not
    # reset it (above), it can never trap it, but the binaries still stop on it.
    local other=$worker i
    [ "$1" = worker ] && other=$api
    for i in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "$other" 2>/dev/null || break
      sleep 0.1
    done
    if ! kill -0 "$other" 2>/dev/null; then
      echo "Stopping..." >&2
      stop_all
      exit 130
    fi
    echo "The $1 was stopped (pid $2), so the run stops too." >&2
    exit 1
  fi
  echo "The $1 stopped (exit status $status), so the run stops too. Why:" >&2
  reason "$3" | sed 's/^/  /' >&2
  echo "Fix that and run make run again." >&2
  exit 1
}

if ! command -v curl >/dev/null; then
  echo "make run needs curl to see when the api and the worker are up: install it (apt-get install curl)." >&2
  exit 1
fi

# The pipes ignore Ctrl-C: they must outlive the binaries, which log while they stop.
"$bin/quotaplane-worker" 2> >(trap '' INT TERM; tee -a "$worker_log" | sed -u 's/^/[worker] /' >&2) &
worker=$!
# Nothing is persisted without the worker: wait until it answers before going on.
url=$(healthz_url "$worker_addr")
until curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; do
  kill -0 "$worker" 2>/dev/null || died worker "$worker" "$worker_log"
  sleep 0.2
done
echo "Worker started (pid $worker, $url)."

"$bin/quotaplane-api" 2> >(trap '' INT TERM; tee -a "$api_log" >&2) &
api=$!
url=$(healthz_url "$api_addr")
until curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null; do
  kill -0 "$api" 2>/dev/null || died api "$api" "$api_log"
  kill -0 "$worker" 2>/dev/null || died worker "$worker" "$worker_log"
  sleep 0.2
done
echo "API started (pid $api, http://$api_addr). Ctrl-C stops both."

# Whichever stops first stops the run. wait -n returns when one of them ends (or at
# once when bash has already reaped one, hence the checks and the pause).
while :; do
  kill -0 "$api" 2>/dev/null || died api "$api" "$api_log"
  kill -0 "$worker" 2>/dev/null || died worker "$worker" "$worker_log"
  wait -n "$worker" "$api" 2>/dev/null || sleep 0.5
done
