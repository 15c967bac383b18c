package ledger_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A hot path takes several leases a second, each a reservation record. A settled lease
// is read by nobody, so its record leaves Redis 10 minutes after settlement (a
// reservation's stays a day) and its row leaves Postgres at the next drain (a
// reservation's stays), also when an earlier drain persisted it held. Before, every
// lease was kept a day in Redis and for ever in Postgres, and hydration loaded a day of
// them back.
func TestSettledLeasesAreNotKept(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1_000_000_000)}, nil, tenants.TeamInput{ID: "eng"})
	opt, err := quota.ClientOptions(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	eng, err := quota.New(rdb, quota.Config{KeyPrefix: e.Prefix, Hydrator: e.Ledger,
		Leases: quota.LeaseConfig{Enabled: true, Max: 50 * time.Millisecond, Threshold: 50}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close(); _ = rdb.Close() })
	flusher := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc,
		Counters: oneEngine(eng), Interval: time.Hour, Logger: quietLog()})
	r, err := e.Svc.ResolveOrg(ctx, org)
	if err != nil {
		t.Fatal(err)
	}
	req := quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: 1,
		AnchorDay: r.Org.BillingAnchorDay, Limits: quota.LevelLimits{Org: limitsFor("requests", r.Org.EffectiveLimits)}}

	rv, _, err := eng.Reserve(ctx, quota.Request{Org: org, Metric: "requests", Cost: 5, AnchorDay: req.AnchorDay,
		Limits: req.Limits}, quota.ReserveOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Commit(ctx, org, req.AnchorDay, rv.ID, 3); err != nil {
		t.Fatal(err)
	}

	var leased atomic.Int64
	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				res, err := eng.Check(ctx, req)
				if err != nil {
					t.Errorf("check: %v", err)
					return
				}
				if res.Leased {
					leased.Add(1)
				}
			}
		})
	}
	// Drain while leases are open, so that some are persisted held.
	heldPersisted := 0
	for time.Now().Before(stop) {
		if _, err := flusher.FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE org_id = $1 AND id <> $2 AND state = 'held'`,
			org, rv.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		heldPersisted = max(heldPersisted, n)
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	waitFor(t, 5*time.Second, "the leases settled", func() bool { held, _ := eng.LeasedUnits(); return held == 0 })
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if leased.Load() == 0 || heldPersisted == 0 {
		t.Fatalf("%d checks answered from leases, at most %d leases persisted held at once: the test saw no lease drained held",
			leased.Load(), heldPersisted)
	}

	var rows []string
	got, err := e.Pool.Query(ctx, `SELECT id || ' ' || state FROM reservations WHERE org_id = $1 ORDER BY id`, org)
	if err != nil {
		t.Fatal(err)
	}
	for got.Next() {
		var s string
		if err := got.Scan(&s); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, s)
	}
	if got.Err() != nil {
		t.Fatal(got.Err())
	}
	if want := rv.ID + " committed"; len(rows) != 1 || rows[0] != want {
		t.Errorf("reservations rows %v, want only %q: settled leases kept in Postgres", rows, want)
	}

	keys, err := rdb.Keys(ctx, e.Prefix+":{"+org+"}|r|*").Result()
	if err != nil {
		t.Fatal(err)
	}
	leases := 0
	for _, k := range keys {
		ttl, err := rdb.TTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasSuffix(k, "|r|"+rv.ID):
			if ttl < 23*time.Hour {
				t.Errorf("the reservation's record expires in %s, want a day after its expiry", ttl)
			}
		case ttl <= 0 || ttl > 10*time.Minute:
			t.Errorf("lease record %s expires in %s, want within 10 minutes of its settlement", k, ttl)
		default:
			leases++
		}
	}
	if leases == 0 {
		t.Fatal("no lease records found in Redis")
	}
	t.Logf("%d checks from leases, %d lease records in Redis (each gone within 10 min), up to %d persisted held at once, none kept settled",
		leased.Load(), leases, heldPersisted)
}
