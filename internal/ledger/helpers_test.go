package ledger_test

import (
	"testing"

	"github.com/quotaplane/quotaplane/internal/ledger/ledgertest"
)

// env is one test's ledgertest.Env (shared with the ledger's, billing's and webhooks'
// tests).
type env struct {
	*ledgertest.Env
}

func newEnv(t testing.TB) *env {
	t.Helper()
	le := ledgertest.New(t)
	return &env{Env: le}
}

var (
	operator   = ledgertest.Operator
	quietLog   = ledgertest.QuietLog
	limitsFor  = ledgertest.LimitsFor
	monthLimit = ledgertest.MonthLimit
	waitFor    = ledgertest.WaitFor
	oneEngine  = ledgertest.OneEngine
)
