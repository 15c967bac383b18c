package webhooks_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/ledger/ledgertest"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/internal/worker"
)

// env is ledgertest.Env (shared with the ledger's, billing's and webhooks' tests) under
// the names this package's tests use, with its event store.
type env struct {
	le     *ledgertest.Env
	t      testing.TB
	pool   *pgxpool.Pool
	dbURL  string
	svc    *tenants.Service
	store  *ledger.Store
	prefix string
	engine *quota.Engine
	rdb    *redis.Client // retries off, for the engine
	hooks  *webhooks.Store
}

func newEnv(t testing.TB) *env {
	t.Helper()
	le := ledgertest.New(t)
	return &env{le: le, t: t, pool: le.Pool, dbURL: le.DBURL, svc: le.Svc, store: le.Ledger, prefix: le.Prefix,
		engine: le.Engine, rdb: le.RDB, hooks: webhooks.NewStore(le.Pool)}
}

var (
	operator   = ledgertest.Operator
	quietLog   = ledgertest.QuietLog
	limitsFor  = ledgertest.LimitsFor
	monthLimit = ledgertest.MonthLimit
	waitFor    = ledgertest.WaitFor
	oneEngine  = ledgertest.OneEngine
)

// newEngine starts an engine on url with the env's prefix and the ledger as Hydrator.
func (e *env) newEngine(url string) (*quota.Engine, *redis.Client) { return e.le.NewEngine(url) }

// seed creates a plan (with pricing when not nil), an org on it and teams.
func (e *env) seed(org string, planLimits []vocab.Limit, pricing *tenants.Pricing, teams ...tenants.TeamInput) tenants.Org {
	e.t.Helper()
	return e.le.Seed(org, planLimits, pricing, teams...)
}

// check runs one check the way the API builds it (org, team and user limits of metric).
func (e *env) check(eng *quota.Engine, org, team, user, metric string, cost int64) (quota.Result, error) {
	e.t.Helper()
	return e.le.Check(eng, org, team, user, metric, cost)
}

func (e *env) flusher(interval time.Duration) *ledger.Flusher { return e.le.Flusher(interval) }

// startWorker starts a River client of the real worker wiring with the billing jobs
// and hook, whose clock is injected.
func (e *env) startWorker(id string, clock func() time.Time, hook *worker.WebhookWorker) (*river.Client[pgx.Tx], *billing.Closer) {
	e.t.Helper()
	closer := billing.NewCloser(billing.CloserConfig{Store: billing.NewStore(e.pool), Tenants: e.svc,
		Counters: oneEngine(e.engine), Clock: clock, Grace: time.Minute, WorkerID: id, Logger: quietLog()})
	return e.le.StartWorker(id, closer, hook), closer
}

func (e *env) migrateRiver() { e.le.MigrateRiver() }

func (e *env) count(q string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n
}
