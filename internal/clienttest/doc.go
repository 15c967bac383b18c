// Package clienttest tests the Go client module (client/, a module of its own that
// cannot import this one's internal packages) against the real quotaplane-api and
// quotaplane-worker, started by testenv.StartStack on a fresh database: checks and
// their headers, a lost reply retried, Quotaplane down under each fail policy, the
// net/http middleware with the standard mux and chi (every option, an
// unregistered user answered 403, a streaming disconnect that still counts what the
// handler reported), the caller's cancel, reservations, webhook
// verification of the worker's real deliveries, and the tour's Go client steps
// followed as printed in a fresh directory outside the repository (a new module that
// replaces the client by the clone's client/). The package has only tests.
//
// # The Go client's tests
//
// `client/` is a separate module (`github.com/quotaplane/quotaplane/client`) so that a
// service importing it pulls in no pgx, River or Redis: its go.mod has no requirement,
// and the main module requires it through `replace ... => ./client` (the Dockerfile
// copies `client/go.mod` before `go mod download`). Types are hand-written (a dozen small
// structs, converted from the wire shapes: durations, not seconds) rather than generated:
// a generator's output would need its runtime module. `make test-client` runs its own
// tests (retries over a real TCP server that swallows replies, the fail policies against
// a closed port, the problem a denial writes, and the faults: a hung api, 503s
// with Retry-After, TLS and DNS errors, the caller's cancel, every middleware option
// against `quotaplanetest.Server`); they need no server.
//
// `internal/clienttest` (in `make test`) runs the client against `testenv.StartStack`'s
// real api and worker, one stack per test on Redis database 12: checks with levels and
// headers mapped, a TCP proxy that forwards a check and drops the api's first reply (the
// retry is answered `replayed` and the units count once), the api unreachable and
// answering 503 (an org whose `redis_url` points at nothing, under a `closed` plan) under
// each fail policy, the middleware in front of `ServeMux` and chi, reservations, the
// concurrency middleware (release on return, 500, panic, disconnect and a timeout's
// cancel, each read back with GET on the reservation; 429 when full; extend past the
// ttl and in-flight counts with the merged server), the
// worker's real webhook delivery verified with `client/webhook`, `examples/go-service`,
// and the tour's Go client section followed as printed in a fresh directory outside the
// repository: its setup commands (`go mod init`, a `replace` of the client by
// the clone's `client/`, the only way to depend on it before it is published), its
// program saved as `main.go`, and `go mod tidy && go run .`, whose output must be the
// one the tour shows. The Go environment is the newcomer's (no `GOFLAGS`, `GOPROXY` or
// `GOWORK` of the test run): with the replace, nothing is downloaded, so it passes
// offline too; `go list -m all` must name the module and the client only.
//
// The TypeScript SDK's equivalent (`sdk/typescript/test/readme.test.ts`) copies the
// SDK's files as git has them into a temp clone, runs the tour's install commands there
// (`npm ci && npm pack` in the SDK, whose `prepack` builds it, then `npm install` of the
// tarball into a fresh `npm init -y` project) without `npm test`'s environment, and runs
// the tour's first block in that project, importing `@quotaplane/client` as printed.
//
// The TypeScript middlewares answer a client error of Quotaplane themselves, as the Go
// ones do (`DefaultErrorHandler`: a problem+json). `onError` (default `"answer"`): a 4xx about what the request named (an
// unregistered user and no team: 400; unknown team or metric) is a 403 problem+json
// with Quotaplane's detail; a refused key (401, 403) a 500 problem+json without it
// (logged); unreachable without a fail policy a 503. `"next"` hands a
// `QuotaplaneMiddlewareError` to the app's error handlers, a function answers as the
// app likes. Express's default handler, which answered 500 with an HTML stack trace
// for `X-User: zed`, is never reached unless asked for.
//
// # Client leases and batching
//
// `leases_test.go` runs the Go client's leases (`client/leases.go`) and coalescing
// (`client/batch.go`) against the real api: a hot path through `WithLeases` against
// the plain client in the same run (both rates printed, the ratio asserted >= 50x,
// and what both admitted counted exactly once the leases are settled); an org with
// `client_leases` off (nothing leased); 1,000 concurrent cold checks through
// `WithBatching` counted by a `RoundTripper` (<= 20 requests), users near and under
// their limits each decided right; and two client processes (the test binary re-run
// as `TestLeaseChild`, reporting every admission and lease on stdout) on a month
// limit, one killed -9: admitted <= limit, and after the worker's sweep counted >=
// admitted, the excess within the killed process's unsettled leases (read from its
// lease lines), a check in flight per worker and the one lease it may have been
// taking. The client's own tests (`client/leases_test.go`, a fake server) pin the
// rest: the deadline from the send time, one unsettled lease per path, refusals,
// timers, retried settlements, Close.
//
// # The clients' concurrency middleware
//
// `middleware.Concurrency` (Go, `client/middleware/concurrency.go`) and
// `concurrencyMiddleware` (TypeScript, `sdk/typescript/src/middleware.ts`) hold a
// reservation for the life of a request: it counts against `concurrent` limits until it
// is settled, so the slot is the reservation, and the server's guarantees (settled
// exactly once; a dead holder's slot back at expiry) are the clients' too. What the
// clients add is the timing. A heartbeat extends the reservation every third of its ttl
// (default 30 s, `on_expiry: release`): a holder that dies stops beating and loses the
// slot within a ttl; each extend is bounded by the beat, and a 409/404 ends the beat.
// Settlement happens once (`sync.Once`; a `done` flag in Node). In Go,
// when the handler is done (it returns or panics), not at a disconnect: the beats stop
// when the request's context ends, so a handler deaf to it holds its slot a ttl at most
// (the reservation expires, released), and a handler that finishes its stream after the
// client left has what it reported committed ("The Go client" below). In Node, at the
// first of: the handler returns, it throws (Express answers throws through
// `next(err)`, and the slot is given back when that response finishes), or the socket
// closes before the response ends (Node's `close` event): at once, while the handler
// may still run, since waiting for a handler deaf to its context is what leaks slots
// (cancelled streams). The release after a
// cancel uses `context.WithoutCancel` bounded by `WithSettleTimeout` (10 s). Given back
// is a release unless the handler reported usage, which is committed instead: the slot
// comes back either way, and `used` counts in the other windows. A reservation of several
// metrics answers each in `metrics` (the top-level figures are its first's): the Go
// client maps them to `Amounts` and `UsedByMetric`, TypeScript's `amountsOf`/`usedOf`
// read them; the TypeScript types widen the generated ones (`costs`, `amounts`,
// `metric`, the `concurrent` window) so they compile before and after the spec has them.
//
// # The Go client: budgets, settlement, options, test kit
//
// What the client (`client/client.go`, `errors.go`, `hooks.go`) guarantees, and where:
//
//   - A budget per call (`do`): one deadline for all attempts and waits, 1 s for
//     `Check`, `CheckBatch`, `Reserve` (`DefaultBudget`), 10 s for settlement calls
//     (`DefaultSettleBudget`); each attempt is also bounded by `WithTimeout` (2 s) inside
//     it. Bound: a hung api costs a check at most the budget (`TestHungAPIAnsweredWithinTheBudget`).
//   - Retry-After (seconds or an HTTP date) is the wait when the answer has one,
//     neither capped nor jittered; when it reaches past the budget the call ends at once
//     with `ErrUnavailable` (the fail policy answers: `TestRetryAfterPastTheBudgetAnswersAtOnce`).
//     Otherwise full jitter: random in [0, min(`WithMaxBackoff` 1 s, 100 ms × 2ⁿ⁻¹)].
//   - Who failed decides what the caller sees: the caller's context ending is
//     `ctx.Err()` wrapped (checked first, after every attempt and wait: a caller's
//     deadline shorter than the budget is the caller's, not Quotaplane's); a
//     configuration error (`isConfigError`: `*tls.CertificateVerificationError`, x509
//     errors, TLS alerts and record errors, `*net.DNSError` with `IsNotFound`) is
//     `ErrConfiguration` after one attempt; only the rest is `ErrUnavailable`, the one
//     error a `FailPolicy` sees. The same meaning as TypeScript's `AbortError`.
//   - A batch item answered with a 5xx problem goes to the policy like a check; a 4xx
//     problem is an item error, never a denial.
//   - Hooks and headers: `OnAttempt`, `OnRetry`, `OnDecision`, a `slog` logger,
//     `WithHeaders`, and `WithHeaderFunc(ctx, h)` for `traceparent` (the module stays
//     standard library only, so the caller brings its propagator); `User-Agent:
//     quotaplane-go/<Version>`.
//
// The middleware (`client/middleware`) takes a `Quota` interface, not `*client.Client`,
// so a test passes `quotaplanetest.Noop` or a client of `quotaplanetest.Server` (an
// `httptest` server speaking the api's wire shapes, decisions scripted per call,
// requests and reservations read back). `Reserve` settles in a goroutine started when
// the handler returns or panics, under `context.WithoutCancel` and `WithSettleTimeout`:
// the response never waits (`TestReserveSettlesOffTheResponsePath`), the client leaving does not cut it, and `WithOnSettled` says
// when it is done. The rule, the same in TypeScript: what `ReportUsage` added up is
// committed; nothing reported commits the whole amount on success and releases on a
// failure (a panic, or a 5xx recorded by a status-capturing writer that keeps `Flush`,
// `Hijack` and `Unwrap`); a failure after a report commits the report. The cost: a
// process that exits right after a response may lose that settlement; the
// reservation's `on_expiry` then settles it. `Concurrency` still settles before the
// response ends (a caller's next request finds its slot free). The default error
// handler answers the api's 4xx about the request with 403 problem+json
// (`TestMiddlewareOptions`: an unregistered user without a team), a refusal
// of the service's own key (401, 403) with 500 without the api's detail (as the
// TypeScript middleware), nothing when the client went away, and logs every cause
// (debug for the caller's own faults, warn for refusals and no decision, error for the
// key and configuration).
//
// Release: `client.Version` is the version of the `client/vX.Y.Z` tag the integrator
// creates; `client/CHANGELOG.md` lists what changed and `client/README.md` states what
// stays compatible.
package clienttest
