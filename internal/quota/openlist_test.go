package quota_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// OpenReservations lists the held reservations in expiry order, never a lease, never
// a settled one; pages of any size go through all of them exactly once, and a filter
// keeps the team's or user's.
func TestOpenReservationsSkipsLeasesAndSettled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := MustRig(t, "", quota.Config{})
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1_000_000)}}
	mk := func(team, user string, ttl time.Duration) vocab.Reservation {
		req := quota.Request{Org: "acme", Team: team, User: user, Metric: "tokens", Cost: 5, Limits: limits}
		return r.mustReserve(t, req, quota.ReserveOptions{TTL: ttl})
	}
	// Created out of expiry order; one of each kind expires between the others.
	a3 := mk("eng", "alice", 30*time.Minute)
	a1 := mk("eng", "alice", 10*time.Minute)
	settled := mk("eng", "alice", 15*time.Minute)
	b2 := mk("ops", "bob", 20*time.Minute)
	o4 := mk("", "", 40*time.Minute) // the org's own
	for _, ttl := range []time.Duration{5 * time.Minute, 12 * time.Minute, 25 * time.Minute} {
		l, out, err := quota.ReserveLease(ctx, r.e, quota.Request{Org: "acme", Team: "eng", User: "alice", Metric: "tokens", Cost: 5, Limits: limits}, ttl)
		if err != nil || !out.Allowed || !quota.IsLease(l.ID) {
			t.Fatalf("lease: %+v %+v %v", l, out, err)
		}
	}
	if _, err := r.e.Commit(ctx, "acme", 1, settled.ID, 5); err != nil {
		t.Fatal(err)
	}
	want := []string{a1.ID, b2.ID, a3.ID, o4.ID}

	ids := func(rs []vocab.Reservation) []string {
		var out []string
		for _, x := range rs {
			out = append(out, x.ID)
		}
		return out
	}
	for _, size := range []int{0, 1, 2, 3, 4, 100} {
		var got []string
		var after quota.OpenCursor
		for pages := 0; ; pages++ {
			rs, next, err := r.e.OpenReservations(ctx, "acme", 1, quota.OpenFilter{}, after, size)
			if err != nil {
				t.Fatal(err)
			}
			if size > 0 && len(rs) > size {
				t.Fatalf("size %d: a page of %d", size, len(rs))
			}
			for _, x := range rs {
				if x.State != vocab.Held || x.Amount != 5 || x.Metric != "tokens" {
					t.Errorf("listed %+v", x)
				}
			}
			got = append(got, ids(rs)...)
			if next.IsZero() {
				break
			}
			if pages > 10 {
				t.Fatalf("size %d: no end after %d pages", size, pages)
			}
			after = next
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("size %d: ids (-want +got):\n%s", size, diff)
		}
	}
	// A full page of exactly the rest ends without a cursor to an empty page.
	if rs, next, err := r.e.OpenReservations(ctx, "acme", 1, quota.OpenFilter{}, quota.OpenCursor{}, 4); err != nil || len(rs) != 4 || !next.IsZero() {
		t.Errorf("a page of all 4: %d, next %+v, %v", len(rs), next, err)
	}

	filters := []struct {
		name string
		f    quota.OpenFilter
		want []string
	}{
		{"team", quota.OpenFilter{Team: "eng"}, []string{a1.ID, a3.ID}},
		{"user", quota.OpenFilter{User: "bob"}, []string{b2.ID}},
		{"team and user", quota.OpenFilter{Team: "ops", User: "bob"}, []string{b2.ID}},
		{"nobody", quota.OpenFilter{Team: "eng", User: "bob"}, nil},
	}
	for _, tc := range filters {
		rs, next, err := r.e.OpenReservations(ctx, "acme", 1, tc.f, quota.OpenCursor{}, 0)
		if err != nil || !next.IsZero() {
			t.Fatalf("%s: next %+v, %v", tc.name, next, err)
		}
		if diff := cmp.Diff(tc.want, ids(rs)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
		for _, x := range rs {
			if tc.f.Team != "" && x.Team != tc.f.Team || tc.f.User != "" && x.User != tc.f.User {
				t.Errorf("%s: listed %+v", tc.name, x)
			}
		}
	}

	// Another org has none of them.
	if rs, _, err := r.e.OpenReservations(ctx, "other", 1, quota.OpenFilter{}, quota.OpenCursor{}, 0); err != nil || len(rs) != 0 {
		t.Errorf("another org: %d, %v", len(rs), err)
	}
	bad := []struct {
		name  string
		f     quota.OpenFilter
		after quota.OpenCursor
		limit int
	}{
		{"limit over the max", quota.OpenFilter{}, quota.OpenCursor{}, quota.MaxOpenPage + 1},
		{"negative limit", quota.OpenFilter{}, quota.OpenCursor{}, -1},
		{"bad cursor id", quota.OpenFilter{}, quota.OpenCursor{ExpiresAt: 1, ID: "x_nope"}, 0},
		{"bad team", quota.OpenFilter{Team: " eng"}, quota.OpenCursor{}, 0},
	}
	for _, tc := range bad {
		if _, _, err := r.e.OpenReservations(ctx, "acme", 1, tc.f, tc.after, tc.limit); !errors.Is(err, quota.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", tc.name, err)
		}
	}
}

// Ties at one expiry are paged by id: more reservations expiring in the same
// millisecond than a page holds are all listed once.
func TestOpenReservationsTies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := newClock()
	r := MustRig(t, "", quota.Config{Clock: clk.Now})
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1_000_000)}}
	want := map[string]bool{}
	var at time.Time
	for range 7 {
		res := r.mustReserve(t, quota.Request{Org: "acme", Metric: "tokens", Cost: 1, Limits: limits}, quota.ReserveOptions{TTL: time.Minute})
		if !at.IsZero() && !res.ExpiresAt.Equal(at) {
			t.Fatalf("expiries %s and %s differ: no tie to test", at, res.ExpiresAt)
		}
		want[res.ID], at = true, res.ExpiresAt
	}
	var after quota.OpenCursor
	var last string
	got := 0
	for {
		rs, next, err := r.e.OpenReservations(ctx, "acme", 1, quota.OpenFilter{}, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range rs {
			if !want[x.ID] || x.ID <= last {
				t.Errorf("listed %s after %s (a repeat, out of order or not made here)", x.ID, last)
			}
			last = x.ID
			got++
		}
		if next.IsZero() {
			break
		}
		after = next
	}
	if got != len(want) {
		t.Errorf("listed %d of %d", got, len(want))
	}
}
