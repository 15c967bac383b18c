package quota_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// llmReq is a request of 1 request and tokens tokens on acme/eng/alice.
func llmReq(tokens int64, reqLimits, tokLimits quota.LevelLimits) quota.Request {
	return quota.Request{Org: "acme", Team: "eng", User: "alice", Metric: "requests", Cost: 1, Limits: reqLimits,
		More: []quota.MetricCost{{Metric: "tokens", Cost: tokens, Limits: tokLimits}}}
}

// A multi-metric check whose tokens would pass a limit at any one level is denied and
// counts nothing anywhere: not the request, at no level, in no window.
func TestMultiMetricDeniedCountsNothing(t *testing.T) {
	reqLimits := quota.LevelLimits{
		Org:  []vocab.Limit{lim(vocab.Month, 1000), lim(vocab.Minute, 500)},
		Team: []vocab.Limit{lim(vocab.Month, 1000)},
		User: []vocab.Limit{lim(vocab.Minute, 100)},
	}
	for _, level := range []vocab.Level{vocab.LevelOrg, vocab.LevelTeam, vocab.LevelUser} {
		t.Run(string(level), func(t *testing.T) {
			r := MustRig(t, "", quota.Config{})
			tok := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1_000_000)}}
			tight := []vocab.Limit{lim(vocab.Hour, 1000)}
			switch level {
			case vocab.LevelOrg:
				tok.Org = append(tok.Org, tight...)
			case vocab.LevelTeam:
				tok.Team = tight
			case vocab.LevelUser:
				tok.User = tight
			}
			res := r.MustCheck(t, llmReq(600, reqLimits, tok))
			if !res.Allowed {
				t.Fatalf("first check denied: %+v", res.BlockedAt)
			}
			before := r.snapshot(t, "acme")
			res = r.MustCheck(t, llmReq(600, reqLimits, tok))
			if res.Allowed {
				t.Fatal("600 more tokens over a limit of 1000 allowed")
			}
			b := res.BlockedAt
			if b == nil || b.Metric != "tokens" || b.Level != level || b.Window != vocab.Hour {
				t.Fatalf("blocked at %+v, want tokens %s hour", b, level)
			}
			if after := r.snapshot(t, "acme"); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("a denied multi-metric check changed counters:\nbefore %v\nafter  %v", before, after)
			}
			u := r.usage(t, "acme")
			for _, c := range []quota.Counter{orgC("requests"), teamC("requests", "eng"), userC("requests", "eng", "alice")} {
				if u[c] != 1 {
					t.Errorf("%+v = %d, want 1 (the denied check's request counted)", c, u[c])
				}
			}
			for _, c := range []quota.Counter{orgC("tokens"), teamC("tokens", "eng"), userC("tokens", "eng", "alice")} {
				if u[c] != 600 {
					t.Errorf("%+v = %d, want 600", c, u[c])
				}
			}
			// levels: every metric's every limit, the metric named
			var reqRows, tokRows int
			for _, l := range res.Levels {
				switch l.Metric {
				case "requests":
					reqRows++
				case "tokens":
					tokRows++
				default:
					t.Errorf("level %+v names no metric of the request", l)
				}
			}
			if reqRows != 4 || tokRows != 2 {
				t.Errorf("levels: %d of requests, %d of tokens; want 4 and 2: %+v", reqRows, tokRows, res.Levels)
			}
		})
	}
}

