package scale_test

import (
	"context"
	"os"
	"testing"

	"github.com/quotaplane/quotaplane/internal/scale"
)

// TestScaleShort is make scale's worker run at 1,500 orgs, its outcomes checked (its
// timings are make scale's: not bounded here): with every org active, one tick writes
// every org and the ledger then equals the counters of every org; a worker started
// after a kill with 200 orgs drained and not written reads exactly those whole and
// stores each equal to Redis; a restarted worker with nothing in flight visits no
// org.
func TestScaleShort(t *testing.T) {
	db, rds := os.Getenv("DATABASE_URL"), os.Getenv("REDIS_URL")
	if db == "" || rds == "" {
		t.Skip("DATABASE_URL and REDIS_URL are not set")
	}
	const orgs, inFlight = 1500, 200
	r, err := scale.Run(context.Background(), scale.Config{DatabaseURL: db, RedisURL: rds, Orgs: orgs, InFlight: inFlight, Ticks: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.ActiveVisited != orgs || r.LedgerEqual != orgs {
		t.Errorf("active tick: %d orgs visited, %d stored equal to Redis; want %d and %d", r.ActiveVisited, r.LedgerEqual, orgs, orgs)
	}
	if r.Recovered != inFlight || r.RecoveredEqual != inFlight {
		t.Errorf("after a kill with %d orgs in flight: %d read whole, %d stored equal; want %d each", inFlight, r.Recovered, r.RecoveredEqual, inFlight)
	}
	if r.FirstVisited != 0 {
		t.Errorf("a restart with nothing in flight visited %d orgs, want 0", r.FirstVisited)
	}
	if r.Provision <= 0 || r.ActivePersist <= 0 || r.FirstFlush <= 0 || r.IdleFlush <= 0 {
		t.Errorf("a figure was not measured: %+v", r)
	}
}
