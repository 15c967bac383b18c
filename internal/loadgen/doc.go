// Package loadgen drives a running Quotaplane api: it provisions orgs, teams, users
// and keys through the API, sends /v1/check or /v1/check/batch traffic, or Envoy's
// ShouldRateLimit over gRPC (one [team, user] descriptor a call), or (Config.Mode)
// multi-metric checks or acquire+release pairs of concurrency slots, at a given
// concurrency, duration or rate, shows progress, reports throughput and latency
// percentiles, and verifies afterwards, through the usage API and its own tally of
// allowed answers, that no level admitted more than its limit.
//
// # The load tool's modes (internal/loadgen/modes.go)
//
// `loadgen -mode multi` sends checks whose `costs` name requests and tokens; `-mode
// pairs` acquires a slot (`POST /v1/reservations` of 1 request against `concurrent`
// limits at every level) and releases it (`DELETE /v1/reservations/{id}`). Each mode
// provisions its own plan, teams and user defaults with the limits it needs, and builds
// its requests from its own small structs written to API.md, not from the generated
// types, so the wire stays the contract's. An answer 400, 404, 405 or 422 to a mode's
// plan, team or request is an api without that section of API.md: a `RefusedError`
// cancels the run at once (the command exits 3, `make bench` prints it and goes on).
// Pairs go out under the run's parent context, not the run's own: a pair begun before
// the end is released after it, so a run leaves nothing held. Verification adds to the
// month limits of every metric: the slots held at once as the tool saw them (from the
// acquire's answer to the release's request, inside the api's holding) never above a
// level's concurrent limit, and after the run usage `reserved` (and `in_flight` where
// the api reports it, on a level or its concurrent window) 0 everywhere. The tests run
// both modes against the real api (`TestRunModes`: refused there without the section,
// exact with it), and the tool's own handling of answers (every slot released once, a
// refusal ending a 20 s run at once) against a recording server.
//
// `loadgen -mode rlqs -grpc ADDR` (rlqs.go, RunRLQS) runs N simulated Envoy proxies
// (Proxy, proxy.go: Envoy's rate_limit_quota filter admitting the worst case every
// assignment allows, a fresh full token bucket each time, on go-control-plane's RLQS
// client; internal/rls's tests drive the service with it too) on the rate limit quota
// service, each on one org's key watching its users as buckets ranked by Zipf's law,
// then ShouldRateLimit as long, and prints admitted per server message and per second
// of the server's CPU (its `process_cpu_seconds_total`, -metrics-url) side by side
// (`TestRunRLQS`; docs/PERFORMANCE.md "Envoy proxies on RLQS beside ShouldRateLimit").
package loadgen
