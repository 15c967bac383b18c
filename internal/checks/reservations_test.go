package checks_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Reserve validates the reservation's own fields, then resolves its check as Check
// does (cost = amount, or amounts as costs), holds it for its TTL (default a minute,
// at most an hour) to be settled by its on_expiry (default commit), and describes a
// denial as a check's; nothing is asked of the engine for a refused one.
func TestReserve(t *testing.T) {
	w := newWorld(t)
	eng := in("acme", "eng", "", "", -1)
	for _, tc := range []struct {
		name    string
		caller  checks.Caller
		in      checks.ReserveInput
		deny    *vocab.Result
		err     error // the engine's
		said    string
		ttl     time.Duration
		expiry  vocab.OnExpiry
		multi   bool
		refuse  *refusal
		retry   int64
		blocked string
	}{
		{name: "an amount, the defaults", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 40},
			said: "eng/ requests:40", ttl: time.Minute, expiry: vocab.ExpiryCommit},
		{name: "the amount, not the check's cost", caller: acmeKey, in: checks.ReserveInput{Check: in("acme", "", "alice", "tokens", 99), Amount: 7},
			said: "eng/alice tokens:7", ttl: time.Minute, expiry: vocab.ExpiryCommit},
		{name: "a ttl and release", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 1, TTL: ptr(int64(3600)), OnExpiry: ptr("release")},
			said: "eng/ requests:1", ttl: time.Hour, expiry: vocab.ExpiryRelease},
		{name: "amounts", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amounts: map[string]int64{"tokens": 4000, "requests": 1}},
			said: "eng/ requests:1 tokens:4000", ttl: time.Minute, expiry: vocab.ExpiryCommit, multi: true},
		{name: "amounts of which one is 0", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amounts: map[string]int64{"tokens": 0, "requests": 1}},
			said: "eng/ requests:1 tokens:0", ttl: time.Minute, expiry: vocab.ExpiryCommit, multi: true},
		{name: "denied: described as a check", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 400},
			deny: &vocab.Result{Levels: []vocab.LevelStatus{level("", vocab.LevelTeam, "eng", vocab.Month, 600, 300, w.now.Add(time.Hour))},
				BlockedAt: &vocab.Blocked{Level: vocab.LevelTeam, ID: "eng", Window: vocab.Month}, RetryAfter: 2500 * time.Millisecond},
			said: "eng/ requests:400", retry: 3, blocked: "team-month"},
		{name: "no org", caller: acmeKey, in: checks.ReserveInput{Amount: 1}, refuse: &refusal{derrors.Invalid, "org", "is required"}},
		{name: "no amount", caller: acmeKey, in: checks.ReserveInput{Check: eng, AmountMissing: true}, refuse: &refusal{derrors.Invalid, "amount", "is required"}},
		{name: "an amount of 0", caller: acmeKey, in: checks.ReserveInput{Check: eng}, refuse: &refusal{derrors.Invalid, "amount", "must be 1"}},
		{name: "an amount past the bound", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: vocab.MaxUnits + 1}, refuse: &refusal{derrors.Invalid, "amount", ""}},
		{name: "a ttl of 0", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 1, TTL: ptr(int64(0))}, refuse: &refusal{derrors.Invalid, "ttl_seconds", "3600"}},
		{name: "a ttl past an hour", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 1, TTL: ptr(int64(3601))}, refuse: &refusal{derrors.Invalid, "ttl_seconds", ""}},
		{name: "an unknown on_expiry", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 1, OnExpiry: ptr("keep")}, refuse: &refusal{derrors.Invalid, "on_expiry", ""}},
		{name: "amounts beside a metric", caller: acmeKey, in: checks.ReserveInput{Check: in("acme", "eng", "", "tokens", -1), Amounts: map[string]int64{"tokens": 1}},
			refuse: &refusal{derrors.Invalid, "metric", "not both"}},
		{name: "amounts beside an amount", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 2, Amounts: map[string]int64{"tokens": 1}},
			refuse: &refusal{derrors.Invalid, "amount", "not both"}},
		{name: "amounts of nothing", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amounts: map[string]int64{"tokens": 0}},
			refuse: &refusal{derrors.Invalid, "amounts", "at least 1"}},
		{name: "a check's field", caller: acmeKey, in: checks.ReserveInput{Check: in("acme", "e ng", "", "", -1), Amount: 1}, refuse: &refusal{derrors.Invalid, "team", ""}},
		{name: "another org", caller: acmeKey, in: checks.ReserveInput{Check: in("strict", "", "", "", -1), Amount: 1}, refuse: &refusal{derrors.NotFound, "", ""}},
		{name: "no check scope", caller: noScope, in: checks.ReserveInput{Check: eng, Amount: 1}, refuse: &refusal{derrors.Forbidden, "", ""}},
		{name: "an unknown metric", caller: acmeKey, in: checks.ReserveInput{Check: in("acme", "eng", "", "gpu", -1), Amount: 1}, refuse: &refusal{derrors.Unprocessable, "", "gpu"}},
		{name: "the engine overloaded", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 1}, err: quota.ErrOverloaded,
			said: "eng/ requests:1", refuse: &refusal{derrors.Overloaded, "", ""}},
		{name: "the engine's idempotency records bound", caller: acmeKey, in: checks.ReserveInput{Check: eng, Amount: 1},
			err: &quota.BoundError{Org: "acme", Bound: quota.BoundIdempotencyRecords, Limit: 5}, said: "eng/ requests:1", refuse: &refusal{derrors.Unprocessable, "idempotency_key", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			f.deny, f.err = tc.deny, tc.err
			r, err := s.Reserve(context.Background(), tc.caller, tc.in)
			var said string
			if len(f.reserved) == 1 {
				said = saidReq(f.reserved[0])
			}
			if said != tc.said || len(f.reserved) > 1 {
				t.Errorf("reserved %q (%d asked), want %q", said, len(f.reserved), tc.said)
			}
			if tc.refuse != nil {
				if why := tc.refuse.is(err); why != "" {
					t.Errorf("Reserve: %v: %s", err, why)
				}
				return
			}
			if err != nil {
				t.Fatalf("Reserve: %v", err)
			}
			d := r.Decision
			if tc.deny != nil {
				if d.Result.Allowed || r.Reservation.ID != "" || d.RetryAfter != tc.retry || d.Violated() != tc.blocked || d.RateLimit.Reset != tc.retry {
					t.Errorf("denied: %+v, want retry %d at %s", r, tc.retry, tc.blocked)
				}
				return
			}
			if !d.Result.Allowed || r.Reservation.ID == "" || r.Reservation.State != vocab.Held {
				t.Errorf("reservation %+v, want held", r)
			}
			if got := r.Reservation.ExpiresAt.Sub(w.now); got != tc.ttl || r.Reservation.OnExpiry != tc.expiry {
				t.Errorf("held for %v settled by %q, want %v %q", got, r.Reservation.OnExpiry, tc.ttl, tc.expiry)
			}
			if d.Multi != tc.multi || d.Metric != f.reserved[0].Metric {
				t.Errorf("Multi %v Metric %q, want %v %q", d.Multi, d.Metric, tc.multi, f.reserved[0].Metric)
			}
		})
	}
}

