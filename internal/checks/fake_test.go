package checks_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// fakeEngine is the quota engine the service's unit tests ask: it records what it was
// asked and answers as the test says. Decide answers each check with decide (nil:
// allowed, no levels); Now is now; the reservations are a map of the org's, settled
// as the engine settles them (commit: used counted, the rest released), and err, when
// set, is every reservation method's answer.
type fakeEngine struct {
	mu     sync.Mutex
	now    time.Time
	decide func(c *quota.Check)
	// calls is every Decide call's checks, as they were asked.
	calls [][]quota.Check

	reserved []quota.Request // what Reserve was asked, in order
	deny     *vocab.Result   // when set, Reserve's answer: denied, nothing held
	held     map[string]*vocab.Reservation
	ops      []op // every other call of the reservations, in order
	inFlight map[quota.Counter]int64
	err      error
}

// op is one call of the engine's reservations other than Reserve.
type op struct {
	name   string // commit, commitUsed, release, reservation, extend, open, inFlight
	org    string
	anchor int
	id     string
	used   int64
	usedBy map[string]int64
	ttl    time.Duration
	filter quota.OpenFilter
	after  quota.OpenCursor
	limit  int
}

var _ checks.Engine = (*fakeEngine)(nil)

func newFake(now time.Time) *fakeEngine {
	return &fakeEngine{now: now, held: map[string]*vocab.Reservation{}}
}

func (f *fakeEngine) Decide(_ context.Context, cs []quota.Check) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, slices.Clone(cs))
	for i := range cs {
		if f.decide == nil {
			cs[i].Result = vocab.Result{Allowed: true}
			continue
		}
		f.decide(&cs[i])
	}
}

func (f *fakeEngine) Now(vocab.Route) time.Time { return f.now }

// asked is every check Decide was given, over all its calls.
func (f *fakeEngine) asked() []quota.Check {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []quota.Check
	for _, c := range f.calls {
		out = append(out, c...)
	}
	return out
}

func (f *fakeEngine) Reserve(_ context.Context, _ vocab.Route, req quota.Request, opt quota.ReserveOptions) (vocab.Reservation, vocab.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reserved = append(f.reserved, req)
	if f.err != nil {
		return vocab.Reservation{}, vocab.Result{}, f.err
	}
	if f.deny != nil {
		return vocab.Reservation{}, *f.deny, nil
	}
	r := &vocab.Reservation{ID: fmt.Sprintf("r%d", len(f.reserved)), Org: req.Org, Team: req.Team, User: req.User,
		Metric: req.Metric, Amount: req.Cost, State: vocab.Held, OnExpiry: opt.OnExpiry,
		CreatedAt: f.now, ExpiresAt: f.now.Add(opt.TTL)}
	if len(req.More) > 0 {
		r.Metrics = append(r.Metrics, vocab.MetricAmount{Metric: req.Metric, Amount: req.Cost})
		for _, m := range req.More {
			r.Metrics = append(r.Metrics, vocab.MetricAmount{Metric: m.Metric, Amount: m.Cost})
		}
	}
	f.held[req.Org+"/"+r.ID] = r
	return *r, vocab.Result{Allowed: true}, nil
}

// hold puts a reservation in the map as if reserved (its Org and ID set).
func (f *fakeEngine) hold(r vocab.Reservation) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.State == "" {
		r.State = vocab.Held
	}
	f.held[r.Org+"/"+r.ID] = &r
}

// byID records o and finds its reservation: held, unless settled may be.
func (f *fakeEngine) byID(o op, settled bool) (*vocab.Reservation, error) {
	f.ops = append(f.ops, o)
	if f.err != nil {
		return nil, f.err
	}
	r, ok := f.held[o.org+"/"+o.id]
	switch {
	case !ok:
		return nil, fmt.Errorf("%s %s: %w", o.name, o.id, quota.ErrReservationNotFound)
	case !settled && r.State != vocab.Held:
		return nil, &quota.StateError{ID: r.ID, State: r.State}
	}
	return r, nil
}

func (f *fakeEngine) Commit(_ context.Context, _ vocab.Route, org string, anchor int, id string, used int64) (vocab.Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.byID(op{name: "commit", org: org, anchor: anchor, id: id, used: used}, false)
	if err != nil {
		return vocab.Reservation{}, err
	}
	r.State, r.Used, r.Released, r.OverReserved = vocab.Committed, used, max(r.Amount-used, 0), max(used-r.Amount, 0)
	return *r, nil
}

func (f *fakeEngine) CommitUsed(_ context.Context, _ vocab.Route, org string, anchor int, id string, used map[string]int64) (vocab.Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.byID(op{name: "commitUsed", org: org, anchor: anchor, id: id, usedBy: used}, false)
	if err != nil {
		return vocab.Reservation{}, err
	}
	for m := range used {
		if !slices.ContainsFunc(r.Metrics, func(a vocab.MetricAmount) bool { return a.Metric == m }) && m != r.Metric {
			return vocab.Reservation{}, fmt.Errorf("%w: metric %s is not held", quota.ErrInvalid, m)
		}
	}
	r.State = vocab.Committed
	for i := range r.Metrics {
		r.Metrics[i].Used = used[r.Metrics[i].Metric]
	}
	r.Used = used[r.Metric]
	return *r, nil
}

func (f *fakeEngine) Release(_ context.Context, _ vocab.Route, org string, anchor int, id string) (vocab.Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.byID(op{name: "release", org: org, anchor: anchor, id: id}, false)
	if err != nil {
		return vocab.Reservation{}, err
	}
	r.State, r.Released = vocab.Released, r.Amount
	return *r, nil
}

func (f *fakeEngine) Reservation(_ context.Context, _ vocab.Route, org string, anchor int, id string) (vocab.Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.byID(op{name: "reservation", org: org, anchor: anchor, id: id}, true)
	if err != nil {
		return vocab.Reservation{}, err
	}
	return *r, nil
}

func (f *fakeEngine) Extend(_ context.Context, _ vocab.Route, org string, anchor int, id string, ttl time.Duration) (vocab.Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.byID(op{name: "extend", org: org, anchor: anchor, id: id, ttl: ttl}, false)
	if err != nil {
		return vocab.Reservation{}, err
	}
	r.ExpiresAt = f.now.Add(ttl)
	return *r, nil
}

// OpenReservations answers the org's held reservations matching flt by expiry, at
// most limit; the cursor is recorded and given back as the next one.
func (f *fakeEngine) OpenReservations(_ context.Context, _ vocab.Route, org string, anchor int, flt quota.OpenFilter, after quota.OpenCursor, limit int) ([]vocab.Reservation, quota.OpenCursor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops = append(f.ops, op{name: "open", org: org, anchor: anchor, filter: flt, after: after, limit: limit})
	if f.err != nil {
		return nil, quota.OpenCursor{}, f.err
	}
	var out []vocab.Reservation
	for _, r := range f.held {
		if r.Org == org && r.State == vocab.Held && (flt.Team == "" || flt.Team == r.Team) && (flt.User == "" || flt.User == r.User) {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b vocab.Reservation) int { return a.ExpiresAt.Compare(b.ExpiresAt) })
	return out[:min(limit, len(out))], after, nil
}

func (f *fakeEngine) InFlight(_ context.Context, _ vocab.Route, org string) (map[quota.Counter]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops = append(f.ops, op{name: "inFlight", org: org})
	if f.err != nil {
		return nil, f.err
	}
	return f.inFlight, nil
}

// opNames is the names of the reservation calls made, in order.
func (f *fakeEngine) opNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, o := range f.ops {
		out = append(out, o.name)
	}
	return out
}