// 64 concurrent multi-metric checks over two engines on one Redis (two replicas) never
// admit past any metric's limit at any level, and the counters hold exactly what was
// admitted.
func TestMultiMetricConcurrentExact(t *testing.T) {
	prefix := testenv.ID(t, "qm")
	rigs := []*testRig{
		MustRig(t, "", quota.Config{KeyPrefix: prefix, Leases: quota.LeaseConfig{Enabled: true, Max: 50 * time.Millisecond, Threshold: 50, Replicas: 2}}),
		MustRig(t, "", quota.Config{KeyPrefix: prefix, Leases: quota.LeaseConfig{Enabled: true, Max: 50 * time.Millisecond, Threshold: 50, Replicas: 2}}),
	}
	const userReq, teamReq, orgTok, userTok = 400, 700, 20_000, 11_000
	reqLimits := quota.LevelLimits{
		Org:  []vocab.Limit{lim(vocab.Month, 1_000_000)},
		Team: []vocab.Limit{lim(vocab.Month, teamReq)},
		User: []vocab.Limit{lim(vocab.Month, userReq)},
	}
	tokLimits := quota.LevelLimits{
		Org:  []vocab.Limit{lim(vocab.Month, orgTok)},
		User: []vocab.Limit{lim(vocab.Month, userTok)},
	}
	users := []string{"alice", "bob"}
	var mu sync.Mutex
	admitted := map[string][2]int64{} // user -> requests, tokens
	var denied atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		r := rigs[g%2]
		user := users[(g/2)%len(users)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 40 {
				tokens := 1 + rng.Int64N(60)
				req := llmReq(tokens, reqLimits, tokLimits)
				req.User = user
				res, err := r.e.Check(context.Background(), req)
				if err != nil {
					t.Errorf("Check: %v", err)
					return
				}
				if res.Leased {
					t.Error("a multi-metric check answered from a lease")
				}
				if !res.Allowed {
					denied.Add(1)
					continue
				}
				mu.Lock()
				a := admitted[user]
				a[0]++
				a[1] += tokens
				admitted[user] = a
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var teamReqs, orgToks int64
	u := rigs[0].usage(t, "acme")
	for _, user := range users {
		a := admitted[user]
		teamReqs += a[0]
		orgToks += a[1]
		if a[0] > userReq || a[1] > userTok {
			t.Errorf("%s admitted %d requests, %d tokens: over the user's %d, %d", user, a[0], a[1], userReq, userTok)
		}
		if got := u[userC("requests", "eng", user)]; got != a[0] {
			t.Errorf("%s requests counted %d, admitted %d", user, got, a[0])
		}
		if got := u[userC("tokens", "eng", user)]; got != a[1] {
			t.Errorf("%s tokens counted %d, admitted %d", user, got, a[1])
		}
	}
	if teamReqs > teamReq || orgToks > orgTok {
		t.Errorf("admitted %d requests in the team (limit %d), %d tokens in the org (limit %d)", teamReqs, teamReq, orgToks, orgTok)
	}
	if got := u[teamC("requests", "eng")]; got != teamReqs {
		t.Errorf("team requests counted %d, admitted %d", got, teamReqs)
	}
	if got := u[orgC("requests")]; got != teamReqs {
		t.Errorf("org requests counted %d, admitted %d", got, teamReqs)
	}
	if got := u[orgC("tokens")]; got != orgToks {
		t.Errorf("org tokens counted %d, admitted %d", got, orgToks)
	}
	if denied.Load() == 0 {
		t.Error("no check denied: the limits were never reached")
	}
	t.Logf("admitted %v, denied %d", admitted, denied.Load())
}

// An idempotency key covers every metric and cost: a repeat replays, a repeat with
// another cost of any metric is refused and counts nothing.
func TestMultiMetricIdempotency(t *testing.T) {
	r := MustRig(t, "", quota.Config{})
	lims := quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 10_000)}}
	req := llmReq(500, lims, lims)
	req.IdempotencyKey = "idem-multi-1"
	first := r.MustCheck(t, req)
	again := r.MustCheck(t, req)
	if !first.Allowed || !again.Replayed {
		t.Fatalf("first %+v, again %+v: want allowed, then replayed", first, again)
	}
	if len(again.Levels) != 2 || again.Levels[0].Metric != "requests" || again.Levels[1].Metric != "tokens" || again.Levels[1].Used != 500 {
		t.Fatalf("replayed levels %+v", again.Levels)
	}
	before := r.snapshot(t, "acme")
	other := req
	other.More = []quota.MetricCost{{Metric: "tokens", Cost: 501, Limits: lims}}
	if _, err := r.e.Check(context.Background(), other); !errors.Is(err, quota.ErrIdempotencyConflict) {
		t.Fatalf("another token cost under the key: %v, want ErrIdempotencyConflict", err)
	}
	one := req
	one.More = nil
	if _, err := r.e.Check(context.Background(), one); !errors.Is(err, quota.ErrIdempotencyConflict) {
		t.Fatalf("the request alone under the key: %v, want ErrIdempotencyConflict", err)
	}
	if after := r.snapshot(t, "acme"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a refused repeat changed counters")
	}
	if u := r.usage(t, "acme"); u[userC("tokens", "eng", "alice")] != 500 || u[userC("requests", "eng", "alice")] != 1 {
		t.Fatalf("usage %v", u)
	}
}

