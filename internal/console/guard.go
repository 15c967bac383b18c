package console

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/time/rate"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// Limits bound sign-ins before any password is hashed. Every limit is this replica's: N
// replicas admit up to N times as much. Zero fields take the defaults.
//
//   - Global: sign-ins per Window on this replica, all addresses together (default
//     10/s): with the hash slots (tenants.WithPasswordHashes) it bounds the CPU that
//     hashing can take from the checks, whoever sends them.
//   - PerIP: sign-ins per Window from one client address (default 30/min).
//   - IPFailures: failed sign-ins one address may make across all accounts before it
//     must wait (default 20), after which it gets one more per FailureRefill (1 min):
//     a password spray from one address tries at most 60 accounts an hour.
//   - Per (address, org, email): FreeFailures failures (default 3), then a delay
//     before the next attempt from that address, Delay (1 s) doubling with each
//     further failure up to MaxDelay (15 min); a success clears it. The delay is the
//     address's only: the account's owner, from another address, is never held up
//     by a stranger's failures.
//
// Entries bounds each table (addresses; address and email pairs) as an LRU (default
// 10000 each, about 1 MB): an address gets an entry once admitted, a pair after a
// failed hash, both no faster than Global admits, so pushing an entry out takes
// Entries / Global seconds (1000 s by default) of the replica's whole budget. An IPv6
// client counts by its /64.
type Limits struct {
	Global, PerIP          int
	GlobalWindow, IPWindow time.Duration
	IPFailures             int
	FailureRefill          time.Duration
	FreeFailures           int
	Delay, MaxDelay        time.Duration
	Entries                int
}

func (l *Limits) defaults() {
	if l.Global <= 0 || l.GlobalWindow <= 0 {
		l.Global, l.GlobalWindow = 10, time.Second
	}
	if l.PerIP <= 0 || l.IPWindow <= 0 {
		l.PerIP, l.IPWindow = 30, time.Minute
	}
	if l.IPFailures <= 0 {
		l.IPFailures = 20
	}
	if l.FailureRefill <= 0 {
		l.FailureRefill = time.Minute
	}
	if l.FreeFailures <= 0 {
		l.FreeFailures = 3
	}
	if l.Delay <= 0 {
		l.Delay = time.Second
	}
	if l.MaxDelay <= 0 {
		l.MaxDelay = 15 * time.Minute
	}
	if l.Entries <= 0 {
		l.Entries = 10_000
	}
}

// ThrottledError is a sign-in refused before its password was checked: too many
// from its address, for its address and email, or on this replica. It is a 429; the
// handler sends RetryAfter as Retry-After.
type ThrottledError struct {
	RetryAfter time.Duration
	why        string
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("%s; retry after %d s", e.why, e.Seconds())
}

// Kind is derrors.RateLimited.
func (e *ThrottledError) Kind() derrors.Kind { return derrors.RateLimited }

// Seconds is RetryAfter in whole seconds, at least 1.
func (e *ThrottledError) Seconds() int64 {
	return max(int64(math.Ceil(e.RetryAfter.Seconds())), 1)
}

type ipState struct {
	attempts *rate.Limiter // sign-ins
	failures *rate.Limiter // failed sign-ins, across accounts
}

type pairState struct {
	failures int
	until    time.Time // no attempt from this address for this email before
}

// guard holds the limits' state: token buckets (golang.org/x/time/rate) in LRU
// tables (hashicorp/golang-lru), under one mutex: sign-ins are few, and each
// operation is a map lookup.
type guard struct {
	lim    Limits
	mu     sync.Mutex
	global *rate.Limiter
	ips    *simplelru.LRU[netip.Addr, *ipState]
	pairs  *simplelru.LRU[string, pairState]
}

func newGuard(l Limits) *guard {
	l.defaults()
	ips, _ := simplelru.NewLRU[netip.Addr, *ipState](l.Entries, nil) // only fails for size <= 0
	pairs, _ := simplelru.NewLRU[string, pairState](l.Entries, nil)
	return &guard{lim: l, ips: ips, pairs: pairs,
		global: rate.NewLimiter(every(l.Global, l.GlobalWindow), l.Global)}
}

func every(n int, window time.Duration) rate.Limit { return rate.Every(window / time.Duration(n)) }

func pairKey(ip netip.Addr, org, email string) string {
	return ip.String() + "\x00" + org + "\x00" + strings.ToLower(email)
}

// wait is how long until lim holds a token, 0 when it holds one now.
func wait(lim *rate.Limiter, now time.Time) time.Duration {
	t := lim.TokensAt(now)
	if t >= 1 {
		return 0
	}
	return time.Duration((1 - t) / float64(lim.Limit()) * float64(time.Second))
}

// admit decides whether a sign-in may go on to hash its password, and takes its
// tokens when it may. The order puts the cheapest refusals, and the ones that are a
// single address's own, first: a flood from one address is refused before it spends
// the replica's global budget.
func (g *guard) admit(now time.Time, ip netip.Addr, org, email string) error {
	ip = client(ip)
	g.mu.Lock()
	defer g.mu.Unlock()
	if p, ok := g.pairs.Get(pairKey(ip, org, email)); ok && now.Before(p.until) {
		return &ThrottledError{RetryAfter: p.until.Sub(now), why: "too many failed sign-ins for this email from this address"}
	}
	st, known := g.ips.Get(ip)
	if known {
		if d := wait(st.failures, now); d > 0 {
			return &ThrottledError{RetryAfter: d, why: "too many failed sign-ins from this address"}
		}
		if d := wait(st.attempts, now); d > 0 {
			return &ThrottledError{RetryAfter: d, why: "too many sign-ins from this address"}
		}
	}
	if d := wait(g.global, now); d > 0 {
		return &ThrottledError{RetryAfter: d, why: "too many sign-ins at once"}
	}
	// An address gets its entry only once admitted, so entries come no faster than
	// the global limit admits: a flood from fresh addresses cannot churn the table.
	if !known {
		st = &ipState{attempts: rate.NewLimiter(every(g.lim.PerIP, g.lim.IPWindow), g.lim.PerIP),
			failures: rate.NewLimiter(rate.Every(g.lim.FailureRefill), g.lim.IPFailures)}
		g.ips.Add(ip, st)
	}
	st.attempts.AllowN(now, 1)
	g.global.AllowN(now, 1)
	return nil
}

// client is the unit the limits count by: an IPv4 address, or an IPv6 address's /64
// (one subscriber's network, whose 2^64 addresses cost an attacker nothing).
func client(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// failed records a failed sign-in: one more towards the address's and email's delay,
// and one of the address's failures across accounts.
func (g *guard) failed(now time.Time, ip netip.Addr, org, email string) {
	ip = client(ip)
	g.mu.Lock()
	defer g.mu.Unlock()
	k := pairKey(ip, org, email)
	p, _ := g.pairs.Get(k)
	p.failures++
	if n := p.failures - g.lim.FreeFailures; n >= 0 {
		d := g.lim.Delay
		for i := 0; i < n && d < g.lim.MaxDelay; i++ {
			d *= 2
		}
		p.until = now.Add(min(d, g.lim.MaxDelay))
	}
	g.pairs.Add(k, p)
	if st, ok := g.ips.Get(ip); ok {
		st.failures.AllowN(now, 1)
	}
}

// succeeded clears the delay of the address and email.
func (g *guard) succeeded(ip netip.Addr, org, email string) {
	ip = client(ip)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pairs.Remove(pairKey(ip, org, email))
}
