package quota

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// BucketsOnEngineClock returns cfg deciding token buckets on the engine's now (its
// Clock) instead of Redis TIME, so a test of a fake clock can move a bucket's time.
func BucketsOnEngineClock(cfg Config) Config {
	cfg.bucketsOnEngineClock = true
	return cfg
}

// CheckKeys lists every key one check of req touches when the engine's clock reads
// now: the KEYS of the EVALSHA the engine builds (month hash, dirty set, idempotency
// key; hydrate.lua and drain.lua use the first two), then the current and previous
// bucket of each sliding window, which the engine names in ARGV. It fails as New does
// for a bad prefix and as Check does for a bad request.
func CheckKeys(prefix string, req Request, now time.Time) ([]string, error) {
	args, err := CheckCommand(prefix, req, now)
	if err != nil {
		return nil, err
	}
	nkeys := args[2].(int)
	var keys []string
	for _, k := range args[3 : 3+nkeys] {
		keys = append(keys, k.(string))
	}
	argv := args[3+nkeys:]
	nums := argv[len(argv)-1].([]byte) // the last ARGV: nl and nw are its 6th and 7th numbers
	num := func(i int) int { return int(math.Float64frombits(binary.LittleEndian.Uint64(nums[8*i:]))) }
	nl, nw := num(5), num(6)
	for _, k := range argv[nl : nl+2*nw] {
		keys = append(keys, k.(string))
	}
	return keys, nil
}

// KeyCacheLen is the number of entries in e's key cache.
func KeyCacheLen(e *Engine) int { return e.keys.len() }

// WouldBlockPending is the number of would-block rows e holds in memory for all orgs:
// counted and not yet confirmed by Redis.
func WouldBlockPending(e *Engine) int {
	w := e.wb
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for i := range w.shards {
		s := &w.shards[i]
		s.mu.Lock()
		for _, p := range s.orgs {
			n += len(p.counts)
		}
		s.mu.Unlock()
	}
	for _, p := range w.carry {
		n += len(p.counts)
	}
	for _, b := range w.unacked {
		n += (len(b.args) - 4) / 4
	}
	return n
}

// WouldBlockRecorder returns a function that counts reqs[i] as a check that b would
// have denied, as Check does after such a decision (the calls are built beforehand).
func WouldBlockRecorder(e *Engine, reqs []Request, b *vocab.Blocked) func(i int) {
	calls := make([]*call, len(reqs))
	for i := range reqs {
		calls[i] = &call{req: reqs[i], org: reqs[i].Org, period: e.Period(reqs[i].AnchorDay), nowMs: e.Now().UnixMilli()}
	}
	return func(i int) { e.wb.record(calls[i], b) }
}

// LeasePaths is the number of paths e's leases keep state for.
func LeasePaths(e *Engine) int {
	e.leases.mu.RLock()
	defer e.leases.mu.RUnlock()
	return len(e.leases.paths)
}

// ReserveLease holds req.Cost units as a lease (an l_ id), as a hot path's lease does.
func ReserveLease(ctx context.Context, e *Engine, req Request, ttl time.Duration) (vocab.Reservation, vocab.Result, error) {
	return e.reserve(ctx, req, ReserveOptions{TTL: ttl, OnExpiry: vocab.ExpiryCommit, lease: true})
}

// OpenLeases is the number of leases e holds unsettled (admitting, or being settled).
func OpenLeases(e *Engine) int {
	return int(e.leases.openN.Load())
}

// LeaseAdmitting reports whether a path of e has a lease it admits from.
func LeaseAdmitting(e *Engine) bool {
	e.leases.mu.RLock()
	defer e.leases.mu.RUnlock()
	for _, p := range e.leases.paths {
		if l := p.cur.Load(); l != nil && l.used.Load()&closedBit == 0 {
			return true
		}
	}
	return false
}

// SyncClock samples Redis TIME now, as the engine's sampler does every ClockSync.
func SyncClock(ctx context.Context, e *Engine) error { return e.syncClock(ctx) }

// CheckBatch decides reqs[i] on routes[i] through Decide and returns each answer, in
// order; a length mismatch fails every check with ErrInvalid.
func (r *Engines) CheckBatch(ctx context.Context, routes []vocab.Route, reqs []Request) ([]vocab.Result, []Outcome, []error) {
	n := len(reqs)
	results, outs, errs := make([]vocab.Result, n), make([]Outcome, n), make([]error, n)
	if len(routes) != n {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %d routes for %d checks", ErrInvalid, len(routes), n)
		}
		return results, outs, errs
	}
	cs := make([]Check, n)
	for i := range cs {
		cs[i].Route, cs[i].Request = routes[i], reqs[i]
	}
	r.Decide(ctx, cs)
	for i := range cs {
		results[i], outs[i], errs[i] = cs[i].Result, cs[i].Outcome, cs[i].Err
	}
	return results, outs, errs
}

// InFlightOrgs is the number of orgs r holds an in-flight count for.
func InFlightOrgs(r *Engines) int { return r.inflight.len() }

// OrgSlots is the in-flight table of orgs, for its benchmark.
type OrgSlots = orgSlots

// NewOrgSlots returns a table of at most max checks in flight per org.
func NewOrgSlots(max int) *OrgSlots { return newOrgSlots(max) }

// Acquire and Release are orgSlots.acquire and orgSlots.release.
func (s *orgSlots) Acquire(org string) bool { return s.acquire(org) }
func (s *orgSlots) Release(org string)      { s.release(org) }

// BuildOrgKeys builds (or finds) the keys of org in per in e's key cache, as a check
// does.
func BuildOrgKeys(e *Engine, org string, per vocab.Period) { e.orgKeys(org, per) }
