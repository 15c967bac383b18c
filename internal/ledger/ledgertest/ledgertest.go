// Package ledgertest is what the tests of internal/ledger, internal/billing and
// internal/webhooks share: a tenancy service on a fresh Postgres database, a quota
// engine on its own key prefix with the ledger as its hydrator, and seeding and
// checking as the API does them. It is test-only (internal/archtest places it so).
package ledgertest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/worker"
)

// Operator is the actor the tests' changes are made as.
var Operator = tenants.Actor{Name: "operator"}

// QuietLog discards logs unless BILLING_TEST_LOG is set (then they go to stderr).
func QuietLog() *slog.Logger {
	if os.Getenv("BILLING_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Env is one test's Postgres database, tenancy service, ledger and quota engine on
// its own key prefix.
type Env struct {
	T      testing.TB
	Pool   *pgxpool.Pool
	DBURL  string
	Svc    *tenants.Service
	Ledger *ledger.Store
	Prefix string
	Engine *quota.Engine
	RDB    *redis.Client // retries off, for the engine
}

// New makes t's Env: a fresh database, the tenancy service and ledger over it, and an
// engine on REDIS_URL with the ledger as its hydrator.
func New(t testing.TB) *Env {
	t.Helper()
	dbURL := testenv.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &Env{T: t, Pool: pool, DBURL: dbURL, Svc: tenants.NewService(pool, tenants.WithPasswordCost(64, 1)),
		Ledger: ledger.NewStore(pool), Prefix: testenv.ID(t, "b")}
	e.Engine, e.RDB = e.NewEngine(testenv.RedisURL(t))
	// The test's keys go with it (they would expire at the period's end): the shared
	// Redis of a developer's machine does not gather thousands a run.
	t.Cleanup(func() {
		ctx := context.Background()
		it := e.RDB.Scan(ctx, 0, e.Prefix+":*", 1000).Iterator()
		var keys []string
		for it.Next(ctx) {
			if keys = append(keys, it.Val()); len(keys) == 1000 {
				e.RDB.Unlink(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			e.RDB.Unlink(ctx, keys...)
		}
	})
	return e
}

// NewEngine starts an engine on url with the env's prefix and the ledger as Hydrator.
func (e *Env) NewEngine(url string) (*quota.Engine, *redis.Client) {
	e.T.Helper()
	opt, err := quota.ClientOptions(url)
	if err != nil {
		e.T.Fatal(err)
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = time.Second, time.Second, time.Second
	rdb := redis.NewClient(opt)
	eng, err := quota.New(rdb, quota.Config{KeyPrefix: e.Prefix, Hydrator: e.Ledger})
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { _ = eng.Close(); _ = rdb.Close() })
	return eng, rdb
}

// Seed creates a plan (with pricing when not nil), an org on it and teams.
func (e *Env) Seed(org string, planLimits []vocab.Limit, pricing *tenants.Pricing, teams ...tenants.TeamInput) tenants.Org {
	e.T.Helper()
	ctx := context.Background()
	planID := "plan-" + org
	if _, err := e.Svc.CreatePlan(ctx, Operator, tenants.PlanInput{ID: planID, Name: "Plan", Limits: planLimits,
		FailMode: vocab.FailClosed, Pricing: pricing}); err != nil {
		e.T.Fatalf("create plan: %v", err)
	}
	o, err := e.Svc.CreateOrg(ctx, Operator, tenants.OrgInput{ID: org, Name: "Org", PlanID: planID})
	if err != nil {
		e.T.Fatalf("create org: %v", err)
	}
	for _, tm := range teams {
		if tm.Name == "" {
			tm.Name = tm.ID
		}
		if _, err := e.Svc.CreateTeam(ctx, Operator, org, tm); err != nil {
			e.T.Fatalf("create team: %v", err)
		}
	}
	return o
}

// Check runs one check the way the API builds it (org, team and user limits of metric).
func (e *Env) Check(eng *quota.Engine, org, team, user, metric string, cost int64) (vocab.Result, error) {
	e.T.Helper()
	ctx := context.Background()
	r, err := e.Svc.ResolveOrg(ctx, org)
	if err != nil {
		e.T.Fatal(err)
	}
	req := quota.Request{Org: org, Team: team, User: user, Metric: metric, Cost: cost, AnchorDay: r.Org.BillingAnchorDay}
	req.Limits.Org = LimitsFor(metric, r.Org.EffectiveLimits)
	if team != "" {
		req.Limits.Team = LimitsFor(metric, r.Teams[team].Limits)
		if user != "" {
			req.Limits.User = LimitsFor(metric, r.Teams[team].UserLimits)
		}
	}
	return eng.Check(ctx, req)
}

// LimitsFor is the limits of metric in ls, as the engine takes them.
func LimitsFor(metric string, ls []vocab.Limit) []vocab.Limit {
	var out []vocab.Limit
	for _, l := range ls {
		if l.Metric == metric {
			out = append(out, vocab.Limit{Window: l.Window, Limit: l.Limit, Burst: l.Burst})
		}
	}
	return out
}

// Flusher is the worker's flush of the env's engine into its ledger every interval.
func (e *Env) Flusher(interval time.Duration) *ledger.Flusher {
	return ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc,
		Counters: OneEngine(e.Engine), Interval: interval, Logger: QuietLog()})
}

// MonthLimit is a month limit of n units of metric.
func MonthLimit(metric string, n int64) vocab.Limit {
	return vocab.Limit{Metric: metric, Window: vocab.Month, Limit: n}
}

// WaitFor polls cond every 20 ms and fails t when it is not true within d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// OneEngine serves every org's counters from eng, whose dirty-org index the flusher
// pops (ledger.IndexedSource).
func OneEngine(eng *quota.Engine) ledger.IndexedSource { return oneEngine{eng} }

type oneEngine struct{ eng *quota.Engine }

func (o oneEngine) CountersFor(string, vocab.Route) (ledger.Counters, error) { return o.eng, nil }

func (o oneEngine) DirtyIndexes() ([]ledger.DirtyIndex, error) {
	return []ledger.DirtyIndex{o.eng}, nil
}

// StartWorker starts a River client of the real worker wiring with closer's jobs and
// hook, stopped when the test ends.
func (e *Env) StartWorker(id string, closer *billing.Closer, hook *worker.WebhookWorker) *river.Client[pgx.Tx] {
	e.T.Helper()
	c, err := worker.NewClient(e.Pool, worker.Config{ID: id, Logger: QuietLog(),
		Jobs: &worker.Jobs{Closer: closer, Webhook: hook, ScanEvery: time.Hour}})
	if err != nil {
		e.T.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c
}

// MigrateRiver creates River's tables in the env's database.
func (e *Env) MigrateRiver() {
	e.T.Helper()
	if err := worker.MigrateRiver(context.Background(), e.Pool); err != nil {
		e.T.Fatal(err)
	}
}

// Gauges returns the values of the gauge family name by its label values joined with "|".
func Gauges(t testing.TB, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			k := ""
			for i, lp := range m.GetLabel() {
				if i > 0 {
					k += "|"
				}
				k += lp.GetName() + "=" + lp.GetValue()
			}
			out[k] = m.GetGauge().GetValue()
		}
	}
	return out
}