// A reservation is addressed by id with an org API key of the check scope (not the
// operator), in the key's org only (another org's id is not found), at the org's
// billing anchor; its errors: not found (echoing at most 64 characters of the id), a
// conflict naming the state once settled, the bounds of used and ttl_seconds, and
// the engine's kinds.
func TestReservationsByID(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	long := strings.Repeat("x", 100)
	type call func(s *checks.Service, c checks.Caller, id string) (vocab.Reservation, error)
	read := func(s *checks.Service, c checks.Caller, id string) (vocab.Reservation, error) {
		return s.Reservation(ctx, c, id)
	}
	release := func(s *checks.Service, c checks.Caller, id string) (vocab.Reservation, error) {
		return s.Release(ctx, c, id)
	}
	commit := func(used int64) call {
		return func(s *checks.Service, c checks.Caller, id string) (vocab.Reservation, error) {
			return s.Commit(ctx, c, id, used)
		}
	}
	commitUsed := func(used map[string]int64) call {
		return func(s *checks.Service, c checks.Caller, id string) (vocab.Reservation, error) {
			return s.CommitUsed(ctx, c, id, used)
		}
	}
	extend := func(ttl int64) call {
		return func(s *checks.Service, c checks.Caller, id string) (vocab.Reservation, error) {
			return s.Extend(ctx, c, id, ttl)
		}
	}
	for _, tc := range []struct {
		name   string
		caller checks.Caller
		id     string
		call   call
		err    error  // the engine's
		ops    string // the engine's calls: name@org/anchor, ...
		state  vocab.ReservationState
		check  func(r vocab.Reservation) bool
		refuse *refusal
	}{
		{name: "read", caller: acmeKey, id: "r1", call: read, ops: "reservation@acme/1", state: vocab.Held},
		{name: "read at the org's anchor", caller: strictKey, id: "s1", call: read, ops: "reservation@strict/15", state: vocab.Held},
		{name: "read a settled one", caller: acmeKey, id: "r2", call: read, ops: "reservation@acme/1", state: vocab.Committed},
		{name: "commit", caller: acmeKey, id: "r1", call: commit(4), ops: "commit@acme/1", state: vocab.Committed,
			check: func(r vocab.Reservation) bool { return r.Used == 4 && r.Released == 6 }},
		{name: "commit over the amount", caller: acmeKey, id: "r1", call: commit(12), ops: "commit@acme/1", state: vocab.Committed,
			check: func(r vocab.Reservation) bool { return r.Used == 12 && r.OverReserved == 2 }},
		{name: "commit 0", caller: acmeKey, id: "r1", call: commit(0), ops: "commit@acme/1", state: vocab.Committed},
		{name: "commit used per metric", caller: acmeKey, id: "r3", call: commitUsed(map[string]int64{"tokens": 900}), ops: "commitUsed@acme/1", state: vocab.Committed,
			check: func(r vocab.Reservation) bool { return r.Metrics[1].Used == 900 && r.Metrics[0].Used == 0 }},
		{name: "release", caller: acmeKey, id: "r1", call: release, ops: "release@acme/1", state: vocab.Released},
		{name: "extend", caller: acmeKey, id: "r1", call: extend(300), ops: "extend@acme/1", state: vocab.Held,
			check: func(r vocab.Reservation) bool { return r.ExpiresAt.Equal(w.now.Add(300 * time.Second)) }},
		{name: "commit a settled one", caller: acmeKey, id: "r2", call: commit(1), ops: "commit@acme/1", refuse: &refusal{derrors.Conflict, "", "committed"}},
		{name: "release a settled one", caller: acmeKey, id: "r2", call: release, ops: "release@acme/1", refuse: &refusal{derrors.Conflict, "", "committed"}},
		{name: "extend a settled one", caller: acmeKey, id: "r2", call: extend(10), ops: "extend@acme/1", refuse: &refusal{derrors.Conflict, "", "committed"}},
		{name: "an unknown id", caller: acmeKey, id: "r9", call: read, ops: "reservation@acme/1", refuse: &refusal{derrors.NotFound, "", `"r9"`}},
		{name: "a long id, echoed cut", caller: acmeKey, id: long, call: release, ops: "release@acme/1", refuse: &refusal{derrors.NotFound, "", strings.Repeat("x", 64) + "..."}},
		{name: "another org's id", caller: acmeKey, id: "s1", call: commit(1), ops: "commit@acme/1", refuse: &refusal{derrors.NotFound, "", "s1"}},
		{name: "the operator", caller: operator, id: "r1", call: read, refuse: &refusal{derrors.Forbidden, "", "org API key"}},
		{name: "a key of no org", caller: keyOf(""), id: "r1", call: release, refuse: &refusal{derrors.Forbidden, "", ""}},
		{name: "a key without the check scope", caller: noScope, id: "r1", call: commit(1), refuse: &refusal{derrors.Forbidden, "", "check"}},
		{name: "a key of an unknown org", caller: keyOf("gone", "check"), id: "r1", call: read, refuse: &refusal{derrors.NotFound, "", "gone"}},
		{name: "used below 0", caller: acmeKey, id: "r1", call: commit(-1), refuse: &refusal{derrors.Invalid, "used", ""}},
		{name: "used past the bound", caller: acmeKey, id: "r1", call: commit(vocab.MaxUnits + 1), refuse: &refusal{derrors.Invalid, "used", ""}},
		{name: "used of no metric", caller: acmeKey, id: "r3", call: commitUsed(map[string]int64{}), refuse: &refusal{derrors.Invalid, "used", ""}},
		{name: "used of a negative metric", caller: acmeKey, id: "r3", call: commitUsed(map[string]int64{"tokens": -1}), refuse: &refusal{derrors.Invalid, "used", "tokens"}},
		{name: "used of a metric not held", caller: acmeKey, id: "r3", call: commitUsed(map[string]int64{"images": 1}), ops: "commitUsed@acme/1",
			refuse: &refusal{derrors.Invalid, "used", "images"}},
		{name: "a ttl of 0", caller: acmeKey, id: "r1", call: extend(0), refuse: &refusal{derrors.Invalid, "ttl_seconds", ""}},
		{name: "a ttl past an hour", caller: acmeKey, id: "r1", call: extend(3601), refuse: &refusal{derrors.Invalid, "ttl_seconds", ""}},
		{name: "the engine overloaded", caller: acmeKey, id: "r1", call: commit(1), err: quota.ErrOverloaded, ops: "commit@acme/1",
			refuse: &refusal{derrors.Overloaded, "", ""}},
		{name: "the engine down", caller: acmeKey, id: "r1", call: release, err: errEngine, ops: "release@acme/1",
			refuse: &refusal{derrors.Unavailable, "", "quota store"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			f.hold(vocab.Reservation{Org: "acme", ID: "r1", Team: "eng", Metric: "requests", Amount: 10, ExpiresAt: w.now.Add(time.Minute)})
			f.hold(vocab.Reservation{Org: "acme", ID: "r2", Metric: "requests", Amount: 10, State: vocab.Committed})
			f.hold(vocab.Reservation{Org: "acme", ID: "r3", Metric: "requests", Amount: 1,
				Metrics: []vocab.MetricAmount{{Metric: "requests", Amount: 1}, {Metric: "tokens", Amount: 1000}}})
			f.hold(vocab.Reservation{Org: "strict", ID: "s1", Metric: "requests", Amount: 1})
			f.err = tc.err
			r, err := tc.call(s, tc.caller, tc.id)
			var ops []string
			for _, o := range f.ops {
				ops = append(ops, fmt.Sprintf("%s@%s/%d", o.name, o.org, o.anchor))
			}
			if got := strings.Join(ops, ", "); got != tc.ops {
				t.Errorf("engine calls %q, want %q", got, tc.ops)
			}
			if tc.refuse != nil {
				if why := tc.refuse.is(err); why != "" {
					t.Errorf("%v: %s", err, why)
				}
				if tc.name == "a long id, echoed cut" && strings.Contains(err.Error(), strings.Repeat("x", 65)) {
					t.Errorf("%v: the whole id echoed", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.ID != tc.id || r.State != tc.state || (tc.check != nil && !tc.check(r)) {
				t.Errorf("reservation %+v, want %s %s", r, tc.id, tc.state)
			}
		})
	}
}

// OpenReservations and InFlight read an org's reservations (the transport has
// authorized the caller): a page of 1 to quota.MaxOpenPage (0: the default page), the
// filter passed on, the cursor read from and made as the API's opaque
// base64url("<expires_at ms>.<id>"), at the org's anchor; an unknown org is not found;
// the engine's errors answer with their kinds.
func TestOpenReservationsAndInFlight(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		org    string
		limit  int
		filter quota.OpenFilter
		cursor string // "-": the cursor of after below
		err    error
		ids    string
		anchor int
		refuse *refusal
	}{
		{cursor: "-", name: "a page", org: "acme", limit: 2, ids: "[r1 r3]", anchor: 1},
		{cursor: "-", name: "a filter", org: "acme", limit: quota.MaxOpenPage, filter: quota.OpenFilter{Team: "eng", User: "alice"}, ids: "[r3]", anchor: 1},
		{cursor: "-", name: "the org's anchor", org: "strict", limit: 1, ids: "[s1]", anchor: 15},
		{cursor: "-", name: "the default page", org: "acme", limit: 0, ids: "[r1 r3 r2]", anchor: 1},
		{name: "the first page", org: "acme", limit: 1, cursor: "", ids: "[r1]", anchor: 1},
		{cursor: "-", name: "a page of -1", org: "acme", limit: -1, refuse: &refusal{derrors.Invalid, "limit", fmt.Sprint(quota.MaxOpenPage)}},
		{name: "a cursor not made here", org: "acme", limit: 1, cursor: "bm9wZQ", refuse: &refusal{derrors.Invalid, "cursor", ""}},
		{name: "a cursor of a bad id", org: "acme", limit: 1, cursor: base64.RawURLEncoding.EncodeToString([]byte("12.r0")), refuse: &refusal{derrors.Invalid, "cursor", ""}},
		{cursor: "-", name: "a page past the most", org: "acme", limit: quota.MaxOpenPage + 1, refuse: &refusal{derrors.Invalid, "limit", ""}},
		{cursor: "-", name: "an unknown org", org: "nope", limit: 1, refuse: &refusal{derrors.NotFound, "", "nope"}},
		{cursor: "-", name: "the engine down", org: "acme", limit: 1, err: errEngine, refuse: &refusal{derrors.Unavailable, "", ""}},
	} {
		t.Run("open: "+tc.name, func(t *testing.T) {
			s, f := w.service()
			f.hold(vocab.Reservation{Org: "acme", ID: "r1", Team: "eng", ExpiresAt: w.now.Add(time.Second)})
			f.hold(vocab.Reservation{Org: "acme", ID: "r2", Team: "ops", ExpiresAt: w.now.Add(3 * time.Second)})
			f.hold(vocab.Reservation{Org: "acme", ID: "r3", Team: "eng", User: "alice", ExpiresAt: w.now.Add(2 * time.Second)})
			f.hold(vocab.Reservation{Org: "acme", ID: "r4", State: vocab.Released})
			f.hold(vocab.Reservation{Org: "strict", ID: "s1"})
			f.err = tc.err
			after := quota.OpenCursor{ExpiresAt: 12, ID: "r_" + strings.Repeat("x", 22)}
			cursor := base64.RawURLEncoding.EncodeToString([]byte("12." + after.ID))
			if tc.cursor != "-" {
				cursor = tc.cursor
			}
			rs, next, err := s.OpenReservations(ctx, tc.org, tc.filter.Team, tc.filter.User, cursor, tc.limit)
			if tc.refuse.answered(t, err) {
				return
			}
			var ids []string
			for _, r := range rs {
				ids = append(ids, r.ID)
			}
			o, limit, wantAfter := f.ops[0], tc.limit, quota.OpenCursor{}
			if limit == 0 {
				limit = quota.DefaultOpenPage
			}
			if cursor != "" {
				wantAfter = after
			}
			if fmt.Sprint(ids) != tc.ids || next != cursor || o.after != wantAfter || o.anchor != tc.anchor || o.filter != tc.filter || o.limit != limit {
				t.Errorf("ids %v next %q, asked %+v; want %s", ids, next, o, tc.ids)
			}
		})
	}
	held := map[quota.Counter]int64{{Metric: "requests", Level: vocab.LevelTeam, Team: "eng"}: 3}
	for _, tc := range []struct {
		name   string
		org    string
		err    error
		refuse *refusal
	}{
		{name: "held", org: "acme"},
		{name: "an unknown org", org: "nope", refuse: &refusal{derrors.NotFound, "", "nope"}},
		{name: "the engine overloaded", org: "acme", err: quota.ErrOverloaded, refuse: &refusal{derrors.Overloaded, "", ""}},
	} {
		t.Run("in flight: "+tc.name, func(t *testing.T) {
			s, f := w.service()
			f.inFlight, f.err = held, tc.err
			m, err := s.InFlight(ctx, tc.org)
			if tc.refuse != nil {
				if why := tc.refuse.is(err); why != "" {
					t.Errorf("%v: %s", err, why)
				}
				return
			}
			if err != nil || fmt.Sprint(m) != fmt.Sprint(held) || f.ops[0].org != tc.org {
				t.Errorf("InFlight = %v, %v; want %v", m, err, held)
			}
		})
	}
}
