// Package tenants owns the tenancy model of Quotaplane: plans and their limits, orgs
// with overrides, teams and users with allocations carved out of their parent's,
// API keys, console users and the audit log. Its Service validates every change,
// enforces the allocation rules inside the same Postgres transaction as the write,
// and records an audit row for it.
//
//   - The route is built in one place: `tenants.RouteOf(org, plan)`, which
//     `ResolvedOrg.Route()` calls; the check service, the reservation routes and the
//     ledger, billing and adjustment readers all take it from there.
//     `ledger.CounterSource.CountersFor(org, route)` replaced `billing.Route`.
//
// # Auth
//
//   - The operator token (`QUOTA_ADMIN_TOKEN`) is compared as SHA-256 digests in constant
//     time, so neither content nor length leaks through timing.
//   - Org API keys are `qpk_<id>_<secret>`: 16 hex digits of public id, 256 random bits of
//     secret (base64url). Postgres keeps only the SHA-256 digest of the whole token; lookup
//     is by id, comparison constant-time. `last_used_at` is coarse (a minute, plus 30 s) and
//     never written on a request: authentication notes a key whose stamp is stale, and the
//     api writes the notes every 30 s in one `UPDATE ... WHERE id = ANY($1)`
//     (`tenants.Service.RecordKeyUses`); `TestCheckPathWritesNothingToPostgres` reads every
//     statement of a cold key's and org's checks from their spans: reads only.
//   - Scopes: `admin` for everything org-scoped in the admin API; `check`, `billing` for
//     those calls. A key of another org gets 404 on every org-scoped route before its scope
//     is even looked at, so it learns nothing about the org. `plan`, `limits`, `redis_url`,
//     `billing_anchor_day`, `weight` of an org are operator-only (403 for keys, nothing changes).
//   - Console passwords are argon2id (19 MiB, 2 iterations, PHC string format); emails are
//     unique within an org (case-insensitive), not across orgs (an index across orgs would answer
//     another org's admin 409 for an email that exists elsewhere). The sign-in therefore names the org (`{"org", "email", "password"}`) and
//     looks at exactly one account, computing one password hash whether it exists or not,
//     so neither creation nor sign-in (answer or timing) tells whether an email exists in
//     another org; a wrong org, an unknown email and a wrong password are the same 401.
//
// # Data model and allocation rules
//
// Limits live in one table per owner (`plan_limits`, `org_limits`, `team_limits` with
// kind `team` or `user_default`, `user_limits`), so Postgres enforces windows,
// non-negative limits and one row per (metric, window). A row's nullable `burst` makes
// a second to day limit a token bucket (`max_units` per window, holding at most
// `burst`); Postgres refuses it on a month or concurrent window and below 1. An org's
// effective limits are its plan's with its overrides applied per (metric, window); a
// user's are its team's user defaults with its own applied on top. An override
// replaces the whole limit, burst included: a sliding override of a plan's bucket is a
// sliding window.
//
// Fair share (migration 000024). A plan's or an org's limit of a second to day window
// may say `fair_share` (Postgres refuses it elsewhere, and validation on a team's or
// user's limit, which no one shares): the org's teams without a limit of their own for
// its metric and window share it by team `weight` above its saturation point (the
// check service draws on it as a capacity; docs/ARCHITECTURE.md "Capacities and fair
// share"). Weights are integers 1 to 1000: a plan's (default 1), an org's override
// (NULL: its plan's; `ResolvedOrg.Weight` is the one in force) and a team's (default
// 1). Operator capacities live in `capacities` (capacities.go): an id, a metric, a
// second to day window, a limit and a saturation in (0, 1] (default 0.8); their
// metric and window stay as made. Every write is audited (org "",
// `capacity.create|update|delete`) and announced to the change listeners as
// `|capacities`, which names no org: `Cache.Capacities` holds the whole list in
// process (cache_capacities.go), read again off the check path: by the replica that
// made a change before it answers, by the others in the background when the
// invalidation channel tells them (and on every (re)subscription; `Subscribe` keeps
// the announcement from the worker, which caches no capacity), and in the background
// past `CacheOptions.CapacityTTL` (30 s). A check queries Postgres for it only when
// the cache holds no list yet; while Postgres is down the last list read serves.
//
// Known metrics. A plan names its metrics in its limits, its pricing and its
// `metered` list (`plans.metered`, metrics counted in usage and billed without any
// limit); the metrics an org knows are those plus the metrics of its own overrides. A
// check of any other metric, the default `requests` included, is refused with 422 (the
// problem names the metric and lists the org's metrics, sorted) before Redis is asked, so
// a misspelt metric is never counted, shown in usage or billed. `ResolveOrg` computes the
// set once (`tenants.MetricSet`, in `ResolvedOrg.Metrics`, read from the cache with the
// rest of the org): a check pays one map lookup and no allocation. A plan change
// invalidates every org on the plan, so a newly declared metric works at once.
//
// Allocations keep to the known metrics both ways, checked in the write's transaction
// under the org's lock like the rules below: a team's `limits` or `user_limits`, or a
// user's `limits`, naming a metric the org does not know is refused (422 at
// `limits[i].metric`), since it could never apply; and a change of the plan (`metered`,
// `limits`, pricing) or of the org (`plan`, `limits`) that would make the org forget a
// metric its teams or users still allocate is refused (422 at that field), as lowering
// a parent below its children is.
// Migration 000007 started from the same invariant: it declared as metered, on each
// plan, the metrics that its orgs' teams and users allocated and the plan did not name,
// so no existing allocation became unreachable; metrics that were only ever checked,
// never named by a limit, were left out, since they are what the rule refuses.
//
// The rules, checked level by level against the direct parent:
//
//   - a child's limit never exceeds its parent's for the same metric and window (team vs
//     org, user vs team, team user-defaults vs team); a token bucket's limit is its
//     rate, so this bounds a bucket's rate whichever of the two is a bucket;
//   - a child's bucket holds no more than its parent's bucket in the same metric and
//     window (422 at the child's `limits[i].burst`); a parent without a bucket there
//     bounds only the rate;
//   - per metric, the children's month limits add up to at most the parent's month limit,
//     unless the org oversubscribes;
//   - lowering a parent (plan, org overrides, a new plan, turning oversubscription off,
//     team limits) is refused the same way when its current children no longer fit,
//     its burst below a child's bucket too;
//   - a parent without a limit for a metric and window leaves its children free there.
//
// Every allocation change takes the org's row lock (`SELECT ... FOR UPDATE`) first, then
// reads the aggregates it checks against and writes, in one transaction; a plan change
// locks the plan and then every org on it in id order. So concurrent edits in one org
// serialize, and checks always see committed siblings (tested: 100 concurrent conflicting
// edits never exceed the parent). Transactions are retried on 40001/40P01.
//
// # Grants
//
// A grant (top-up, `grants` table, migration 000009; `internal/tenants/grants.go`) adds
// units to an org's month limit of one metric from when the operator makes it until its
// `until` (by default the end of the org's current billing period; at most a year
// ahead), unless revoked before; each carries a reason, and creating and revoking are
// audited with before and after. Only the operator creates or revokes them (an org key,
// even `admin`, and a console user get 403; another org's key 404, as on every org
// route); the operator and the org's `admin` or `billing` keys (a console viewer too)
// list them.
//
//   - One place applies them. `fillOrgs`, which builds every `Org` the service returns
//     (`GetOrg`, `ResolveOrg`, and `lockOrg` inside allocation writes), adds the units of
//     the org's grants active at the service's clock (in the binaries the engines' clock,
//     `Engines.DefaultNow`: see "Time") to the month limits of
//     `EffectiveLimits`, and records them in `Org.Granted`. So checks (through the
//     resolved org), the allocation rules (teams may be allocated out of the larger limit;
//     `UpdateOrg` checks new plans and overrides with the grants applied), usage and
//     `GET /v1/orgs/{org}` all see the same raised limit, with no second code path.
//   - Every replica at once. Creating and revoking call `changed(org)`: the cache of the
//     replica drops the org, and the others through Redis pub/sub, as for any change.
//   - Lapsing needs no action. Whether a grant is active is decided at resolution
//     against the clock; a resolved org carries when its first grant lapses
//     (`Org.GrantsLapse`), and the cache reads it again from then on, however fresh the
//     entry (`orgEntry.lapsed`; `TestGrantLiftsAtUntil` fails without it). Should Postgres
//     be down at that moment, the stale org (with the grant) keeps serving, like any stale
//     entry. The billing flusher's limit cache, which only decides threshold webhooks, sees
//     the lapse within its TTL.
//   - An org without a month limit of the metric is refused (422 at `metric`): there is
//     no cap to raise, and a grant that did nothing would be misleading. A metric the org
//     does not know is the usual 422 (`UnknownMetricError`). Should the org later lose the
//     month limit (a plan change), its grants raise nothing.
//   - Lapsing or revoking below allocations. Teams keep allocations made out of a grant
//     when it ends, as with oversubscription: the org's own counter still caps the org, and
//     the next change of an allocation is checked against the lower limit. Refusing the
//     revocation instead would make a grant impossible to take back, and a lapse cannot be
//     refused anyway.
//   - Usage and billing. Usage reports the org's month window of the current period
//     with the raised `limit` and its `granted` units. The billing export has
//     `granted_units` as its last column (so `period,org,team,user,metric,units` stays its
//     start): on org total rows, the units of every grant active at any time of the period
//     (from its creation to its `until` or revocation, placed with the org's anchor day),
//     counted whole; 0 on other rows. Grants raise the cap, not the included units: units
//     above `included_units` are overage whether or not a grant let them through, so a
//     grant is capacity, not a credit. A closed period's usage shows the month limit in
//     force at close, without the period's lapsed grants; its export still counts them.
//
// Why `Service` is concrete over Postgres (STYLE.md suggests a store interface): the
// rules must be checked on data read under the parent's lock in the write's own
// transaction. A store interface would have to expose transactions and the aggregate
// queries anyway, so the Service and its SQL live together in `internal/tenants`
// (`store_*.go`), and the tests run against real Postgres.
//
// Every change writes one `audit_log` row in the same transaction: actor (`operator`,
// `key:<id>`, `demo-seed`), org, action (`team.update`), object (`team:eng`), before and
// after snapshots (no secrets: key snapshots carry no digest, console users no hash, Redis
// URLs are masked) and the request id.
//
// # Bulk import
//
// `ImportOrgs` creates many orgs, each with its teams and one API key, as `CreateOrg`,
// then `CreateTeam` for each team in order, then `CreateAPIKey` would: the same
// `Validate`, defaults (`OrgInput.withDefaults`, `newTeam`), allocation rules (the pure
// `teamViolations` and `allocatedMetrics`, each team against its org and the teams before
// it), tokens (`Service.newToken`) and audit rows. It writes with COPY, one transaction per
// `ImportChunk` (1,000) orgs, each holding a share lock on the orgs' plans, which
// `UpdatePlan` waits for: the plan the rules were checked against is the plan at commit.
//
//   - Audit: one row per object (`org.create`, `team.create`, `api_key.create`), as the
//     single calls write them. An org's trail is read by org (`ListAudit`), so one row per
//     import, which has no one org, would leave every imported org without its creation.
//     `TestImportOrgsEqualsTheSingleCalls` compares what a reader sees (org, teams, keys,
//     trail) of an imported org with one made by the single calls.
//   - All or nothing for input: every input is checked (fields, ids given twice, plans,
//     allocation rules) before the first chunk is written. Only what the database says
//     (an org that exists already, a key id taken) fails a chunk; the chunks before it stay
//     committed and their keys are returned with the error
//     (`TestImportOrgsRollsBackTheFailingChunk`).
//   - Tokens come from `crypto/rand` unless the Service has `WithKeyTokens`, which
//     `CreateAPIKey` takes its tokens from too: `internal/scale` sets it so its load
//     scripts rebuild each org's token from its number; no server does.
//
// # The resolved-limits cache
//
// `tenants.Cache` keeps resolved orgs (settings, effective limits, plan fail mode and pool,
// teams with limits, user defaults and `unknown_users`, and their registered users), the users of large
// orgs, and API keys in memory, so the check path makes no Postgres query in steady state
// whatever the user id. Every committed change calls the Service's change listeners
// with the orgs it touched: the local cache drops them at once and publishes the ids on
// the Redis channel `quotaplane:invalidate`, on which every replica listens (measured:
// another replica sees a change about 5 ms later). A (re)subscription drops the whole
// cache, since messages may have been missed. A TTL is the safety net (5 min; 2 min for
// API keys: a revoked key stops working everywhere within a second through pub/sub, and
// within 2 min should a message be lost while the subscription holds); it was 30 s and
// 5 s, and any org checked less often than that paid Postgres lookups, so spread traffic
// over 10,000 orgs ran at 0.17 of the same load over 10. When Postgres cannot
// answer, stale entries keep serving.
//
// Keys in use are revalidated before their TTL ends (`Cache.RefreshKeys`, run by the
// api every second): a key authenticated past half its TTL is queued, and the queue is
// checked 5,000 keys per query (`Service.LiveKeys`: live, and its `last_used_at`
// noted as `Authenticate` does); a live key is served for another TTL from the time of
// the query, a revoked one is dropped. A key in use is thus never looked up alone on
// the check path, and N keys in use cost N/5,000 queries per minute instead of N
// lookups every 2 min (at 100,000 orgs, 833 a second, each on some check's path). An
// org's entry is still read again, alone, when its 5 min TTL ends: N/300 lookups a
// second at N orgs in use (docs/SCALING.md, "Many orgs").
//
// Users. End users need not be registered, so most user ids a check names are unknown
// to Postgres; looking each one up (as the cache once did, one query per new id per 30 s)
// made checks over unique ids 30-40 % slower and grew the process without bound. Instead
// an org is resolved with its registered users (`ResolvedOrg.Users`: team and own limits;
// in the same query, below), so an id that is not among them is unregistered,
// known without a query, and holds no memory. Registering, changing or removing a user is
// a change of its org, invalidated like any other, so the snapshot is never older than an
// org's limits are. Above a bound an org is resolved without its users
// (`UsersComplete` false): its ids go through a per-user LRU that also remembers
// unregistered ids (a negative cache), one query per new id, then none until the TTL or a
// change of the org; ids of one org missed while a lookup of it is in flight wait for it
// and go together in the next query (`userBatches`, up to 500 ids: a burst of 64 new ids
// costs 2 queries, `TestCacheLargeOrgUserLookupsBatched`), and a lone miss
// waits for nothing. The bound is a tenth of `QUOTA_CACHE_USERS` (200,000 registered
// users carried by all cached orgs together, 120-190 bytes of heap each: 24-38 MB), so 20,000 by
// default: every org that registers users one by one through the admin API is well under
// it, the snapshot of the largest costs 2-4 MB and one query per TTL (5 min), and at least ten
// such orgs fit together without pushing each other out. Orgs with more registered users
// than that are the ones that sync a user directory, where one lookup per id (cached) is
// cheaper than reading the directory every TTL. Checked by
// `TestCheckNewUserIDsCostNoPostgresQuery` (httpapi: 301 checks after warm-up, 0 queries;
// 302 before) and `TestCacheUnknownUsersCostNoQuery`, `TestCacheUserChangesInvalidate`,
// `TestCacheLargeOrgLooksUsersUpOnce` (tenants).
//
// One query per org. `Service.ResolveOrgUsers` is one statement
// (`resolveOrgSQL`, internal/tenants/resolve.go): the org's row joined to its plan (fail
// mode, pool, leases, client leases, sliding windows, metered list, priced metrics), with its overrides,
// its plan's limits, its active grants summed per metric, its teams with their limits and
// user defaults, its throttles and its plan's, and (up to the bound plus one) its
// registered users with their own limits, each as a JSON aggregate decoded in Go
// (timestamps as exact microseconds, not JSON dates, which would carry the session's time
// zone). One query, since pgx prepares each statement the first time a connection runs it:
// every further statement would cost a cold org on a fresh connection two round trips
// (the single-flight already joins concurrent resolutions). A user of an org above
// the bound is one query too (`ResolveUser`: the user and its limits). So the first check
// of a cold key and a cold org makes 2 queries, the key's (`api_keys`, cached apart for
// `QUOTA_CACHE_KEY_TTL`: a key is not an org's) and the org's, and no write; the checks of
// further user ids of that org make none while it is cached, registered or not
// (`TestColdOrgResolvedInTwoQueries`, httpapi, from the Postgres spans: 2 queries and 4
// statements with prepares, against 12 and 18 before; `TestCheckPathWritesNothingToPostgres`).
//
// Scale: memory bounds and negative entries. The resolved orgs are
// bounded by an estimate of their heap (`orgBytes`: a fixed ~1 KiB, ~400 bytes a team,
// ~160 a registered user, 64 a limit; it errs high) under `QUOTA_CACHE_MEMORY_MB` (512),
// and by `QUOTA_CACHE_ORGS` (1,000,000, so the memory bound binds first: ~160,000
// orgs of 5 teams at ~3.2 KiB; `make scale`
// at 100,000 such orgs with a 256 MB budget evicted and made 4 queries per lookup); keys by
// `QUOTA_CACHE_KEYS` (500,000, ~400 bytes each: 200 MB at most). Negative results are
// cached too, bounded apart (100,000 each): an unknown org id is remembered with its
// org's generation, which creating that org bumps (here at once, elsewhere through
// pub/sub), so it is found the moment it exists; a well-formed token that is no key is
// remembered with the cache's epoch, which every invalidation moves, creating a key
// among them (`TestCacheNegativeResultsUntilCreated`, `TestCacheOrgsBoundedByMemory`).
// A cold org is still one query, a cold key one more.
//
// Bounds. Every part is an LRU bounded in entries (`hashicorp/golang-lru/v2`: plain,
// well kept, no goroutine per cache), counted in
// `quotaplane_cache_lookups_total{cache,result}` and
// `quotaplane_cache_evictions_total{cache}`, both made by `internal/platform/cachemetrics`
// (`cachemetrics.New(reg).For("orgs")` gives a cache its `Hit`, `Miss` and `Evict` hooks;
// both binaries use it):
//
//	| cache | bound (default) | why that size |
//	| --- | --- | --- |
//	| `orgs` | `QUOTA_CACHE_MEMORY_MB` 512 of estimated heap, `QUOTA_CACHE_ORGS` 1,000,000 orgs, and `QUOTA_CACHE_USERS` 200,000 registered users carried by them, summed (the least recently used orgs go until all hold) | an org resolved again costs one query; tenants number in the tens of thousands, and every one must stay cached however rarely it is checked |
//	| `users` | `QUOTA_CACHE_USERS` entries | only orgs above the per-org bound use it; one entry ~150 bytes |
//	| `keys` | `QUOTA_CACHE_KEYS` 500,000 keys | one per active key; a miss is one indexed query |
//	| `bad_tokens` | 100,000, apart | a flood of well-formed made-up tokens cannot push real keys out; dropped when any org changes (a key created) |
//	| unknown org ids | 100,000, apart (counted as `orgs` hits) | a flood of made-up org ids costs one query each, once |
//	| `billing_limits` (worker) | `QUOTA_CACHE_ORGS` | the flusher's limits of each org for threshold events, read again after 10 s |
//	| `billing_events` (worker) | 100,000 events | threshold events already recorded; forgetting one costs a no-op insert (the table dedupes) |
//
// Entries past their TTL are not served while Postgres answers, but stay until the LRU
// needs their room: they are what serves while Postgres is down, and the bound, not the
// TTL, caps memory. Invalidation does not search the LRUs: each entry carries its org's
// generation when it was read (hashed into 4,096 fixed slots, so the generations take no
// memory per org, and a collision only costs another org a re-read), an invalidation
// bumps it, and an entry of an older generation is never served, not even stale. The
// generation is read inside the single-flight before its queries, and a caller that joined
// a flight older than its own view reads again, so a lookup that raced a change never
// serves or stores what it read before it (`TestCacheConcurrentInvalidation`, under
// `-race`). The engine's key cache (internal/quota) is bounded apart.
//
// # Entitlements
//
// A plan carries `features` (entitlements), each a boolean,
// an integer or a string (`{"sso": true, "seats": 25, "tier": "gold"}`); the operator may
// override them per org (`PUT /v1/orgs/{org}/features`, `{"features": {"seats": 50,
// "beta": null}}`: a value sets a feature, whether or not the plan has it, `null` removes
// the plan's for that org, `{}` clears every override); and the check path resolves them
// (`GET /v1/entitlements?org=&team=&user=`, an org key with `check`) to the features and
// where each comes from (`sources`: `plan` or `org`). Code: `internal/tenants/features.go`
// (types, validation, resolution, the store), `internal/checks/entitlements.go` (the
// check path's resolution), `internal/httpapi/features.go` (the three routes); migration
// 000018 adds `plans.features` and `orgs.feature_overrides`, both `jsonb`.
//
//   - Bounded. A plan's features are carried by every cached org of the plan, so they
//     are bounded where they enter: at most 64 names matching
//     `^[a-zA-Z][a-zA-Z0-9_.:-]{0,63}$`, strings of at most 256 bytes, integers within
//     ±(2^53-1), which a JavaScript number (the TypeScript SDK's, the console's) holds
//     exactly; `null` only in an org's overrides. The spec says it (`Features`,
//     `FeatureValue`, `FeatureOverrides`) and the request validator refuses the rest
//     with a problem naming the field (`features.seats`); the schema's
//     `x-invalid-message` words a `oneOf` or `maxProperties` failure, which the
//     validator's rules cannot. `tenants.ValidateFeatures` says the same behind it, for
//     callers that do not come through the spec, and normalizes values to `bool`, `int64`
//     or `string`. A refused request writes nothing (`TestFeaturesValidation`, by the
//     tenancy tables' fingerprint; `TestValidateFeatures`).
//   - Cached like limits. The org's features ride in its resolved org: `resolveOrgSQL`
//     reads `{"plan": p.features, "org": o.feature_overrides}` in the same one statement,
//     and `ResolvedOrg.Entitlements` holds the resolution. So `GET /v1/entitlements` is a
//     key lookup and an org lookup in the cache, the same two a check makes: no Postgres
//     query once both are warm (`TestEntitlementsCostNoPostgresQuery`: 300 calls after
//     warm-up, over the org, a team, a registered user and 75 new user ids, 0 pool
//     acquisitions). An override is a change of its org and a plan's features a change of
//     every org on the plan, so both go through the cache's invalidation: the changing
//     replica drops the orgs at once, the others on the pub/sub message
//     (`TestFeaturesChangeReachesSecondReplica`: the second replica served an override
//     2 ms after it, a plan's change 2 ms after it; the test's bound is a second), with
//     the cache's TTL as the safety net should a message be lost.
//   - Team and user. Features are the org's, the same at every level today; `team` and
//     `user` are resolved as a check resolves them (an unknown team 404, a registered
//     user's team found without being named, a different one 400), so a caller can ask
//     per user now and keep working if per-team features come later. Another org is 404,
//     as everywhere (`checks.Caller.Authorize`).
//   - Audited. A plan's features are in the plan, so `plan.create`/`plan.update` carry
//     them before and after; an override is `org.features`, with the overrides before and
//     after (`TestEntitlementsResolvePlanAndOverrides`).
//   - Read by people. `GET /v1/orgs/{org}/features` (operator, `admin` or `billing`: a
//     console viewer too) answers the plan's features, the overrides and the resolution
//     from Postgres, for the console's read-only Entitlements page; it is not the hot
//     path. The clients' `Entitled`/`Feature` (Go) and `entitled`/`feature` (TypeScript)
//     call `GET /v1/entitlements` each time and cache nothing: the server's answer is
//     already a cache hit, and a client cache would delay an override by its own TTL. An
//     integer stays exact: the Go client decodes with `UseNumber` to `int64`. `Entitled`
//     is true when the feature is present and not `false`, `0` or `""`.
//
// # Throttle
//
// An adaptive throttle multiplies limits by a factor `0 < f <= 1` for a while:
// an org admin (or the operator) sets one on an org (`PUT /v1/orgs/{org}/throttle`), the
// operator on a plan (`PUT /v1/plans/{plan}/throttle`), with a reason and an expiry
// (`expires_at` at most 7 days ahead, or `ttl_seconds`; an hour by default).
//
//   - Storage. Table `throttles` (migration 000008): one row per org or plan
//     (`org_id` xor `plan_id`, each with a partial unique index, cascading deletes), the
//     factor in millionths (`factor_ppm`), `month`, `reason`, `expires_at`, `created_by`.
//     `tenants.Service.SetThrottle` / `DeleteThrottle` take the owner's row lock, replace
//     the row and write an audit row (`throttle.set` / `throttle.delete`, before and
//     after; a plan's under no org, like every plan change) in one transaction, then call
//     `changed(...)` with the org, or every org of the plan.
//   - Reaching every replica. Nothing new: `ResolvedOrg.Throttles` carries the org's
//     and its plan's unexpired throttles (one more query per org resolve), so the change
//     listener that already drops the org from every replica's cache through Redis pub/sub
//     makes the next check resolve it with the throttle (`TestThrottleReachesEveryReplicaAndLifts`:
//     about 5-20 ms on the second replica, bounded at 1 s).
//   - Expiry without any change. The check path picks the throttle with
//     `ResolvedOrg.ThrottleOf(now)`, now on the engine's clock of the check's route
//     (`Engines.Now`: Redis time on the monotonic clock, see "Time"), so a cached throttle stops applying at its
//     `expires_at` on every replica, with no invalidation, no job and no cache refresh; an
//     expired row is ignored by the next resolve, and replaced or deleted by the next PUT
//     or DELETE.
//   - Org and plan. When both apply, the smaller factor wins (the org's on a tie): an org
//     admin must not be able to undo the operator's throttle of the plan by setting 1 on
//     the org. `GET /v1/orgs/{org}/throttle` answers the one in force, with its `scope`,
//     or 204 when none is (not 404: none is the usual state, and the console asks on every
//     overview, where a 404 would be an error in the browser's console).
//   - Applying it. `httpapi.limitsFor` multiplies each sliding-window limit (second,
//     minute, hour, day) of the check's org, team and user levels, and the month limit when
//     `month` is set, as it copies them into the request: `floor(limit * ppm / 10^6)` in
//     integers (`bits.Mul64`/`Div64`: exact where `float64` is not, e.g. 100 x 0.29 = 29, and
//     no overflow at the largest limit). Without a throttle the zero `tenants.Throttle`
//     leaves every limit as it is: no allocation, no branch on the hot path beyond
//     `len(org.Throttles) > 0` (BenchmarkCheckHTTP 139-141 allocs/op before and after).
//     The engine knows nothing of throttles: it gets smaller limits, so the answer's
//     levels, `RateLimit-*` headers and `Retry-After` are those of the throttled limits.
//     The answer (and each item of a batch) says `"throttled": {"factor", "expires_at",
//     "scope"}`.
//   - Counters are not touched. Usage counted before the throttle still counts: an org
//     at 80 of 100/minute that is throttled to 0.5 is refused until its window drops
//     below 50.
//   - Console. The overview shows the throttle in force (factor, reason, expiry, whose)
//     in a banner (`web/src/throttle.tsx`). A viewer's session can read it but not set or
//     lift it (403, like every change by a viewer: `TestConsoleThrottle`).
//
// Tests: `TestThrottleReachesEveryReplicaAndLifts`, `TestThrottleExactAdmission` (200
// concurrent checks at 100/minute under 0.5: exactly 50 admitted, under `-race`),
// `TestThrottleSmallerFactorWins`, `TestThrottleAudit` (httpapi, real Postgres and
// Redis through the real router); the route table (bad input 400 in API terms, 401,
// 403, another org 404) and the spec-driven security tests; `TestThrottleApply` and
// `TestThrottleOfPicksTheSmallerActive` (tenants); `throttle.test.tsx` (console).
package tenants
