package billing_test

import (
	"testing"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/ledger/ledgertest"
)

// env is one test's ledgertest.Env (shared with the ledger's, billing's and webhooks'
// tests), with billing's store.
type env struct {
	*ledgertest.Env
	store *billing.Store // billing's store over the same database
}

func newEnv(t testing.TB) *env {
	t.Helper()
	le := ledgertest.New(t)
	return &env{Env: le, store: billing.NewStore(le.Pool)}
}

var (
	operator   = ledgertest.Operator
	quietLog   = ledgertest.QuietLog
	limitsFor  = ledgertest.LimitsFor
	monthLimit = ledgertest.MonthLimit
	waitFor    = ledgertest.WaitFor
	oneEngine  = ledgertest.OneEngine
)
