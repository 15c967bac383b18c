// Package ledger keeps Quotaplane's usage durable: it persists the live month
// counters, reservations and would-block records of the quota engine into Postgres
// (Flusher, which drains what changed in Redis), restores them into an empty Redis
// (Store.StoredUsage and Store.StoredReservations, the engine's hydrators), and raises
// the usage.threshold events of what it flushes (recorded and queued through
// internal/webhooks).
//
// Postgres is the record, Redis holds the live counters: a counter's stored value
// only ever goes up (GREATEST), so flushes from several workers, in any order, and a
// close racing a flush, cannot lose units. What Redis counted since the last flush
// is lost if Redis restarts empty: at most one flush interval.
//
// internal/billing closes periods over the ledger's rows (PeriodLock, UpsertCounters,
// RecordDaily in its transaction) and reads them for usage reports.
//
//   - The split of billing: `internal/ledger` owns the usage rows, the `Flusher`
//     (drains from Redis), hydration (`ledger.Store` is the engines' `Hydrator` and
//     `ReservationHydrator`), threshold events and `EngineCounters`; `internal/billing`
//     owns `Closer` (periods and their close), exports, usage reads, would-block reports
//     and adjustments, over a `ledger.Store`; `internal/webhooks` owns `Envelope` (the one
//     event type: it is the webhook's body), `RecordEvent` (in the caller's transaction,
//     queued through a `webhooks.Enqueuer`), `Deliverer`, `Service` (the webhook API) and
//     the delivery log. Only `internal/worker` imports River: it registers the heartbeat,
//     the close scan, the close of one period and webhook delivery, and gives webhooks its
//     queue (`worker.DeliveryQueue`). Job kinds (`billing.close_period`,
//     `billing.close_scan`, `billing.webhook`), cache names (`billing_limits`,
//     `billing_events`) and the `billing.flush` span keep their names: dashboards and
//     queued jobs use them.
//
// # Durability and billing
//
// Redis holds the live counters; Postgres is the record. `internal/billing` owns the
// tables of migration 000003: `usage_counters` (the ledger), `billing_periods`,
// `period_usage` and `billing_lines` (closed periods), `usage_adjustments`,
// `billing_events` and `webhook_deliveries`, and `usage_daily` of migration 000006 (000004
// is unused). It depends on `quota` (counters, periods,
// `Hydrator`) and `tenants` (orgs, limits, pricing), never on the HTTP layer.
//
// Persistence. Every worker runs a `ledger.Flusher` loop every
// `QUOTA_FLUSH_INTERVAL` (2 s). For each org it visits it drains the current and the
// previous period: the org's dirty set (`<p>:{<org>}|d|<period>`, in the org's hash
// slot) is popped atomically by a script together with the counters' values, so no
// tick scans the keyspace and nothing needs a global key, which Redis Cluster would not
// allow next to the org's keys. The orgs go in batches of 500 (by engine): one run of
// `drain.lua` per org (both periods, with their would-block versions), 64 orgs per
// pipeline (`quota.Engine.DrainMany`), then one transaction per batch
// (`Store.PersistMany`): the periods' advisory locks in one order, one
// `INSERT ... ON CONFLICT DO UPDATE ... WHERE usage_counters.units < EXCLUDED.units`
// for every counter of the batch, the daily rows of the periods that rose and the
// adjustments of those already closed. A stored value only ever rises, so several
// workers (each drains a disjoint part), stale writes and retries are harmless. A batch
// that cannot be written is written org by org, so one org that fails holds back no
// other; if an org's write fails, its drained fields are no longer dirty, so the next
// tick reads that org's period whole (`MonthUsage`) instead.
//
// A worker killed -9 between a pop and its write forgets that, but not the pop: the pop
// script records each org it takes in the index's in-flight record (`<p>:|f`, a sorted
// set scored by the pop's Redis time, unique per pop), and the worker removes the entry,
// with the score it popped, only after the org's write. A worker's first flush reads
// whole every org recorded there (what a dead worker may have drained: without it a
// drained counter that never changed again, a user whose limit is spent, stayed behind
// in the ledger until a Redis restart lost it; `make faults SEED=1`,
// `TestFlushAfterAWorkerKilledMidFlush`), so it costs what was in flight, not the orgs
// that exist. Every `recoverAfter`/2 any worker also reads the entries older than
// `recoverAfter` (a tick's deadline and 10 s: no live worker drains that long after its
// pop), so a worker killed while others keep running is recovered within ~25 s
// (`TestSurvivorPersistsAKilledWorkersDrain`). Threshold checks and stored utilization,
// which read each org's limits, run after the writes in what is left of the tick and
// carry over (`afterWork`): events are late under load, never lost.
//
// Only the orgs that changed. Listing every org and draining each on
// every tick cost 133 ms per 2 s tick at 1,000 idle orgs and 1,345 ms at 10,000, and
// under load ticks were abandoned. Now every script that leaves work for the flush
// (check.lua when a counter field is new in the org's dirty set, reserve.lua, settle.lua,
// extend.lua, adjust.lua and the re-dirty script, wouldblock.lua) adds the org to a
// dirty-org index in the same script run: one set per Redis (`<prefix>:|o`), and on
// a Redis Cluster one per slot, named with a short tag of that slot
// (`<prefix>:{o123}|o`, `quota.slotTag`), so it is always in the org's slot and the
// script stays single-slot. A check adds nothing when its fields were already dirty
// (one `SADD` only when one is new: no cost on the hot path). The flusher takes each
// index with `SPOP` (atomic: an org that changes after the pop is in the index again,
// and a field that was already dirty when the org was popped is drained by the same
// tick, which drains after it pops), reads those orgs' routes in one query
// (`tenants.Service.OrgRoutes`), and drains them as above. Orgs whose flush failed, or
// that need a whole read, are kept in memory and visited next tick; orgs with a Redis of
// their own are listed once a minute (`DedicatedOrgs`, on the partial index of
// migration 000021) and visited every tick (their Redis keeps no shared index).
// `TestFlushVisitsDirtyOrgsAndCatchesChangesDuringATick`: an
// idle tick visits no org; an org checked while a tick runs (after the pop: a counter
// the tick already drained, and an org it had not popped) is persisted by the next
// tick; every ledger test (kill -9, Redis loss, reservations, would-block) runs on the
// indexed path. What a worker per Redis or several workers do: each pops a disjoint
// part of the index, and each org's drain stays atomic, so several workers share the
// work and none persists a value twice; a worker killed between a pop and its writes
// leaves its in-flight entries, read whole as above. Tick budget and lag: `quotaplane_worker_flush_orgs`,
// `quotaplane_worker_flush_dirty_orgs`, `quotaplane_worker_flush_budget_ratio` (the last
// tick's duration over the interval) beside `quotaplane_worker_flush_lag_seconds`.
// Measured with `make scale` (docs/SCALING.md).
//
// Daily history. In the same transaction, when a flush raised anything, the org-level
// ledger values of the metrics it wrote are copied into `usage_daily (org_id, period,
// metric, day, used)` for the UTC day of the flusher's clock (for a period that has ended,
// its last day: usage counted before the end and flushed after it). The upsert keeps
// `GREATEST(stored, new)`, so the row is the org's cumulative usage of the period at the
// end of that day as far as it is known, monotonic and idempotent like the ledger, and it
// reads the ledger rather than the drained values, so a stale write cannot record less
// than what is stored. The close writes the final totals for the period's last day. A day
// without a row saw no change (the flusher writes only what changed). This is one row per
// org, metric and day with usage: ~31 rows per metric a month, not worth a rollup job.
// History starts when this version's worker first flushes; days before that have no rows.
// The flusher is a plain loop rather than a River periodic job: a 2 s job would add
// ~43,000 job rows a day for nothing River's retries give here. A clean shutdown flushes
// once more. Orgs are reached where the api counts them: `REDIS_URL`, the plan's pool in
// `QUOTA_REDIS_POOLS`, or the org's dedicated Redis: both binaries read counters
// through `quota.Engines.EngineFor` (`ledger.EngineCounters`), the same mapping that
// routes checks, so the two can never disagree.
//
// Rehydration and the loss bound. The api's engines get `ledger.Store` as their
// `quota.Hydrator`. When a Redis restarts empty, fails over to an empty replica or is
// flushed, the month hash loses its period marker with its counters; the check script
// then refuses to decide (`H`), the engine asks the Store for the ledger's values once
// per org and period, `hydrate.lua` sets each counter to max(in Redis, stored) and the
// marker atomically, and the check is retried. So no check is decided on an empty
// counter, and what is lost is what Redis counted after the last flush: at most one
// flush interval of usage (plus the time one flush takes). With no traffic in the last
// interval nothing is lost. `TestKill9RedisRestoresUsageWithinOneFlushInterval` kills -9 a
// private redis-server without persistence, quiet and mid-traffic, and checks both. Sliding
// windows are not persisted: after a Redis loss they start empty (at worst one window of
// extra admissions), which the month limit still bounds.
//
// Would-block records (the shadow and warn report). An org rolls out shadow ->
// warn -> enforce; before the last step its admin needs to know whom enforcing would
// hurt. The engine counts every check that `enforce` would have denied (shadow and warn
// only; a replay of an idempotent check once) after the decision, in process, per org,
// period, limit (metric, level, team, user, window) and UTC day, with its units, and adds
// the counts to a per-org, per-period Redis hash about once a second
// (`scripts/wouldblock.lua`; layout and exactly-once re-sends in
// KEYS.md). `check.lua` is untouched: recording after the
// decision keeps the script's instruction budget, and an allowed check pays one nil test
// (`BenchmarkWouldBlockPath`; the record alone is a map update under one of 16 shard
// locks with no allocation, `BenchmarkWouldBlockRecord`). The cap: at most
// `quota.Config.WouldBlockCap` (1,000) distinct rows per org and period, in Redis and
// pending in each process; what would have been blocked at further limits is counted in
// one row of level `other`, so the totals stay exact and memory stays bounded however
// many ids a flood names (`TestWouldBlockBoundedByCap`; the API's answer says
// `capped`). The worker's flusher reads each org's record version for the current and
// previous period (one `HMGET`), and when it changed, the record (`HSCAN`) into
// `would_block` (migration 000011), raised with GREATEST per epoch: the hash's epoch is
// new whenever Redis creates it again, so after a Redis loss the new counts add to the
// stored ones instead of hiding under them (`TestWouldBlockSurvivesRedisFlushDB`). What a
// Redis loss costs is what the worker had not copied yet (one flush interval plus the
// engine's second). `GET /v1/orgs/{org}/would-block?period=` (`billing.Service.WouldBlock`)
// adds the stored epochs and raises the live record's own epoch to Redis's values, so it
// is about a second behind the checks even with no worker; a degraded answer (fail mode
// `open` or `local`) is not recorded, since Redis did not decide it.
//
// Period close. A River periodic job `billing.close_scan` (every minute, and at start)
// lists, per org, the two latest periods that ended more than `QUOTA_CLOSE_GRACE` (1 min)
// ago and are not closed, in one query (the 56 candidate periods of the 28 anchor days are joined to the
// orgs of each day and the closed ones dropped by `billing_periods`' key), and inserts
// them in `billing.close_batch` jobs of 100 (unique by their items), each closing 4 at a
// time (`Closer.CloseMany`); a period that fails becomes a `billing.close_period
// {org, period}` job of its own, retried by River as before. Each close is the same
// exactly-once transaction below, so two workers running overlapping batches close each
// period once (`TestMonthBoundaryClosesEveryOrgOnceWithTwoWorkers` runs the scans of
// two workers on batch jobs).
// A single job is unique per org and period (River `UniqueOpts{ByArgs}`), and idempotent
// besides: in one transaction under a per-org-and-period advisory lock (the same lock the
// flusher's writes take) it returns at once if the period is closed; otherwise it raises
// the ledger to Redis's full `MonthUsage`, inserts `billing_periods`, copies every counter
// into `period_usage` with the month limit in force, writes one `billing_lines` row per
// metric used or priced (included units, overage units, amount = overage x overage price
// computed in Postgres `numeric`, currency), and records a `period.closed` event. Triggers
// make these rows immutable. The worker logs each close with its lines. A flush that
// arrives after the close (a check counted late in the old period) raises the ledger as
// usual; under the lock the flusher sees the period closed and appends the difference to
// `usage_adjustments`, so late usage is reconciled, not lost: exports and the usage API
// of a closed period add the adjustments to the closed rows. Anchor days other than 1
// shift each org's periods (`vocab.PeriodAt`); the period id is the month it starts in.
//
// Usage API and exports. `GET /v1/orgs/{org}/usage` answers a closed period from its
// rows (month limits as at close) and an open one from the ledger raised to Redis's live
// counters, with the current limits; for the current period the sliding windows of each
// level are read with cost-0 checks, which count nothing. Each metric carries `daily`,
// the period's `usage_daily` rows (open and closed periods alike); in the current period
// today's point is raised to the live org total, so the series ends where the bars do.
// Gaps are left to the client (they mean "no change"), so the API states only what was
// recorded. Exports are one SQL query per page of 100 orgs, run with
// `enable_nestloop` off in a read-only transaction and with the team remainders computed
// by a window over the usage rows rather than a join to a per-team aggregate: on a
// database never analysed the planner nested that join, 29.9 s at 1,000 orgs before the
// first byte; every join is an equality, so hash joins always exist and stay linear
// whatever the estimates (`TestExportWithoutStatisticsStreamsFast`, autovacuum off, no
// ANALYZE, 1,000 orgs of 100 users: first byte 276 ms, all 106,000 rows in 3.4 s; 162 s
// before the change on this machine). Each page is
// streamed row by row (pgx reads rows as they arrive; the writer flushes every 1,000
// rows), ordered by org, then team and user, then the org's total rows: user rows, a team
// row for units counted at the team without a user, and per metric an org total row with
// included units, overage and amount (pricing recorded at close, or the plan's current
// pricing for an open period). An open period is exported from the ledger, so it is at
// most one flush interval behind Redis. Headers are sent with the first row, so an error
// after that truncates the body (a JSON export then lacks its closing `]`). Measured
// (`TestExport100kUsersStreamsWithFlatMemory`, under -race): 100,000 users export in
// about 2 s (CSV) with a peak heap 2.5 MiB above the baseline, the same as for 10,000
// users.
//
// Events and webhooks. After each flush the written counters are compared with their
// month limits: crossing 80 % or 100 % records a `usage.threshold` event once per org,
// period, level, id, metric and threshold (`billing_events` has a unique dedup key, and
// the flusher remembers what it recorded, so an over-threshold counter costs no query),
// and the event's delivery job `billing.webhook` is inserted in the same transaction.
// The month limits come from a cache the worker drops an org from when an api replica
// announces a change on the invalidation channel (`Flusher.LimitsChanged`); that org's
// current period is then read whole at the next flush, so a counter that crossed a
// threshold of a limit changed just before, judged once against the old limits, raises
// its event one flush interval after the change, though it never moves again.
// The job POSTs `{"id","type","org","period","created_at","data"}` with
// `Quotaplane-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, keyed with the
// org's signing secret (HMAC-SHA256 of the org id under `QUOTA_WEBHOOK_SECRET` until the
// org rotates it, see *Signing secret rotation* below; without that setting events are
// recorded and nothing is sent). Signing and verifying live in
// the client module's public package `client/webhook` (`webhook.Sign`, `webhook.Verify`,
// standard library only), so a customer's Go service imports the very code the worker
// signs with; `internal/billing` uses it, and the older public package `webhook/` at the
// repository root delegates to it (same constants, same error values). A non-2xx answer or a network
// error is retried by River with exponential backoff (up to 20 attempts). The HTTP client
// checks the address every connection dials, after DNS resolution, and refuses loopback,
// private, link-local, CGNAT and other non-public ranges (the job is then cancelled), never
// follows redirects and ignores proxy settings; `QUOTA_WEBHOOK_ALLOW_PRIVATE=true` lifts
// the address check for tests and local development. Every attempt is a
// `webhook_deliveries` row (status, error, attempt). Its error is in the API's own words
// (`webhooks.DescribeSendError`, never Go's dial errors): "could not connect to the endpoint (connection refused)", "DNS lookup failed
// for <host>", "timed out after 10 s", "TLS handshake failed (...)", "receiver answered
// 500"; a test send (`POST .../webhook/test`) says the same. Orgs read both over the API (admin
// scope): `GET /v1/orgs/{org}/webhook` gives the URL, the signing secret, the signature
// header and the event types, and `url_warning` when the URL names an address the worker
// refuses by default (`billing.URLWarning`: the worker's own address check on an IP
// literal or `localhost`; names are checked when the worker dials, so the API does no DNS); the api derives the secret exactly as the worker does, so
// it needs the same `QUOTA_WEBHOOK_SECRET` (without it the secret is `null` with a `note`;
// a console viewer also gets `null`, since the key would let it forge the org's webhooks;
// the answer is `no-store`). `GET /v1/orgs/{org}/webhook-deliveries` lists the attempts
// newest first, keyset-paginated on the row id with the same `limit`/`cursor` conventions
// as every other list (`webhooks.Store.Deliveries`); a status of 0 (no answer) is `null`
// on the wire, as is the error of a success. The secret shown is the org's current one:
// derived until its first rotation, its own after.
// `POST /v1/orgs/{org}/webhook/test` (`billing.Service.TestWebhook`) sends one
// `webhook.test` event synchronously through the worker's own delivery code (`deliver`:
// same headers, same signature, same public-only client unless the api runs with
// `QUOTA_WEBHOOK_ALLOW_PRIVATE=true`) and answers the receiver's status, or the error and,
// for a refused non-public target, the `url_warning` words. It is not recorded in
// `billing_events` (whose types are checked) nor retried: a test is a question asked now,
// and a log row would need an event row to point at. The request is audited
// (`webhook.test`, `tenants.Service.RecordAudit`) like the URL changes it follows.
//
// Signing secret rotation. A derived secret could only be rotated for every
// org at once (by changing `QUOTA_WEBHOOK_SECRET`). `POST /v1/orgs/{org}/webhook/secret/rotate`
// (operator or the org's `admin` key; `webhooks.Service.RotateSecret`) gives one org a
// random secret of its own (32 bytes from crypto/rand, hex, as long as a derived one),
// answered once with `previous_expires_at`. Migration 000020's `org_webhook_secrets`
// holds, per rotated org, the secret, the previous one and its expiry, upserted in one
// statement with the audit row (`webhook.secret.rotate`, the expiry only) in the same
// transaction. An org without a row keeps the derived secret, so receivers set up before
// rotation existed see no change. The replaced secret (the derived one at the first
// rotation) still signs for `webhooks.SecretGrace` (24 h): meanwhile `deliver` signs with
// both, `t=<unix>,v1=<new>,v1=<previous>` (`webhook.SignAll`), as Stripe does during a
// roll, and `webhook.Verify` (Go) and `verifyWebhook` (TypeScript) accept a header when
// any `v1` is the secret's, comparing every one in constant time; their signatures did not
// change. A second rotation within the day drops the oldest secret at once (at most two
// sign). The worker reads the row per delivery (`Store.signingSecrets`, one primary-key
// read beside the event's), so a rotation applies from the next attempt. The secrets are
// stored sealed, AES-256-GCM under a key derived from `QUOTA_WEBHOOK_SECRET` with the org
// id as additional data, so the database alone (a backup, a replica) still cannot forge an
// org's webhooks, as before when nothing was stored; a server with another
// `QUOTA_WEBHOOK_SECRET` cannot open them (the delivery fails and is retried, and the
// api's `GET .../webhook` answers 500): changing it means rotating every org that had
// rotated. Tested by `TestRotateWebhookSecret` (internal/httpapi: real Postgres, the
// worker's `Deliverer` with an injected clock, before, within and after the grace, the
// other org, refused keys, the audit row and the stored rows).
//
// Operations. The worker serves `/healthz` and `/metrics` on `QUOTA_WORKER_HTTP_ADDR`:
// `quotaplane_worker_flush_lag_seconds` (since the start of the last complete flush: the
// usage a Redis loss would cost now), `quotaplane_worker_flush_duration_seconds`,
// `quotaplane_worker_usage_rows_flushed_total`, `quotaplane_worker_flush_errors_total`,
// `quotaplane_worker_flush_orgs`, `quotaplane_worker_flush_dirty_orgs` and
// `quotaplane_worker_flush_budget_ratio` (the orgs the last tick visited and
// popped, and its share of the interval),
// `quotaplane_worker_jobs{kind,state}` (River's job table at scrape time),
// `quotaplane_worker_periods_closed_total`, `quotaplane_worker_webhook_deliveries_total`,
// `quotaplane_worker_webhook_failures_total`,
// `quotaplane_worker_oldest_unclosed_period_end_timestamp_seconds` and
// `quotaplane_worker_month_utilization_ratio{org,level,metric}` (both under "Metrics"
// below).
package ledger
