# Shell functions shared by the bench scripts. scripts/bench.sh and scripts/bench_base.sh both measure
# POST /v1/check over the same 1,000 users, and their figures compare only while the
# org and the wrk script are the same. Source it; it runs nothing by itself.

# bench_org URL TOKEN ORG: creates, through the operator API at URL (TOKEN), the
# plan "bench", the org ORG on it and its team "eng" of 1,000 users' limits (month
# and minute limits never reached), and prints a check key of ORG.
bench_org() {
  local u=$1 token=$2 org=$3
  _bench_post() { curl -sf -X POST "$u$1" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d "$2"; }
  _bench_lim() { echo "[{\"metric\":\"requests\",\"window\":\"month\",\"limit\":$1},{\"metric\":\"requests\",\"window\":\"minute\",\"limit\":$1}]"; }
  _bench_post /v1/plans "{\"id\":\"bench\",\"name\":\"bench\",\"fail_mode\":\"closed\",\"limits\":$(_bench_lim 1000000000000)}" >/dev/null
  _bench_post /v1/orgs "{\"id\":\"$org\",\"name\":\"bench\",\"plan\":\"bench\"}" >/dev/null
  _bench_post "/v1/orgs/$org/teams" "{\"id\":\"eng\",\"name\":\"Eng\",\"limits\":$(_bench_lim 500000000000),\"user_limits\":$(_bench_lim 250000000000)}" >/dev/null
  _bench_post "/v1/orgs/$org/api-keys" '{"name":"bench","scopes":["check"]}' | sed 's/.*"secret":"\([^"]*\)".*/\1/'
}

# check_lua KEY ORG: prints a wrk script that sends POST /v1/check for users u0..u999
# of ORG's team eng in turn, with KEY. The 1,000 requests are formatted once, in init:
# formatting one per request in wrk's Lua cost wrk ~5 µs of the two shared cores per
# check, which /healthz does not pay.
check_lua() {
  cat <<LUA
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $1"
local reqs, n = {}, 0
init = function()
  for i = 0, 999 do
    reqs[i] = wrk.format(nil, "/v1/check", nil, '{"org":"$2","team":"eng","user":"u' .. i .. '"}')
  end
end
request = function()
  n = n + 1
  return reqs[n % 1000]
end
LUA
}

# private_stack NAME PORT: a redis-server of its own on 127.0.0.1:PORT (no
# persistence; its pid added to pids, its log in $tmp) and the URLs of a database NAME
# on DATABASE_URL's server that the api's migrations create: sets redis_url, bench_db,
# db_url and db_admin (the server's postgres database, to drop bench_db at the end), and
# a fresh operator token. The caller holds pids, tmp and a cleanup trap.
private_stack() {
  redis-server --port "$2" --bind 127.0.0.1 --save '' --appendonly no > "$tmp/redis.log" 2>&1 &
  pids+=($!)
  redis_url=redis://127.0.0.1:$2/0
  for _ in $(seq 50); do redis-cli -u "$redis_url" ping >/dev/null 2>&1 && break; sleep 0.1; done
  local base=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/quotaplane?sslmode=disable}
  bench_db=$1
  db_url=$(sed -E "s#/[^/?]*(\\?|\$)#/$bench_db\\1#" <<< "${base%%\?*}")${base#"${base%%\?*}"}
  db_admin=$(sed -E "s#/[^/?]*(\\?|\$)#/postgres\\1#" <<< "${base%%\?*}")${base#"${base%%\?*}"}
  token="bench-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
}

# private_cleanup: the EXIT trap of private_stack's users: kills pids, drops
# bench_db, removes tmp.
private_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  [ -n "$bench_db" ] && psql -q "$db_admin" -c "drop database if exists $bench_db" 2>/dev/null || true
  rm -rf "$tmp"
}
