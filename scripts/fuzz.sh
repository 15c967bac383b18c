#!/usr/bin/env bash
# Runs every Fuzz target of the module, one after the other, for ${FUZZTIME:-30s} each
# (go test -fuzz takes one target at a time and uses every core), then prints a
# summary. Exits non-zero if any target fails. go test saves a failing input under
# the package's testdata/fuzz/<Target>/: commit it with the fix, and every later
# go test runs it as a regression case.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# go test -list prints a package's matching names, then "ok <package> <time>".
if ! $GO test -list '^Fuzz' ./... >"$logs/list" 2>&1; then
  cat "$logs/list" >&2
  echo "fuzz: could not list the fuzz targets" >&2
  exit 1
fi
targets=()
pending=()
while read -r first second _; do
  case "$first" in
    Fuzz*) pending+=("$first") ;;
    ok)
      for name in "${pending[@]+"${pending[@]}"}"; do targets+=("$second $name"); done
      pending=()
      ;;
  esac
done <"$logs/list"
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz targets found" >&2
  exit 1
fi

# deadline_race tells whether a failed run is Go's own fuzzing-coordinator race
# (golang/go#75804, fixed in Go 1.27, not in the 1.26 this module builds with): at
# the -fuzztime boundary a worker's cancelled context leaks out as the target's
# failure, "--- FAIL: <target>" followed by nothing but "context deadline exceeded",
# with no input written. A real finding prints "Failing input written to ..." (a
# crash, a failed check, a hung worker), so it never matches.
deadline_race() { # log name
  ! grep -q 'Failing input written\|panic:\|fuzzing process hung' "$1" &&
    [ "$(grep -A1 -- "^--- FAIL: $2 " "$1" | sed -n 2p | tr -d '[:space:]')" = "contextdeadlineexceeded" ]
}

# corpus lists the inputs go test has saved for a target (a new one is a finding).
corpus() { # pkg name
  local dir
  dir=$($GO list -f '{{.Dir}}' "$1" 2>/dev/null)/testdata/fuzz/$2
  ls "$dir" 2>/dev/null || true
}

echo "fuzz: ${#targets[@]} targets, $FUZZTIME each"
failed=0
summary=()
for t in "${targets[@]}"; do
  pkg=${t% *}
  name=${t#* }
  log="$logs/$name.log"
  echo "--- $name ($pkg)"
  before=$(corpus "$pkg" "$name")
  result=FAIL
  for attempt in 1 2; do
    if $GO test -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" "$pkg" >"$log" 2>&1; then
      result=PASS
      [ "$attempt" -gt 1 ] && result="PASS (run again after Go's fuzztime race, golang/go#75804)"
      break
    fi
    # Only the toolchain's race is run again, and only once: two in a row fail.
    if [ "$attempt" -eq 1 ] && deadline_race "$log" "$name" && [ "$(corpus "$pkg" "$name")" = "$before" ]; then
      echo "fuzz: $name ended on Go's fuzztime race (golang/go#75804: \"context deadline exceeded\", no input written); running it again"
      continue
    fi
    break
  done
  note=
  case "$result" in "PASS "*) note="  ${result#PASS }" ;; esac
  if [ "$result" = FAIL ]; then
    failed=$((failed + 1))
    tail -n 40 "$log"
  fi
  # The last progress line: "fuzz: elapsed: 30s, execs: 123456 (4100/sec), ...".
  last=$(grep -E '^fuzz: elapsed: [0-9]+s, execs: [0-9]+' "$log" | tail -n 1)
  secs=$(sed -E 's/^fuzz: elapsed: ([0-9]+)s.*/\1/' <<<"$last")
  execs=$(sed -E 's/.*execs: ([0-9]+).*/\1/' <<<"$last")
  rate=-
  if [ -n "$last" ] && [ "${secs:-0}" -gt 0 ]; then rate=$((execs / secs)); fi
  summary+=("$(printf '%-4s  %-48s %12s %10s  %s' "${result%% *}" "$name" "${execs:--}" "$rate" "${pkg#github.com/quotaplane/quotaplane/}${note}")")
done

echo
printf '%-4s  %-48s %12s %10s  %s\n' "" "target" "execs" "execs/s" "package"
printf '%s\n' "${summary[@]}"
if [ "$failed" -gt 0 ]; then
  echo "fuzz: $failed of ${#targets[@]} targets failed" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets passed"
