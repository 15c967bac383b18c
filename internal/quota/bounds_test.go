package quota_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// idemKeys counts org's idempotency records in Redis.
func (r *testRig) idemKeys(tb testing.TB, org string) int {
	tb.Helper()
	keys, err := r.raw.Keys(context.Background(), r.prefix+":{"+org+"}|i|*").Result()
	if err != nil {
		tb.Fatal(err)
	}
	return len(keys)
}

// A check that counts nothing (denied, or cost 0) stores no idempotency record, so
// 2,000 denied checks with unique keys leave none.
func TestCheckThatCountsNothingStoresNoRecord(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "org")
	full := quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1)}}}
	r.MustCheck(t, full) // the user's one unit
	reqs := make([]quota.Request, 0, 100)
	for batch := range 20 {
		reqs = reqs[:0]
		for i := range 100 {
			q := full
			q.IdempotencyKey = fmt.Sprintf("denied-%04d-%03d", batch, i)
			reqs = append(reqs, q)
		}
		res, errs := r.e.CheckBatch(context.Background(), reqs)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		for i := range res {
			if res[i].Allowed {
				t.Fatalf("check %d of batch %d allowed over the limit", i, batch)
			}
		}
	}
	// one-by-one too, and a query (cost 0) that is allowed but counts nothing
	for i := range 10 {
		q := full
		q.IdempotencyKey = fmt.Sprintf("single-%04d", i)
		if res := r.MustCheck(t, q); res.Allowed {
			t.Fatal("allowed over the limit")
		}
	}
	q := full
	q.Cost, q.IdempotencyKey = 0, "query-00000001"
	if res := r.MustCheck(t, q); !res.Allowed {
		t.Fatalf("cost 0: %+v", res)
	}
	if n := r.idemKeys(t, org); n != 0 {
		t.Errorf("%d idempotency records after 2,011 checks that counted nothing; want 0", n)
	}
	// a check that counts stores its record, as before
	q = full
	q.Limits.User, q.IdempotencyKey = []vocab.Limit{lim(vocab.Month, 10)}, "counted-00000001"
	r.MustCheck(t, q)
	if n := r.idemKeys(t, org); n != 1 {
		t.Errorf("%d idempotency records after one counted check; want 1", n)
	}
}

