// Package scale measures what Quotaplane's per-org costs do as the orgs grow (issue
// 29): it provisions N orgs in a fresh Postgres database through the tenants service
// in bulk (ImportOrgs: 100,000 orgs in seconds), counts usage for a few active orgs in
// Redis, and times the worker's flush ticks (the first, which reads every org
// whole; idle ones; ones with the active orgs' new usage), the close scan and the
// close of every org's period. cmd/scale prints the figures; `make scale` runs it.
package scale

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

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
	Active      int    // orgs with new usage before each measured tick
	Ticks       int    // measured ticks of each kind (average)
	Close       bool   // also close every org's period
	Parallel    int    // periods closed at once (billing.Closer.CloseMany)
}

// Result holds the figures of one run.
type Result struct {
	Orgs, Active  int
	Provision     time.Duration
	FirstFlush    time.Duration // reads every org whole
	IdleFlush     time.Duration // average
	ActiveFlush   time.Duration // average, Active orgs with new usage
	ActiveVisited int           // orgs the last active tick visited
	DueScan       time.Duration // the close scan with every period due
	Due           int
	Close         time.Duration // every org's period
	Closed        int
	Cache         CacheResult
}

// Run provisions cfg.Orgs orgs in a new database and measures; the database and the
// Redis keys are removed afterwards.
func Run(ctx context.Context, cfg Config) (Result, error) {
	res := Result{Orgs: cfg.Orgs, Active: min(cfg.Active, cfg.Orgs)}
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
	engines, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: cfg.RedisURL,
		Engine: quota.Config{KeyPrefix: prefix, Hydrator: store}})
	if err != nil {
		return res, err
	}
	defer engines.Close()
	defer deletePrefix(cfg.RedisURL, prefix)
	svc := tenants.NewService(pool)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: store, Tenants: svc, Counters: ledger.EngineCounters(engines),
		Interval: 2 * time.Second, Logger: quiet})
	tick := func() (time.Duration, ledger.FlushStats, error) {
		t := time.Now()
		st, err := f.FlushOnce(ctx)
		return time.Since(t), st, err
	}
	if res.FirstFlush, _, err = tick(); err != nil {
		return res, fmt.Errorf("first flush: %w", err)
	}
	ticks := max(cfg.Ticks, 1)
	for range ticks {
		d, _, err := tick()
		if err != nil {
			return res, err
		}
		res.IdleFlush += d / time.Duration(ticks)
	}
	lim := []vocab.Limit{{Metric: "requests", Window: vocab.Month, Limit: 1_000_000_000}}
	for r := range ticks {
		for i := range res.Active {
			// spread over the orgs: every (Orgs/Active)-th org, shifted each round
			org := OrgID((i*cfg.Orgs/res.Active + r) % cfg.Orgs)
			req := quota.Request{Org: org, Team: "t0", User: fmt.Sprintf("u%d", r), Metric: "requests", Cost: 1,
				Limits: quota.LevelLimits{Org: lim}}
			if _, _, err := engines.Check(ctx, vocab.Route{}, req); err != nil {
				return res, fmt.Errorf("check: %w", err)
			}
		}
		d, st, err := tick()
		if err != nil {
			return res, err
		}
		res.ActiveFlush += d / time.Duration(ticks)
		res.ActiveVisited = st.Orgs
	}
	if !cfg.Close {
		return res, nil
	}
	per := vocab.PeriodAt(time.Now(), 1)
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
