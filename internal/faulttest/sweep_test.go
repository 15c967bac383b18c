package faulttest

import (
	"context"
	"testing"
	"time"
)

// TestReservationExpiresAfterRedisRestart: a replica that has reserved for an org
// before, a Redis restarted empty when the ledger holds no reservation of the org,
// then a reservation left to expire: the worker's sweep must still expire it.
//
// It failed before the fix (found by make faults SEED=7, 670 held 30 s after the load): the
// sweep's set of orgs (q:{|reservations}) is lost with Redis, hydration adds the org
// back only when it restores held reservations, and each engine adds an org once in
// its life (Engine.markReserving), so the org's later reservations, and the leases of
// a replica that dies, were never expired: their units stayed held. Now an engine adds
// the org again once Redis shows a loss (Engine.markReserving).
func TestReservationExpiresAfterRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binaries")
	}
	ctx := context.Background()
	c, key, rdb := startOneReplica(t)
	reserve := func(ttl int) string {
		var r struct {
			ID string `json:"id"`
		}
		if err := c.call(ctx, c.apiAddrs[0], key, "POST", "/v1/reservations", map[string]any{"org": org, "team": "resv", "user": "v",
			"metric": "tokens", "amount": 5, "ttl_seconds": ttl, "on_expiry": "commit"}, &r); err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	held := func() int64 { return rdb.ZCard(ctx, "q:{"+org+"}|x").Val() }
	// The replica has reserved for the org; the reservation is settled and flushed.
	id := reserve(60)
	if err := c.call(ctx, c.apiAddrs[0], key, "POST", "/v1/reservations/"+id+"/commit", map[string]any{"used": 3}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	// Redis restarted empty; the next check hydrates the org (no reservation held).
	c.redis.Kill9()
	if err := c.restartRedis(); err != nil {
		t.Fatal(err)
	}
	if err := c.call(ctx, c.apiAddrs[0], key, "POST", "/v1/check", map[string]any{"org": org, "team": "month", "user": "m", "cost": 1}, nil); err != nil {
		t.Fatal(err)
	}
	reserve(1)
	deadline := time.Now().Add(10 * time.Second)
	for held() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a reservation of 1 s is still held 10 s later; the sweep's set of orgs holds %q",
				rdb.SMembers(ctx, "q:{|reservations}").Val())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
