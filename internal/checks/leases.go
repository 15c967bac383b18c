package checks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Client leases (docs/ARCHITECTURE.md "Client leases"): a client library admits the
// checks of a hot path in its own process from units the server took for it, as a
// reservation with on_expiry commit, atomically from every level of the path. The
// client settles the lease with what it admitted; one it never settles (its process
// died) is committed whole when its reservation expires, so a lost client costs its
// unsettled leases, counted as used, and never an admission past a limit. The server
// alone sizes a lease, from the rate the client reports and the path's headroom.

const (
	// ClientLeaseMaxLife bounds a client lease's life: the client settles what it
	// admitted at most this long after taking it, plus the time to send the settlement.
	ClientLeaseMaxLife = time.Second
	// clientLeaseGrace is added to a lease's life in its reservation's TTL: the time a
	// client has to settle it after its end before it is counted whole.
	clientLeaseGrace = 5 * time.Second
	// clientLeaseShare: a lease takes at most 1/clientLeaseShare of the least remaining
	// headroom of its path's limits, so k holders of one path together take at most
	// 1 - (1 - 1/16)^k of it, and a lost holder's cost is a small part of what was left.
	clientLeaseShare = 16
	// clientLeaseTraffic is a lease's size in lives of the path's traffic, so a steady
	// path ends a lease by time rather than running dry.
	clientLeaseTraffic = 1.25
	// clientLeaseMin is the smallest lease worth taking: below it the path is near a
	// limit and its checks go to the server one by one, so the last units are admitted.
	clientLeaseMin = 4
	// clientLeaseMinLife is the shortest lease worth taking: a bucket that ends sooner
	// is waited out (window_edge).
	clientLeaseMinLife = 5 * time.Millisecond
	// leaseAgainNear is how long a client checks one by one after a near_limit answer,
	// leaseAgainOff after client_leases_off or not_leasable.
	leaseAgainNear = time.Second
	leaseAgainOff  = time.Minute
	// headroomPaths bounds the paths whose last seen headroom is remembered.
	headroomPaths = 1 << 16
)

// Why a lease answer holds no units.
const (
	LeaseOff          = "client_leases_off"
	LeaseNearLimit    = "near_limit"
	LeaseNotLeasable  = "not_leasable"
	LeaseAtWindowEdge = "window_edge"
)

// LeaseHolder is who holds a lease, which says how it is sized near a limit.
type LeaseHolder int

const (
	// HolderClient is a client library: near a limit it is answered 0 units and checks
	// one by one, so the last units are admitted by the counters.
	HolderClient LeaseHolder = iota
	// HolderProxy is an Envoy proxy holding an RLQS assignment (internal/rls): it cannot
	// check one by one, so near a limit its lease is clientLeaseMin units while they
	// are left (then what is left, to the last unit), and a
	// path whose last seen headroom shows none is asked of the counters once, the
	// refusal's retry (when the window can admit again) becoming the answer's TTL. The
	// org's client_leases setting is not read: it is the client libraries'.
	HolderProxy
)

// ProxyLeaseMaxLife bounds a proxy's lease (LeaseInput.Life) as ClientLeaseMaxLife
// bounds a client's.
const ProxyLeaseMaxLife = 10 * time.Second

// LeaseInput asks for a lease of a path: the check's org, team, user and metric (its
// cost, costs and idempotency key are not read), and the rate in units a second the
// holder saw on the path (nil: none).
type LeaseInput struct {
	Check Input
	Rate  *float64
	// Holder is a client (the default) or a proxy.
	Holder LeaseHolder
	// Life is the longest the lease lives: 0 is ClientLeaseMaxLife, a proxy's may be
	// up to ProxyLeaseMaxLife. It still ends with the current bucket of the path's
	// shortest sliding window and with the period (quota.LeaseEnd).
	Life time.Duration
}

