// Package faulttest is the fault schedule with an oracle (in the spirit of
// Jepsen): it runs api replicas and the worker, real binaries built from the checkout,
// on a private redis-server behind a TCP proxy and a fresh Postgres database; drives
// checks, reservations and a leased hot path over HTTP; injects faults on a schedule
// drawn from a seed (kill -9 of a replica and of the worker, Redis restarted empty,
// connections cut or their replies dropped, clock steps); and then compares what the
// clients were told with the Redis counters, the usage API and the billing export.
// "Fault schedule" below says how to read its output.
//
// # Fault schedule
//
// `internal/faulttest` is the fault schedule with an oracle (in the spirit of
// Jepsen). `TestFaultSchedule` runs it in `make test` on a fixed short schedule (seed 1,
// 45 s of load, every kind of fault twice, about a minute in all; in `make test-faults`,
// alone, not beside the other packages' tests, since its loss allowances are measured in
// real time), and `make faults
// SEED=... DURATION=...` (default a random seed and 10m) on a random one. The driver runs
// under `-race` in both. `make faults` builds the binaries with `-race` too (`RACE=0`: not),
// and a data race any of them reports fails the run; `make test` builds them without it,
// to keep the schedule near a minute: with `-race` the build took 1 min 52 s and the run
// 165 s in all instead of ~65 s (the hot path was still leased: 35,876 leased 200s of
// 40,760, against ~48,000 of ~53,000 without).
//
//   - What runs. `quotaplane-api` x 3 and `quotaplane-worker`, built from the checkout,
//     on a fresh database and a private `redis-server` on a free port (`--save ""
//     --appendonly no`; never the shared 6379), the replicas through a TCP proxy the driver
//     owns, the worker straight to Redis; `QUOTA_FLUSH_INTERVAL=250ms`,
//     `QUOTA_RESERVATION_SWEEP=200ms`, `QUOTA_REPLICAS=3`, `QUOTA_REDIS_TIMEOUT=1s`. Every
//     child gets SIGKILL if the driver dies (`Pdeathsig`), and SIGINT/SIGTERM of the driver
//     stops them all before it exits; t.Cleanup stops them otherwise.
//   - The org. A plan that fails `closed` (a check without Redis answers 503, never an
//     uncounted 200) with org month limits of 10^8 requests and tokens; team `month`
//     (3,000 a month per 45 s of load, users 400 each: both levels bind), team `hot`
//     (users 3,000 a month), team `rate` (users 10 a second and 200 a minute), team
//     `burst` (users a token bucket: 10 a second, burst 30), team `resv` (users 5,000
//     tokens a month), team `cap` (no limits of its own; its checks count `gpu` units,
//     which the operator's capacity `faults-gpu` holds to 100 a second across every
//     replica). Users are unregistered (the team's defaults); those of `month`
//     and `resv` change every minute (`m0.3` is user 3 of the first minute), so a long
//     run keeps their limits binding.
//   - The load (over HTTP, to 127.0.0.1 only, for the run's duration): the hot path,
//     two clients per replica in a loop on one user of team `hot`, leased (the report
//     says how many 200s were `leased`), moving to the next user after 30 denials, and
//     a client that keeps checking the spent hot users (units given back uncounted are
//     admitted there again); 8 users of `month` with costs 1-3; 3 users of `rate` at
//     ~50 checks a second; 3 users of `burst`, each pressing its bucket past empty
//     (~100 checks a second of costs 1-3 for 1-3 s) then resting 0.5-3.5 s while it
//     refills (~50 checks a second in all, a burst to spend at most presses); 2 users
//     of `cap`, each ~100 checks a second of 1-2 gpu units (about three times the
//     capacity);
//     reservations of 1-50 tokens, committed with used <= amount (6 in 10), released (2
//     in 10) or left to expire (2 in 10, TTL 1-3 s, `on_expiry` commit or release at
//     random). No request is re-sent (POST without an Idempotency-Key header).
//   - The faults, one at a time, each healed before a gap of 0.7-2 s, none in the last
//     8 s, drawn from the seed and printed with their time: `kill-api` (kill -9 of a
//     replica, down 0.2-1.7 s, restarted on its port, ready again), `kill-worker` (kill -9,
//     down 0.2-2.2 s, restarted, `/healthz` again), `restart-redis` (writes paused, the
//     month counters read, kill -9, the ledger read, restarted empty: hydration brings the
//     counters back), `cut` (the proxy closes every api-Redis connection and refuses new
//     ones for 0.3-2 s), `drop` (the proxy swallows Redis's replies on the open
//     connections for 0.3-1.5 s: commands run, callers time out), `clock` (SIGUSR1 or
//     SIGUSR2 to a replica, or to the worker in a random schedule: its engine clock steps
//     +-2 s; only when the checkout has the `QUOTA_FAULT_CLOCK` hook, `FAULTS_CLOCK=off`
//     leaves them out).
//   - After the load the driver waits until no reservation or lease is held (the
//     worker's sweep expires those left; any still held 30 s later are a finding, printed
//     with their expiry and the sweep's set of orgs) and the export agrees with Redis (or
//     20 s), then
//     reads the month counters of Redis (less held units), the usage API and the billing
//     export of the open period. The export of an open period is the ledger (the worker's
//     flush), so no period needs closing: closing the current one would need the clock
//     moved past its end.
//
// The oracle. Each call's answer bounds what it counted: a 200 check its cost; a 429 or
// a refused connection nothing; a timeout or a 5xx anything from nothing to its cost
// (`unknown`, Jepsen's indeterminate); a reservation committed with a 200 its `used`;
// released, nothing; left to expire (or its settle refused before it was sent, or a 409),
// what its `on_expiry` counts; a settle of unknown fate, either. Per counter (org, team,
// user, metric): `admitted` is what the clients were certainly told, `unknown` the calls
// of unknown outcome.
//
//   - `over` = admitted - limit (month limits) beyond what Redis restarts measurably lost
//     (a restart that lost X units lets up to X more in, even where a forced check counts
//     a forgotten lease's units again later): must be 0.
//   - `lost` = admitted - counted (Redis) beyond what Redis restarts lost: must be 0.
//   - `extra` = counted - (admitted + the unknown calls' units + what leases settled at
//     expiry counted + what a restart gave back): must be 0. A lease that expires (its
//     replica died, or its settle gave up) is committed whole ("Leases" above): the leases'
//     documented over-count, measured per lease from its record (the driver reads the org's
//     held set every 50 ms, and again while Redis's writes are paused before a kill, and each
//     lease's record until it is settled, since a Redis restart erases them). Each such lease
//     must hold at most its path's month limit / (16 x `QUOTA_REPLICAS`), the bound per crash
//     stated there.
//   - `Redis restarts: lost/gained (allowed)`: at each restart the driver pauses writes
//     (`CLIENT PAUSE WRITE`), reads the month counters (held units included), kills Redis,
//     and reads the ledger with its held reservations (one settled since the last flush
//     counted as its expiry will count: it is held again after the restart and nobody
//     settles it twice). Lost is what Redis had and the ledger not; it must not exceed the
//     units admitted within one flush interval + 250 ms (the flush's own run) before the
//     kill (checks, reservations, commits, leases taken, and calls of unknown outcome then),
//     internal/ledger's loss bound, or since the start of the worker's last complete flush
//     (`quotaplane_worker_last_flush_timestamp_seconds`) when that is older, or to the
//     worker's last kill when the restarted worker has not completed a flush yet: a loaded
//     machine or a worker just restarted flushes late, and the fault line prints how late.
//   - The usage API's used and the export's units must equal Redis's counter; no unit may
//     stay held.
//   - Sliding windows: for each limit of `rate`, the most units admitted in any real span
//     [t, t + window), counting a call only when its whole send-to-answer interval is in the
//     span (never overstated), must not exceed the two-bucket bound, 2 x limit. Spans within
//     a window of a Redis restart are reported apart (buckets are not durable).
//   - Token buckets: for each limit with a burst, over every real span [start_i, end_j] of
//     two certainly admitted checks (i <= j by start), the units of the checks whose whole
//     send-to-answer interval lies in it must not exceed burst + limit x span / window with
//     span = end_j - start_i, the GCRA's bound (internal/quota/doc.go "Token buckets").
//     The true admission times lie inside the span, so the figure never overstates; the
//     comparison is exact (integers). No allowance for the replicas' clocks: a bucket is
//     decided on its Redis's `TIME`, one clock whichever replica asks. The report prints
//     how far apart the replicas' engine clocks certainly were (each reservation's
//     `expires_at` less its ttl, read between the call's send and answer): 6-15 ms on a
//     loaded 2-core machine, which, while buckets were decided on those clocks, put the
//     worst spans 0.01-0.13 units over the bound (docs/PERFORMANCE.md). A span that meets
//     a Redis restart (writes paused to Redis ready again) is reported apart, allowed one
//     more burst per restart it holds (a bucket Redis lost comes back full); above that it
//     is a finding too. Clock steps get no allowance: the hook steps an engine's wall
//     reading only (internal/platform/faultclock) and no Redis clock, so the bound holds
//     through them. A leased 200 on a bucket's path is a finding (such a path is never
//     leased).
//   - The capacity: the gpu units certainly admitted within any real second (a check
//     counted only when its whole call lies in the span) must not exceed its limit, 100:
//     a replica's grant is counted in the capacity's window when taken and spent only
//     within the sub-bucket it was counted in, so kills of replicas, cuts and clock
//     steps leave no room (capacities are decided on Redis TIME and the replicas'
//     monotonic clocks). A second within a second of a Redis restart may hold one more
//     limit per restart (the window is not durable). A run in which nothing was
//     admitted, or nothing refused, by it is a finding too (the load missed it).
//
// Reading the output. The run prints the seed, each fault with its time since the load
// started and its UTC time, and for a Redis restart what it lost; then the calls by
// outcome, the leases (leased 200s; records committed, settled by expiry and how they
// counted, lost with Redis), one table row per counter (`counter window limit admitted
// unknown counted usage-API export over lost extra lost/gained (allowed)
// lease-over-count`; users with nothing to report are summed into one row per team),
// one per sliding window (`limit bound worst-real-span over
// worst-span-with-a-Redis-restart`) and one per token bucket, after the line saying how
// far apart the replicas' engine clocks were (`rate burst admitted`, then the worst
// real span as `units in length (bound) at from-to` since the load started, its
// `excess`, units minus the bound without skew: negative is within it, by that much,
// and what it `needs`, the excess as time at the rate: a finding when more than the
// clocks were apart; then the same over the spans holding a Redis restart, their bound
// a burst more per restart). Each finding is a test error naming the seed, the counter,
// when it was admitting, the faults meanwhile and its leases settled at expiry; rerun
// it with `make faults SEED=<seed> DURATION=<duration>` (the schedule is the seed's;
// timings, and so the figures, vary).
package faulttest
