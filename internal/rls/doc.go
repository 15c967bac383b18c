// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over the quota engine,
// so that Envoy's and Istio's global rate limit filter can ask Quotaplane instead of
// envoyproxy/ratelimit, and Envoy's rate limit quota service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas,
// rlqs.go; "Envoy's rate limit quota service" below). The protocol is go-control-plane's generated code; this
// package is a transport only: it authenticates the key, maps descriptors to checks,
// makes one call of the check service (internal/checks, as POST /v1/check does), maps
// the described decision to Envoy's answer and errors to codes (status.go's table).
// The server carries recovery, metrics and tracing interceptors (server.go).
//
// A descriptor's entries name one check: org (optional: the key's org), team, user
// and metric (default "requests"); other entry keys may be configured as aliases of
// those four. The descriptors of one request that lie on one org -> team -> user path
// are decided as one atomic check, counted once with the largest of their costs;
// descriptors on different paths are each decided on their own.
//
// Nothing an end user sends switches enforcement off: a descriptor that names no
// check (Envoy builds descriptors from request headers) is answered OVER_LIMIT for
// itself, counting nothing, and the call's other descriptors are still decided and
// counted; only the key, the service's own failures and a closed plan's store being
// down are errors, which a proxy's failure_mode_deny decides on.
//
//   - gRPC (internal/rls/server.go) has the interceptors HTTP has as middleware:
//     go-grpc-middleware's Prometheus metrics (`quotaplane_grpc_server_started_total`,
//     `_handled_total` by `grpc_service`, `grpc_method`, `grpc_type`, `grpc_code`, and
//     `quotaplane_grpc_server_handling_seconds`), its recovery (a panic answers INTERNAL,
//     is logged with its stack, and the server keeps serving) and otelgrpc's server span.
//     Its transport (internal/rls/limits.go, `rls.ServerOptions`): TLS from
//     `QUOTA_GRPC_TLS_CERT`/`_KEY`, `MaxConcurrentStreams` (1,024 per connection) and a
//     keepalive enforcement policy (pings at most every 10 s, allowed without a call in
//     flight as Envoy sends them; the server pings silent connections every minute) and
//     128 stream workers (`QUOTA_GRPC_STREAM_WORKERS`: calls run on kept
//     goroutines whose stacks have grown, not a new goroutine each that copies its stack;
//     a call that finds them all busy still gets its own); tests `TestGRPCServesTLS`,
//     `TestGRPCMaxStreams`, `TestGRPCStreamWorkersNeverMakeACallWait`.
//     Every gRPC code is chosen in internal/rls/status.go's table (derrors kind -> code),
//     as every HTTP status is in internal/platform/problem's; `TestNoCodeOutsideTheMap`
//     and `TestNoStatusOutsideTheMap` (both in `make lint`) fail on a status chosen
//     anywhere else.
//
// # Envoy's rate limit service (internal/rls)
//
// A check has two transports: `POST /v1/check` and Envoy's
// `RateLimitService/ShouldRateLimit` over gRPC on `QUOTA_GRPC_ADDR` (its own listener,
// with the standard gRPC health service; the api drains it with the HTTP server,
// health first saying NOT_SERVING). Both make one call of `checks.Service` (caller and
// scope, org, team, registered user, limits under a throttle, from the tenancy cache; the
// engine; the description: RateLimit-* values and the warning), so the two cannot
// drift. The protocol is go-control-plane's
// generated types and grpc-go; nothing of it is hand-written.
//
// A request's descriptors are read into `checks.Input` (entry keys `org`, `team`,
// `user`, `metric` or a configured alias) and resolved one by one. A descriptor that
// cannot be decided for a fault of its own (`checks.InputFault`: an unknown entry key, a
// malformed or unknown id, an unknown metric, a `hits_addend` past the bound: every
// kind but Internal, Unavailable, Overloaded and Canceled) is set aside, answered
// `OVER_LIMIT` for itself with its reason in `Quotaplane-Refused`, and counts nothing;
// the others are decided as if it had not been sent. So nothing an end user puts in a
// header Envoy turns into a descriptor can make the call an error, which a proxy with
// `failure_mode_deny: false` would forward on: enforcement fails closed. Only an error
// of the service's own (tenancy or Redis down, overload) fails the whole call, before
// anything is counted when it is met resolving. The resolved requests are then grouped by path (`pathGroups`): a request
// lying on the path of a deeper one of the same org and metric joins it, and each group
// is decided as one request of its deepest member, the largest cost of its members,
// so the engine's one script decides all its levels atomically. Groups ending at the
// same org, team and user that differ only in metric are then one multi-metric request
// (`mergeMetrics`; see "Several metrics in one decision"), so a
// request descriptor and a tokens descriptor are admitted or refused together, each
// descriptor's status describing its own metric's limits. A path is never split: one
// naming more than 16 metrics is refused whole, every descriptor of it, counting
// nothing (a priced path's `spend` is not one of the 16: it is the engine's `Derived`
// counter). Every group is asked of the engine in one `Decide`
// (`checks.Service.CheckPaths`), one pipeline per Redis. Error kinds map to gRPC codes in
// one place (internal/rls/status.go): a call without descriptors is INVALID_ARGUMENT
// (a descriptor's own Invalid, NotFound or Unprocessable is the OVER_LIMIT above);
// Forbidden -> PERMISSION_DENIED; Unavailable and Overloaded ->
// UNAVAILABLE (logged), which is what a `closed` plan's outage gives, so Envoy's
// `failure_mode_deny` decides; Internal (only a panic the recovery interceptor caught)
// -> INTERNAL. The user-facing
// contract is docs/ENVOY.md.
//
// # Envoy's rate limit quota service (rlqs.go)
//
// A proxy running Envoy's rate_limit_quota filter holds one stream, reports each
// bucket's admitted and denied requests every interval, and enforces locally the
// assignment the service pushes for it. The stream is authenticated as ShouldRateLimit
// is (the key in its metadata; again on every report, so a revoked key ends it), and a
// bucket id's entries are read by the same readEntry as a descriptor's (org, team,
// user, metric and the aliases): one path, one unit a request. Nothing of a lease is
// written here: an assignment is a lease of the check service (checks.Service.Lease
// with HolderProxy, the client leases' sizing and reservation; SettleLease).
//
// What holds, and why:
//
//   - Nothing is admitted that was not taken. Every token bucket assignment is
//     reserved, atomically at every level of its path and before it is sent, for the
//     most the proxy can admit under it. Envoy's bucket starts full and refills
//     continuously, so over a life T it admits at most max_tokens + tokens_per_fill x
//     T / fill_interval; bucketStrategy makes that the lease's units over the TTL and
//     a slack for the proxy's timers (T = TTL + max(TTL/4, 50 ms); fill_interval >=
//     T). Envoy keeps its tokens and extends an assignment when the same strategy is
//     sent again: a reassignment's fill_interval differs from the last one's, so the
//     proxy starts afresh and never holds an assignment past the TTL it came with, and
//     tokens carried into it (at most max_tokens) would be covered by its own lease
//     too. ALLOW_ALL is never sent; DENY_ALL takes nothing. So the proxies of one path
//     together admit at most what their leases took, which never passes a limit
//     (TestRLQSThreeProxiesShareAMonthLimit: three proxies at 2,000/s on a month limit
//     of 1,000 admit 1,000).
//   - Reports settle exactly. A report's num_requests_allowed is counted on the
//     bucket's open assignments, oldest first, each up to its units (past them all, on
//     the newest: counted over its units, never dropped). An assignment is settled
//     (its counted units committed, the rest given back) by the first report that
//     arrives ReportLag after the proxy could last admit under it: its replacement
//     was sent, or its TTL and slack passed. Proxies that report are counted what they
//     admitted (1,000 of 1,000).
//   - Never released on trust. An assignment no report covers (the stream ended, the
//     proxy stopped reporting) is left to its lease's expiry, on_expiry commit: counted
//     whole. A lost proxy costs, per bucket, its unsettled assignments, each at most
//     min(ceil(1.25 x r x TTL), H / 16) (4 near a limit), and never an admission past a
//     limit (TestRLQSProxyCutWithoutAReport). Envoy keeps assignments across a broken
//     stream and reports on the next: counted twice then, never less.
//   - Pushed, not polled. A new bucket is decided on its first report; a starving one
//     (denied requests reported) at once, at most every minDecideGap; a DENY_ALL one at
//     most every recheckDenied while its proxy reports demand; a live one is renewed
//     at three quarters of its TTL while it has traffic. Near a limit an assignment
//     shrinks with the headroom's share (1/16), to 4 units and then the last ones;
//     refused, the bucket is DENY_ALL until the refusal's retry (the window can admit).
//   - Fail closed per bucket. A bucket that cannot be decided (no entry, an unknown
//     entry key, an entry twice, another org, a malformed or unknown id, too many
//     buckets) is DENY_ALL for faultTTL, counting nothing; the stream's other buckets
//     go on (TestRLQSBadBucketsAndKeys). A path that cannot be leased (token bucket or
//     concurrent limits, capacities, priced spend, an org not enforcing) is DENY_ALL;
//     the service failing is DENY_ALL for errorTTL, then decided again.
//   - Bounded streams: MaxBuckets buckets per stream (past twice that, not answered),
//     IdleTimeout, gRPC's 4 MiB message (TestRLQSBoundedStreams). One goroutine runs a
//     stream's decisions and sends; another receives. A stream holds one of the
//     server's stream workers (Limits.StreamWorkers) for its life.
//   - The way to the proxy. A TTL runs from when the proxy receives it: it may admit
//     past the end of the sliding window's bucket its lease was counted in by the
//     one-way delay, and a report straddling such an end is counted oldest first (up
//     to one assignment's unused units in the earlier bucket). A month limit is exact;
//     a minute limit held in one minute (TestRLQSTeamMinuteAndUserMonth).
//
// Metrics: quotaplane_rlqs_streams, _buckets, _assignments_total{strategy},
// _outstanding_units, _lost_units_total, _unassigned_units_total (docs/ENVOY.md).
package rls
