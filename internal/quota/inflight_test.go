package quota_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// TestInFlightRecord: a pop records each org with a score of its own; only the
// pop's own score removes the entry (a later pop's entry stays); old entries come
// back to be read whole.
func TestInFlightRecord(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	ctx := context.Background()
	a, b := testenv.ID(t, "a"), testenv.ID(t, "b")
	check := func(org string) {
		r.MustCheck(t, quota.Request{Org: org, Team: "eng", User: "u", Metric: "requests", Cost: 1})
	}
	pop := func(recoverAfter int) map[string]quota.DirtyOrg {
		t.Helper()
		ds, err := r.e.PopDirtyOrgs(ctx, -1)
		if recoverAfter == 0 {
			ds, err = r.e.PopDirtyOrgs(ctx, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]quota.DirtyOrg{}
		for _, d := range ds {
			out[d.Org] = d
		}
		return out
	}
	record := r.prefix + ":|f"
	check(a)
	check(b)
	first := pop(-1)
	if len(first) != 2 || first[a].Recover || first[a].Token <= 0 || first[b].Token <= 0 {
		t.Fatalf("first pop: %+v, want a and b popped with tokens", first)
	}
	if n := r.raw.ZCard(ctx, record).Val(); n != 2 {
		t.Fatalf("in-flight record holds %d, want 2", n)
	}
	if _, err := r.e.Drain(ctx, a, r.e.Period(1).ID); err != nil { // its fields are dirty again only once drained
		t.Fatal(err)
	}
	check(a)
	second := pop(-1)
	if second[a].Token <= first[a].Token {
		t.Fatalf("a popped again with token %d, not above its first %d", second[a].Token, first[a].Token)
	}
	if err := r.e.DoneInFlight(ctx, []quota.DirtyOrg{first[a], first[b]}); err != nil {
		t.Fatal(err)
	}
	if got := r.raw.ZRange(ctx, record, 0, -1).Val(); !cmp.Equal(got, []string{a}) {
		t.Fatalf("after the first pop's removal the record holds %v, want only a (its second pop is not written)", got)
	}
	recovered := pop(0)
	if d := recovered[a]; len(recovered) != 1 || !d.Recover || d.Token != second[a].Token {
		t.Fatalf("recovered %+v, want a with its second token", recovered)
	}
	if err := r.e.DoneInFlight(ctx, []quota.DirtyOrg{recovered[a]}); err != nil {
		t.Fatal(err)
	}
	if n := r.raw.ZCard(ctx, record).Val(); n != 0 {
		t.Fatalf("in-flight record holds %d after every removal, want 0", n)
	}
}

// TestDrainManyIsDrain: one pipeline drains what Drain would, per period, and a bad
// period fails alone.
func TestDrainManyIsDrain(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	ctx := context.Background()
	org, other := testenv.ID(t, "org"), testenv.ID(t, "other")
	per := r.e.Period(1).ID
	r.MustCheck(t, quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: 2})
	r.MustCheck(t, quota.Request{Org: other, Team: "ops", Metric: "tokens", Cost: 5})
	got := r.e.DrainMany(ctx, []quota.OrgPeriod{{Org: org, Period: per}, {Org: org, Period: "2026-13"}, {Org: other, Period: per}})
	want := map[quota.Counter]int64{orgC("requests"): 2, teamC("requests", "eng"): 2, userC("requests", "eng", "alice"): 2}
	if got[0].Err != nil || !cmp.Equal(want, got[0].Counters) {
		t.Errorf("org: %v %v, want %v", got[0].Counters, got[0].Err, want)
	}
	if !errors.Is(got[1].Err, quota.ErrInvalid) {
		t.Errorf("a bad period: %v, want ErrInvalid", got[1].Err)
	}
	if want := (map[quota.Counter]int64{orgC("tokens"): 5, teamC("tokens", "ops"): 5}); got[2].Err != nil || !cmp.Equal(want, got[2].Counters) {
		t.Errorf("other: %v %v, want %v", got[2].Counters, got[2].Err, want)
	}
	if again, err := r.e.Drain(ctx, org, per); err != nil || len(again.Counters) != 0 {
		t.Errorf("a drain after DrainMany: %v %v, want nothing left", again.Counters, err)
	}
}
