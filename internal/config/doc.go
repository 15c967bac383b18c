// Package config reads the typed configuration of each binary from environment
// variables, with the defaults of API.md "Running", and validates it at start-up.
//
// # Start-up
//
// Both binaries first bind their listening address (`QUOTA_HTTP_ADDR`, `QUOTA_PPROF_ADDR`,
// `QUOTA_WORKER_HTTP_ADDR`), so a busy address stops them at once with a message naming
// the variable to change (`config.Listen`), and "listening" is logged only once it is
// true. They then open Postgres (creating the database if the server says it does not
// exist, and retrying with backoff while the server is unreachable, logging the masked
// URL), then apply migrations with golang-migrate, which holds a Postgres advisory lock,
// so replicas starting together are safe (tested). The worker then applies River's
// migrations under its own advisory lock and starts the River client.
//
// Besides `worker.heartbeat`, a periodic River job that records which worker last ran a
// job in `worker_heartbeats` (proof that the queue runs jobs end to end), the worker runs
// the usage flusher and the billing jobs described in "Durability and billing".
//
// Logs. Every line either binary writes to stderr is JSON from `log/slog`, at
// `QUOTA_LOG_LEVEL`, including the last one when it stops on an error. go-redis's own
// messages (a pool that cannot dial, a pub/sub reconnecting) are sent through slog at warn
// with `"component":"go-redis"` (`redisconn.LogTo`); River's go through the worker's
// logger with `"component":"river"`, its routine chatter (a producer's job counts, a
// maintenance service's "ran successfully") demoted to debug. Tests run each binary's
// real process (the test binary re-executed as `main`) with Redis unreachable and with a
// busy address, and parse each line of its stderr.
//
// Traces. With `OTEL_EXPORTER_OTLP_ENDPOINT` set, both binaries export OpenTelemetry
// spans over OTLP (`internal/platform/tracing`, the standard `OTEL_*` variables): the
// api's requests (otelhttp, named after their chi route), each check (`quota.check`, from
// `quota.Engines`), each pipeline of EVALSHAs (`redis.pipeline`, a root span linked both ways
// to the coalesced checks it carried, since it belongs to many requests' traces), and
// Postgres queries through pgx's tracer interface (otelpgx), only under a span already
// started; the worker's flushes (`billing.flush`) and River jobs (otelriver). The tracer provider is a field (`quota.Config.TracerProvider`,
// `httpapi.Deps.TracerProvider`, `pgdb.Open`'s last argument), nil when tracing is off, so
// the hot path skips every span on a nil test and allocates nothing for tracing.
// It is stopped last at shutdown, flushing the last spans. docs/TRACING.md has the span
// tree of a check, produced by `TestCheckTrace`.
//
// `make run` (scripts/run.sh) seeds the demo, starts the worker and waits for its
// `/healthz` (nothing is persisted without it), then the api and its `/healthz`; it
// waits on both, and when either stops, at start or later, it stops the other and exits
// non-zero repeating the reason the binary logged. It defaults
// `QUOTA_WEBHOOK_ALLOW_PRIVATE=true` for local receivers. The demo seed
// (internal/demo) never rewrites credentials it did not make: each state
// dir has an identity (`demo-id`, random), its own key named `demo <id>` (a key of the
// state dir that no longer works is replaced, and the identity's other keys are revoked)
// and its own console account (`admin@demo.test` if free, else `admin-<id>@demo.test`;
// a password changed by someone else is left alone and the printout says how to get a new
// one). The printed console URL carries `?org=demo`, which the sign-in form reads. `scripts/run_test.go` runs it
// on free ports, a fresh database and a throwaway `QUOTA_STATE_DIR`/`QUOTA_BIN_DIR`: a
// busy api port, a busy worker port, and a healthy run whose worker is then killed;
// `scripts/compose_test.go` parses docker-compose.yml for defaulted secrets, ports
// published beyond loopback, restart policies and healthchecks (the distroless image
// has no shell: `quotaplane-api healthcheck [url]` and `quotaplane-worker healthcheck
// [url]`, internal/platform/healthcheck, GET the process's own `/healthz`), and
// `.dockerignore` for what `COPY . .` must not send (`.quotaplane/`'s secrets, `bin/`,
// `node_modules`). Every compose service is `read_only` with `cap_drop: [ALL]`
// and `no-new-privileges` (Postgres and Redis as their images' own users, with tmpfs for
// their sockets and `/tmp`), and the seed runs `demo --hide-secrets`: the key and the
// console password stay in the `seed` volume (the image's `/var/lib/quotaplane`, owned by
// `nonroot`) and its output says how to read them (`TestComposeServicesAreHardened`,
// cmd/api `TestDemoSeedHidesSecrets`). Webhooks: a refused target is described
// without the address its name resolved to; 64:ff9b:1::/48, 2002::/16 and 2001::/32 are
// refused like the private ranges (`TestPrivateTargetIsNotNamed`,
// `TestIPv6TransitionRangesAreNotPublic`); a webhook URL's credentials are masked for
// console viewers and in the audit log (`redact.WebhookURL`,
// `TestWebhookURLCredentialsAreRedacted`).
package config
