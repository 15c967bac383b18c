// Package checks is the check service (Service): the one way of a check, whichever
// transport carries it (POST /v1/check, its batch and /v1/reservations in
// internal/httpapi; Envoy's ShouldRateLimit in internal/rls). It authorizes the caller
// for the org (the check scope's one test, Caller.Authorize), resolves the org, team,
// user and metric into the engine's quota.Request and the route to the org's Redis,
// asks the engine (a Decider and Reservations, both satisfied by *quota.Engines), and
// describes the decision as
// the RateLimit-* and Retry-After values and warnings clients see. Its errors carry
// derrors kinds, among them the one rule of which engine errors are retryable
// (engineError); each transport maps kinds to its statuses in one table.
//
//   - `checks.Service` (internal/checks/service.go, checks.go, paths.go,
//     reservations.go) is what both transports call: `Check`, `CheckBatch`, `CheckPaths`
//     (Envoy's descriptors, grouped by path), and `Reserve`, `Reservation`, `Commit`,
//     `Release`, `OpenReservations`. A check has one way through it: `Check` is a batch
//     of one, and `Check` and `CheckBatch` both run `decide` (each input resolved by
//     `resolve` and priced, or refused alone; every resolved check asked of the engine
//     in one `Decide` by `ask`; each decision described); `CheckPaths` merges its
//     inputs' paths between `resolve` and `ask`. It takes the engine through two narrow
//     interfaces, `Decider` (`Decide` over a batch, `Now`) and `Reservations`, together
//     `checks.Engine` (satisfied by `*quota.Engines`; the unit tests' fake engine
//     decides from a table), authorizes the key for the org with
//     `Caller.Authorize` (the check scope, tested in one place), and hands back a `Decision`
//     that already carries its description: the tightest level and window, RateLimit-*
//     values, retry-after, the warn-mode warning, the mode and any throttle. The one
//     rule of which engine errors are retryable (`engineError`) lives here; HTTP and gRPC
//     only encode. The service adds no span of its own (that would change the trace's
//     shape and cost an allocation a check): it marks its entry with an event on the
//     transport's span (`checks.Check`, `checks.CheckBatch`, `checks.CheckPaths`,
//     `checks.Reserve`). How "entered once" is verified: internal/rls
//     `TestACheckEntersTheServiceOnce` records the spans of one `POST /v1/check` and of one
//     `ShouldRateLimit` (one path, then two) with an in-memory span recorder and asserts
//     exactly one service event and one `quota.check` (or one `quota.check_batch` for two
//     paths) per call; `TestCheckTrace` (internal/httpapi) keeps the whole tree.
//   - Leases held away from the server (leases.go): `Lease` and `SettleLease` size,
//     reserve (a reservation with on_expiry commit, atomically at every level) and
//     settle a lease for a client library (`HolderClient`: POST /v1/leases) and for an
//     Envoy proxy (`HolderProxy`: internal/rls's RLQS assignments), one sizing for both:
//     the holder's rate x the lease's life x 1.25, at most 1/16 of the path's headroom
//     as last seen. They differ only near a limit: a client is answered 0 units and
//     checks one by one; a proxy cannot, so it is leased 4 units while they are left,
//     then the last ones, and a refusal's retry becomes its TTL. A proxy's life may be
//     up to `ProxyLeaseMaxLife` (`LeaseInput.Life`), and client_leases is not read for it.
//
// # RateLimit header fields, two generations
//
// Checks, reservations (201 and 429) and Envoy's `response_headers_to_add` carry both
// generations of the IETF RateLimit headers, built in one place
// (`internal/checks/headers.go`) from the decision the check service describes: the
// legacy `RateLimit-Limit`, `-Remaining`, `-Reset` (draft-06, what most clients and
// gateways read) and draft-ietf-httpapi-ratelimit-headers-11's structured fields.
// `RateLimit-Policy` has one item per limit of the path (Envoy: of every path of the
// call, each name once), named `"<level>-<window>"` or `"<metric>-<level>-<window>"` for
// a metric other than requests: stable for a caller, no ids. `q` is the limit; `w` the
// window in seconds, none for a month (its length follows the calendar and the billing
// anchor) or a concurrent limit; `qu` is omitted for requests, `"concurrent-requests"`
// for a concurrent limit of requests, else the metric's name (the draft's registry knows
// no tokens; a client must not take them for requests). No `pk`: the partition is the
// org, team and user the caller named itself, and ids stay out of headers intermediaries
// log. `RateLimit` is one item, the limit the legacy fields describe: `r` = remaining,
// `t` = reset (on a denial `Retry-After`; omitted for an allowed concurrent limit).
// A denial's body (a check's, a batch item's, a reservation's 429) adds the member the
// draft's quota-exceeded problem type defines, `violated-policies`, naming the policy of
// `blocked_at`; its type and fields are otherwise ours, `application/json`. A
// batch answer carries both generations for its tightest decided item
// (`checks.TightestItem`: a denied item's, the furthest retry, before any allowed one;
// else the least remaining), none when every item is an error, and no `Retry-After`
// (it answers 200). `QUOTA_RATELIMIT_HEADERS`
// (`both`, `draft`, `legacy`, `off`) turns either generation off. The admin rate limit
// sends the legacy fields only. Tests parse the draft fields with
// github.com/dunglas/httpsfv (`TestDraftRateLimitFields`, `TestDraftFieldsInResponseHeaders`);
// the Go client, standard-library only, parses them with its own small RFC 9651 parser
// (`client/sfv.go`), held to httpsfv by `TestClientFieldParserAgreesWithHTTPSFV`; the
// TypeScript SDK likewise (`src/ratelimit.ts`, held to the structured-headers package).
// Both clients' middlewares pass the two generations on to their own callers:
// `RateLimit-Policy` as Quotaplane sent it (`client.FormatPolicies`, `formatPolicies`),
// `RateLimit` of the tightest, and the legacy fields (tests read them with httpsfv and
// structured-headers).
//
// # Money: rates and budgets
//
// Money is one more counter of the same decision, priced from a rate card.
//
// Rate cards (internal/tenants/rates.go, migration 000017). A plan's `currency`
// (`plans.rate_currency`; ISO 4217, checked against golang.org/x/text's table) and
// `rates` (`plan_rates`: metric, price, per), and the operator's overrides per org
// (`org_rates`, `PUT /v1/orgs/{org}/rates`, audited as `org.rates`; a plan's are audited in
// `plan.update`). They are kept apart from the plan's billing `pricing` (its own
// `currency`, base price and overage prices, which price the period's invoice): rates
// price checks. A price is a decimal string with at most 6 places, parsed once, exactly,
// with math/big into whole micro-units per `per` units (`ParsePrice`; no float is ever
// made of it, and above 2^50 micro-units it is refused). math/big (standard library,
// exact rationals) instead of shopspring/decimal or apd: the only operations are a parse,
// a product and a sum of fractions and one ceiling, which need no decimal context or
// rounding modes, so a dependency would add nothing. Bad input is a 400 problem naming
// the field (`currency`, `rates[i].price`, ...): rates without a currency, a spend limit
// without one, `spend` priced, a repeated metric, a part of a micro-unit.
//
// Spend in the decision (internal/checks/money.go). The resolved org carries its
// currency and effective rates (`ResolvedOrg.Currency`, `.Rates`: plan rates with the
// org's overrides in their place, two more columns of `resolveOrgSQL`), and `spend` and
// every rated metric join the metrics it knows. When a check names a priced metric,
// `checks.price` adds `spend` to the request as one more `quota.MetricCost` of
// `Request.More`, cost ceil(sum of cost x micros / per) (128-bit `bits.Mul64`/`Div64` for
// one priced metric, `big.Rat` for several; over `vocab.MaxUnits` is a 400), with the
// spend limits of the path's org, team and user (throttled like any limit). check.lua
// then decides it with the units in the same script run, per counter cost, all or
// nothing over every metric, level and window: a refusal by any level's budget counts
// nothing anywhere, and spent is exactly the sum of admitted prices
// (`TestMoneyBudgetRefusalCountsNothing`, `TestMoneyConcurrentOverTwoReplicas`: 64
// goroutines x 4 checks over two replicas, 54 admitted, every level's spend equal to the
// admitted prices and under its budget). Because spend rides the multi-metric machinery,
// every way in shares it: `Check`, `CheckBatch` and `Reserve` price after `resolve`;
// `CheckPaths` (Envoy's descriptors) prices each path once its descriptors are merged
// (`TestPricedDescriptorsSpend`). The cost is marked `Derived`, so it is not part of the
// idempotency fingerprint: a retry after a rate change is still a repeat, answered with
// the first decision. Shadow and warn, threshold events (the flusher reads month limits
// of every metric, spend's included) and the utilization gauge need nothing of their own.
//
// Reservations hold the price of their amounts (spend is one of their metrics) and
// settle it to the price of `used`: `checks.Commit`/`CommitUsed` read the reservation
// (one more Redis round trip, only for orgs with rates) and commit spend priced from
// `used` at the org's rates at commit; an expiry that commits keeps the reserved price
// (`TestReservationSpendHeldAndSettled`). A reservation may instead hold `spend` itself
// (a cost already in micro-units), when none of its metrics is priced: naming `spend`
// beside a priced metric is refused when reserving, so a reservation's spend is either
// derived or given, never both. A given spend is a metric like any: its commit counts
// `used.spend` (or the one-metric form's `used`) exactly, and one left out used 0
// (`TestReservationHoldingSpendCommitsItExactly`). Which of the two a reservation is is
// read at commit: derived when it holds spend beside a metric the org's rates price
// then, so a rate change while it is held settles it as the new rates say.
//
// Leases: a priced check is never leased, as no multi-metric check is; each is one
// script run, so a rate change applies to the next decision and no block of spend is
// ever taken at an old price.
//
// A rate change is a change of the plan (or org): committed, then the Service's
// change listeners drop the org (for a plan, every org on it) from the local cache and
// publish it on `quotaplane:invalidate`, which every replica's cache drops at once
// (about 5 ms), the TTL being the safety net. A decision in flight when the change
// commits was priced from the snapshot it resolved (old rate, all of it); every decision
// that resolves the org after the invalidation reached its replica is priced at the new
// rate. `TestRateChangeReachesEveryReplica` checks that the new rate reaches replica b
// within a second of the PATCH's answer and that every later decision on either
// replica is at the new rate, for a plan change and an org override.
//
// Budgets are `spend` limits (micro-units), month or shorter, in plans, org
// overrides, team and user allocations; the allocation rules are the usual ones, and a
// violation of `spend` is said in money (`tenants.inMoney`, `FormatMoney`: grouped, the
// currency's own places): `team "research": spend/month budget 2,500.00 USD exceeds org
// "lab"'s 2,000.00 USD` (`TestSpendAllocationInMoney`). Usage marks the `spend` metric
// with the plan's `currency` (the field the console reads) and adds decimal amounts
// (`used_amount`, `reserved_amount`, `limit_amount`, `remaining_amount`); the billing
// export adds `spend_amount`, `spend_currency`, `rate_price`, `rate_per` at the end of
// each row (the rate is the org's at export time; `spend` rows are what was counted,
// decision by decision) (`TestSpendInUsageAndExport`). `make bench` prints a priced
// requests+tokens check beside the same check unpriced (`BenchmarkCheckPricedHTTP`,
// `BenchmarkCheckUnpricedHTTP`).
//
// # Capacities and fair share
//
// `resolve` adds a check's draws (capacities.go, `drawCapacities`): for each metric it
// names, one on every operator capacity of the metric (`tenants.Cache.Capacities`,
// held in process: no query per check), its org the member by the org's weight in
// force (its own, else its plan's); and, when the check names a team, one on every
// org limit of the metric marked `fair_share` whose metric and window the team has no
// limit of its own for, the team the member by its weight, the limit throttled as the
// check's own are, saturation 0.8. A check without a team draws on no fair-share
// limit. The engine takes the draws all or nothing with the check's limits (a shadow or
// warn org's refusal is a would-block there). `CheckPaths` merges the draws of a
// path's metrics with them. A reservation draws its amount as a check draws its cost
// (its settling does not reach the capacity: internal/quota, Engines.Reserve).
// `Service.CapacityWindow` reads a capacity's
// window for `GET /v1/capacities/{id}` through the engine's `Capacities` interface,
// so the transports need not import internal/quota.
package checks
