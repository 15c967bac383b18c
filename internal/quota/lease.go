package quota

import (
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Leases (docs/ARCHITECTURE.md "Leases"): for a
// hot (org, team, user, metric) path, the engine reserves a block of units through the
// reservation primitive (one reserve script run: all or nothing over every limit of
// every level and window, exactly like a check), admits the path's checks in process
// from that block (a compare-and-swap on one counter: no Redis, no allocation), and at
// the lease's end commits what it admitted, exactly once, giving the rest back. A check
// is admitted in process only from units already taken from every level, so at every
// moment used + leased <= limit everywhere; a lease never outlives the current bucket of
// the path's shortest limited sliding window, the billing period, nor LeaseConfig.Max.
//
// Units whose fate is unknown count as used, so nothing is over-admitted: a lease is
// a reservation with on_expiry commit, so one its replica never settled (the replica
// died, or its settlement gave up) is committed whole by the worker's sweep at its
// expiry. Nothing admitted from it is given back to be admitted again; what a crash
// costs is the lease's unused part, counted as used. A path has at most one lease of
// this replica unsettled at any moment (the next is taken only once the previous is
// settled: leasePath.busy), and a lease is small (size), so that cost per killed
// replica is at most one lease per hot path: docs/ARCHITECTURE.md "Leases" states it.

// LeaseConfig turns leases on and tunes them. The zero value is off.
type LeaseConfig struct {
	// Enabled turns leases on for the engine; requests with NoLease are never leased.
	Enabled bool
	// Max bounds a lease's life (default 250 ms). A lease also ends with the current
	// bucket of the path's shortest limited sliding window and with the billing period.
	Max time.Duration
	// Threshold is the rate, in units per second on this replica, above which a path is
	// leased (default 200).
	Threshold float64
	// Replicas is the number of replicas that may lease the same path: a lease takes at
	// most 1/(leaseShare x Replicas) of a level's remaining headroom (default 1).
	Replicas int
	// OnLease, when set, is told of every lease taken, settled or missed (metrics). It
	// must not block.
	OnLease func(LeaseEvent)
}

// LeaseEvent is one lease event, for metrics.
type LeaseEvent struct {
	// Kind is LeaseTaken (Units: its size), LeaseReturned (Units: what was given back,
	// Used: what was committed), LeaseExpired (its reservation expired before this
	// replica settled it, so its expiry committed all of it: Units its size, Used what
	// was admitted from it, Units - Used counted unused), LeaseMiss (a check of a hot
	// path that went to Redis) or LeaseFailed (a lease whose settlement gave up: Units
	// its size, Used what was admitted; its expiry commits all of it).
	Kind  LeaseEventKind
	Units int64
	Used  int64
}

// LeaseEventKind names a LeaseEvent.
type LeaseEventKind uint8

// The lease events.
const (
	LeaseTaken LeaseEventKind = iota + 1
	LeaseReturned
	LeaseMiss
	LeaseFailed
	LeaseExpired
)

const (
	// leaseGrace is added to a lease's life in its reservation's TTL, so the replica
	// settles it before the sweep could (a commit that finds it expired has nothing to
	// add: the expiry committed the whole amount, at least what was admitted).
	leaseGrace = time.Second
	// leaseShare: a lease takes at most 1/(leaseShare x Replicas) of the least
	// remaining headroom of its path's limits, so a crash, which counts a lease's
	// unused units as used, costs a small fraction of what is left (never half).
	leaseShare = 16
	// leaseWait is the longest a check of a hot path waits for the path's next lease
	// (being settled and taken: two round trips) before it goes to Redis.
	leaseWait = 20 * time.Millisecond
	// leaseTraffic is a lease's size in lives of the path's traffic: enough that a
	// steady path ends a lease by time rather than running dry, small because a crash
	// counts the unused part.
	leaseTraffic = 1.25
	// leaseMinLife is the shortest lease worth taking.
	leaseMinLife = 5 * time.Millisecond
	// rateWindow is the span over which a path's rate is measured.
	rateWindow = 50 * time.Millisecond
	// leaseIdle is how long a path without traffic keeps its state.
	leaseIdle = 10 * time.Second
	// closedBit marks a lease's used counter once settlement has read it.
	closedBit int64 = 1 << 62
	// rateSlots is the size of the table that measures the rate of paths without
	// state: a path gets state (and may be leased) only once its slot is hot, so cold
	// paths (a million distinct users) cost no memory.
	rateSlots = 4096
	// slotSample is the fewest units a slot's window must hold for its rate to be
	// believed: the paths that share a slot are many cold ones, and three checks of
	// three of them in one window would read 60/s (at 5,000 cold checks a second,
	// thresholds of 50/s made a path of a user checked once one run in five; with 5,
	// about one in 4,000 runs). A path's own rate, once it has state, needs no margin.
	slotSample = 5
)

func (c *LeaseConfig) setDefaults() {
	if c.Max <= 0 {
		c.Max = 250 * time.Millisecond
	}
	if c.Threshold <= 0 {
		c.Threshold = 200
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
}

// pathKey names a leased path.
type pathKey struct{ org, team, user, metric string }

// rateCounter counts units over a short window to estimate a rate.
type rateCounter struct {
	winStart atomic.Int64 // ns, engine clock: the start of the rate window
	winUnits atomic.Int64 // units checked in the rate window
	rate     atomic.Int64 // units per second, from the last full window
}

// count adds cost to the window at now (ns) and returns the rate.
func (r *rateCounter) count(now, cost int64) int64 {
	start := r.winStart.Load()
	if el := now - start; el >= int64(rateWindow) && r.winStart.CompareAndSwap(start, now) {
		units := r.winUnits.Swap(cost)
		if el > 2*int64(rateWindow) {
			units = units * int64(rateWindow) / el // a quiet gap: the window was longer
			el = int64(rateWindow)
		}
		r.rate.Store(units * int64(time.Second) / el)
		return r.rate.Load()
	}
	r.winUnits.Add(cost)
	return r.rate.Load()
}

// early estimates the rate from the current, unfinished window at now (ns) once that
// window already holds twice the units threshold (units per second) would bring in a
// whole one (the margin: a part of a window is weaker evidence than a whole one, and
// cold paths that share a slot must not look hot), so a path that turns hot is known
// within milliseconds rather than only when the window ends (before, the first ~100 ms
// of a burst all went to Redis: 2 % of a 4-s paced run, its p99). 0 when it does not.
func (r *rateCounter) early(now int64, threshold float64) int64 {
	units := r.winUnits.Load()
	if float64(units) < 2*threshold*rateWindow.Seconds() {
		return 0
	}
	el := min(max(now-r.winStart.Load(), int64(leaseMinLife)), int64(rateWindow))
	return units * int64(time.Second) / el
}

// leasePath is one path's rate and current lease.
type leasePath struct {
	key pathKey
	cur atomic.Pointer[lease]
	// busy is held by whoever settles the path's lease or takes its next one (a check
	// taking the first, the renewal, the lease's timer): the next lease is taken only
	// once the previous is settled, so the path never has two leases of this replica
	// unsettled (a crash would count both). The janitor takes it for good when it
	// forgets the path. next, while busy is held, is closed when its holder is done
	// (acquire, release): a check that finds no lease meanwhile waits for the next
	// one (leaseWait at most) rather than going to Redis with all the others.
	busy atomic.Bool
	next atomic.Pointer[chan struct{}]

	rateCounter
	headroom atomic.Int64 // least remaining of any limit, last seen (-1 unknown)
}

// lease is one block of units held by a reservation, admitted from in process.
type lease struct {
	path   *leasePath
	id     string
	org    string
	anchor int
	limits LevelLimits // the request's limits: a check with others is not admitted from it
	amount int64
	endNs  int64
	used   atomic.Int64 // units admitted; closedBit once settlement has read it
	levels []vocab.LevelStatus
	done   atomic.Bool
	timer  *time.Timer
}

// leases is an engine's lease manager.
type leases struct {
	e   *Engine
	cfg LeaseConfig

	mu    sync.RWMutex // a map under RLock: a struct key of strings does not allocate
	paths map[pathKey]*leasePath
	seed  maphash.Seed
	slots [rateSlots]rateCounter // rates of paths without state, by hash

	open     sync.Map     // *lease -> struct{}: leases not yet settled, for Close
	openN    atomic.Int64 // len(open), exact at every instant (sync.Map's Range is no snapshot)
	wg       sync.WaitGroup
	stopping atomic.Bool // Close has begun: no new leases
}

func newLeases(e *Engine, cfg LeaseConfig) *leases {
	cfg.setDefaults()
	return &leases{e: e, cfg: cfg, paths: map[pathKey]*leasePath{}, seed: maphash.MakeSeed()}
}

// leasable reports whether req may be answered from a lease: an enforced check that
// consumes, without an idempotency key, of a path whose org allows leases and that
// has no concurrent limit (a lease is a reservation: it would hold in flight, and an
// admission from it could not see what other holders hold) and no token bucket (a
// lease admits after it took its tokens, while the bucket refills: a span that starts
// after the take could then see burst + the lease; a bucket's bound is on the moment
// of admission, which only Redis can give).
func leasable(req *Request) bool {
	// a multi-metric request is decided in Redis: a lease is of one metric's path
	return req.Cost > 0 && req.IdempotencyKey == "" && !req.NoLease && (req.Mode == "" || req.Mode == vocab.Enforce) &&
		len(req.More) == 0 && !unleasableLimit(req)
}

// unleasableLimit reports whether any level of req has a concurrent limit or a token
// bucket.
func unleasableLimit(req *Request) bool {
	for _, ls := range [...][]vocab.Limit{req.Limits.Org, req.Limits.Team, req.Limits.User} {
		for _, l := range ls {
			if l.Window == vocab.Concurrent || l.Bucket() {
				return true
			}
		}
	}
	return false
}

func (m *leases) event(ev LeaseEvent) {
	if f := m.cfg.OnLease; f != nil {
		f(ev)
	}
}

// path returns req's path state, creating it only when the path's slot in the rate
// table is above the threshold at now (ns); nil: a cold path.
func (m *leases) path(req *Request, now int64) *leasePath {
	k := pathKey{req.Org, req.Team, req.User, req.Metric}
	m.mu.RLock()
	p := m.paths[k]
	m.mu.RUnlock()
	if p != nil {
		return p
	}
	var h maphash.Hash
	h.SetSeed(m.seed)
	h.WriteString(req.Org)
	h.WriteByte(0)
	h.WriteString(req.Team)
	h.WriteByte(0)
	h.WriteString(req.User)
	h.WriteByte(0)
	h.WriteString(req.Metric)
	slot := &m.slots[h.Sum64()%rateSlots]
	rate := slot.count(now, req.Cost)
	if float64(rate) < max(m.cfg.Threshold, slotSample/rateWindow.Seconds()) {
		if rate = slot.early(now, m.cfg.Threshold); rate == 0 {
			return nil
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p = m.paths[k]; p == nil {
		p = &leasePath{key: k}
		p.headroom.Store(-1)
		p.winStart.Store(now)
		p.rate.Store(rate) // the slot's: the path's own is known a window later
		m.paths[k] = p
	}
	return p
}

// observe records the headroom a decision of p's path showed.
func (p *leasePath) observe(res *vocab.Result) {
	h := vocab.MaxUnits
	for i := range res.Levels {
		h = min(h, res.Levels[i].Remaining)
	}
	p.headroom.Store(h)
}

// take admits req from l if it fits, before l's end, with l's limits.
func (l *lease) take(req *Request, now int64) bool {
	if now >= l.endNs || req.AnchorDay != l.anchor || !sameLimits(&req.Limits, &l.limits) {
		return false
	}
	for {
		u := l.used.Load()
		if u&closedBit != 0 || u+req.Cost > l.amount {
			return false
		}
		if l.used.CompareAndSwap(u, u+req.Cost) {
			return true
		}
	}
}

// close stops admissions from l and returns the units admitted from it.
func (l *lease) close() int64 {
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

func sameLimits(a, b *LevelLimits) bool {
	return slices.Equal(a.Org, b.Org) && slices.Equal(a.Team, b.Team) && slices.Equal(a.User, b.User)
}

// admit answers req from its path's lease if it can. A lease that no longer fits
// (spent, ended, or taken for other limits) is settled and the next taken in the
// background while checks go to Redis; a hot path without one takes one here, once it
// has none unsettled. ok false: the check goes to Redis, and p (nil for a cold path
// without state) wants to observe its result.
func (m *leases) admit(ctx context.Context, req *Request) (p *leasePath, res vocab.Result, ok bool) {
	now := m.e.Now()
	ns := now.UnixNano()
	if p = m.path(req, ns); p == nil {
		return nil, vocab.Result{}, false
	}
	rate := p.count(ns, req.Cost)
	if float64(rate) < m.cfg.Threshold {
		rate = max(rate, p.early(ns, m.cfg.Threshold))
	}
	l := p.cur.Load()
	if l != nil && l.take(req, ns) {
		return p, vocab.Result{Allowed: true, Levels: l.levels, Leased: true}, true
	}
	hot := float64(rate) >= m.cfg.Threshold && !m.stopping.Load()
	switch {
	case l != nil: // spent, ended, or taken for other limits: settle it, then the next
		if !m.stopping.Load() && p.acquire() {
			m.renew(p, l, *req, rate)
		}
	case hot && p.acquire():
		if p.cur.Load() == nil { // else one was taken since it was loaded
			l = m.take(ctx, p, req, now, rate)
		}
		p.release()
		if l != nil && l.take(req, m.e.Now().UnixNano()) {
			return p, vocab.Result{Allowed: true, Levels: l.levels, Leased: true}, true
		}
		m.event(LeaseEvent{Kind: LeaseMiss})
		return p, vocab.Result{}, false
	case !hot:
		return p, vocab.Result{}, false
	}
	// The path's next lease is on its way: wait for it (two round trips), once.
	if hot && p.await(ctx) {
		if l = p.cur.Load(); l != nil && l.take(req, m.e.Now().UnixNano()) {
			return p, vocab.Result{Allowed: true, Levels: l.levels, Leased: true}, true
		}
	}
	m.event(LeaseEvent{Kind: LeaseMiss})
	return p, vocab.Result{}, false
}

// acquire takes p.busy, reporting whether it did.
func (p *leasePath) acquire() bool {
	if !p.busy.CompareAndSwap(false, true) {
		return false
	}
	ch := make(chan struct{})
	p.next.Store(&ch)
	return true
}

// release gives p.busy back and wakes the checks waiting for it.
func (p *leasePath) release() {
	ch := p.next.Swap(nil)
	p.busy.Store(false)
	if ch != nil {
		close(*ch)
	}
}

// await waits until p.busy's holder is done, leaseWait at most; false when nobody
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

// renew settles l, p's lease when the caller loaded it, and then, if p is still hot,
// takes the next, in the background. The caller holds p.busy (acquire); renew
// releases it. When another holder renewed p meanwhile (p's lease is no longer l) the
// new lease is left to admit.
func (m *leases) renew(p *leasePath, l *lease, req Request, rate int64) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer p.release()
		switch cur := p.cur.Load(); cur {
		case l:
			m.end(l, true)
		case nil:
		default:
			return
		}
		if float64(rate) < m.cfg.Threshold || m.stopping.Load() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		m.take(ctx, p, &req, m.e.Now(), rate)
	}()
}

// expire is l's timer: at its end it is settled. The path's next check takes the
// next lease if the path is still hot (waiting for it as it would for Redis), so a
// path whose traffic stopped is left without one. While p.busy is held its holder
// may be settling l, or may still be installing it (a short lease, a stalled
// goroutine): expire waits until it has settled l or it can.
func (m *leases) expire(l *lease) {
	p := l.path
	for !l.done.Load() {
		if p.acquire() {
			m.end(l, true)
			p.release()
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// leaseEnd is when a lease taken at now ends: LeaseEnd with the engine's Max and the
// billing period of req's anchor day.
func (m *leases) leaseEnd(req *Request, now time.Time) time.Time {
	return LeaseEnd(req, now, m.cfg.Max, m.e.periodAt(now, req.AnchorDay).End)
}

// LeaseEnd is when a lease of req's path taken at now ends, wherever it is held (a
// replica, a client): after maxLife, at the end of the current bucket (a precise
// check's: sub-bucket) of the shortest sliding window any level limits, and at
// periodEnd. Units admitted from it are then admitted in the bucket they were
// counted in, so a sliding window's bound holds for them.
func LeaseEnd(req *Request, now time.Time, maxLife time.Duration, periodEnd time.Time) time.Time {
	end := now.Add(maxLife)
	var shortest time.Duration
	for _, ls := range [...][]vocab.Limit{req.Limits.Org, req.Limits.Team, req.Limits.User} {
		for _, l := range ls {
			if d := l.Window.Duration(); d > 0 && (shortest == 0 || d < shortest) {
				shortest = d
			}
		}
	}
	if shortest > 0 {
		ms := now.UnixMilli()
		w := shortest.Milliseconds()
		if req.Precise {
			// a precise window's bound holds for units admitted in the sub-bucket they
			// were counted in (docs/ARCHITECTURE.md "Sliding windows")
			w /= PreciseSubBuckets
		}
		if b := time.UnixMilli((ms/w + 1) * w); b.Before(end) {
			end = b
		}
	}
	if periodEnd.Before(end) {
		end = periodEnd
	}
	return end
}

// Leasable reports whether a lease may be taken of req's path: one metric, enforced,
// without a concurrent limit or a token bucket at any level, drawing on no capacity
// (a capacity keeps what a lease drew until it leaves the window, used or not).
func Leasable(req *Request) bool {
	return (req.Mode == "" || req.Mode == vocab.Enforce) && len(req.More) == 0 && len(req.Capacities) == 0 && !unleasableLimit(req)
}

// size is the lease for a path at rate units per second for life (leaseTraffic lives
// of its traffic), capped by 1/(leaseShare x Replicas) of the path's last seen
// headroom; 0 means no lease (near a limit, or nothing known).
func (m *leases) size(p *leasePath, req *Request, rate int64, life time.Duration) int64 {
	want := int64(float64(rate) * life.Seconds() * leaseTraffic)
	want = max(want, 2*req.Cost)
	h := p.headroom.Load()
	if h < 0 {
		return 0 // never seen a decision of this path: let one go to Redis first
	}
	share := h / int64(leaseShare*m.cfg.Replicas)
	want = min(want, share)
	if want < 2*req.Cost || want < 4 {
		return 0 // near a limit: checks go to Redis one by one, so the last units are admitted
	}
	return want
}

// take reserves a new lease for p and installs it. The caller holds p.busy and p has
// no lease unsettled.
func (m *leases) take(ctx context.Context, p *leasePath, req *Request, now time.Time, rate int64) *lease {
	end := m.leaseEnd(req, now)
	life := end.Sub(now)
	if life < leaseMinLife {
		return nil
	}
	amount := m.size(p, req, rate, life)
	if amount == 0 {
		return nil
	}
	r := *req
	r.Cost = amount
	rv, res, err := m.e.reserve(ctx, r, ReserveOptions{TTL: life + leaseGrace, OnExpiry: vocab.ExpiryCommit, lease: true})
	if err != nil {
		return nil
	}
	if !res.Allowed {
		// The lease did not fit: remember what is left without it, so the next one is
		// sized to that or not taken.
		for i := range res.Levels {
			res.Levels[i].Remaining = max(res.Levels[i].Limit-res.Levels[i].Used, 0)
		}
		p.observe(&res)
		return nil
	}
	p.observe(&res)
	l := &lease{path: p, id: rv.ID, org: req.Org, anchor: req.AnchorDay, limits: req.Limits, amount: amount, endNs: end.UnixNano(), levels: res.Levels}
	m.wg.Add(1)
	l.timer = time.AfterFunc(life, func() { defer m.wg.Done(); m.expire(l) })
	m.openN.Add(1)
	m.open.Store(l, struct{}{})
	m.event(LeaseEvent{Kind: LeaseTaken, Units: amount})
	p.cur.Store(l)
	if m.stopping.Load() { // Close began while it was taken, and may have missed it
		if l.timer.Stop() {
			m.wg.Done() // the timer's func will not run
		}
		m.end(l, false)
	}
	return l
}

// end stops admissions from l and settles it: commits the units admitted from it,
// giving the rest back, exactly once. When retry is true a failing settlement is
// tried again until it succeeds or well past its reservation's expiry. Whatever
// happens nothing admitted goes uncounted: a lease that expired first (its replica
// stalled past the grace) was committed whole by its expiry, which covers what was
// admitted (nothing more is counted: that would count it twice); one whose settlement
// gives up is committed whole by its expiry; one whose record Redis lost (it restarted
// empty before the lease was persisted) has what was admitted counted by a forced check.
func (m *leases) end(l *lease, retry bool) {
	if !l.done.CompareAndSwap(false, true) {
		return
	}
	used := l.close()
	l.path.cur.CompareAndSwap(l, nil)
	defer func() { m.open.Delete(l); m.openN.Add(-1) }()
	e := m.e
	deadline := time.Now().Add(leaseGrace + 10*time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := e.settle(ctx, l.org, l.anchor, l.id, ActionCommit, used, true)
		cancel()
		var se *StateError
		switch {
		case err == nil:
			m.event(LeaseEvent{Kind: LeaseReturned, Units: l.amount - used, Used: used})
			return
		case errors.As(err, &se) && se.State == vocab.Expired:
			m.event(LeaseEvent{Kind: LeaseExpired, Units: l.amount, Used: used})
			return
		case errors.Is(err, ErrReservationNotFound):
			if used > 0 {
				m.countLost(l, used)
			}
			m.event(LeaseEvent{Kind: LeaseReturned, Units: 0, Used: used})
			return
		}
		if !retry || m.stopping.Load() || time.Now().After(deadline) || errors.Is(err, ErrClosed) {
			m.event(LeaseEvent{Kind: LeaseFailed, Units: l.amount, Used: used})
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countLost counts the used units of a lease whose record Redis lost with its data
// (the record and the units it held are gone, so nothing else counts them): a check
// forced to count, as shadow mode is.
func (m *leases) countLost(l *lease, used int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	k := l.path.key
	req := Request{Org: l.org, Team: k.team, User: k.user, Metric: k.metric, Cost: used, Mode: vocab.Shadow,
		Limits: l.limits, AnchorDay: l.anchor}
	m.e.decide(ctx, []*Check{{Request: req}}) // shadow mode: never admitted from a lease
}

// settleAll ends every open lease, once, without retrying (Close).
func (m *leases) settleAll() {
	m.stopping.Store(true)
	m.open.Range(func(k, _ any) bool {
		l := k.(*lease)
		if l.timer != nil && l.timer.Stop() {
			m.wg.Done() // the timer's func will not run
		}
		m.end(l, false)
		return true
	})
	m.wg.Wait()
}

// janitor forgets idle paths until the engine closes.
func (m *leases) janitor() {
	defer m.e.wg.Done()
	t := time.NewTicker(leaseIdle)
	defer t.Stop()
	for {
		select {
		case <-m.e.closing:
			return
		case <-t.C:
			m.sweep(m.e.Now())
		}
	}
}

// sweep forgets paths that have been idle for leaseIdle and hold no lease. A path it
// forgets keeps its busy flag held, so a check that found it just before can take no
// lease on it beside the path's new state.
func (m *leases) sweep(now time.Time) {
	cut := now.Add(-leaseIdle).UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, p := range m.paths {
		if p.cur.Load() == nil && p.winStart.Load() < cut && p.busy.CompareAndSwap(false, true) {
			delete(m.paths, k)
		}
	}
}

// LeasedUnits returns the units held by this engine's open leases and the units admitted
// from them so far (tests and diagnostics: the usage API shows leases as held units,
// from Redis, for every replica at once).
func (e *Engine) LeasedUnits() (held, used int64) {
	if e.leases == nil {
		return 0, 0
	}
	e.leases.open.Range(func(k, _ any) bool {
		l := k.(*lease)
		held += l.amount
		used += l.used.Load() &^ closedBit
		return true
	})
	return held, used
}
