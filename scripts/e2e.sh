#!/usr/bin/env bash
# `make test-e2e`: the web console's end-to-end tests in headless Chromium. Builds
# quotaplane-api from this checkout; the tests start it on a free port against a fresh
# Postgres database (created and dropped by them) and the shared Redis.
#
# Needs Node.js with web/node_modules (installed here with `npm ci` when missing) and
# Debian's Chromium at /usr/bin/chromium (or $CHROMIUM). Without Chromium the tests are
# skipped with a message, except under CI=true, where that is a failure.
#
# Arguments, when given, are test files relative to web/ (bash scripts/e2e.sh
# e2e/nav.test.mjs) and only they run; without any, every file of web/e2e/ does.
set -euo pipefail
cd "$(dirname "$0")/.."

chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
  msg="e2e: no Chromium at $chromium (apt-get install chromium chromium-driver, or set CHROMIUM)"
  if [ "${CI:-}" = true ]; then echo "$msg" >&2; exit 1; fi
  echo "$msg: skipping the browser tests" >&2
  exit 0
fi
if [ ! -d web/node_modules ]; then
  (cd web && npm ci --no-audit --no-fund)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/quotaplane-api" ./cmd/api
mkdir "$tmp/logs"
cd web
# The apis' logs go to $tmp/logs (web/e2e/harness.mjs keepLog); a failure prints their
# ends, where a console error's cause (a 5xx, a panic) is.
if ! QP_API_BIN="$tmp/quotaplane-api" QP_E2E_LOGS="$tmp/logs" CHROMIUM="$chromium" node --test --test-concurrency=1 "${@:-e2e/}"; then
  for f in "$tmp"/logs/*.log; do
    [ -s "$f" ] || continue
    echo "--- the end of $(basename "$f" .log)'s api log:"
    tail -n 60 "$f"
  done
  exit 1
fi
