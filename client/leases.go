package client

import (
	"context"
	"encoding/json"
	"errors"
	"hash/maphash"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Client leases (WithLeases, API.md "Client leases"). A path (org, team, user,
// metric) checked above the threshold in this process asks the server for a lease:
// units taken atomically from every level of the path, which the client admits in
// process (a compare-and-swap on one counter, no request) until its own monotonic
// clock at sending the request plus the answer's ttl_ms, never past the units. The
// lease is settled with exactly what it admitted: ahead of its end (at 75 % of its
// life or units) in the round trip that takes the next one, or by its timer at its
// end, or by Close. A path has at most one unsettled lease at a time: the current
// lease is closed (its counter marked, atomically) before its settlement is sent,
// and the next is taken only in that settlement's answer. So nothing is admitted
// that the server did not take from every level, and a process that dies costs its
// unsettled leases, counted whole by the server at their settle_by.

// DefaultLeaseThreshold is the rate (units a second of one path in this process)
// above which a path asks for a lease, unless WithLeaseThreshold says otherwise.
const DefaultLeaseThreshold = 50

const (
	// leaseRateWindow is the span over which a path's rate is measured.
	leaseRateWindow = 200 * time.Millisecond
	// leaseWait is the longest a check of a hot path waits for the path's lease
	// being taken or renewed (a round trip) before it goes to the server.
	leaseWait = 10 * time.Millisecond
	// leasePause is how long a path checks one by one after an error taking or
	// settling a lease.
	leasePause = time.Second
	// leaseSettleGrace is the time between a lease's end and its settle_by when an
	// answer does not say (the contract's "about 5 s").
	leaseSettleGrace = 5 * time.Second
	// leaseRetry spaces the attempts to settle a lease whose settlement failed.
	leaseRetry = 100 * time.Millisecond
	// leaseSlots is the size of the table that measures the rate of paths without
	// state, so cold paths (a million users checked once) cost no memory.
	leaseSlots = 4096
	// leaseSlotSample is the fewest units a slot's window must hold for its rate to
	// be believed: the paths that share a slot are many cold ones.
	leaseSlotSample = 5
	// leaseIdle is how long a path without checks keeps its state.
	leaseIdle = 10 * time.Second
	// closedBit marks a lease's counter once its settlement has read it.
	closedBit int64 = 1 << 62
)

// epoch is the origin of mono.
var epoch = time.Now()

// mono is the monotonic clock, in nanoseconds since epoch.
func mono() int64 { return int64(time.Since(epoch)) }

type pathKey struct{ org, team, user, metric string }

// rateCounter counts units over a short window to estimate a rate.
type rateCounter struct {
	winStart atomic.Int64 // mono ns: the start of the window
	winUnits atomic.Int64 // units checked in the window
	rate     atomic.Int64 // units a second, of the last full window
}

// count adds cost at now (mono ns) and returns the rate.
func (r *rateCounter) count(now, cost int64) int64 {
	start := r.winStart.Load()
	if el := now - start; el >= int64(leaseRateWindow) && r.winStart.CompareAndSwap(start, now) {
		units := r.winUnits.Swap(cost)
		if el > 2*int64(leaseRateWindow) { // a quiet gap: the window was longer
			units = units * int64(leaseRateWindow) / el
			el = int64(leaseRateWindow)
		}
		r.rate.Store(units * int64(time.Second) / el)
		return r.rate.Load()
	}
	r.winUnits.Add(cost)
	return r.rate.Load()
}

// early estimates the rate from the unfinished window once it already holds twice
// what threshold brings in a whole one, so a path that turns hot is known within
// milliseconds; 0 when it does not.
func (r *rateCounter) early(now int64, threshold float64) int64 {
	units := r.winUnits.Load()
	if float64(units) < 2*threshold*leaseRateWindow.Seconds() {
		return 0
	}
	el := min(max(now-r.winStart.Load(), int64(time.Millisecond)), int64(leaseRateWindow))
	return units * int64(time.Second) / el
}

// leasePath is one path's rate and current lease.
type leasePath struct {
	key pathKey
	rateCounter
	cur atomic.Pointer[clientLease]
	// busy is held by whoever takes the path's lease or settles it (a check taking
	// the first, a renewal, the lease's timer): the next lease is asked only in the
	// settlement of the previous, so the path never has two unsettled. next, while
	// busy is held, is closed when its holder is done: a hot check that finds no
	// lease meanwhile waits for it (leaseWait at most).
	busy atomic.Bool
	next atomic.Pointer[chan struct{}]
	// quiet (mono ns): the path checks one by one until then (a 0-units answer's
	// ttl_ms, an error).
	quiet atomic.Int64
}

func (p *leasePath) acquire() bool {
	if !p.busy.CompareAndSwap(false, true) {
		return false
	}
	ch := make(chan struct{})
	p.next.Store(&ch)
	return true
}

func (p *leasePath) release() {
	ch := p.next.Swap(nil)
	p.busy.Store(false)
	if ch != nil {
		close(*ch)
	}
}

// await waits until busy's holder is done, leaseWait at most; false when nobody
// held it or it took longer.
func (p *leasePath) await(ctx context.Context) bool {
	ch := p.next.Load()
	if ch == nil {
		return false
	}
	t := time.NewTimer(leaseWait)
	defer t.Stop()
	select {
	case <-*ch:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// hot reports whether the path is checked above threshold and was checked lately.
func (p *leasePath) hot(now int64, threshold float64) bool {
	return float64(p.rate.Load()) >= threshold && now-p.winStart.Load() < 2*int64(leaseRateWindow)
}

// clientLease is one lease, admitted from in process.
type clientLease struct {
	path     *leasePath
	id       string
	units    int64
	endNs    int64 // mono: the request's send time + ttl_ms; nothing admitted at or after it
	renewNs  int64 // mono: 75 % of its life
	renewAt  int64 // 75 % of its units
	settleBy int64 // mono: after it, a failed settlement is left (the server counts it whole)
	used     atomic.Int64
	levels   []Level
	rl       RateLimit
	done     atomic.Bool
	timer    *time.Timer
}

// take admits cost units at now (mono ns) if they fit before the end, returning
// the units admitted so far.
func (l *clientLease) take(cost, now int64) (int64, bool) {
	if now >= l.endNs {
		return 0, false
	}
	for {
		u := l.used.Load()
		if u&closedBit != 0 || u+cost > l.units {
			return 0, false
		}
		if l.used.CompareAndSwap(u, u+cost) {
			return u + cost, true
		}
	}
}

// close stops admissions from l and returns what it admitted.
func (l *clientLease) close() int64 {
	for {
		u := l.used.Load()
		if u&closedBit != 0 {
			return u &^ closedBit
		}
		if l.used.CompareAndSwap(u, u|closedBit) {
			return u
		}
	}
}

// leaser holds a client's leases.
type leaser struct {
	c         *Client
	threshold float64

	mu    sync.RWMutex // a map under RLock: a struct key of strings does not allocate
	paths map[pathKey]*leasePath
	seed  maphash.Seed
	slots [leaseSlots]rateCounter
	swept atomic.Int64 // mono ns of the last forgetting of idle paths

	open    sync.Map     // *clientLease -> struct{}: taken and not settled (or given up)
	openN   atomic.Int64 // len(open)
	running atomic.Int64 // renew goroutines: a lease they take is settled before they end once closing
	closing atomic.Bool
}

func newLeaser(c *Client, threshold float64) *leaser {
	if threshold <= 0 {
		threshold = DefaultLeaseThreshold
	}
	return &leaser{c: c, threshold: threshold, paths: map[pathKey]*leasePath{}, seed: maphash.MakeSeed()}
}

// leasable reports whether req may be admitted from a lease: one metric, a cost
// that consumes, no idempotency key of the caller's.
func leasable(req *CheckRequest) bool {
	return !req.Query && req.Costs == nil && req.IdempotencyKey == "" && req.Cost >= 0
}

// path returns the state of key, creating it only once the key's slot in the rate
// table is above the threshold; nil: a cold path.
func (m *leaser) path(key pathKey, cost, now int64) *leasePath {
	m.mu.RLock()
	p := m.paths[key]
	m.mu.RUnlock()
	if p != nil {
		return p
	}
	var h maphash.Hash
	h.SetSeed(m.seed)
	h.WriteString(key.org)
	h.WriteByte(0)
	h.WriteString(key.team)
	h.WriteByte(0)
	h.WriteString(key.user)
	h.WriteByte(0)
	h.WriteString(key.metric)
	slot := &m.slots[h.Sum64()%leaseSlots]
	rate := slot.count(now, cost)
	if float64(rate) < max(m.threshold, leaseSlotSample/leaseRateWindow.Seconds()) {
		if rate = slot.early(now, m.threshold); rate == 0 {
			return nil
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.swept.Load(); now-s > int64(leaseIdle) && m.swept.CompareAndSwap(s, now) {
		m.forget(now)
	}
	if p = m.paths[key]; p == nil {
		p = &leasePath{key: key}
		p.winStart.Store(now)
		p.rate.Store(rate) // the slot's: the path's own is known a window later
		m.paths[key] = p
	}
	return p
}

// forget drops the paths idle for leaseIdle that hold no lease; each keeps its busy
// flag held for good, so a check that found it just before takes no lease on it.
// The caller holds m.mu.
func (m *leaser) forget(now int64) {
	for k, p := range m.paths {
		if p.cur.Load() == nil && now-p.winStart.Load() > int64(leaseIdle) && p.busy.CompareAndSwap(false, true) {
			delete(m.paths, k)
		}
	}
}

// admit answers req from its path's lease when it can; ok false: the check goes to
// the server.
func (m *leaser) admit(ctx context.Context, req *CheckRequest) (res *CheckResult, ok bool) {
	if !leasable(req) {
		return nil, false
	}
	cost := req.Cost
	if cost == 0 {
		cost = 1
	}
	metric := req.Metric
	if metric == "" {
		metric = "requests"
	}
	now := mono()
	p := m.path(pathKey{req.Org, req.Team, req.User, metric}, cost, now)
	if p == nil {
		return nil, false
	}
	rate := p.count(now, cost)
	if float64(rate) < m.threshold {
		rate = max(rate, p.early(now, m.threshold))
	}
	hot := float64(rate) >= m.threshold
	l := p.cur.Load()
	if l != nil {
		if u, ok := l.take(cost, now); ok {
			if hot && (u >= l.renewAt || now >= l.renewNs) && !m.closing.Load() && p.acquire() {
				m.renew(p, l, *req, rate)
			}
			return l.result(), true
		}
	}
	if m.closing.Load() || now < p.quiet.Load() {
		return nil, false
	}
	switch {
	case l != nil: // spent or ended: settle it, and take the next if the path is hot
		if p.acquire() {
			m.renew(p, l, *req, rate)
		}
		if !hot {
			return nil, false
		}
	case hot:
		if p.acquire() {
			m.renew(p, nil, *req, rate)
		}
	default:
		return nil, false
	}
	if p.await(ctx) {
		if l = p.cur.Load(); l != nil {
			if _, ok := l.take(cost, mono()); ok {
				return l.result(), true
			}
		}
	}
	return nil, false
}

func (l *clientLease) result() *CheckResult {
	return &CheckResult{Allowed: true, Mode: "enforce", Levels: l.levels, RateLimit: l.rl, Leased: true}
}

// renew settles l (nil: none), p's lease when the caller loaded it, and takes the
// next when p is hot, in the background: in the settlement's round trip, or on its
// own for a path without a lease. The caller holds p.busy; renew releases it.
func (m *leaser) renew(p *leasePath, l *clientLease, req CheckRequest, rate int64) {
	m.running.Add(1)
	go func() {
		defer m.running.Add(-1)
		defer p.release()
		hot := float64(rate) >= m.threshold && !m.closing.Load()
		switch cur := p.cur.Load(); {
		case l != nil && cur == l:
			m.end(l, hot, rate, req)
		case cur == nil && hot:
			m.take(p, req, rate)
		}
	}()
}

// expire is l's timer, at its end: l is settled, renewed when its path is hot. While
// p.busy is held its holder may be settling l, or still installing it: expire waits
// until l is settled or it can settle it.
func (m *leaser) expire(l *clientLease, req CheckRequest) {
	p := l.path
	for !l.done.Load() {
		if p.acquire() {
			hot := p.hot(mono(), m.threshold) && !m.closing.Load()
			m.end(l, hot, p.rate.Load(), req)
			p.release()
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// leaseBody is POST /v1/leases's request.
type leaseBody struct {
	Org    string  `json:"org"`
	Team   string  `json:"team,omitempty"`
	User   string  `json:"user,omitempty"`
	Metric string  `json:"metric,omitempty"`
	Rate   float64 `json:"rate"`
}

// leaseAnswer is a lease, or a 0-units answer.
type leaseAnswer struct {
	ID        string    `json:"id"`
	Units     int64     `json:"units"`
	ExpiresAt time.Time `json:"expires_at"`
	TTLMs     int64     `json:"ttl_ms"`
	SettleBy  time.Time `json:"settle_by"`
	Levels    []Level   `json:"levels"`
	Reason    string    `json:"reason"`
}

// take asks for p's lease. The caller holds p.busy and p has no lease unsettled. A
// lease is asked once, never retried: a retry could take a second lease on the
// server while the first one's answer was lost.
func (m *leaser) take(p *leasePath, req CheckRequest, rate int64) {
	send := mono()
	r, err := m.c.doRetries(context.Background(), m.c.budget, 0, http.MethodPost, "/v1/leases",
		leaseBody{Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Rate: float64(rate)})
	if err == nil && r.status != http.StatusOK && r.status != http.StatusCreated {
		err = errorOf(r)
	}
	var a leaseAnswer
	if err == nil {
		err = decode(r, &a)
	}
	if err != nil {
		p.quiet.Store(send + int64(leasePause))
		m.event(LeaseInfo{Event: LeaseError, Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Err: err})
		return
	}
	m.install(p, &a, send, req)
}

// install makes a the lease of p, asked at send (mono ns); a 0-units answer makes p
// check one by one for its ttl_ms.
func (m *leaser) install(p *leasePath, a *leaseAnswer, send int64, req CheckRequest) {
	ttl := a.TTLMs * int64(time.Millisecond)
	if a.Units <= 0 || a.ID == "" {
		p.quiet.Store(send + max(ttl, int64(leaseRateWindow)))
		m.event(LeaseInfo{Event: LeaseRefused, Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Reason: a.Reason})
		return
	}
	grace := int64(leaseSettleGrace)
	if !a.SettleBy.IsZero() && !a.ExpiresAt.IsZero() && a.SettleBy.After(a.ExpiresAt) {
		grace = int64(a.SettleBy.Sub(a.ExpiresAt))
	}
	l := &clientLease{path: p, id: a.ID, units: a.Units, endNs: send + ttl, renewNs: send + ttl*3/4,
		renewAt: max((a.Units*3+3)/4, 1), settleBy: send + ttl + grace, levels: a.Levels}
	l.rl = tightest(a.Levels, true, nil, 0, time.Now())
	// The timer's settlement waits for p.busy, which the caller holds until l is
	// installed; Close finds l in open only once its timer is set.
	l.timer = time.AfterFunc(time.Duration(l.endNs-mono()), func() { m.expire(l, req) })
	m.openN.Add(1)
	m.open.Store(l, struct{}{})
	m.event(LeaseInfo{Event: LeaseTaken, ID: l.id, Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Units: l.units})
	p.cur.Store(l)
	if m.closing.Load() { // Close began while it was taken, and may have missed it
		m.end(l, false, 0, req)
	}
}

// settleAnswer is POST /v1/leases/{id}/settle's answer.
type settleAnswer struct {
	Settled struct {
		Used     int64 `json:"used"`
		Released int64 `json:"released"`
	} `json:"settled"`
	Next *leaseAnswer `json:"next"`
}

// end stops admissions from l and settles it with what it admitted, exactly once,
// asking for the path's next lease in the same round trip when renew is set. A
// failed settlement is retried until l's settle_by, then left: the server counts it
// whole. The caller holds l.path.busy, or Close does (no next lease then).
func (m *leaser) end(l *clientLease, renew bool, rate int64, req CheckRequest) {
	if !l.done.CompareAndSwap(false, true) {
		return
	}
	used := l.close()
	p := l.path
	p.cur.CompareAndSwap(l, nil)
	if l.timer != nil {
		l.timer.Stop()
	}
	defer func() { m.open.Delete(l); m.openN.Add(-1) }()
	info := LeaseInfo{ID: l.id, Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, Units: l.units, Used: used}
	send := mono() // of the first attempt: a repeat answers the lease the first one took
	for failed := false; ; failed = true {
		renew = renew && !failed && !m.closing.Load()
		a, err := m.settle(l.id, used, renew, rate)
		var e *Error
		switch {
		case err == nil:
			info.Event = LeaseSettled
			m.event(info)
			if failed {
				p.quiet.Store(mono() + int64(leasePause))
			}
			if a.Next != nil { // asked now, or by an attempt whose answer was lost: settled at once when not wanted
				m.install(p, a.Next, send, req)
				if !renew {
					if n := p.cur.Load(); n != nil && n.id == a.Next.ID {
						m.end(n, false, 0, req)
					}
				}
			}
			return
		case errors.As(err, &e) && e.StatusCode < 500: // 404, 409: the server knows it no more, or settled it
			info.Event, info.Err = LeaseSettled, err
			m.event(info)
			return
		}
		if !failed {
			p.quiet.Store(l.settleBy)
		}
		if mono()+int64(leaseRetry) > l.settleBy {
			info.Event, info.Err = LeaseError, err
			m.event(info)
			p.quiet.Store(mono() + int64(leasePause))
			return
		}
		time.Sleep(leaseRetry)
	}
}

// settle is one POST /v1/leases/{id}/settle, its attempts within the client's
// settle budget.
func (m *leaser) settle(id string, used int64, renew bool, rate int64) (*settleAnswer, error) {
	in := struct {
		Used  int64    `json:"used"`
		Renew bool     `json:"renew,omitempty"`
		Rate  *float64 `json:"rate,omitempty"`
	}{Used: used, Renew: renew}
	if renew {
		f := float64(rate)
		in.Rate = &f
	}
	budget := 2 * time.Second // an attempt of a settlement, retried until settle_by
	if b := m.c.settleBudget; b > 0 && b < budget {
		budget = b
	}
	// A renewing settlement is sent once: a repeat whose first answer was lost may take
	// another next lease while the first stays unsettled (counted whole). end retries
	// it without renew, and settles a next lease such a repeat still answers.
	retries := m.c.retries
	if renew {
		retries = 0
	}
	r, err := m.c.doRetries(context.Background(), budget, retries, http.MethodPost,
		"/v1/leases/"+url.PathEscape(id)+"/settle", in)
	if err != nil {
		return nil, err
	}
	if r.status != http.StatusOK {
		return nil, errorOf(r)
	}
	var a settleAnswer
	if err := json.Unmarshal(r.body, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// close settles every lease (renew false) and waits for them, until deadline.
func (m *leaser) close(deadline time.Time) error {
	m.closing.Store(true)
	m.open.Range(func(k, _ any) bool {
		l := k.(*clientLease)
		go m.end(l, false, 0, CheckRequest{Org: l.path.key.org, Team: l.path.key.team, User: l.path.key.user, Metric: l.path.key.metric})
		return true
	})
	for m.openN.Load() > 0 || m.running.Load() > 0 {
		if time.Now().After(deadline) {
			return errors.New("quotaplane client: close: leases still settling at the deadline (the server counts them whole)")
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (m *leaser) event(i LeaseInfo) {
	if f := m.c.hooks.OnLease; f != nil {
		f(i)
	}
	if m.c.log != nil && i.Event == LeaseError {
		m.c.log.Warn("quotaplane client: lease error; the path is checked one by one", "org", i.Org, "team", i.Team,
			"user", i.User, "metric", i.Metric, "lease", i.ID, "err", i.Err)
	}
}