// The same metric twice, 17 metrics named, or two derived, are invalid; 16 named and
// one derived are decided.
func TestMultiMetricInvalid(t *testing.T) {
	r := MustRig(t, "", quota.Config{})
	req := llmReq(5, quota.LevelLimits{}, quota.LevelLimits{})
	req.More = append(req.More, quota.MetricCost{Metric: "requests", Cost: 1})
	if _, err := r.e.Check(context.Background(), req); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("requests twice: %v", err)
	}
	req = llmReq(5, quota.LevelLimits{}, quota.LevelLimits{})
	req.More = nil
	for i := range 16 {
		req.More = append(req.More, quota.MetricCost{Metric: fmt.Sprintf("m%d", i), Cost: 1})
	}
	if _, err := r.e.Check(context.Background(), req); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("17 metrics: %v", err)
	}
	// 16 named and one Derived (the check service's spend) are decided; two Derived
	// are not.
	req.More[15].Derived = true
	if res, err := r.e.Check(context.Background(), req); err != nil || !res.Allowed {
		t.Fatalf("16 metrics and one derived: %v %v", res, err)
	}
	req.More[14].Derived = true
	if _, err := r.e.Check(context.Background(), req); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("two derived: %v", err)
	}
}

// A multi-metric reservation holds each metric's amount at every level; commit with
// used per metric counts each (a metric left out used 0), gives back the rest, and the
// held units go to 0.
func TestMultiMetricReservation(t *testing.T) {
	ctx := context.Background()
	r := MustRig(t, "", quota.Config{})
	lims := quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 10_000), lim(vocab.Minute, 5000)}}
	req := llmReq(4000, lims, lims)
	res, dec, err := r.e.Reserve(ctx, req, quota.ReserveOptions{TTL: time.Minute})
	if err != nil || !dec.Allowed {
		t.Fatalf("Reserve: %v %+v", err, dec.BlockedAt)
	}
	if len(res.Metrics) != 2 || res.Metrics[1] != (vocab.MetricAmount{Metric: "tokens", Amount: 4000}) {
		t.Fatalf("reservation metrics %+v", res.Metrics)
	}
	per := r.e.Period(1).ID
	held, err := r.e.HeldUnits(ctx, "acme", per)
	if err != nil {
		t.Fatal(err)
	}
	if held[userC("tokens", "eng", "alice")] != 4000 || held[orgC("tokens")] != 4000 || held[teamC("requests", "eng")] != 1 {
		t.Fatalf("held %v", held)
	}
	// the held tokens count: 6001 more tokens do not fit the month's 10000
	if d := r.MustCheck(t, llmReq(6001, lims, lims)); d.Allowed || d.BlockedAt.Metric != "tokens" {
		t.Fatalf("a check past the held tokens: %+v", d)
	}
	read, err := r.e.Reservation(ctx, "acme", 1, res.ID)
	if err != nil || len(read.Metrics) != 2 || read.Metrics[1].Amount != 4000 {
		t.Fatalf("Reservation: %+v %v", read, err)
	}
	// a bare number for several metrics, or a metric it does not hold: nothing settled
	if _, err := r.e.Commit(ctx, "acme", 1, res.ID, 5); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("commit of a number: %v", err)
	}
	if _, err := r.e.CommitUsed(ctx, "acme", 1, res.ID, map[string]int64{"gpu": 1}); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("commit of gpu: %v", err)
	}
	done, err := r.e.CommitUsed(ctx, "acme", 1, res.ID, map[string]int64{"tokens": 1234})
	if err != nil {
		t.Fatal(err)
	}
	want := []vocab.MetricAmount{{Metric: "requests", Amount: 1, Used: 0, Released: 1}, {Metric: "tokens", Amount: 4000, Used: 1234, Released: 2766}}
	if fmt.Sprint(done.Metrics) != fmt.Sprint(want) || done.State != vocab.Committed {
		t.Fatalf("commit: %+v, want metrics %+v", done, want)
	}
	again, err := r.e.CommitUsed(ctx, "acme", 1, res.ID, map[string]int64{"tokens": 1234})
	if err != nil || fmt.Sprint(again.Metrics) != fmt.Sprint(want) {
		t.Fatalf("repeat: %+v %v", again, err)
	}
	u := r.usage(t, "acme")
	for _, c := range []quota.Counter{orgC("tokens"), teamC("tokens", "eng"), userC("tokens", "eng", "alice")} {
		if u[c] != 1234 {
			t.Errorf("%+v = %d, want 1234", c, u[c])
		}
	}
	for _, c := range []quota.Counter{orgC("requests"), teamC("requests", "eng"), userC("requests", "eng", "alice")} {
		if u[c] != 0 {
			t.Errorf("%+v = %d, want 0 (used 0)", c, u[c])
		}
	}
	held, _ = r.e.HeldUnits(ctx, "acme", per)
	if len(held) != 0 {
		t.Errorf("held after commit: %v", held)
	}
	// the minute window got its units back too: 5000 - 1234 tokens fit again
	if d := r.MustCheck(t, llmReq(5000-1234, lims, lims)); !d.Allowed {
		t.Fatalf("the tokens given back are not free in the minute: %+v", d.BlockedAt)
	}

	// over-reserving one metric counts it in full and reports it
	bob := llmReq(10, lims, lims)
	bob.User = "bob"
	res2, _, err := r.e.Reserve(ctx, bob, quota.ReserveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done, err = r.e.CommitUsed(ctx, "acme", 1, res2.ID, map[string]int64{"requests": 1, "tokens": 25})
	if err != nil || done.Metrics[1].OverReserved != 15 || done.Metrics[0].Used != 1 {
		t.Fatalf("over-reserved commit: %+v %v", done, err)
	}
}

