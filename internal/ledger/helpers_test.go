package ledger_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

var operator = tenants.Actor{Name: "operator"}

func quietLog() *slog.Logger {
	if os.Getenv("BILLING_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// env is one test's Postgres database, tenancy service, ledger and quota engine on
// its own key prefix.
type env struct {
	t      testing.TB
	pool   *pgxpool.Pool
	dbURL  string
	svc    *tenants.Service
	store  *ledger.Store
	prefix string
	engine *quota.Engine
	rdb    *redis.Client // retries off, for the engine
}

func newEnv(t testing.TB) *env {
	t.Helper()
	dbURL := testenv.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &env{t: t, pool: pool, dbURL: dbURL, svc: tenants.NewService(pool, tenants.WithPasswordCost(64, 1)),
		store: ledger.NewStore(pool), prefix: testenv.ID(t, "b")}
	e.engine, e.rdb = e.newEngine(testenv.RedisURL(t))
	return e
}

// newEngine starts an engine on url with the env's prefix and the ledger as Hydrator.
func (e *env) newEngine(url string) (*quota.Engine, *redis.Client) {
	e.t.Helper()
	opt, err := quota.ClientOptions(url)
	if err != nil {
		e.t.Fatal(err)
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = time.Second, time.Second, time.Second
	rdb := redis.NewClient(opt)
	eng, err := quota.New(rdb, quota.Config{KeyPrefix: e.prefix, Hydrator: e.store})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = eng.Close(); _ = rdb.Close() })
	return eng, rdb
}

// seed creates a plan (with pricing when price != ""), an org on it and teams.
func (e *env) seed(org string, planLimits []vocab.Limit, pricing *tenants.Pricing, teams ...tenants.TeamInput) tenants.Org {
	e.t.Helper()
	ctx := context.Background()
	planID := "plan-" + org
	if _, err := e.svc.CreatePlan(ctx, operator, tenants.PlanInput{ID: planID, Name: "Plan", Limits: planLimits,
		FailMode: vocab.FailClosed, Pricing: pricing}); err != nil {
		e.t.Fatalf("create plan: %v", err)
	}
	o, err := e.svc.CreateOrg(ctx, operator, tenants.OrgInput{ID: org, Name: "Org", PlanID: planID})
	if err != nil {
		e.t.Fatalf("create org: %v", err)
	}
	for _, tm := range teams {
		if tm.Name == "" {
			tm.Name = tm.ID
		}
		if _, err := e.svc.CreateTeam(ctx, operator, org, tm); err != nil {
			e.t.Fatalf("create team: %v", err)
		}
	}
	return o
}

// check runs one check the way the API builds it (org, team and user limits of metric).
func (e *env) check(eng *quota.Engine, org, team, user, metric string, cost int64) (quota.Result, error) {
	e.t.Helper()
	ctx := context.Background()
	r, err := e.svc.ResolveOrg(ctx, org)
	if err != nil {
		e.t.Fatal(err)
	}
	req := quota.Request{Org: org, Team: team, User: user, Metric: metric, Cost: cost, AnchorDay: r.Org.BillingAnchorDay}
	req.Limits.Org = limitsFor(metric, r.Org.EffectiveLimits)
	if team != "" {
		req.Limits.Team = limitsFor(metric, r.Teams[team].Limits)
		if user != "" {
			req.Limits.User = limitsFor(metric, r.Teams[team].UserLimits)
		}
	}
	return eng.Check(ctx, req)
}

func limitsFor(metric string, ls []vocab.Limit) []vocab.Limit {
	var out []vocab.Limit
	for _, l := range ls {
		if l.Metric == metric {
			out = append(out, vocab.Limit{Window: l.Window, Limit: l.Limit})
		}
	}
	return out
}

func (e *env) flusher(interval time.Duration) *ledger.Flusher {
	return ledger.NewFlusher(ledger.FlusherConfig{Store: e.store, Tenants: e.svc,
		Counters: oneEngine(e.engine), Interval: interval, Logger: quietLog()})
}

func monthLimit(metric string, n int64) vocab.Limit {
	return vocab.Limit{Metric: metric, Window: vocab.Month, Limit: n}
}

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// oneEngine serves every org's counters from the test's engine.
func oneEngine(eng *quota.Engine) ledger.CounterSource {
	return ledger.CounterSourceFunc(func(string, vocab.Route) (ledger.Counters, error) { return eng, nil })
}
