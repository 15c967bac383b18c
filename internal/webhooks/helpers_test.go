package webhooks_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/ledger/ledgertest"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/internal/worker"
)

// env is one test's ledgertest.Env (shared with the ledger's, billing's and webhooks'
// tests), with the event store.
type env struct {
	*ledgertest.Env
	hooks *webhooks.Store // the event store
}

func newEnv(t testing.TB) *env {
	t.Helper()
	le := ledgertest.New(t)
	return &env{Env: le, hooks: webhooks.NewStore(le.Pool)}
}

var (
	operator   = ledgertest.Operator
	quietLog   = ledgertest.QuietLog
	limitsFor  = ledgertest.LimitsFor
	monthLimit = ledgertest.MonthLimit
	waitFor    = ledgertest.WaitFor
	oneEngine  = ledgertest.OneEngine
)

// startWorker starts a River client of the real worker wiring with the billing jobs
// and hook, whose clock is injected.
func (e *env) startWorker(id string, clock func() time.Time, hook *worker.WebhookWorker) (*river.Client[pgx.Tx], *billing.Closer) {
	e.T.Helper()
	closer := billing.NewCloser(billing.CloserConfig{Store: billing.NewStore(e.Pool), Tenants: e.Svc,
		Counters: oneEngine(e.Engine), Clock: clock, Grace: time.Minute, WorkerID: id, Logger: quietLog()})
	return e.StartWorker(id, closer, hook), closer
}

func (e *env) migrateRiver() { e.MigrateRiver() }

func (e *env) count(q string, args ...any) int {
	e.T.Helper()
	var n int
	if err := e.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		e.T.Fatalf("%s: %v", q, err)
	}
	return n
}
