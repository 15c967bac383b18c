// Package quota is Quotaplane's enforcement engine: it decides checks against the
// limits of an org, its team and its user, exactly and atomically, in Redis.
//
// One check is one run of scripts/check.lua: it reads every limited counter of every
// present level, admits the check only if used + cost <= limit everywhere, and only
// then counts the cost at every level (even where a level has no limit, so usage
// reports are complete). Sliding windows (second, minute, hour, day) use the
// two-bucket weighted counter; the month window is a fixed counter per billing
// period. The buckets and the period are named here from the engine's clock (Now):
// its last Redis TIME sample plus the time elapsed since, on the monotonic clock
// (clock.go), so replicas with skewed or stepped clocks decide identically.
//
// Concurrent checks are coalesced into pipelines by one batching goroutine per
// Engine. The engine never re-sends a check script (a check behind a lost reply
// would be counted twice), so it only accepts Redis clients with retries disabled.
//
// The package knows nothing of HTTP or of how limits are stored: callers resolve
// the limits of a check into a Request. KEYS.md describes the Redis key layout and
// the hooks for the durability worker (DrainDirty, Hydrator).
//
// # Bounded numbers
//
// Redis runs the scripts in Lua, whose numbers are IEEE doubles: integers are exact up to
// 2^53 and no further, and a reply that carries a number past it is one the engine cannot
// read. So every number of units has one bound, `quota.MaxUnits` = 2^50 =
// 1,125,899,906,842,624, and every counter another, `quota.MaxCounter` = 2^51:
//
//   - Inputs above `MaxUnits` (or below their minimum) are refused with a 400 naming
//     the field and stating the bound, writing nothing: a check's `cost` (`/v1/check`, each
//     item of `/v1/check/batch`: `checks.Input.Validate`), a reservation's `amount` and a
//     commit's `used`, every `limit` of plans, org overrides and team and user allocations
//     (`tenants.validateLimits`, and the spec's `maximum`), a grant's `units` and an
//     adjustment's `set`/`add`. Over gRPC, a descriptor's `hits_addend` above it is
//     refused alone, `OVER_LIMIT` counting nothing, with the same words in
//     `Quotaplane-Refused` (`hits_addend: must be 0 to 1125899906842624`); the request's
//     own `hits_addend` is a uint32. A limit stored above
//     the bound before it existed is checked as `MaxUnits`; an org's month limit with all its
//     grants is capped at `MaxUnits` (the SQL sum is numeric, never a bigint overflow).
//   - Counters never pass `MaxCounter` (check.lua's `MAXC`), and only a counter that
//     has a limit can refuse a check:
//   - A limited counter (a limit of the check on its level, metric and window) that a
//     count would take past it counts nothing: enforce (and any reservation) denies the
//     check with retry at the period's end and `blocked_at` naming that limit; shadow and
//     warn allow it (they never deny) uncounted. Since every limit is at most `MaxUnits`
//     it reaches the bound only through shadow or warn counting past its limit, an
//     adjustment or old data, and is then over its limit anyway (the 429 names it).
//   - A counter with no limit (counted for usage and billing only: a metered metric,
//     or a level or window no limit of the check names, such as a team's minute bucket
//     when only its users have a minute limit) never denies. A count that would take it
//     past the bound saturates it: it stops at `MaxCounter` and the units past it are
//     not counted there (the bound: such a counter holds at most 2^51 units a period,
//     or a window, and usage and billing read 2^51); the check is decided by its limited
//     counters alone, counted in the others, and counted in
//     `quotaplane_counters_at_bound_total` (a reservation too). A reservation saturates
//     the same way and holds only the units its month counters counted (record field
//     `k<l>`: the units not counted), so that its commit or release gives back no more
//     than it added (a counter ends at its value before plus `used`, at most the bound);
//     a reservation hydrated from Postgres has no `k<l>`, and a give-back into a
//     saturated window bucket may take it below what it held (a window no limit reads).
//     So two checks of 2^50 of a metered metric do not lock the org's checks of it out
//     for the rest of the month (`TestUnlimitedCounterSaturatesAndNeverDenies`,
//     `TestUnlimitedCounterSaturatesOnEveryPath`,
//     `TestUnlimitedMetricAtTheBoundIsNeverALockout`). Every denial names the limit that
//     refused it: a script reply denying with no row is one the engine cannot read
//     (`ErrBadReply`), never a 429 without `blocked_at`. A commit's over-reserved units
//     stop at the bound (settle.lua). A value stored past it, or text that is no number
//     (old data), reads as `MaxCounter`: over every limit of a limited counter, so the
//     org's checks of it are denied (429), not failed; the checks that met it are counted
//     in `quotaplane_counters_at_bound_total`; the drain and `MonthUsage` read it the same
//     way, hydration restores at most it. An operator sees a counter at the bound by that
//     metric and the usage read (2^51), and resets it with an adjustment (below; RUNBOOK,
//     "A counter is wrong").
//   - Every sum a script makes stays exact: counter + cost <= 2^51 + 2^50 = 3 x 2^50;
//     a sliding window's two buckets plus a cost <= 2 x 2^51 + 2^50 = 5 x 2^50 (the
//     previous bucket's weight is a fraction: its product is an estimate, never a stored
//     count); counter + over-reserved <= 3 x 2^50; held units are part of the counter.
//     All are below 2^53 = 8 x 2^50, with shadow mode counting past its limit for a month
//     included (it stops at 2^51). Tested by `TestCountersStopAtTheBound` and
//     `TestHostileNumbersAreRefusedOverHTTP`/`TestHostileHitsAddendIsRefused`.
//   - A bad reply is one check's failure, never an outage: a reply the engine cannot
//     parse, or a script that fails as it runs (a Lua error on a value it cannot use: Redis
//     answers `ERR ... script ...`), is `quota.ErrBadReply`, not `ErrUnavailable`: it never
//     counts against the pool's circuit breaker (so one org's bad data does not degrade every
//     org) and is never re-sent; `quota.Engines` answers the check by the plan's fail mode
//     (`open`: allowed, degraded; `closed`: 503; `local`: the local limiter) and counts it in
//     `quotaplane_script_reply_errors_total{pool}` (`TestMalformedReplyFailsOnlyItsCheck`,
//     `TestScriptErrorIsNotAnOutage`).
//   - An operator corrects a counter with `POST /v1/orgs/{org}/usage/adjustments`
//     (operator token only; `billing.Service.AdjustUsage`): `set` or `add` (negative lowers)
//     the committed units of one org, team or user month counter of the current period,
//     with a `reason`. adjust.lua changes the Redis counter (held units stay in it) within
//     0..`MaxCounter` and marks it dirty (hydrating first if Redis lost the period); then
//     one transaction under the period's advisory lock (the flush's) writes the ledger row,
//     lower too, with `usage_counters.adjusted_at` (migration 000013), caps the org's daily
//     history of the period at the new value, and writes the audit row `usage.adjust`
//     (actor, time, before and after units, reason). The ledger otherwise only rises: a
//     drain whose snapshot began before the adjustment (`quota.Drained.At`, the engine's
//     clock before drain.lua; the full flush now drains before it reads every counter) is
//     kept off an adjusted row (`adjusted_at < At` to raise it), and the counter is marked
//     dirty again after the commit so that the next drain persists what Redis holds. The
//     bound on that rule is the agreement of the api's and the worker's engine clocks (both
//     Redis TIME corrected): a drain within that skew of the adjustment may be kept off too,
//     and is persisted by the next. Sliding-window buckets are not adjusted (they age out
//     within their window). If Postgres fails after Redis changed, the call fails with 503
//     and Redis holds the new value: repeat the `set` (RUNBOOK, "A counter is wrong").
//     `TestAdjustmentFixesAWrongCounter` covers a drain, a stale drain and Redis loss.
//
// # Shared Redis bounds
//
// Every org of a pool counts in one Redis, so what one org can make it hold is bounded
// per org, where it is written: in check.lua (and so reserve.lua and leases), in the run
// that would write, so replicas cannot pass a bound together and no extra round trip is
// paid. A check that counts nothing stores no idempotency record; an org holds at most
// `QUOTA_IDEMPOTENCY_RECORDS` records (counted by the hour they were stored in, in one
// small hash, so the count is exact from above without a sorted set of every key), and
// names at most `QUOTA_UNREGISTERED_USERS` distinct unregistered users a period (an exact
// set of them, created with the period's keys and expiring with them; a HyperLogLog
// would be smaller but could let two replicas pass the bound by its error). The engine
// passes the bounds as one argument before the packed numbers, so a check's other
// arguments are unchanged and a check that creates no counter and has no key pays one
// argument and nothing else. Past a bound the answer is a `*quota.BoundError`: 422 naming
// the bound and the field (`idempotency_key` or `user`; `checks.engineError`), counted in
// `quotaplane_org_bound_refusals_total{org, bound}` (series only for orgs that reached a
// bound; the operator makes orgs, so the label is bounded) and alerted by
// `QuotaplaneOrgAtRedisBound`. A 422, not a 429: a 429 of a check means "denied by a
// limit" and carries `blocked_at`; this is the org's use of Redis, not a limit of its
// plan. internal/quota/KEYS.md "Bounds" has the keys and the bytes they bound;
// SECURITY.md the table. Tests: internal/quota `TestCheckThatCountsNothingStoresNoRecord`
// (2,000 denied checks in batches and single checks leave no record; it failed before:
// 2,011 records), `TestIdempotencyRecordsBound`, `TestUnregisteredUsersBound`,
// `TestBoundsHoldAcrossReplicas` (60 concurrent checks on two engines: exactly the
// bound), internal/httpapi `TestOrgBoundsOverHTTP` (the 422s, single and batch, and the
// metric), and the alert's promtool case.
//
// # The check engine (internal/quota)
//
// One Lua script (`internal/quota/scripts/check.lua`) decides a check all or nothing for
// every present level (org, team, user) and every window any level limits, and only if it
// passes increments every counter of every level; usage is counted at levels without
// limits too. The key layout, memory per counter and durability hooks are in
// internal/quota/KEYS.md. In short: every key of an org
// carries the hash tag `{<org>}`; month counters of an org live in one hash per period
// (with a `|p` marker field that the script requires, so a Redis that lost the hash makes
// the engine rehydrate before deciding); sliding windows are two-bucket weighted counters
// in one hash per org and bucket (or, for a plan with `sliding_windows: precise`, also 20
// sub-bucket counts per counter: "Sliding windows" below); a per-org dirty set lists the month counters changed
// since the worker last drained it.
//
//   - Time is Redis's, on the monotonic clock: the engine's clock is its last Redis
//     `TIME` sample plus the monotonic time elapsed since (see "Time" below), so replicas
//     with skewed or stepped clocks decide identically. From that clock the engine computes
//     the month period, the sliding-window buckets (it names their keys) and how far into
//     its bucket the check is, and passes them to the script. The script reads no `TIME`
//     (7,000 instructions of Redis time per call), and window behaviour can be tested with
//     a moved clock (`TestSlidingWindowAcrossBuckets`).
//   - Redis time is the budget (docs/PERFORMANCE.md): the script's numbers travel packed
//     in one binary argument and its decision comes back packed the same way, because in
//     Redis every argument, every number parsed or formatted and every `redis.call` costs
//     thousands of instructions on the single thread all checks share.
//   - Retries are off for the engine's client (`MaxRetries: -1`; `New` refuses a client
//     that retries): a go-redis retry after a lost reply would run the script again and count
//     the check twice or more. A lost reply is an error (the fail mode answers) and the check
//     is counted once (tested through a TCP proxy that drops the reply).
//   - Coalescing: one goroutine per engine gathers concurrent checks into pipelines of
//     EVALSHA (up to `MaxBatch`); NOSCRIPT entries are reloaded and only those re-run.
//   - Key cache: the EVALSHA arguments an org's checks share in a period (key names,
//     boxed once) are kept in a bounded LRU (hashicorp/golang-lru, 64 shards,
//     `Config.KeyCacheSize`, default 262,144 entries); `Config.KeyCache` hooks report hits,
//     misses and evictions for metrics.
//   - Idempotency keys are stored by the same script with the first decision (24 h)
//     and a fingerprint of the request (SHA-256 of org, team, user, metric and cost,
//     16 bytes in hex, computed only when a key is given); a repeat with another
//     fingerprint is refused in the script (`ErrIdempotencyConflict`, 422), counting
//     nothing, so the rule holds across replicas and on a cluster (the key is in the
//     org's slot). Only a check that counted stores its decision: a denied
//     check, or one of cost 0, counted nothing, so its retry is decided again, and one
//     org's denied checks leave nothing in Redis ("Shared Redis bounds" below).
//
// `quota.Engines` holds the engines of every pool: an org's checks go to its dedicated Redis
// (`redis_url`), else to its plan's pool class (`QUOTA_REDIS_POOLS`), else to `REDIS_URL`,
// with one engine (and client, 100 ms timeouts, no retries) per URL. Each org has a bound
// on in-flight checks (`ErrOverloaded`, 503). Each pool has a gobreaker circuit breaker
// that counts only unavailability (timeouts, refused connections); while it is open, or a
// call fails, the plan's fail mode answers: `open` allows with `degraded`, `closed` is
// `ErrUnavailable` (503, never 429), `local` decides with an in-process limiter sized to
// limit / `QUOTA_REPLICAS`. Measured in `internal/quota/failmode_test.go`: the breaker
// opens about 30 ms after Redis dies (about 0.5 s when it hangs: five 100 ms timeouts),
// degraded answers have p99 under 0.5 ms, and the breaker closes by itself about 0.5 s
// after Redis returns. The local mode is an approximation: replicas start from zero and
// nothing counted locally is written back to Redis.
//
// An org's dedicated Redis. A `redis_url` is checked when it is set
// (`POST /v1/orgs`, `PATCH /v1/orgs/{org}`, in internal/httpapi/orgs.go): after the
// validation, one PING within 3 s; no answer is a 422 naming `redis_url`, saying why in
// the API's words (connection refused, DNS lookup failed, no answer, authentication) and
// naming the override, `"redis_url_check": false`, for a Redis that comes later; nothing
// is stored. The worker's background polls of a dedicated Redis (its usage flush, through
// `Engines.PollEngine`, and the reservation sweep) back off while it fails
// (`EnginesConfig.PollBackoff`: 1 s doubling to at most 1 min, ended by a success): a
// poll in the pause is skipped without a word (`quota.ErrAway`), so the failure is
// logged at most once per pause instead of several times a second. Checks themselves
// keep the breaker and the fail mode above; pools (default, classes) are polled as
// before.
//
// Redis Cluster. Any Redis URL (`REDIS_URL`, a pool, an org's `redis_url`) may name a
// cluster (a seed list, `?cluster=true`, or `REDIS_CLUSTER=true`; parsed in
// `internal/platform/redisconn`). The engine then uses go-redis's cluster client with
// retries and redirects off and handles what the cluster says itself
// (`internal/quota/cluster.go`): a check Redis refused without running it (`MOVED`, `ASK`
// via `ASKING`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`, `LOADING`, a failed
// dial) is sent again within `Config.RetryBudget` (3 x the Redis timeout), after a slot
// map refresh; anything else is the fail mode. A check sent again (so too after hydrating
// its org) is built again on the engine's clock, so it counts in the window bucket of the
// moment it runs. On a cluster the engines keep a breaker per
// primary (chosen from the org's slot), so a dead primary degrades only the orgs whose
// slots it holds and the replica that takes over starts with a closed breaker.
// `quotaplane_redis_resends_total{pool,reason}` counts the re-sends. The worker reads and
// drains each org's keys where they live, so it needs nothing per primary beyond the
// cluster client. `make test-cluster` (`internal/clustertest`) proves it on six
// redis-server nodes with three api replicas and a worker; docs/SCALING.md has the
// figures.
//
// Files by concern. `engine.go` (Config, New), `clock.go` (the engine's clock), `check.go`
// (the one path of a check: `Check` and `CheckBatch` over `decide`, which admits a
// leasable check from its lease and hands the others to `run`, the one loop of sends, with
// `next`: a reply's re-send after a refusal without a run, its one hydration per period,
// its error; a single check goes through the coalescing loop, several as one pipeline of
// their own; a reservation goes through `run` too), `pipeline.go` (the coalescing loop and
// the pipeline of EVALSHAs), `build.go` (a check's EVALSHA arguments and idempotency
// fingerprint), `keycache.go` (the bounded cache of an org's keys), `reply.go` (`decode`,
// the one decoder of a script's decision, packed or text), `keys.go` (the key layout),
// `drain.go` (Drain, DrainDirty, MonthUsage), `reserve.go` (reservations), `hydrate.go`,
// `cluster.go`, `trace.go` (the spans of checks and pipelines, when tracing is on); for
// `quota.Engines`, `engines.go` (`Decide`, the one path of a batch of checks, a single
// check being a batch of one: each validated once, grouped by Redis behind one breaker
// decision, answered by the engine or the fail mode in `answer`; `Check` wraps it),
// `backend.go` (a Redis's client, engine and breakers, made on first use), `breaker.go`,
// `failmode.go`, `local.go`, `metrics.go`. URLs in messages are
// masked by `internal/platform/redact`, the one helper for it.
//
// # Time
//
// Every decision and expiry that depends on time reads the engine's clock,
// `Engine.Now()` (`internal/quota/clock.go`): the last Redis `TIME` sample plus the time
// elapsed since it was taken, measured on Go's monotonic clock (`time.Since` of the
// sample's local reading). The local wall clock is read by no decision, so a step of it
// (NTP, a resumed VM, an operator's `date`) changes nothing. A wall clock stepped +2 s after a sample would
// name buckets 2 s away from the other replicas' and admit past a limit between them
// (`TestClockStepChangesNoAdmission`).
//
//   - Sampling. `TIME` is sampled at `New` and every `Config.ClockSync` (30 s; every
//     1 s until a first sample succeeds). A sample is taken at the middle of its round
//     trip; it replaces the kept one unless its round trip leaves it less certain than the
//     kept one has become (half the round trip, against the kept one's half plus 500 ppm of
//     its age), so one slow reply does not move the clock by half of it (`TestSlowClockSampleNotKept`:
//     a 1-s round trip is not kept, and is after 2,100 s). `Now` is one
//     atomic pointer load, a monotonic reading and an addition: no lock, no allocation
//     (`BenchmarkEngineNow`, docs/PERFORMANCE.md). Until a first sample (Redis unreachable
//     since `New`, tried again every second) `Now` is the local clock: the fail modes'
//     answers, and checks in the second before the sampler next reaches Redis, use it.
//   - The bound. An engine's `Now` is off Redis time by at most half its sample's
//     round trip plus its monotonic clock's drift since the sample; two replicas' by the
//     sum of theirs: `rtt_a/2 + rtt_b/2 + drift x 30 s`. Drift is at most 500 ppm (the
//     most NTP slews a Linux clock; crystals run 10-50 ppm apart), so at most 15 ms over a
//     sampling interval in the worst case and typically under 1.5 ms; a `TIME` round trip
//     is 20-35 us on a local Redis. A check within that of a bucket edge may count in the
//     neighbouring bucket; at a new sample `Now` may move back or forward by as much.
//   - What a step does now: nothing. A stepped wall clock moves no bucket, no period
//     boundary, no reservation or lease expiry, no throttle expiry and no grant lapse
//     (tests below; the worker's period close and flush read `Engines.DefaultNow`, wired in
//     `cmd/worker`, and are not tested under a step themselves). What moves the engine's time is Redis's own clock: a step of the
//     Redis host's clock reaches each replica at its next sample (within 30 s), and until
//     then replicas disagree by it.
//   - The clock source stays injectable. `Config.Clock` (nil: `time.Now`) gives the
//     local readings; elapsed time is their difference (`Time.Sub`), monotonic when both
//     carry Go's monotonic reading, so a test's fake clock moves the engine by moving its
//     readings, as before. `Config.Monotonic`, when set, is the clock elapsed time is
//     measured on instead: a source that steps its wall reading alone sets both
//     (`testenv.Clock`: `Add` is time passing, `Step` the wall clock stepped;
//     `quota.StepClock`, the fault hook's).
//   - Fault hook (a test hook, off by default; docs/RUNBOOK.md). With
//     `QUOTA_FAULT_CLOCK=on`, the api and the worker run their engines on a
//     `quota.StepClock`; `SIGUSR1` steps its wall reading by +2 s, `SIGUSR2` by -2 s
//     (cumulative), each logged as a JSON line `"clock stepped"` with `by` and the total
//     `step` (`internal/platform/faultclock`); a signal sent again before the previous
//     one's line may be delivered once. Without the variable no handler is
//     installed (Go then ignores `SIGUSR1`/`SIGUSR2`).
//
// What reads the engine's clock, what stays on the local clock, and why:
//
//	| Where | Decides | Clock |
//	|---|---|---|
//	| `quota` build, leases, reservations, sweep, open list, would-block rows | window buckets, period ids, lease ends and renewals, reservations' `expires_at`, what the sweep expires, the would-block day | `Engine.Now` |
//	| `quota.Engines` fail modes | `open`'s `reset_at`, `local`'s windows | `Engines.Now(route)` |
//	| `checks.Service` (resolution) | a throttle's expiry | `Engines.Now(route)` |
//	| httpapi, rls | `RateLimit-Reset` seconds (`reset_at` minus now) | `Engines.Now(route)` |
//	| api: `tenants.Service`, `billing.Service` | a grant's lapse and default `until` (the period end), the resolved-org cache's lapse, the usage API's current period | `Engines.DefaultNow` |
//	| worker: `billing.Closer`, `ledger.Flusher`, `tenants.Service` | which periods have ended (plus grace) and are closed, the periods flushed and the day of the daily history | `Engines.DefaultNow` |
//
// Left on the local clock: durations between two `time.Now` readings, which Go measures
// on the monotonic clock already (the cluster retry budget, a lease settle's deadline,
// the resolved-org and limits caches' TTLs, metrics' durations); logs, metrics, audit
// rows, webhook signature timestamps (the receiver compares them with its own clock) and
// job scheduling; console sessions' expiry (sign-in, not quota); the admin API's rate
// limit (httprate's in-process windows per replica: a step may open one window early, on
// operator traffic only); SQL `now()` (Postgres's clock: the throttle resolve drops
// expired rows by it, but the expiry that decides is `ThrottleOf` on the engine's clock);
// loadgen. Orgs on a dedicated Redis are decided on that Redis's time; the grant, usage
// and period-close clocks read the default pool's, which differ only by the Redis hosts'
// clocks.
//
// Tests: `TestClockStepChangesNoAdmission` (two engines on one Redis, one stepped +2 s or
// -2 s after its sample, 100/second for 3 s: at most 159 admitted in any real second,
// 158 without a step; the two-bucket bound is 201; 369 and 359 on the old engine),
// `TestClockStepMovesNoExpiryOrPeriod` (steps of +-40 days and an hour move neither `Now`,
// the period, a reservation's `expires_at` nor what the sweep expires; time passing
// does), `TestClockStepMovesNoLeaseEnd` (a lease answers through +-1 h steps and ends
// when its time passes), `TestClockSkewDecidesIdentically` (-40 days and +7 minutes of
// skew), `TestSlowClockSampleNotKept`, `TestThrottleExpiryOnTheEngineClock` (httpapi),
// `TestGrantLapsesOnTheEngineClock` (tenants, on `Engines.DefaultNow`),
// `TestFaultClockHookStepsNoDecision` (cmd/api: the real process, its signals and log
// lines, a second window's bucket unmoved) and `TestFaultClockHook` (cmd/worker: on, and
// off with no handler).
//
// # Reservations: key layout and the settlement path
//
// A reservation (`reserve.go`) is a check that holds its cost until settled. Its script
// is check.lua itself with `scripts/reserve.lua` put in place of a hook line
// (`composeReserve`), so the decision is the check's code, not a copy; the engine sends
// it through the same batching loop, re-sends and hydration as a check (`call.src`
// names the script for the EVAL after NOSCRIPT). Admitted, it counts `amount` like a
// check (month counters, every limited window's current bucket, at every level) and
// writes, in the org's slot: the record `r|<id>` (state, amount, expiry, on_expiry,
// period, the counter fields and, per charged window, the bucket it charged), the id in
// `x` (scored by expiry) and `rd` (changed since the last drain), and the amount in
// `h|<period>` (held units). Held units are in the counters, so every later check and
// reservation sees them exactly as used units; committed units are counter - held.
//
// Settlement (`scripts/settle.lua`) moves only a `held` record, so of a commit, a
// release and any number of sweeps, on any replicas and workers, the first wins and the
// rest see its state (a repeated commit or release gets the stored answer, anything else
// 409 naming the state). A record past its expiry is settled by its `on_expiry` whoever
// asks, so the outcome does not depend on when a sweep runs. It gives `amount - used`
// back to the month counters of the record's period and to each charged bucket that is
// still the current or previous bucket of its window (a rolled bucket no longer weighs
// on any decision and is left alone), never below 0, and takes `amount` off the held
// units; `used > amount` adds the excess to the month counters and the current buckets
// with no limit looked at (the work happened: it must be billed). The worker's
// `Engines.RunReservationSweep` runs the same script in sweep mode every
// `QUOTA_RESERVATION_SWEEP` (500 ms) for each org in the Redis's `{|reservations}` set
// (its own slot: Reserve adds the org before its first reservation, and again after any
// sign that Redis lost data, a NOSCRIPT reply or a hydration, checked once more after the
// reservation is made; hydration adds it too). So a reservation made after a Redis
// restart is expired too (`TestReservationExpiresAfterRedisRestart`).
//
// Durability: the committed value of a counter never falls, so the drain
// (`scripts/drain.lua`) returns counter - held for each dirty field and, in the same run,
// the period's changed records; the flusher stores both in one transaction
// (`ledger.Store.PersistDrained`; table `reservations`, a row only ever leaves `held`).
// The ledger stays raise-only and holds committed units, which is what exports bill. On
// hydration `ledger.Store` is also a `quota.ReservationHydrator`: the records of the
// last persist are restored (held ones with their units; settled ones for reads and
// repeated settlements), and a read or a settlement that finds neither record nor
// period marker hydrates first, and each counter becomes `max(in
// Redis, committed + held)`. A reservation settled after the last persist comes back
// held and is settled again from the state it was persisted in: at most one flush
// interval is lost, nothing is given back twice. A settled row is read by nobody once a day
// past its expiry (Redis keeps the record that long): the period's close deletes the
// org's settled rows of that period and earlier ones past that day
// (`TestCloseDeletesSettledReservationRows`), so the table holds about a period's
// reservations, not every one ever made.
//
// Listing (`GET /v1/orgs/{org}/reservations`, `Engine.OpenReservations`): the org's held
// reservations in expiry order, read from `x` a batch at a time (`ZRANGE BYSCORE LIMIT`)
// with the batch's records in one pipeline (KEYS.md), so a page of n unfiltered costs two
// round trips. The cursor is the last id looked at and its expiry (base64url of
// `<ms>.<id>`), so a page is stable while reservations come and go: one settled since is
// simply not there, one opened since appears in its place by expiry. Leases (`l_` ids)
// and records no longer `held` are skipped. `team`/`user` filter on the server; a page
// looks at no more than 1,000 ids, so a filter that few reservations match can give a
// short (even empty) page with a `next_cursor` to follow: a bound on one request's work
// rather than a scan of the whole set. It is read like usage (operator, `admin`,
// `billing`; a console session), is in the admin group, and reads the org's own Redis
// through the engines (`Engines.OpenReservations`), so an org on another pool is listed
// from its pool. Page size 1 to 100 (default 50, not the other lists' 100: each item is a
// Redis read); a bad cursor or limit is a 400 naming it.
//
// For leases (a replica reserving a block for a hot path) the Go API is the primitive:
// `Engine.Reserve(ctx, req, ReserveOptions{TTL, OnExpiry})`, `Engine.Commit(ctx, org,
// anchorDay, id, used)` with `used <= amount` giving the rest back, `Engine.Release`,
// one script run each and no HTTP.
//
// # Several metrics in one decision
//
// A check, a batch item or a reservation may name 1 to 16 metrics (`costs`, `amounts`;
// `quota.Request.More` beside `Metric`), and the spend a priced one adds is a 17th
// counter (`MetricCost.Derived`; the engine takes 16 named and one derived). The check service sorts them by name, checks
// each against the plan (an unknown one is the 422 of an unknown metric) and resolves
// each metric's limits at every level. The engine decides them in one run of
// check.lua: its counters are metric x level (a row's level number is a counter index),
// each counter with its own cost, and every window any row limits is counted at every
// counter, so the decision is all or nothing over every metric, level and window, and a
// denial writes nothing anywhere (KEYS.md "Several metrics" has the arguments; a
// one-metric check's arguments are unchanged, byte for byte). Each level entry and
// `blocked_at` name their metric; RateLimit-* describe the tightest across metrics (the
// least remaining of every metric's rows). The idempotency fingerprint covers every
// metric and cost. A reservation holds each metric's amount; commit takes `used` per
// metric (left out: 0), gives back or over-counts each, exactly once as before (the
// record adds `nm` and `a<m>`; old one-metric records read as they did).
//
// Leases: a multi-metric request is not leased (`leasable`): it always goes to
// Redis. A lease is one metric's path, and admitting a request and its tokens from two
// leases would not be one decision. So an org whose hot traffic is multi-metric gets
// the Redis path's latency for it; the one script run is still cheaper than two
// one-metric checks (BenchmarkCheckTwoMetrics vs ...Apart, in `make bench`). In the
// `local` fail mode (Redis down) the local limiter decides every metric together too.
//
// # Concurrency limits: in-flight units that never leak
//
// A limit with window `concurrent` (`vocab.Concurrent`; plans, overrides, team and user
// allocations; allocation rule as any window: a child's limit may not exceed its
// parent's, 422) bounds the units held at once by open reservations of a level. The
// engine keeps them in one hash per org, `<p>:{<org>}|c`, one field per counter (the
// month counters' fields), with no period: a reservation opened before a period's end
// and settled after it still holds, and is given back, in the same field. Its key is
// derived in the scripts from the month key (like the buckets it is not declared:
// KEYS.md, "Slot migrations"), so neither check.lua's ARGV nor the engine's arguments
// grew.
//
//   - Admission. A concurrent row (window code -1 in the packed rows) is decided with
//     every other row, all or nothing: `held + cost <= limit`. A reservation whose path
//     has any concurrent row adds its amount to the in-flight field of every level (as
//     windows are counted at every level when any level limits them) and records which
//     (`ck`, `cn`, `cf<i>`); a check only tests and holds nothing (its concurrent rows
//     report what is held). A path with a concurrent limit is never leased: a lease is a
//     reservation and would hold in flight, and an admission from it could not see other
//     holders.
//   - Give-back, exactly once. Settlement (commit, release, expiry by the sweep or by
//     whoever asks after `expires_at`) moves only a `held` record, so one of them wins; it
//     takes the record's whole amount off exactly the fields the record names, whatever
//     `used` says (`used` counts against the other windows as before), never below 0, and
//     deletes a field at 0 (the hash is gone when nothing is in flight). `POST
//     /v1/reservations/{id}/extend` (`scripts/extend.lua`) moves a held, not yet due
//     record's `e`, its score in `x` and its record TTL, and marks it changed so the next
//     drain persists the new expiry (the ledger's upsert now updates `expires_at` too); a
//     due one is settled by its on_expiry first and answers 409 expired.
//   - The bound, per fault. *A holder dies* (kill -9, a dropped stream, a client that
//     never releases): its slots come back when its reservation expires, within its TTL +
//     one sweep interval (`QUOTA_RESERVATION_SWEEP`, 500 ms), once
//     (`TestConcurrentKilledHolderSlotsComeBack` kills a real process; two sweepers run).
//     A holder that needs longer heartbeats with extend; its TTL is what a crash costs.
//     *An api replica dies*: the slots it opened are reservations in Redis like any other,
//     expired by the worker's sweep in the same bound; nothing is held in process (no
//     lease, and the local fail mode ignores concurrent rows: degraded answers never hold).
//     *The worker dies*: sweeps stop, so dead holders' slots stay held (never given to
//     two) until a worker sweeps again, or anyone touching the record after its expiry
//     settles it. *Redis loses its data*: hydration restores the held records of the last
//     persist (one flush interval, `QUOTA_FLUSH_INTERVAL`), and when it restored any, it
//     rebuilds the in-flight hash from every held record in `x` (not by adding to it), so
//     a slot is counted once whether the hash survived or not, and none is leaked: a
//     reservation settled after the last persist comes back held and is settled again at
//     its expiry (or by its holder's release), giving its slot back once more in the new
//     Redis only. Reservations made after the last persist are lost with their slots
//     (under-counted, never over). Hydration restores the records of the current period;
//     a reservation held across a period boundary when Redis loses its data is not
//     restored (its slot is free early), the existing limit of reservation durability.
//   - Reads. Usage shows `in_flight` per level for levels with a concurrent limit or
//     anything in flight (`Engine.InFlight`, one `HGETALL`); the console's allocation
//     page has an In flight panel, and concurrent rows in its table read "in flight".
//     Tests: `internal/quota/concurrent_test.go` (64 clients over two engines with user 3,
//     team 5, org 8 sampled throughout; killed holder; extend; Redis loss),
//     `internal/httpapi/concurrency_test.go`, `internal/ledger` (the gauge),
//     `web/e2e/concurrency.test.mjs` (the panel in Chromium).
//
// # Leases (internal/quota/lease.go)
//
// A lease is a reservation an engine takes for itself (`ReserveOptions` with its unexported
// lease flag, `on_expiry` commit) on a hot path (org, team, user, metric above 200 units/s
// on this replica, known from a 50 ms rate window or, for a burst, as soon as one window
// holds twice that: 20 units), so that path's checks are admitted in process: every check,
// single or an item of a batch, first asks its path's lease (`Engine.decide`), a compare-and-swap on one counter (no Redis, no allocation), and
// goes to Redis as before when there is none or it is spent. A timer ends the lease at the
// earliest of `QUOTA_LEASE_MAX`, the end of the current bucket of the path's shortest
// limited window and the period's end; it closes the counter, then commits the units it
// admitted through the ordinary settlement path (exactly once; the rest goes back into the
// same buckets). A lease that is spent or ended is settled first and the next one taken
// after (in the background; the path's checks that come in those two round trips wait for
// it, 20 ms at most, then go to Redis): a path never has two leases of one replica
// unsettled. Size: the path's rate x life x 1.25, capped by the least headroom of its
// limits / (16 x `QUOTA_REPLICAS`), none below 4 units or twice the cost, so the last
// units of a limit are admitted one by one. Never leased: shadow, warn, idempotent,
// `cost: 0`, and `leases: off` (plan field, org override, migration 000012,
// `NoLease` set by `internal/checks`). Cold paths keep no state (a bounded slot table of recent rates).
//
// A replica that dies with leases. Units whose fate is unknown count as
// used: a lease the replica never settled (killed, or its settlement gave up: Redis away
// past the lease's expiry, a failure during `Close`) is committed whole by the worker's
// reservation sweep at its expiry (the lease's end + 1 s + one sweep: 1.75 s with the
// defaults), so what was admitted from it stays counted and is never admitted again, and
// what was not is counted as used. A commit that finds its lease already expired adds
// nothing (the expiry counted all of it); one that finds no record at all (Redis lost it
// with its data before the worker persisted it) counts what was admitted with a forced
// check. A settlement that gives up may still land (its commands queued in a frozen Redis
// run when it resumes: the first commit wins, the rest are replays), so it counts what was
// admitted, plus at most the unused part (`TestLeaseWhoseSettleGaveUpIsCounted`). The
// bound per crash, for any counter (org, team or user usage) and one killed replica:
//
//	over-count <= sum over the replica's hot paths through the counter of (L - admitted)
//	<= sum of L,  L <= min(1.25 x r x QUOTA_LEASE_MAX, H / (16 x QUOTA_REPLICAS))
//
// (r: the path's rate on that replica; H: the least remaining headroom of the path's
// limits when the lease was taken), plus the checks in flight on the replica that Redis
// ran but whose answer died with it (any check, leased or not). For one hot path it is at
// most limit / (16 x `QUOTA_REPLICAS`): a month limit of 2,000 loses at most 125 units per
// kill with the default `QUOTA_REPLICAS=1`, 62 with 2. Over a crash loop each kill's lease
// is sized from what is left, so k kills cost at most H x (1 - (1 - 1/(16 x replicas))^k),
// and the limit is never passed: admitted <= counted <= limit. A lease is never admitted
// from after its reservation can have expired (its life ends 1 s before), so the sweep's
// whole commit always covers what was admitted. Not done: a record of a lease's progress
// that survives its replica. A leased path writes nothing to Redis between its lease's
// reserve and settle (that is the point of a lease), so such a record would be an extra
// write per fraction of a lease; a lease lives at most 250 ms and is already capped at
// 1/16 of the headroom: the sequencing above (one unsettled lease per path) and the size
// bound the cost instead. Figures: docs/PERFORMANCE.md "Exact under faults: leases".
//
// Reservations made through the API keep the `on_expiry` their caller chose. A commit
// that gives up (the client's retries exhausted, the replica gone) leaves the reservation
// held; with `commit` (the default, and what the Go middleware uses unless told) its
// expiry counts the whole amount, at least what was used, so nothing admitted is lost;
// with `release` everything goes back, the caller's stated choice, and the caller was
// told the commit failed and may repeat it (idempotently) until `expires_at`
// (`TestReservationWhoseCommitGaveUp`).
//
// A hot path takes several leases a second, so a lease's record (id `l_...`, never found
// by the API) is kept 10 minutes once settled instead of a reservation's day, is persisted
// only while held (for a Redis that restarts empty) and its row is deleted by the drain
// that sees it settled (`TestSettledLeasesAreNotKept`); a lease is not counted in the
// reservation metrics, its expiry included.
// Metrics: `quotaplane_leases_total` (taken, returned, expired: committed whole before
// its replica settled it, failed: its settlement gave up), `quotaplane_lease_units_total`
// (leased, used, returned, unused_counted: counted as used by such an expiry),
// `quotaplane_lease_checks_total`.
//
// # Token buckets: GCRA in the same run
//
// A limit with Burst B over a window of W us at rate L (units per window) is decided
// with GCRA (scripts/check.lua "Token buckets", KEYS.md): one theoretical arrival time
// per counter, T = W / L us per unit, now the script's Redis TIME in microseconds (one
// clock for every replica's decisions), a cost c admitted at now when
// max(TAT - now, 0) + c x T <= B x T, the TAT then moved to now + that, rounded up to a
// whole microsecond. Bound: let admissions c_1..c_n happen at t_1 <= ... <= t_n, all
// in a real span [a, b]. The first one starts from max(TAT, t_1) >= a, and each adds
// at least c_i x T to the TAT, so after the last the TAT is at least a + (sum c_i) x T;
// the last was admitted only if that TAT is at most t_n + B x T <= b + B x T. So
// sum c_i <= B + (b - a) / T = B + L x (b - a) / W: never more than burst + rate x
// span. Rounding up only raises the TAT (never admits early), at most 1 us a write.
// TestBucketRealSpan checks it on 3,000 random checks of random cost at a rate whose T
// is not whole (7/s); TestBucketOneClockAcrossSkewedReplicas on two engines whose own
// clocks drift apart (the control, decided on those clocks, passes the bound by 239
// units in 1.2 s); the fault schedule with kills and clock steps. Why Redis TIME and not
// the engine's clock of every other decision ("Time"): the engines' clocks agree only
// to their samples' round trips and drift, a few ms, which a bucket turns into units
// over its bound (the fault schedule measured 0.01-0.13 at 10/s when buckets used them).
// A Redis failover moves the clock by the nodes' difference, once. A rate that changes
// (a plan upgraded, a throttle) keeps the units owed, not the time: the key keeps the T
// and the time of its write, and a new T converts what was owed then and pays it off
// at the new rate since (TestBucketRateChangeKeepsUnitsOwed: 1 a day to 100 a second is
// full again in 100 ms, not 10 days). Tests of a fake
// clock and simulations at chosen times (CheckCommand) decide on the engine's now
// instead (Config's bucketsOnEngineClock; the reply's debt is the same either way).
// A denial's retry is the wait until debt + c x T <= B x T, to the ms above; a cost
// above B (or L = 0) can never fit and carries no retry (vocab.Result.RetryAfter 0).
// Shadow and warn count past an empty bucket as empty: it never holds less than 0,
// and a debt already past empty (a burst lowered, a rate raised) stays: a forced check
// never gives tokens.
// A reservation takes tokens; settling gives back the unused ones (the TAT moves back,
// never before now: never more than B tokens) and takes an excess. Leases: a path with
// a bucket is not leased (lease.go's leasable says why). Redis losing the keys makes
// the buckets full again: like sliding windows, the span holding the loss may admit
// one more burst. Values: the debt is kept at most 2^52 us (142 years), so the TAT is
// exact as a double; a bucket whose burst x T is longer holds at most 2^52 us / T
// tokens (1/day: 52,124; a larger cost never fits, and the level counts the tokens
// above as used), so the cap never forgives a unit.
//
// # Sliding windows: the estimate's bound and the precise option
//
// The estimate (default, `sliding_windows: estimate`). A window of length W (ms) and
// limit L counts `c + floor(p x (W - e) / W)`: c the current bucket, p the previous one,
// e the ms elapsed in the current bucket. It is not a count of any real span, and its
// worst real span is about twice the limit. Bound: take a real span [s, s + W) that
// starts at offset x > 0 of bucket k-1 (at x = 0 the span is one bucket, at most L). Every
// admission in bucket k-1 needed c(k-1) <= L, so the span holds at most c(k-1) <= L units
// from it. The last admission in bucket k inside the span, at e <= x - 1, left
// `c(k) <= L - floor(c(k-1) x (W - e) / W)`. So the span holds at most
// `c(k-1) + L - floor(c(k-1) x (W - x + 1) / W)`, largest at c(k-1) = L and x = W - 1:
// at most 2L - floor(2L / W) units in any real span of one window (W in ms; 2L for any
// limit under W/2, e.g. 200 for 100/second), reached by a burst of L in the last
// millisecond of a bucket followed by steady load. Measured (TestPreciseWindowRealSpan,
// check.lua at simulated times, 100/second): 190 behind a burst at 900 ms into a second
// , 199 behind one at 990 ms; random arrivals 102.
// Leases do not change it (a lease's units are charged to the bucket they are admitted
// in). Fixed windows have the same worst case (2L across a boundary); the estimate's
// advantage is smoothness, not the bound (docs/ENVOY.md says so).
//
// Precise (`sliding_windows: precise`). Each bucket also holds, per counter, its
// N = 20 sub-bucket counts (`quota.PreciseSubBuckets`; W/20 each: 50 ms, 3 s, 3 min,
// 72 min), packed in one field `<counter>#` (internal/quota/KEYS.md). A precise check
// counts the current bucket whole plus the previous bucket less its sub-buckets 0..j-1
// (j the current sub-bucket's index): the current sub-bucket and the N before it. That
// span starts at most W + W/N before now and at least W before, so it always contains
// the real window ending now, and nothing is admitted unless every unit admitted in the
// last W, this one included, fits: over-admission is zero in every real span of one
// window. The choice is the conservative one: weighting the oldest sub-bucket would let a burst in it pass
// again, up to L, so only counting it whole bounds the error by a fraction. The price is
// a bounded under-admission: units stay counted up to one sub-bucket (W/N) longer
// than the window, so a check can be refused while the real last window holds fewer
// than L - cost + 1 units, by at most the units of the oldest counted sub-bucket; under
// load that saturates the limit evenly at least N/(N+1) = 20/21 (95.2 %) of L is admitted
// per window (in the test, 500 of 500 for 5 s of one check per ms at 100/second: a
// bursty saturation loses nothing). Measured over the same runs: precise worst real span
// 100 of 100 everywhere, default 190/199.
//
// Neither survives a Redis that restarts empty. Sliding-window buckets are not
// persisted (month counters are): after such a restart a window starts empty, so a real
// span holding the restart can admit up to one more limit on top of either bound. The
// fault schedule reports those spans apart (docs/PERFORMANCE.md: 402-452 in a minute
// span of a 200/minute limit across restarts, 142-201 clear of them).
//
//   - Per plan, with an org override, not per limit. A counter (an org's, a team's) is
//     shared by every check through its level; whether it is counted in sub-buckets must be
//     the same for all of them, or a precise check would meet units an estimate check
//     wrote without sub-bucket counts. With the setting on the plan (and the operator's
//     override per org, as `leases`), every check of an org counts alike and a check
//     counts every window at every level the same way. Units written without sub-bucket
//     counts (an estimate check before the switch) count whole until their bucket leaves
//     (total minus the sub-buckets that left), so a switch to precise never over-admits; a
//     switch back reads the totals, which precise checks keep as before. Per limit would
//     also mean a flag on plan limits, overrides, team allocations, user limits and user
//     defaults, and rules for mixing them, for a cost that is paid per check anyway.
//   - Retry-After and RateLimit-Reset. A denied precise check's retry is exact: the
//     script has every counted sub-bucket in hand and finds the first sub-bucket boundary
//     by which enough units have left for the cost to fit (TestPreciseWindowRetryAfter: one
//     ms before it the check is still denied, at it admitted), at most W + W/N. An allowed
//     check's reset is the end of the current sub-bucket, when the count next falls.
//   - Reservations. The reserve record notes the sub-bucket charged (`ns`, `bs<i>`);
//     settle.lua gives unused units back to that sub-bucket and its bucket's total (if the
//     bucket is still current or previous; a sub-bucket that already left the count is
//     given back too, which changes no count), and adds over-reserved units to the current
//     sub-bucket (TestPreciseReservationSettlesIntoItsSubBucket).
//   - Leases stay on. A lease of a precise path ends with the current sub-bucket of the
//     shortest window (not the bucket), so every unit a lease admits is admitted in the
//     sub-bucket it was counted in and the bound holds; a precise second window's leases
//     live 50 ms at most. Measured (TestPreciseWindowWithLeases, two engines with leases,
//     8 goroutines on one path for 3 s at 200/second behind a start 850 ms into a second):
//     worst real 990 ms span 200 precise (about 80 % of admissions leased) against 369-370
//     for the estimate; 600 admitted in 3 s precise. A lease whose commit finds it expired (a replica stalled past the
//     grace) counts its units by a forced check later, outside the sub-bucket they were
//     admitted in; that stall case is not covered by the bound.
//   - Not covered: the `local` fail mode's in-process limiter (Redis down) and a slot
//     migration (KEYS.md) behave as for the estimate; shadow and warn count over limits by
//     design; commits above the amount are counted with no limit looked at.
//   - Cost. One more field per counter and window read and written (the packed
//     counts), the previous bucket's sub-buckets that left unpacked and one double
//     rewritten per counter: 1.5-1.8x the estimate's Redis time per check
//     (BenchmarkCheckWindows, docs/PERFORMANCE.md). The estimate's path is the script's
//     previous code: the precise functions and tables are made only for a precise check,
//     and a row costs one more untaken test.
//
// Org labels by recent volume (internal/quota/orglabels.go). The first
// `QUOTA_METRICS_ORGS` orgs a replica checks take the free labels. Once they are taken,
// the checks counted as `_other` are also counted per org in a space-saving sketch
// (at most 2 x `QUOTA_METRICS_ORGS` entries; a new org replaces the smallest entry and
// inherits its count as its possible error), and each named org counts its checks of the
// window. Every minute (`EnginesConfig.MetricsOrgsWindow`) the busiest orgs of the sketch
// take the labels of the quietest named orgs when their count, less its possible error,
// is more than twice the named org's; at most `QUOTA_METRICS_ORGS`/10 labels (at least 1)
// change per window. A demoted org's series are deleted (Prometheus keeps its history; a
// later series of it starts at 0, a counter reset to `rate()`). So a noisy tenant that
// arrives late has its own series after its first minute or two, and `_other` holds only
// orgs quieter than every named one: `QuotaplaneRejectionRateHighOrg` reads it as "the
// long tail" (org `_other`). Costs: a named org's check is a read lock and two atomic adds,
// as before; an unnamed org's check also takes the sketch's mutex (a map update and a
// heap fix, O(log 200); the smallest entry a new org replaces is the heap's top: a scan of
// the 200 entries took 6.8 % of the api's CPU with checks spread over 3,000 orgs,
// `BenchmarkOrgLabelsSpread`, `TestOrgLabelsSketchKeepsItsBounds`). Series churn is bounded by
// `QUOTA_METRICS_ORGS`/10 orgs (3 series each) per replica per minute, and only when a
// clearly busier org appears. Checked by `TestOrgLabelsGoToABusyLateOrg` (100 quiet orgs,
// then a noisy one: own series after one window) and `TestOrgLabelsChurnBounded`
// (quota), and the promtool case of the late org in deploy/prometheus/tests.
//
// Pre-initialised series. A counter whose series appears with its first
// event starts at 1, and `rate()` never sees that step: the first 5xx of a route or the
// first denial of a plan went unseen. The api creates at 0, at start:
// `quotaplane_checks_total` for every decision, blocked level, mode and degraded (30
// series); `quotaplane_plan_checks_total{plan="none"}` and
// `quotaplane_org_checks_total{org="_other"}` for every decision (and degraded);
// `quotaplane_http_requests_total` with status 500 and 503 (the 5xx the api answers) for
// every route and method of the router (`chi.Walk`) and for `unmatched`. A plan's or an
// org's series are created for every decision (and degraded value) at once with its first
// check, so its first denial is a step from 0. The worker's unlabelled counters
// (`quotaplane_worker_flush_errors_total`, `quotaplane_worker_webhook_failures_total`,
// `_deliveries_total`, ...) are exported at 0 from registration. Checked by
// `TestMetricsStartAtZero` (httpapi) and the worker's `TestFaultClockHook` (its fresh
// `/metrics`).
package quota
