package tenants_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// capacityService is a Service on a fresh database, and a pool on it to read what
// no method lists (the operator's audit rows, org "").
func capacityService(t *testing.T) (*tenants.Service, *pgxpool.Pool) {
	t.Helper()
	pool := testenv.Postgres(t)
	return tenants.NewService(pool), pool
}

func capacityAudits(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT action || ' ' || object FROM audit_log WHERE action LIKE 'capacity.%' ORDER BY id DESC`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A capacity is created (saturation 0.8 by default), read, listed, changed and
// deleted, each write audited.
func TestCapacityCRUD(t *testing.T) {
	ctx := context.Background()
	s, db := capacityService(t)
	c, err := s.CreateCapacity(ctx, op, tenants.CapacityInput{ID: "gpt-4o", Metric: "tokens", Window: vocab.Minute, Limit: 2_000_000})
	if err != nil {
		t.Fatal(err)
	}
	want := tenants.Capacity{ID: "gpt-4o", Metric: "tokens", Window: vocab.Minute, Limit: 2_000_000, Saturation: 0.8}
	ignoreTimes := cmpopts.IgnoreFields(tenants.Capacity{}, "CreatedAt", "UpdatedAt")
	if diff := cmp.Diff(want, c, ignoreTimes); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
	if _, err := s.CreateCapacity(ctx, op, tenants.CapacityInput{ID: "gpt-4o", Metric: "tokens", Window: vocab.Hour, Limit: 1}); !errors.Is(err, tenants.ErrExists) {
		t.Errorf("a second gpt-4o: %v, want ErrExists", err)
	}
	if _, err := s.CreateCapacity(ctx, op, tenants.CapacityInput{ID: "a-first", Metric: "requests", Window: vocab.Second, Limit: 50, Saturation: 1}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetCapacity(ctx, "gpt-4o")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, ignoreTimes); diff != "" {
		t.Errorf("read (-want +got):\n%s", diff)
	}
	page, next, err := s.ListCapacities(ctx, tenants.Page{Limit: 1})
	if err != nil || len(page) != 1 || page[0].ID != "a-first" || next == "" {
		t.Fatalf("first page: %+v, %q, %v", page, next, err)
	}
	if page, next, err = s.ListCapacities(ctx, tenants.Page{Limit: 1, Cursor: next}); err != nil || len(page) != 1 || page[0].ID != "gpt-4o" || next != "" {
		t.Fatalf("second page: %+v, %q, %v", page, next, err)
	}
	up, err := s.UpdateCapacity(ctx, op, "gpt-4o", tenants.CapacityPatch{Limit: ptr(int64(3_000_000)), Saturation: ptr(0.9)})
	if err != nil || up.Limit != 3_000_000 || up.Saturation != 0.9 || up.Metric != "tokens" || up.Window != vocab.Minute {
		t.Fatalf("updated: %+v, %v", up, err)
	}
	if err := s.DeleteCapacity(ctx, op, "gpt-4o"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetCapacity(ctx, "gpt-4o"); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("deleted capacity: %v, want ErrNotFound", err)
	}
	if err := s.DeleteCapacity(ctx, op, "gpt-4o"); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("deleted twice: %v, want ErrNotFound", err)
	}
	if _, err := s.UpdateCapacity(ctx, op, "nope", tenants.CapacityPatch{Limit: ptr(int64(1))}); !errors.Is(err, tenants.ErrNotFound) {
		t.Errorf("update of none: %v, want ErrNotFound", err)
	}
	actions := capacityAudits(t, db)
	wantActions := []string{"capacity.delete capacity:gpt-4o", "capacity.update capacity:gpt-4o", "capacity.create capacity:a-first", "capacity.create capacity:gpt-4o"}
	if diff := cmp.Diff(wantActions, actions); diff != "" {
		t.Errorf("audit (-want +got):\n%s", diff)
	}
}

// Bad input is refused naming each bad field, and nothing is written.
func TestCapacityValidation(t *testing.T) {
	ctx := context.Background()
	s, db := capacityService(t)
	for _, c := range []struct {
		name   string
		in     tenants.CapacityInput
		fields []string
	}{
		{"saturation above 1", tenants.CapacityInput{ID: "c", Metric: "tokens", Window: vocab.Minute, Limit: 1, Saturation: 1.5}, []string{"saturation"}},
		{"negative saturation", tenants.CapacityInput{ID: "c", Metric: "tokens", Window: vocab.Minute, Limit: 1, Saturation: -0.1}, []string{"saturation"}},
		{"NaN saturation", tenants.CapacityInput{ID: "c", Metric: "tokens", Window: vocab.Minute, Limit: 1, Saturation: math.NaN()}, []string{"saturation"}},
		{"month window", tenants.CapacityInput{ID: "c", Metric: "tokens", Window: vocab.Month, Limit: 1}, []string{"window"}},
		{"concurrent window", tenants.CapacityInput{ID: "c", Metric: "tokens", Window: vocab.Concurrent, Limit: 1}, []string{"window"}},
		{"unknown window", tenants.CapacityInput{ID: "c", Metric: "tokens", Window: "week", Limit: 1}, []string{"window"}},
		{"limit 0", tenants.CapacityInput{ID: "c", Metric: "tokens", Window: vocab.Minute}, []string{"limit"}},
		{"limit past MaxUnits", tenants.CapacityInput{ID: "c", Metric: "tokens", Window: vocab.Minute, Limit: vocab.MaxUnits + 1}, []string{"limit"}},
		{"bad id and metric", tenants.CapacityInput{ID: "a|b", Metric: "", Window: vocab.Minute, Limit: 1}, []string{"id", "metric"}},
	} {
		_, err := s.CreateCapacity(ctx, op, c.in)
		var ve *tenants.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("%s: %v, want a validation error", c.name, err)
			continue
		}
		var fields []string
		for _, f := range ve.Fields {
			fields = append(fields, f.Field)
		}
		if diff := cmp.Diff(c.fields, fields); diff != "" {
			t.Errorf("%s: fields (-want +got):\n%s", c.name, diff)
		}
	}
	if _, err := s.CreateCapacity(ctx, op, tenants.CapacityInput{ID: "c", Metric: "tokens", Window: vocab.Minute, Limit: 10}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []tenants.CapacityPatch{{Saturation: ptr(0.0)}, {Saturation: ptr(1.01)}, {Limit: ptr(int64(0))}} {
		var ve *tenants.ValidationError
		if _, err := s.UpdateCapacity(ctx, op, "c", p); !errors.As(err, &ve) {
			t.Errorf("patch %+v: %v, want a validation error", p, err)
		}
	}
	if cs, err := s.AllCapacities(ctx); err != nil || len(cs) != 1 || cs[0].Limit != 10 || cs[0].Saturation != 0.8 {
		t.Errorf("capacities after refusals: %+v, %v; want c alone, unchanged", cs, err)
	}
	if n := len(capacityAudits(t, db)); n != 1 {
		t.Errorf("%d capacity audit rows, want the one create", n)
	}
}

// The capacities are held in process: a change reaches the replica that made it at
// once and another replica through the invalidation channel; the TTL reads them again
// in the background; and with Postgres gone the last list read serves.
func TestCacheCapacities(t *testing.T) {
	ctx := context.Background()
	a, _, ca, cb := twoReplicas(t, true)
	for _, c := range []*tenants.Cache{ca, cb} {
		if set, err := c.Capacities(ctx); err != nil || set.Len() != 0 {
			t.Fatalf("no capacities yet: %d, %v", set.Len(), err)
		}
	}
	start := time.Now()
	if _, err := a.CreateCapacity(ctx, op, tenants.CapacityInput{ID: "gpu", Metric: "tokens", Window: vocab.Minute, Limit: 100}); err != nil {
		t.Fatal(err)
	}
	if set, err := ca.Capacities(ctx); err != nil || len(set.Of("tokens")) != 1 {
		t.Fatalf("the replica that created it: %+v, %v", set.Of("tokens"), err)
	}
	for {
		set, err := cb.Capacities(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cs := set.Of("tokens"); len(cs) == 1 && cs[0].ID == "gpu" && cs[0].Limit == 100 {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatal("the other replica does not see the capacity after 1s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the other replica saw the capacity after %v", time.Since(start))
	if _, err := a.UpdateCapacity(ctx, op, "gpu", tenants.CapacityPatch{Limit: ptr(int64(200))}); err != nil {
		t.Fatal(err)
	}
	for {
		set, _ := cb.Capacities(ctx)
		if cs := set.Of("tokens"); len(cs) == 1 && cs[0].Limit == 200 {
			break
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("the other replica does not see the new limit")
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Without pub/sub: a TTL read in the background.
	dbURL := testenv.PostgresURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	svc := tenants.NewService(pool)
	wpool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wpool.Close)
	writer := tenants.NewService(wpool)
	c := tenants.NewCache(svc, tenants.CacheOptions{CapacityTTL: 50 * time.Millisecond})
	if set, err := c.Capacities(ctx); err != nil || set.Len() != 0 {
		t.Fatalf("none: %v", err)
	}
	if _, err := writer.CreateCapacity(ctx, op, tenants.CapacityInput{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 9}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for {
		set, err := c.Capacities(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(set.Of("tokens")) == 1 {
			break
		}
		if time.Since(start) > 2*time.Second {
			t.Fatal("a capacity created by another replica, unannounced, not seen after 2s (TTL 50ms)")
		}
		time.Sleep(10 * time.Millisecond)
	}
	pool.Close()
	c.InvalidateAll() // as a lost subscription does: the next call reads, fails, and serves the last list
	for i := 0; i < 3; i++ {
		set, err := c.Capacities(ctx)
		if err != nil || len(set.Of("tokens")) != 1 {
			t.Fatalf("Postgres down: %+v, %v; want the last list read", set.Of("tokens"), err)
		}
	}
	fresh := tenants.NewCache(svc, tenants.CacheOptions{})
	if _, err := fresh.Capacities(ctx); err == nil {
		t.Error("a cache that never read the capacities answered with Postgres down")
	}
}

// Subscribe (the worker's) tells the org ids announced, not a change of the
// capacities, which names no org.
func TestSubscribeLeavesOutCapacities(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb := testenv.Redis(t)
	channel := tenants.InvalidationChannel + ":" + testenv.ID(t, "sub")
	got := make(chan string, 4)
	tenants.Subscribe(ctx, rdb, channel, func(org string) { got <- org }, func() {})
	time.Sleep(200 * time.Millisecond) // let the subscription settle
	for _, m := range []string{"|capacities", "acme"} {
		if err := rdb.Publish(ctx, channel, m).Err(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case org := <-got:
		if org != "acme" {
			t.Fatalf("Subscribe told %q, want acme alone", org)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("acme not told within 2 s")
	}
	select {
	case org := <-got:
		t.Fatalf("Subscribe told %q too", org)
	case <-time.After(100 * time.Millisecond):
	}
}
