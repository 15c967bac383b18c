// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over the quota engine,
// so that Envoy's and Istio's global rate limit filter can ask Quotaplane instead of
// envoyproxy/ratelimit. The protocol is go-control-plane's generated code; this
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
package rls
