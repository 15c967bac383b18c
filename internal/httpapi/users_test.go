package httpapi_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// After warm-up a check costs no Postgres query whatever its user id: checks of 300
// user ids never seen before, and of a registered user, make none (the replica's
// pool counts every query it runs).
func TestCheckNewUserIDsCostNoPostgresQuery(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	key, _ := r.setup("acme")
	r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"alice","limits":[{"metric":"requests","window":"month","limit":50}]}`, 201)
	// Warm up until three checks in a row cost no query: the setup's own invalidations
	// come back through Redis pub/sub a moment later and drop the org once more.
	warmUntilNoQuery(t, r.f.pool, "checks of a warm-up user", func() {
		if c := r.check(key, `{"org":"acme","team":"eng","user":"warm-up"}`); c.code != 200 {
			t.Fatalf("warm-up check = %d %s", c.code, c.raw)
		}
	})
	before := r.f.pool.Stat().AcquireCount()
	for i := range 300 {
		if c := r.check(key, fmt.Sprintf(`{"org":"acme","team":"eng","user":"visitor-%d"}`, i)); c.code != 200 && c.code != 429 {
			t.Fatalf("check of visitor-%d = %d %s", i, c.code, c.raw)
		}
	}
	c := r.check(key, `{"org":"acme","user":"alice"}`) // the registered user's team comes from the org
	if c.code != 200 && c.code != 429 {
		t.Fatalf("check of alice = %d %s", c.code, c.raw)
	}
	if n := r.f.pool.Stat().AcquireCount() - before; n != 0 {
		t.Errorf("301 checks after warm-up made %d Postgres queries, want 0", n)
	}
}

// warmUntilNoQuery calls call until three calls in a row take no connection from pool
// (what names the calls in the failure), within 10 s: a setup's own invalidations come
// back through Redis pub/sub a moment later and drop the org once more.
func warmUntilNoQuery(t *testing.T, pool *pgxpool.Pool, what string, call func()) {
	t.Helper()
	for quiet, deadline := 0, time.Now().Add(10*time.Second); quiet < 3; {
		if time.Now().After(deadline) {
			t.Fatal(what + " still query Postgres after 10 s")
		}
		n := pool.Stat().AcquireCount()
		call()
		if pool.Stat().AcquireCount() == n {
			quiet++
		} else {
			quiet = 0
			time.Sleep(20 * time.Millisecond)
		}
	}
}