// Lease is a client lease just taken, or, with Units 0, the answer to check one by one:
// Reason says why and TTL for how long.
type Lease struct {
	ID        string
	Units     int64
	ExpiresAt time.Time // nothing may be admitted from it after
	SettleBy  time.Time // its reservation's expiry: unsettled by then, counted whole
	TTL       time.Duration
	Reason    string
	Decision  Decision // with Units, the path's levels after the lease
}

// LeaseSettled is what a settlement counted and gave back.
type LeaseSettled struct{ Used, Released int64 }

// validRate refuses a rate that is not a number of units a second the API counts.
func validRate(field string, rate *float64) error {
	if rate != nil && (math.IsNaN(*rate) || *rate < 0 || *rate > float64(vocab.MaxUnits)) {
		return derrors.Field(field, fmt.Sprintf("must be a number from 0 to %d", vocab.MaxUnits))
	}
	return nil
}

// Lease takes a client lease of in's path for the caller. The org or its plan may turn
// client leases off, and a path that cannot be leased (leasable) answers Units 0, as a
// path near a limit does. Errors: Check's, and Invalid naming rate.
func (s *Service) Lease(ctx context.Context, c Caller, in LeaseInput) (Lease, error) {
	enter(ctx, "checks.Lease")
	if err := validRate("rate", in.Rate); err != nil {
		return Lease{}, err
	}
	check := in.Check
	check.Cost, check.Costs, check.IdempotencyKey = nil, nil, nil
	rc, err := s.resolveHeld(ctx, c, check)
	if err != nil {
		return Lease{}, err
	}
	org, err := s.org(ctx, check.Org)
	if err != nil {
		return Lease{}, err
	}
	if in.Holder == HolderClient && org.ClientLeases == tenants.LeasesOff {
		return Lease{Reason: LeaseOff, TTL: leaseAgainOff}, nil
	}
	if !quota.Leasable(&rc.req) {
		return Lease{Reason: LeaseNotLeasable, TTL: leaseAgainOff}, nil
	}
	rate := 0.0
	if in.Rate != nil {
		rate = *in.Rate
	}
	life := ClientLeaseMaxLife
	if in.Life > 0 {
		life = in.Life
		if in.Holder == HolderProxy {
			life = min(life, ProxyLeaseMaxLife)
		} else {
			life = min(life, ClientLeaseMaxLife)
		}
	}
	return s.takeLease(ctx, &rc, rate, in.Holder, life)
}

// takeLease sizes and reserves a lease of rc's path: rate x its life x
// clientLeaseTraffic, at most 1/clientLeaseShare of the path's headroom as last seen
// (before any lease of the path: its least limit). A lease that does not fit is tried
// once more at the share of what its refusal shows is left. A proxy's lease is at least
// one unit (HolderProxy); a proxy refused with nothing left is answered near_limit with
// the refusal's retry as its TTL.
func (s *Service) takeLease(ctx context.Context, rc *resolved, rate float64, holder LeaseHolder, maxLife time.Duration) (Lease, error) {
	req := rc.req
	now := s.engine.Now(rc.route)
	end := quota.LeaseEnd(&req, now, maxLife, vocab.PeriodAt(now, req.AnchorDay).End)
	life := end.Sub(now)
	if life < clientLeaseMinLife {
		return Lease{Reason: LeaseAtWindowEdge, TTL: max(life, time.Millisecond)}, nil
	}
	least := int64(clientLeaseMin)
	if holder == HolderProxy {
		least = 1
	}
	want := max(int64(math.Min(math.Ceil(rate*life.Seconds()*clientLeaseTraffic), float64(vocab.MaxUnits))), least)
	path := leasePathKey(&req)
	headroom, seen := s.headroom.Get(path)
	if !seen {
		headroom = leastLimit(&req)
	}
	opt := quota.ReserveOptions{TTL: life + clientLeaseGrace, OnExpiry: vocab.ExpiryCommit}
	near := Lease{Reason: LeaseNearLimit, TTL: leaseAgainNear}
	for try := 0; try < 2; try++ {
		amount := min(want, headroom/clientLeaseShare)
		if holder == HolderProxy {
			// near a limit, clientLeaseMin units while they are left, then what is;
			// with none seen, the counters are asked once for one
			amount = min(want, max(amount, min(headroom, clientLeaseMin), 1))
		}
		if amount < least {
			return near, nil
		}
		req.Cost = amount
		rv, res, err := s.engine.Reserve(ctx, rc.route, req, opt)
		if err != nil {
			return Lease{}, engineError(err)
		}
		if !res.Allowed {
			headroom = leastRemaining(&res, true)
			s.headroom.Add(path, headroom)
			if holder == HolderProxy && headroom < 1 {
				// until the window can admit again, or sooner if held units come back
				// and the proxy asks again
				near.TTL = max(res.RetryAfter, leaseAgainNear)
				d := rc.decision(false)
				d.Result = res
				describe(&d, now)
				near.Decision = d
				return near, nil
			}
			continue
		}
		s.headroom.Add(path, leastRemaining(&res, false)+amount)
		d := rc.decision(false)
		d.Result = res
		describe(&d, now)
		return Lease{ID: rv.ID, Units: amount, ExpiresAt: end, SettleBy: rv.ExpiresAt, TTL: life, Decision: d}, nil
	}
	return Lease{Reason: LeaseNearLimit, TTL: leaseAgainNear}, nil
}