// A multi-metric reservation left open is settled by the sweep, once, with each
// metric's whole amount (on_expiry commit).
func TestMultiMetricReservationExpiry(t *testing.T) {
	ctx := context.Background()
	r := MustRig(t, "", quota.Config{})
	lims := quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 10_000)}}
	res, _, err := r.e.Reserve(ctx, llmReq(300, lims, lims), quota.ReserveOptions{TTL: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := r.e.CommitUsed(ctx, "acme", 1, res.ID, map[string]int64{"tokens": 1}); err == nil {
		t.Fatal("a commit after expiry succeeded")
	}
	read, err := r.e.Reservation(ctx, "acme", 1, res.ID)
	if err != nil || read.State != vocab.Expired || fmt.Sprint(read.Metrics) != fmt.Sprint([]vocab.MetricAmount{
		{Metric: "requests", Amount: 1, Used: 1}, {Metric: "tokens", Amount: 300, Used: 300}}) {
		t.Fatalf("expired: %+v %v", read, err)
	}
	u := r.usage(t, "acme")
	if u[userC("tokens", "eng", "alice")] != 300 || u[orgC("requests")] != 1 {
		t.Fatalf("usage after expiry %v", u)
	}
}

// A multi-metric reservation's idempotency key replays the same reservation, holding
// nothing more; other amounts under the key are refused.
func TestMultiMetricReservationIdempotency(t *testing.T) {
	ctx := context.Background()
	r := MustRig(t, "", quota.Config{})
	lims := quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 10_000)}}
	req := llmReq(400, lims, lims)
	req.IdempotencyKey = "idem-reserve-1"
	first, _, err := r.e.Reserve(ctx, req, quota.ReserveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	again, dec, err := r.e.Reserve(ctx, req, quota.ReserveOptions{})
	if err != nil || !dec.Replayed || again.ID != first.ID || len(again.Metrics) != 2 || again.Metrics[1].Amount != 400 {
		t.Fatalf("repeat: %+v %+v %v", again, dec, err)
	}
	other := req
	other.More = []quota.MetricCost{{Metric: "tokens", Cost: 401, Limits: lims}}
	if _, _, err := r.e.Reserve(ctx, other, quota.ReserveOptions{}); !errors.Is(err, quota.ErrIdempotencyConflict) {
		t.Fatalf("other amounts under the key: %v", err)
	}
	held, _ := r.e.HeldUnits(ctx, "acme", r.e.Period(1).ID)
	if held[userC("tokens", "eng", "alice")] != 400 || held[userC("requests", "eng", "alice")] != 1 {
		t.Fatalf("held %v, want one reservation's", held)
	}
}

