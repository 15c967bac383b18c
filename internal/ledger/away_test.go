package ledger_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// An org whose dedicated Redis is away does not make every flush fail and warn: the
// first failure is reported, saying when the next try is; flushes in the pause skip
// the org without an error; the other orgs are flushed.
func TestFlushBacksOffADedicatedRedisThatIsAway(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "redis://" + ln.Addr().String() + "/0"
	ln.Close()
	away := testenv.ID(t, "away")
	e.Seed(away, []vocab.Limit{monthLimit("requests", 1000)}, nil, tenants.TeamInput{ID: "eng"})
	if _, err := e.Svc.UpdateOrg(ctx, tenants.Actor{Name: "t"}, away, tenants.OrgPatch{RedisURL: &dead}); err != nil {
		t.Fatal(err)
	}
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), Engine: quota.Config{KeyPrefix: e.Prefix},
		PollBackoff: quota.PollBackoff{Min: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer router.Close()
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: ledger.EngineCounters(router), Logger: quietLog()})
	_, err = f.FlushOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "next try in 1m") {
		t.Fatalf("the first flush: %v; want the away Redis's failure, saying when the next try is", err)
	}
	for range 5 {
		if _, err := f.FlushOnce(ctx); err != nil {
			t.Fatalf("a flush in the pause: %v, want the away org skipped quietly", err)
		}
	}
}
