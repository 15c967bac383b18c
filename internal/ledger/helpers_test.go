package ledger_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/ledger/ledgertest"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// env is ledgertest.Env (shared with the ledger's, billing's and webhooks' tests) under
// the names this package's tests use.
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
}

func newEnv(t testing.TB) *env {
	t.Helper()
	le := ledgertest.New(t)
	return &env{le: le, t: t, pool: le.Pool, dbURL: le.DBURL, svc: le.Svc, store: le.Ledger, prefix: le.Prefix,
		engine: le.Engine, rdb: le.RDB}
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