// SettleLease counts used units of client lease id and gives the rest back (a commit
// of its reservation), and with renew takes the path's next lease at rate. A lease
// that expired unsettled was committed whole: its settlement says so. A repeated
// settlement answers the first's settled units and takes no next lease. Errors:
// Commit's (NotFound for another org's lease; Conflict for one released), Invalid
// naming used or rate.
func (s *Service) SettleLease(ctx context.Context, c Caller, id string, used int64, renew bool, rate *float64) (LeaseSettled, *Lease, error) {
	enter(ctx, "checks.SettleLease")
	if err := validRate("rate", rate); err != nil {
		return LeaseSettled{}, nil, err
	}
	res, err := s.Commit(ctx, c, id, used)
	var se *quota.StateError
	if errors.As(err, &se) && se.State == vocab.Expired {
		res, err = s.Reservation(ctx, c, id)
	}
	if err != nil {
		return LeaseSettled{}, nil, err
	}
	settled := LeaseSettled{Used: res.Used, Released: res.Released}
	if !renew || res.Replayed {
		// A repeat takes no second next lease: the first answer's, if that answer was
		// lost, is counted whole at its settle_by, never held twice.
		return settled, nil, nil
	}
	in := LeaseInput{Check: Input{Org: res.Org, Metric: &res.Metric}, Rate: rate}
	if res.Team != "" {
		in.Check.Team = &res.Team
	}
	if res.User != "" {
		in.Check.User = &res.User
	}
	next, err := s.Lease(ctx, c, in)
	if err != nil {
		return LeaseSettled{}, nil, err
	}
	return settled, &next, nil
}

// leasePathKey names req's path in the headroom cache.
func leasePathKey(req *quota.Request) string {
	return req.Org + "\x00" + req.Team + "\x00" + req.User + "\x00" + req.Metric
}

// leastLimit is the least limit of req's path: its headroom before anything is known.
func leastLimit(req *quota.Request) int64 {
	least := vocab.MaxUnits
	for _, ls := range [...][]vocab.Limit{req.Limits.Org, req.Limits.Team, req.Limits.User} {
		for _, l := range ls {
			if l.Metric == "" || l.Metric == req.Metric {
				least = min(least, l.Limit)
			}
		}
	}
	return least
}

// leastRemaining is the least headroom res shows at any level and window; a refusal's
// levels are as before it, so what is left is the limit less what is used.
func leastRemaining(res *vocab.Result, refused bool) int64 {
	least := vocab.MaxUnits
	for _, l := range res.Levels {
		r := l.Remaining
		if refused {
			r = l.Limit - l.Used
		}
		least = min(least, max(r, 0))
	}
	return least
}
