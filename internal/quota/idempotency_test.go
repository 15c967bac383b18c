package quota_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// idemRequest is a three-level check with an idempotency key, limited at every level.
func idemRequest(org, key string) quota.Request {
	return quota.Request{
		Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: 5, IdempotencyKey: key,
		Limits: quota.LevelLimits{
			Org:  []vocab.Limit{lim(vocab.Month, 1000)},
			Team: []vocab.Limit{lim(vocab.Minute, 100)},
			User: []vocab.Limit{lim(vocab.Day, 50)},
		},
	}
}

// The same idempotency key with a different request (team, user, metric or cost) is
// refused with ErrIdempotencyConflict and counts nothing; the same request replays the
// first decision. Keys are per org: another org's identical key is a new check.
func TestIdempotencyKeyConflict(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "org")
	first := idemRequest(org, "order-12345")
	want := r.MustCheck(t, first)
	if !want.Allowed || want.Replayed {
		t.Fatalf("first check: %+v", want)
	}
	before := r.snapshot(t, org)

	variants := []struct {
		name   string
		mutate func(*quota.Request)
	}{
		{"cost", func(q *quota.Request) { q.Cost = 6 }},
		{"cost 0", func(q *quota.Request) { q.Cost = 0 }},
		{"metric", func(q *quota.Request) { q.Metric = "tokens" }},
		{"user", func(q *quota.Request) { q.User = "bob" }},
		{"team", func(q *quota.Request) { q.Team = "ops" }},
		{"no user", func(q *quota.Request) { q.User, q.Limits.User = "", nil }},
	}
	for _, v := range variants {
		req := idemRequest(org, "order-12345")
		v.mutate(&req)
		res, err := r.e.Check(context.Background(), req)
		if !errors.Is(err, quota.ErrIdempotencyConflict) {
			t.Errorf("%s changed: Check = %+v, %v; want ErrIdempotencyConflict", v.name, res, err)
		}
		if diff := cmp.Diff(before, r.snapshot(t, org)); diff != "" {
			t.Errorf("%s changed: counters changed (-before +after):\n%s", v.name, diff)
		}
	}

	// The same request, even with other limits resolved meanwhile, replays.
	again := idemRequest(org, "order-12345")
	again.Limits.Org = []vocab.Limit{lim(vocab.Month, 2000)}
	got := r.MustCheck(t, again)
	if !got.Replayed || !got.Allowed {
		t.Errorf("same request: %+v, want a replay", got)
	}
	if diff := cmp.Diff(want.Levels, got.Levels); diff != "" {
		t.Errorf("replay differs from the first decision (-first +replay):\n%s", diff)
	}
	if diff := cmp.Diff(before, r.snapshot(t, org)); diff != "" {
		t.Errorf("replay counted (-before +after):\n%s", diff)
	}

	// Another org's key of the same name is its own.
	other := testenv.ID(t, "org")
	if res := r.MustCheck(t, idemRequest(other, "order-12345")); res.Replayed || !res.Allowed {
		t.Errorf("another org's key: %+v, want a fresh decision", res)
	}
	if got := r.usage(t, other)[orgC("requests")]; got != 5 {
		t.Errorf("another org's check counted %d, want 5", got)
	}
}

// In a batch each item is held to its own key: a replay, a conflict and a new key
// side by side, decided in one pipeline.
func TestIdempotencyKeyConflictBatch(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "org")
	r.MustCheck(t, idemRequest(org, "order-1-abc"))
	before := r.usage(t, org)[orgC("requests")]

	conflict := idemRequest(org, "order-1-abc")
	conflict.Metric = "tokens"
	reqs := []quota.Request{idemRequest(org, "order-1-abc"), conflict, idemRequest(org, "order-2-abc")}
	res, errs := r.e.CheckBatch(context.Background(), reqs)
	if errs[0] != nil || !res[0].Replayed {
		t.Errorf("same request: %+v, %v; want a replay", res[0], errs[0])
	}
	if !errors.Is(errs[1], quota.ErrIdempotencyConflict) {
		t.Errorf("other metric: %+v, %v; want ErrIdempotencyConflict", res[1], errs[1])
	}
	if errs[2] != nil || res[2].Replayed || !res[2].Allowed {
		t.Errorf("new key: %+v, %v; want a fresh decision", res[2], errs[2])
	}
	u := r.usage(t, org)
	if got := u[orgC("requests")]; got != before+5 {
		t.Errorf("org counter %d, want %d (only the new key counted)", got, before+5)
	}
	if got := u[orgC("tokens")]; got != 0 {
		t.Errorf("the conflicting check counted %d tokens", got)
	}
}

// A decision stored before fingerprints existed (the reply alone, within its 24 h)
// still replays.
func TestIdempotencyKeyStoredBeforeFingerprints(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "org")
	r.MustCheck(t, quota.Request{Org: org, Metric: "warmup"}) // hydrate
	key := r.prefix + ":{" + org + "}|i|legacy-key-1"
	if err := r.raw.Set(context.Background(), key, "A;1764000000000;0;0;o|"+org+"|M|1000|5|1764547200000", 0).Err(); err != nil {
		t.Fatal(err)
	}
	req := idemRequest(org, "legacy-key-1")
	res := r.MustCheck(t, req)
	if !res.Replayed || !res.Allowed || len(res.Levels) != 1 || res.Levels[0].Used != 5 {
		t.Errorf("legacy value: %+v, want its replay", res)
	}
	if got := r.usage(t, org)[orgC("requests")]; got != 0 {
		t.Errorf("replay counted %d", got)
	}
}

// Concurrent checks with one key and two different costs: exactly one decides and
// counts; every other with its request replays it, every other with the other cost
// conflicts. The script decides, so this holds however the checks are pipelined.
func TestIdempotencyKeyConcurrent(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	org := testenv.ID(t, "org")
	r.MustCheck(t, quota.Request{Org: org, Metric: "warmup"}) // hydrate first
	const n = 40
	type outcome struct {
		cost int64
		res  vocab.Result
		err  error
	}
	out := make(chan outcome, n)
	for i := range n {
		go func() {
			req := idemRequest(org, "order-race-1")
			req.Cost = int64(5 + i%2)
			res, err := r.e.Check(context.Background(), req)
			out <- outcome{req.Cost, res, err}
		}()
	}
	var decided []int64
	byCost := map[int64][]outcome{}
	for range n {
		o := <-out
		byCost[o.cost] = append(byCost[o.cost], o)
		if o.err == nil && !o.res.Replayed {
			decided = append(decided, o.cost)
		}
	}
	if len(decided) != 1 {
		t.Fatalf("%d checks decided, want exactly 1", len(decided))
	}
	winner := decided[0]
	for cost, os := range byCost {
		for _, o := range os {
			switch {
			case cost == winner && o.err != nil:
				t.Errorf("cost %d (the first request's): %v", cost, o.err)
			case cost != winner && !errors.Is(o.err, quota.ErrIdempotencyConflict):
				t.Errorf("cost %d (another request): %+v, %v; want ErrIdempotencyConflict", cost, o.res, o.err)
			}
		}
	}
	if got := r.usage(t, org)[orgC("requests")]; got != winner {
		t.Errorf("org counter %d, want %d (counted once)", got, winner)
	}
}
