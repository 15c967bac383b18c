// Package httpapi is the HTTP layer of quotaplane-api: the /v1 REST API generated from
// api/openapi.yaml, authentication and authorization, problem+json errors, health and
// metrics. Handlers decode, convert with named converters, call the domain services
// and encode; they hold no business rules, and do not check their caller: who may
// call each operation is declared once, in the route table (routes.go).
//
// One file per resource (plans.go, orgs.go, keys.go, consoleusers.go, audit.go,
// teams.go, users.go, grants.go, throttle.go, usage.go, exports.go, webhooks.go,
// wouldblock.go, check.go, reservations.go), each with its converters; server.go
// builds the handler, auth.go authenticates and holds the accesses, health.go and
// metrics.go serve operations, adminlimit.go limits the admin API per credential.
//
//   - Access is declared with the routes (internal/httpapi/routes.go): one row per
//     operation of the spec with its access: `public`, `checkScoped` (the check service
//     authorizes the key for the org), `operator`, `orgKey(scopes...)` (the operator, or
//     a key of the path's `{org}` holding one of the scopes; another org's key gets 404)
//     and `orgOperator(scopes...)`. The access also picks the route's group (public,
//     check hot path, admin with its limiter and validation), and runs as the generated
//     wrapper's handler middleware, so every 401, 403
//     and 404 keeps its answer and its order against 400. A route without a row makes
//     `NewHandler` fail; `TestRouteTable` holds the table to the spec's `security`,
//     `x-required-scopes` and `x-operator-only`.
//   - Error context is added with `derrors.Wrap(err, format, args...)`: for a
//     sentinel of a kind callers may see (not found, exists) it builds the caller's detail
//     at the point of wrapping ("team \"eng\" of org \"acme\" not found"), so
//     platform/problem need not cut it out of the message; anything else only gains
//     context for the logs.
//   - httpapi's files: server.go (Deps, NewHandler, recoverer, body limit), auth.go
//     (principal, bearer token, console session, the accesses), health.go (`/healthz`,
//     `/readyz`, `/metrics`), metrics.go (HTTP metrics middleware), routes.go (the table),
//     one file per resource with its converters (plans, orgs, keys, consoleusers, audit,
//     teams, users, grants, throttle, usage, exports, webhooks, wouldblock, check with
//     checkjson, reservations), and the shared convert.go (with the small
//     `respond`/`handle`/`noContent` decode-call-encode adapter), decode.go,
//     validate.go, contenttype.go, errors.go, tracing.go, adminlimit.go.
//
// # Requests
//
// Every request passes request id, panic recovery and metrics, then chi routes it.
//
// Request state (`internal/httpapi/reqstate.go`): the request id, the metrics'
// response writer and, after `authenticate`, the principal live in one context,
// `requestState`, allocated once per request. Its `Value` answers chi's
// `middleware.RequestIDKey` (the id formatted as chi's `RequestID` formats it, its
// counter `middleware.NextRequestID`, or the client's `X-Request-Id`), so
// `middleware.GetReqID` and every reader work unchanged; `callerOf` reads the principal
// from it. Outside it (a handler built without `begin`) the old context values apply. The
// routes are declared in three groups (`internal/httpapi/routes.go`), each with the
// middleware that applies to it and to nothing else; chi runs a group's middleware after
// routing, so no middleware compares paths:
//
//	| group | routes | middleware |
//	| --- | --- | --- |
//	| operations and console | `/healthz`, `/readyz`, `/metrics` (404 unless `QUOTA_METRICS_ADDR=public`: served on its own listener), `/console/` | none (the console authenticates its own endpoints) |
//	| checks | `POST /v1/check`, `POST /v1/check/batch`, and the reservations: `POST /v1/reservations`, `GET` and `DELETE /v1/reservations/{id}`, `POST /v1/reservations/{id}/commit`, `POST /v1/reservations/{id}/extend` | 1 MiB body cap (413), authentication (401); no admin rate limit and no spec validation (the hot path; the engine bounds each org's checks in flight) |
//	| admin API | every other operation of the spec (the listing of an org's open reservations, `GET /v1/orgs/{org}/reservations`, included) | body cap, authentication, admin rate limit (429), validation against the embedded OpenAPI spec (400, every field problem listed, unknown fields included) |
//
// One Content-Type rule holds for every route that takes a body, admin and checks alike
// (`jsonBody` in `internal/httpapi/contenttype.go`): the body is JSON when the header is
// absent, `application/json`, any `+json` type, or `application/x-www-form-urlencoded`.
// The last is what `curl -d` sends; refusing it made every README example fail, and no
// route takes a form, so its bytes are parsed as JSON, never form-decoded. Any other type
// is 415, naming what was sent. The validator applies the rule to admin routes before it
// reads the body; the check routes apply it in `decodeFast` with a header comparison that
// allocates nothing. Accepting a form type is safe there: an HTML form of another site can
// send one without a CORS preflight, but it cannot set `Authorization`, and a console
// session's cookie is `SameSite=Strict` and its changes need `X-CSRF-Token`. The console's
// own sign-in (`/console/api/sign-in`, which takes no token) keeps to `application/json`
// alone for that reason: a form post from another site must not sign anyone in.
//
// The handlers are the generated wrappers (`api.ServerInterfaceWrapper`, which parse path
// and query parameters); `TestEveryOperationIsRouted` checks that every operation of the
// spec is in a group and nothing else is routed. A path no route has is 404 whatever the
// credentials; a path without the method is 405 with `Allow` listing the methods it has.
// An admin handler authorizes (403 / 404), decodes strictly (`DisallowUnknownFields`
// again), converts with named converters (`toTeamInput`, `fromTeam`), calls
// `tenants.Service`, and encodes.
//
// # Errors: few kinds, one map
//
// Every refusal and failure is an error of one of a few kinds (`internal/derrors`, in the
// style of pkgsite's `derrors` and wtf's error codes). Domain packages define their errors
// as kinds (`tenants.ErrNotFound = derrors.New(derrors.NotFound, "not found")`,
// `quota.ErrOverloaded`, `billing.ErrInvalid`, `console.ErrBadLogin`) or as types with a
// `Kind` method (`*tenants.ValidationError`, `*tenants.AllocationError`, which also name
// their fields). Stores translate the driver's errors: SQLSTATE 23505 becomes `ErrExists`
// in `tenants`, and `pgdb.DB` (the pool every store queries through) turns a refused
// connection, a lost one (unexpected EOF, SQLSTATE class 08, 57P01-57P05) or a query that
// never reached the server into `derrors.Unavailable`; the HTTP layer never sees pgx's
// errors. One table in `internal/platform/problem` maps each kind to its status and its
// RFC 9457 document (`type` `https://quotaplane.dev/problems/<status-slug>`), for the
// admin API, the checks (and each refused item of a batch) and the console alike:
//
//	| kind | status | e.g. |
//	| --- | --- | --- |
//	| `Invalid` | 400 with `errors[]` | `*tenants.ValidationError`, a malformed body, a bad cursor, `billing.ErrInvalid` |
//	| `Unauthenticated` | 401 | no or unknown token, `tenants.ErrBadToken`, `console.ErrBadLogin`, an ended session |
//	| `Forbidden` | 403 | missing scope, operator-only field, console viewer, missing CSRF token |
//	| `NotFound` | 404 | `tenants.ErrNotFound`, another org's object, no such route |
//	| `MethodNotAllowed` | 405 with `Allow` | |
//	| `Exists`, `InUse` | 409 | `tenants.ErrExists`, `tenants.ErrInUse` |
//	| `Conflict` | 409 | `*quota.StateError`: a reservation settled otherwise already (the detail names its state) |
//	| `TooLarge` | 413 | a body over 1 MiB |
//	| `UnsupportedMediaType` | 415 | a console sign-in that is not JSON |
//	| `Unprocessable` | 422 with the numbers and the field | `*tenants.AllocationError` |
//	| `RateLimited` | 429 | the admin rate limit (a denied check is a 429 too, with its own body) |
//	| `Unavailable` | 503 with `Retry-After` | Postgres down, Redis down under `closed`, no engine |
//	| `Overloaded` | 503 with `Retry-After` | too many checks of the org in flight |
//	| `Canceled` | nothing is written | the client went away |
//	| `Internal` (anything else) | 500, logged with the request id; no internals sent | |
//
// The detail shown is the `Detail` of a `*derrors.Error` when the error carries one (the
// HTTP layer words its own refusals that way), the kind's own words for a 5xx (never the
// error's text), else the domain error's text. Adding a domain error is one line in its
// package: `ErrX = derrors.New(derrors.Unprocessable, "...")`, or a `Kind()` method (and
// `FieldErrors()` to list fields) on an error type; adding a kind is one constant in
// `derrors` and one row in the table (`TestEveryKindHasAStatus`). No other file chooses
// an error status: `make lint` runs `TestNoStatusOutsideTheMap`, which fails on any 4xx or
// 5xx `http.Status` constant, `http.Error` or `http.NotFound` outside the table.
//
// Every 400 speaks the API's terms and names what is at fault in `errors[]`: the spec
// validator's schema errors (`limits[0].window`), and for the bodies `encoding/json`
// refuses (`decodeBytes` in `internal/httpapi/decode.go`) the field and what it must be
// (`checks[3].cost: must be an integer`, the path found from the error's byte offset),
// an unknown field by its path, or the body as a whole: empty, not an object, not valid
// JSON (with line and column), data after the object. A body that starts with a byte
// order mark is told so ("send plain UTF-8 JSON"), and a number with a leading zero (`01`)
// is named with its position, not in `encoding/json`'s words (`invalidJSON` in
// `internal/httpapi/strictjson.go`, on every route). No regular expression either: every
// `pattern` of the spec says in words what it admits (`x-invalid-message`: a price "must
// be a decimal amount such as 2.50: at most 16 digits before the point and 6 after"), and
// the services word an id as the spec does (`vocab.IDRule`; `TestNoPatternReachesAnError`
// walks the spec for a pattern without words). No error repeats more than 64 characters
// of a value the client sent: `problem.From`, which every HTTP error passes, cuts each
// quoted value and each unbroken run longer than that to 64 characters and "…"
// (`vocab.ClipText`, beside `vocab.Clip`, which messages quoting a value use; this is
// the backstop for the ones that do not; `TestErrorsEchoAtMost64CharactersOfAValue`
// sends 1 MB values; a route that does not exist echoed its whole path). No Go type names:
// `TestMalformedBodiesSpeakTheAPIsTerms`, `TestCheckAndReservationBodiesAreStrict` and
// the decode fuzz target assert it. Text with the NUL character (`\u0000`, which
// Postgres cannot store) is refused there too, naming each field that holds it
// (`reason: must not contain the NUL character`), before anything is written: a name or
// reason with one was a 500, and a usage adjustment moved its Redis counter before its
// audit row failed, answering 503 (so a retried `add` applied twice). The console's
// sign-in refuses it in `org` and `email`, and answers a sign-in or password change body
// past 64 KiB with a 413 (`TestHostileNumbersAreRefusedOverHTTP`,
// `TestConsoleEmailsDoNotLeakAcrossOrgs`). A commit's `"used": null` is refused as well
// (it committed 0).
//
// An object that names a member twice (`{"cost": 3, "cost": 30}`) is refused on every
// body, naming the member by its path (`checks[1].cost: field named twice`):
// `encoding/json` keeps the last without a word, where a gateway reading the first
// would disagree about what was charged. `internal/platform/jsonnames` finds it in one
// pass over JSON already known valid, and each family asks once, where it first holds
// the body: the spec validator (every admin body), `decodeStrict` (checks, batches,
// reservations, commits, extends: the hand-written fast path declines a repeated field
// and so ends there, and pays nothing) and the console's `decodeSmall` (sign-in,
// password change). `TestFieldNamedTwiceIsRefusedOnEveryBody` has a row for every
// operation of the spec with a body and fails when one is added without one.
//
// The check routes skip spec validation: they are the hot path and validate by hand
// (`validateCheck` in `internal/httpapi/check.go`, for field errors in the API's terms);
// `quota.Engines` validates the `quota.Request` once more, as its own contract, and its
// engine no more. For the same reason they read and write their JSON by hand
// (`internal/httpapi/checkjson.go`): a flat request of known fields with plain values is
// parsed directly, anything else goes to `decodeStrict` (`internal/httpapi/strictjson.go`),
// and the answer is appended without reflection,
// byte for byte what `encoding/json` writes (tested). `decodeStrict` is also what the
// reservation routes (create, commit, extend) and the client leases' decode with. `encoding/json` matches field
// names in any case (`{"ORG":"acme"}` was acme's check, `{"cost":1,"Cost":500}` counted
// 500), and these routes have no spec validator to refuse them, so `decodeStrict` first
// walks the body along the request's shape (`checkShape`, `batchShape`,
// `reservationShape`, `commitShape`, `extendShape`, `leaseShape`, `leaseSettleShape`;
// `TestShapesAreTheRequests` holds them
// to the generated types' json tags): a key of the request's own objects, at any depth,
// must be exactly a field's name, or it is an unknown field (`checks[1].Cost: is not a
// field of this request`, as the admin routes say it); the keys of `costs`, `amounts`
// and `used` are the caller's metrics. An integer field that holds anything but an
// integer `encoding/json` can put in an int64 (`1e400`, `1.5`, `"1"`) is refused naming
// it and its bounds (`cost: must be an integer from 0 to 1125899906842624`). The walk
// allocates nothing when it finds nothing wrong; then `decodeBytes` decodes, and words
// what is left (a string field of another type, a body that is not an object). The fast
// path already matched names exactly and declines everything else, so the two accept the
// same bodies. Profiles and figures are
// in PERFORMANCE.md; `QUOTA_PPROF_ADDR` serves pprof on a separate
// loopback listener. The handler then calls `checks.Service`, which resolves org, team,
// user and their limits for the metric from `tenants.Cache` (no Postgres in steady state),
// builds a `quota.Request` (user limits = the team's user defaults with the user's own on
// top; an unregistered user under a team that refuses unknown users,
// `tenants.RefusesUnknownUsers`: the team's `unknown_users`, else its org's, both carried
// by the cached org, is refused there as Unprocessable, before the engine, so nothing is
// counted and no query is made) and hands it with the org's route (`ResolvedOrg.Route()`: dedicated Redis, pool
// class, fail mode, plan) to `quota.Engines`; `/v1/check/batch` resolves every check first
// and sends the valid ones to Redis in one pipeline per pool.
//
// # Admin rate limit
//
// Every `/v1` route except those of the checks group (`POST /v1/check`, `/v1/check/batch`
// and the reservations under `/v1/reservations`) is rate limited per credential: API key id, the operator token, or console user (all sessions of one
// person share it). `QUOTA_ADMIN_RATE_LIMIT` sets it (`20/s`, `600/m`, `5000/h`; default
// `50/s`; `0` or `off` disables it). The middleware (`internal/httpapi/adminlimit.go`,
// github.com/go-chi/httprate, sliding window) sits in the admin group after
// authentication and before request validation, so a request over the limit costs no
// schema walk and no query: 429 problem+json with `Retry-After` (the window), nothing
// written. Its headers follow the checks' convention: `RateLimit-Limit`,
// `RateLimit-Remaining` and `RateLimit-Reset` in seconds (until the current window ends;
// on a 429, equal to `Retry-After`), not httprate's `X-RateLimit-*` with a unix reset,
// and spelled as the checks spell them on the wire: httprate sets them with `Header.Set`,
// which writes Go's canonical `Ratelimit-Limit`, so they are moved to map keys spelled
// `RateLimit-Limit` (`TestRateLimitFieldsAreSpelledAlikeOnTheWire` reads the raw bytes).
// Every JSON answer, problem documents included, leaves `<`, `>` and `&` as they are
// (`problem.Encoder`: "Bearer <token>", not "Bearer \u003ctoken\u003e") and carries
// `X-Content-Type-Options: nosniff`, so no browser takes one for HTML.
//
// On a check, `RateLimit-*` describe the tightest level and window of an allowed check
// (least remaining, then soonest reset). On a denial they describe the level and window
// that refused it (`blocked_at`), and `RateLimit-Reset` is `Retry-After`: a sliding
// window frees units gradually, so the end of its current bucket (its `reset_at`) can
// come before the check could pass, and a client waiting for the reset would retry too
// early (`TestDeniedCheckHeadersAgree`).
// A check an operator's capacity refuses names it: `blocked_at` is `{"level":
// "capacity", "id", "metric", "window"}` (the metric always, as a capacity counts one)
// with `levels` empty, since the check's own limits were never decided, and so no
// `RateLimit-*` but a `Retry-After`; a team refused past its share of an org limit
// marked `fair_share` gets the org's level with `"fair_share": true`
// (`TestCapacityOverHTTP`, `TestFairShareOrgLimitOverHTTP`). `GET /v1/capacities/{id}`
// (capacities.go) reads the window through `checks.Service.CapacityWindow`.
// Counters are in process, so N replicas admit up to N times the limit: it guards
// Postgres and the audit log against a runaway script or a leaked key, it is not a
// quota. The checks and reservations are left out on purpose: they are the hot path and
// already bounded per org (quota, in-flight cap). The spec documents the 429 on each operation it
// applies to (`components/responses/AdminRateLimited`).
//
// # Per org, and a cap on keys
//
// A per-credential limit alone let one org send N keys x the limit (keys are cheap to
// make), outbound webhook tests included. A second httprate limiter
// (`adminOrgRateLimit`, after the per-credential one) counts every request of an org,
// all its keys and console users together (`QUOTA_ADMIN_ORG_RATE_LIMIT`, default
// `100/s`, per replica; the operator has no org and is not counted); its 429 carries only
// `Retry-After` and names `admin-org` in `violated-policies`, so the RateLimit fields stay
// those of the credential. And an org holds at most `QUOTA_MAX_KEYS_PER_ORG` active keys
// (default 100; `tenants.WithMaxKeysPerOrg`): `CreateAPIKey` locks the org's row and
// counts them in its transaction, so the cap holds exactly under concurrent creations;
// one more is a 422 naming the cap, nothing written.
//
// # Security tests
//
// `internal/httpapi/security_test.go` is generated from the embedded spec at run time,
// so a new operation is covered without a line of test. Each operation an org key may
// call declares `x-required-scopes` in api/openapi.yaml (any one is enough; the test also
// checks the description says so). For every operation whose path has `{org}`, on a
// fresh database: another org's key with every scope gets 404 for org A's objects, and
// for A's objects named through its own org; a key of A with every scope but the
// required ones gets 403; all refusals are problem+json and leave the tenancy tables'
// md5 fingerprint unchanged; and a key with just one required scope succeeds, so the
// refusals are the ones under test. For every request body, each server-owned field
// (properties of the success answer that the request lacks, plus `id`, `org`,
// `created_at`, `updated_at`, `last_used_at`, `revoked_at`, `secret`, `prefix`,
// `digest`, `usage`... wherever the request lacks them; for a batch, inside its checks
// too) is sent by the operator and by an org key with every scope: 400 naming the field,
// nothing written, and the same body without it is accepted. Bodies are built from the
// schemas (required properties, first enum value, minimum) and validated against them
// first. An operation the generators cannot handle (a path parameter without a fixture
// object, a required query parameter, a body they cannot fill, no `x-required-scopes`)
// fails the test rather than being skipped.
package httpapi
