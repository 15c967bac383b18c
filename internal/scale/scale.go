// Package scale measures what Quotaplane's per-org costs do as the orgs grow: it
// provisions N orgs in a fresh Postgres database through the tenants service in bulk
// (ImportOrgs), counts usage for every org in Redis, and times the worker's flush
// ticks (one with the active orgs' new usage, checking that the ledger then equals the
// counters; a restarted worker's first, after a kill with orgs in flight and with
// none; idle ones), the close scan and the close of every org's period. cmd/scale
// prints the figures; `make scale` runs it.
package scale

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Config says what one run measures.
type Config struct {
	DatabaseURL string // a server where a database may be created (and dropped after)
	RedisURL    string // keys go under a prefix of their own, deleted after
	Orgs        int    // orgs provisioned
	Active      int    // orgs with new usage before the measured active tick (0: every org)
	InFlight    int    // orgs a killed worker had popped and drained, not written
	Ticks       int    // measured idle ticks (average)
	Close       bool   // also close every org's period
	Parallel    int    // periods closed at once (billing.Closer.CloseMany)
	Interval    time.Duration
}

// Result holds the figures of one run.
type Result struct {
	Orgs, Active, InFlight int
	Provision              time.Duration
	// ActivePersist is a tick's writes with Active orgs changed (ActiveTick the whole
	// tick, with its threshold checks); ActiveRead the counters it read.
	ActivePersist, ActiveTick time.Duration
	ActiveVisited, ActiveRead int
	// ActiveDraining and ActiveWriting are its batches' Redis reads and Postgres
	// writes, summed over batches run 8 at a time.
	ActiveDraining, ActiveWriting time.Duration
	// ActiveRedis is the time Redis spent running scripts during that tick (INFO
	// commandstats: every client's, so other traffic on the same Redis counts too).
	ActiveRedis time.Duration
	// CheckRedis is the same of the checks that made every org active, per check: the
	// control for ActiveRedis, measured on the same Redis in the same run.
	CheckRedis time.Duration
	// RedisBytes is Redis's used memory per org once every org has counted (its
	// month counters, dirty set, index and in-flight entries; INFO memory, the
	// whole Redis, so other data on it counts too), LedgerBytes the Postgres bytes
	// per org of usage_counters and usage_daily (tables and indexes), LedgerRows
	// their rows per org.
	RedisBytes, LedgerBytes int64
	LedgerRows              float64
	// LedgerEqual is how many of the active orgs' ledgers equal their counters after it.
	LedgerEqual int
	// Recovery is a restarted worker's first flush after a worker killed with
	// InFlight orgs drained and not written (Recovered orgs read whole, RecoveredEqual
	// of them then stored equal to Redis); AfterTicks the ticks until its after-work
	// (the restart's utilization scan) was done. FirstFlush is a restarted worker's
	// first flush with nothing in flight.
	Recovery                  time.Duration
	Recovered, RecoveredEqual int
	AfterTicks                int
	FirstFlush                time.Duration
	FirstVisited              int
	IdleFlush                 time.Duration // average, after the after-work is done
	DueScan                   time.Duration // the close scan with every period due
	Due                       int
	Close                     time.Duration // every org's period
	Closed                    int
	Cache                     CacheResult
}