// Past QUOTA_IDEMPOTENCY_RECORDS an org's checks with a new key are refused with a
// *BoundError, counting nothing; replays, and checks without a key, still pass; records
// that expire leave the count.
func TestIdempotencyRecordsBound(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{IdempotencyRecords: 5, IdempotencyTTL: 2 * time.Second})
	org := testenv.ID(t, "org")
	req := func(key string) quota.Request {
		return quota.Request{Org: org, Team: "eng", Metric: "requests", Cost: 1, IdempotencyKey: key}
	}
	for i := range 5 {
		if res := r.MustCheck(t, req(fmt.Sprintf("key-%08d", i))); !res.Allowed {
			t.Fatalf("check %d: %+v", i, res)
		}
	}
	before := r.snapshot(t, org)
	_, err := r.e.Check(context.Background(), req("key-00000005"))
	var be *quota.BoundError
	if !errors.As(err, &be) || be.Bound != quota.BoundIdempotencyRecords || be.Limit != 5 || be.Org != org {
		t.Fatalf("sixth record: err %v; want a BoundError of idempotency_records, 5", err)
	}
	if diff := cmp.Diff(before, r.snapshot(t, org)); diff != "" {
		t.Errorf("the refused check wrote (-before +after):\n%s", diff)
	}
	if res := r.MustCheck(t, req("key-00000000")); !res.Replayed {
		t.Errorf("a stored key at the bound: %+v, want its replay", res)
	}
	if res := r.MustCheck(t, req("")); !res.Allowed {
		t.Errorf("a check without a key at the bound: %+v", res)
	}
	// a reservation stores a record too: refused alike
	if _, _, err := r.e.Reserve(context.Background(), req("key-res00001"), quota.ReserveOptions{TTL: time.Minute}); !errors.As(err, &be) {
		t.Errorf("a reservation with a new key at the bound: %v, want a BoundError", err)
	}
	// the records expire after 2 s; their buckets (1 s) leave the count a bucket later
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := r.e.Check(context.Background(), req("key-later001"))
		if err == nil {
			break
		}
		if !errors.As(err, &be) || time.Now().After(deadline) {
			t.Fatalf("after the records expired: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Past QUOTA_UNREGISTERED_USERS distinct unregistered users in a period, a check naming
// another is refused with a *BoundError (in shadow mode too, where checks count without
// limit), counting nothing; users already counted and registered users still pass.
func TestUnregisteredUsersBound(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{UnregisteredUsers: 3})
	org := testenv.ID(t, "org")
	req := func(user string) quota.Request {
		return quota.Request{Org: org, Team: "eng", User: user, Unregistered: true, Metric: "requests", Cost: 1, Mode: vocab.Shadow,
			Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Minute, 1)}}}
	}
	for _, u := range []string{"u1", "u2", "u3", "u1"} {
		r.MustCheck(t, req(u))
	}
	before := r.snapshot(t, org)
	_, err := r.e.Check(context.Background(), req("u4"))
	var be *quota.BoundError
	if !errors.As(err, &be) || be.Bound != quota.BoundUnregisteredUsers || be.Limit != 3 {
		t.Fatalf("a fourth unregistered user: err %v; want a BoundError of unregistered_users, 3", err)
	}
	if diff := cmp.Diff(before, r.snapshot(t, org)); diff != "" {
		t.Errorf("the refused check wrote (-before +after):\n%s", diff)
	}
	// another metric of a counted user, and a registered user, pass
	other := req("u2")
	other.Metric = "tokens"
	r.MustCheck(t, other)
	reg := req("registered")
	reg.Unregistered = false
	r.MustCheck(t, reg)
	// a multi-metric request is bounded alike
	multi := req("u5")
	multi.More = []quota.MetricCost{{Metric: "tokens", Cost: 1}}
	if _, err := r.e.Check(context.Background(), multi); !errors.As(err, &be) {
		t.Errorf("a multi-metric check of a new user: %v, want a BoundError", err)
	}
	if _, _, err := r.e.Reserve(context.Background(), req("u6"), quota.ReserveOptions{TTL: time.Minute}); !errors.As(err, &be) {
		t.Errorf("a reservation of a new user: %v, want a BoundError", err)
	}
}

// Two replicas (engines) checking at once cannot pass the bounds together: the script
// tests and counts in one run.
func TestBoundsHoldAcrossReplicas(t *testing.T) {
	t.Parallel()
	r1 := MustRig(t, "", quota.Config{UnregisteredUsers: 10, IdempotencyRecords: 10})
	r2 := MustRig(t, "", quota.Config{KeyPrefix: r1.prefix, UnregisteredUsers: 10, IdempotencyRecords: 10})
	org := testenv.ID(t, "org")
	r1.MustCheck(t, quota.Request{Org: org, Metric: "requests"}) // hydrate first
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := r1.e
			if i%2 == 1 {
				e = r2.e
			}
			q := quota.Request{Org: org, Team: "eng", User: fmt.Sprintf("user-%d", i), Unregistered: true, Metric: "requests", Cost: 1}
			if i%3 == 0 {
				q.User, q.IdempotencyKey = "", fmt.Sprintf("key-%08d", i)
			}
			_, _ = e.Check(context.Background(), q)
		}()
	}
	wg.Wait()
	users, records := 0, r1.idemKeys(t, org)
	for c := range r1.usage(t, org) {
		if c.Level == vocab.LevelUser {
			users++
		}
	}
	if users != 10 || records != 10 {
		t.Errorf("after 60 concurrent checks on two replicas: %d users, %d records; want 10 and 10", users, records)
	}
}