// storeHydrator keeps what one Drain took, as the ledger persists it.
type storeHydrator struct {
	mu   sync.Mutex
	d    quota.Drained
	used map[quota.Counter]int64
}

func (s *storeHydrator) StoredUsage(context.Context, string, vocab.Period) (map[quota.Counter]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used, nil
}

func (s *storeHydrator) StoredReservations(context.Context, string, vocab.Period) ([]quota.ReservationRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.d.Reservations, nil
}

// A multi-metric reservation persisted by the drain survives a Redis that restarts
// empty: hydration restores each metric's held units, and its commit settles per metric.
func TestMultiMetricReservationHydrated(t *testing.T) {
	ctx := context.Background()
	h := &storeHydrator{}
	r := MustRig(t, "", quota.Config{Hydrator: h})
	lims := quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 10_000)}}
	res, _, err := r.e.Reserve(ctx, llmReq(900, lims, lims), quota.ReserveOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	per := r.e.Period(1).ID
	d, err := r.e.Drain(ctx, "acme", per)
	if err != nil || len(d.Reservations) != 1 {
		t.Fatalf("Drain: %+v %v", d, err)
	}
	h.d, h.used = d, d.Counters
	r.wipeOrg(t, "acme")
	if _, err := r.e.Reservation(ctx, "acme", 1, res.ID); err != nil { // hydrates
		t.Fatal(err)
	}
	held, _ := r.e.HeldUnits(ctx, "acme", per)
	if held[userC("tokens", "eng", "alice")] != 900 || held[orgC("requests")] != 1 {
		t.Fatalf("held after hydration %v, want each metric's amount", held)
	}
	done, err := r.e.CommitUsed(ctx, "acme", 1, res.ID, map[string]int64{"tokens": 100, "requests": 1})
	if err != nil || done.Metrics[1].Released != 800 {
		t.Fatalf("commit after hydration: %+v %v", done, err)
	}
	u := r.usage(t, "acme")
	if u[userC("tokens", "eng", "alice")] != 100 || u[teamC("requests", "eng")] != 1 {
		t.Fatalf("usage %v", u)
	}
	if held, _ := r.e.HeldUnits(ctx, "acme", per); len(held) != 0 {
		t.Fatalf("held after commit %v", held)
	}
}