// Run provisions cfg.Orgs orgs in a new database and measures; the database and the
// Redis keys are removed afterwards.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Active <= 0 || cfg.Active > cfg.Orgs {
		cfg.Active = cfg.Orgs
	}
	cfg.InFlight = min(cfg.InFlight, cfg.Active)
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	res := Result{Orgs: cfg.Orgs, Active: cfg.Active, InFlight: cfg.InFlight}
	dbURL, drop, err := freshDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return res, err
	}
	defer drop()
	if err := pgdb.Migrate(dbURL); err != nil {
		return res, err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	start := time.Now()
	if err := Provision(ctx, pool, cfg.Orgs); err != nil {
		return res, err
	}
	res.Provision = time.Since(start)
	if res.Cache, err = MeasureCache(ctx, pool, cfg.Orgs, 3); err != nil {
		return res, fmt.Errorf("cache: %w", err)
	}

	prefix := fmt.Sprintf("scale%d", time.Now().UnixNano()%1_000_000_000)
	store := ledger.NewStore(pool)
	engines, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: cfg.RedisURL, RedisTimeout: 5 * time.Second, // as cmd/worker's
		Engine: quota.Config{KeyPrefix: prefix, Hydrator: store}})
	if err != nil {
		return res, err
	}
	defer engines.Close()
	defer deletePrefix(cfg.RedisURL, prefix)
	svc := tenants.NewService(pool)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	worker := func() *ledger.Flusher {
		return ledger.NewFlusher(ledger.FlusherConfig{Store: store, Tenants: svc, Counters: ledger.EngineCounters(engines),
			Interval: cfg.Interval, Logger: quiet})
	}
	tick := func(f *ledger.Flusher) (time.Duration, ledger.FlushStats, error) {
		t := time.Now()
		st, err := f.FlushOnce(ctx)
		return time.Since(t), st, err
	}
	lim := []vocab.Limit{{Metric: "requests", Window: vocab.Month, Limit: 1_000_000_000}}
	// checks counts one unit for each of orgs (round r's user), 8 at a time.
	checks := func(orgs []string, r int) error {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for _, org := range orgs {
			g.Go(func() error {
				req := quota.Request{Org: org, Team: "t0", User: fmt.Sprintf("u%d", r), Metric: "requests", Cost: 1,
					Limits: quota.LevelLimits{Org: lim}}
				_, _, err := engines.Check(gctx, vocab.Route{}, req)
				return err
			})
		}
		return g.Wait()
	}
	every := make([]string, cfg.Orgs)
	for i := range every {
		every[i] = OrgID(i)
	}
	active := make([]string, cfg.Active) // spread over the orgs: every (Orgs/Active)-th
	for i := range active {
		active[i] = OrgID(i * cfg.Orgs / cfg.Active)
	}

	// A running worker: every org has stored usage, then Active orgs change at once.
	mem0 := redisMemory(ctx, cfg.RedisURL)
	f := worker()
	if _, _, err := tick(f); err != nil {
		return res, fmt.Errorf("first flush: %w", err)
	}
	if err := checks(every, 0); err != nil {
		return res, fmt.Errorf("check: %w", err)
	}
	if _, _, err := tick(f); err != nil {
		return res, err
	}
	res.RedisBytes = (redisMemory(ctx, cfg.RedisURL) - mem0) / int64(cfg.Orgs)
	scripts0 := scriptTime(ctx, cfg.RedisURL)
	if err := checks(active, 1); err != nil {
		return res, fmt.Errorf("check: %w", err)
	}
	res.CheckRedis = (scriptTime(ctx, cfg.RedisURL) - scripts0) / time.Duration(len(active))
	scripts0 = scriptTime(ctx, cfg.RedisURL)
	d, st, err := tick(f)
	if err != nil {
		return res, err
	}
	res.ActiveRedis = scriptTime(ctx, cfg.RedisURL) - scripts0
	res.ActivePersist, res.ActiveTick, res.ActiveVisited, res.ActiveRead = st.Persisted, d, st.Orgs, st.Read
	res.ActiveDraining, res.ActiveWriting = st.Draining, st.Writing
	if res.LedgerEqual, err = ledgerEqual(ctx, engines, store, active); err != nil {
		return res, err
	}
	var rows int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM usage_counters) + (SELECT count(*) FROM usage_daily),
		pg_total_relation_size('usage_counters') + pg_total_relation_size('usage_daily')`).Scan(&rows, &res.LedgerBytes); err != nil {
		return res, err
	}
	res.LedgerRows, res.LedgerBytes = float64(rows)/float64(cfg.Orgs), res.LedgerBytes/int64(cfg.Orgs)

	// A worker killed between drain and write: InFlight orgs popped (recorded in
	// flight) and drained, the write never done.
	if err := checks(active[:cfg.InFlight], 2); err != nil {
		return res, fmt.Errorf("check: %w", err)
	}
	eng, _, err := engines.PollEngine(vocab.Route{})
	if err != nil {
		return res, err
	}
	popped, err := eng.PopDirtyOrgs(ctx, -1)
	if err != nil {
		return res, err
	}
	per := vocab.PeriodAt(time.Now(), 1)
	var ps []quota.OrgPeriod
	for _, o := range popped {
		ps = append(ps, quota.OrgPeriod{Org: o.Org, Period: per.ID})
	}
	for _, d := range eng.DrainMany(ctx, ps) {
		if d.Err != nil {
			return res, d.Err
		}
	}
	// The worker started again.
	f = worker()
	if res.Recovery, st, err = tick(f); err != nil {
		return res, fmt.Errorf("first flush after the kill: %w", err)
	}
	res.Recovered = st.Recovered
	if res.RecoveredEqual, err = ledgerEqual(ctx, engines, store, active[:cfg.InFlight]); err != nil {
		return res, err
	}
	for res.AfterTicks = 1; st.Pending > 0 && res.AfterTicks < 1000; res.AfterTicks++ {
		if _, st, err = tick(f); err != nil {
			return res, err
		}
	}
	// And again, with nothing in flight: every org idle.
	f = worker()
	if res.FirstFlush, st, err = tick(f); err != nil {
		return res, fmt.Errorf("first flush: %w", err)
	}
	res.FirstVisited = st.Orgs
	for n := 0; st.Pending > 0 && n < 1000; n++ {
		if _, st, err = tick(f); err != nil {
			return res, err
		}
	}
	ticks := max(cfg.Ticks, 1)
	for range ticks {
		d, _, err := tick(f)
		if err != nil {
			return res, err
		}
		res.IdleFlush += d / time.Duration(ticks)
	}
	if !cfg.Close {
		return res, nil
	}
	closer := billing.NewCloser(billing.CloserConfig{Store: billing.NewStore(pool), Tenants: svc,
		Counters: ledger.EngineCounters(engines), Clock: func() time.Time { return per.End.Add(2 * time.Minute) },
		Logger: quiet, WorkerID: "scale"})
	start = time.Now()
	due, err := closer.Due(ctx)
	if err != nil {
		return res, err
	}
	res.DueScan, res.Due = time.Since(start), len(due)
	start = time.Now()
	failed := closer.CloseMany(ctx, due, cfg.Parallel)
	res.Close, res.Closed = time.Since(start), len(due)-len(failed)
	for _, err := range failed {
		return res, fmt.Errorf("close: %d failed, e.g. %w", len(failed), err)
	}
	return res, nil
}

// redisMemory is Redis's used_memory (INFO memory); 0 when it cannot be read.
func redisMemory(ctx context.Context, redisURL string) int64 {
	var n int64
	redisInfo(ctx, redisURL, "memory", func(name, value string) {
		if name == "used_memory" {
			n, _ = strconv.ParseInt(value, 10, 64)
		}
	})
	return n
}

// scriptTime is the time Redis has spent running scripts (EVALSHA and EVAL) since its
// statistics were reset; 0 when it cannot be read.
func scriptTime(ctx context.Context, redisURL string) time.Duration {
	var total time.Duration
	redisInfo(ctx, redisURL, "commandstats", func(name, value string) {
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
			return
		}
		for _, kv := range strings.Split(value, ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				us, _ := strconv.ParseInt(v, 10, 64)
				total += time.Duration(us) * time.Microsecond
			}
		}
	})
	return total
}

// redisInfo calls line with each "name:value" line of a section of INFO; nothing
// when Redis cannot be read.
func redisInfo(ctx context.Context, redisURL, section string, line func(name, value string)) {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	info, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return
	}
	for _, l := range strings.Split(info, "\n") {
		if name, value, ok := strings.Cut(strings.TrimSpace(l), ":"); ok {
			line(name, value)
		}
	}
}

// ledgerEqual counts the orgs whose ledger of the current period equals their live
// counters in Redis, every counter (and has any).
func ledgerEqual(ctx context.Context, engines *quota.Engines, store *ledger.Store, orgs []string) (int, error) {
	eng, _, err := engines.PollEngine(vocab.Route{})
	if err != nil {
		return 0, err
	}
	per := vocab.PeriodAt(time.Now(), 1).ID
	ps := make([]quota.OrgPeriod, len(orgs))
	for i, o := range orgs {
		ps[i] = quota.OrgPeriod{Org: o, Period: per}
	}
	var equal atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := 0; i < len(ps); i += 1000 {
		page := ps[i:min(i+1000, len(ps))]
		g.Go(func() error {
			stored, err := store.UsageMany(gctx, page)
			if err != nil {
				return err
			}
			for _, p := range page {
				live, err := eng.MonthUsage(gctx, p.Org, p.Period)
				if err != nil {
					return err
				}
				if len(live) > 0 && maps.Equal(live, stored[p]) {
					equal.Add(1)
				}
			}
			return nil
		})
	}
	err = g.Wait()
	return int(equal.Load()), err
}

// CacheResult is what resolving every org's key and org through the api's cache cost.
type CacheResult struct {
	FirstPass, Spread, Concentrated time.Duration // per lookup
	FirstQueries, SpreadQueries     int64         // Postgres transactions committed (pg_stat_database)
}

// MeasureCache resolves n orgs' keys and orgs through a tenants.Cache with its
// default bounds: a first pass over all (cold), then passes spread over all and
// concentrated on 10, counting the Postgres queries.
func MeasureCache(ctx context.Context, pool *pgxpool.Pool, n, passes int) (CacheResult, error) {
	var r CacheResult
	svc := tenants.NewService(pool)
	c := tenants.NewCache(svc, tenants.CacheOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	// Every query the cache makes acquires a connection of pool (pg_stat_database's
	// counters are reported lazily, so they cannot be read back at once).
	commits := func() int64 { return pool.Stat().AcquireCount() }
	one := func(i int) error {
		k, err := c.Authenticate(ctx, Token(i))
		if err != nil {
			return err
		}
		_, err = c.Org(ctx, k.OrgID)
		return err
	}
	pass := func(count int, pick func(int) int) (time.Duration, int64, error) {
		before := commits()
		start := time.Now()
		for j := range count {
			if err := one(pick(j)); err != nil {
				return 0, 0, err
			}
		}
		took := time.Since(start) / time.Duration(count)
		return took, commits() - before, nil
	}
	var err error
	if r.FirstPass, r.FirstQueries, err = pass(n, func(j int) int { return j }); err != nil {
		return r, err
	}
	total := n * max(passes, 1)
	// Twice each, alternating, the second pair kept: the first spread pass runs
	// while the cold pass's garbage is collected.
	for range 2 {
		if r.Spread, r.SpreadQueries, err = pass(total, func(j int) int { return (j * 7919) % n }); err != nil {
			return r, err
		}
		if r.Concentrated, _, err = pass(total, func(j int) int { return j % min(10, n) }); err != nil {
			return r, err
		}
	}
	return r, nil
}

// ProvisionDatabase creates a database on dbURL's server, migrates it and provisions
// n orgs, and returns its URL; the caller drops it (for driving a real api with load).
func ProvisionDatabase(ctx context.Context, dbURL string, n int) (string, error) {
	u, _, err := freshDatabase(ctx, dbURL)
	if err != nil {
		return "", err
	}
	if err := pgdb.Migrate(u); err != nil {
		return u, err
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return u, err
	}
	defer pool.Close()
	return u, Provision(ctx, pool, n)
}

// freshDatabase creates a database on dbURL's server and returns its URL and a
// function that drops it.
func freshDatabase(ctx context.Context, dbURL string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", nil, err
	}
	name := fmt.Sprintf("quotaplane_scale_%d", time.Now().UnixNano()%1_000_000_000)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), func() {
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		conn.Close(context.Background())
	}, nil
}

// deletePrefix removes the run's keys.
func deletePrefix(redisURL, prefix string) {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	it := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var batch []string
	for it.Next(ctx) {
		if batch = append(batch, it.Val()); len(batch) == 1000 {
			rdb.Del(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Del(ctx, batch...)
	}
}
