package checks

import (
	"context"
	"errors"
	"fmt"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Capacities and fair share (docs/ARCHITECTURE.md "Capacities and fair share"): a
// check draws, for every metric it names, on each operator capacity of that metric
// (the member is its org, by the org's weight), and on each org limit of that metric
// marked fair_share whose metric and window its team has no limit of its own for
// (the member is its team, by the team's weight). The engine takes the draws all or
// nothing with the check's own limits, and leaves a shadow or warn org's refusal a
// would-block. A check without a team draws on no fair-share limit. A reservation
// draws its amount when it is taken; a client lease draws on none, as a path that
// draws is not leased (leases.go).

// Capacities reads capacity windows for the operator's view. *quota.Engines satisfies
// it; its errors are the engine's (quota.ErrInvalid, ErrUnavailable).
type Capacities interface {
	CapacityWindow(ctx context.Context, c quota.Capacity) (quota.CapacityWindow, error)
}

// fairShareSaturation is the saturation point of an org limit marked fair_share: the
// share of the limit used in its window above which teams are held to their shares.
const fairShareSaturation = quota.DefaultSaturation

// drawCapacities adds to req the draws of its metrics on the capacities caps holds,
// and on the org limits marked fair_share in orgLimits (the org's effective limits),
// throttled by th as the check's own limits are, that team shares.
func drawCapacities(req *quota.Request, caps tenants.CapacitySet, org tenants.ResolvedOrg, team tenants.Team, th tenants.Throttle) {
	if caps.Len() == 0 && req.Team == "" {
		return
	}
	draw := func(metric string) {
		for _, c := range caps.Of(metric) {
			req.Capacities = append(req.Capacities, quota.CapacityDraw{
				Capacity: quota.Capacity{ID: c.ID, Metric: c.Metric, Window: c.Window, Limit: c.Limit, Saturation: c.Saturation},
				Member:   req.Org, Weight: max(org.Weight, 1)})
		}
		if req.Team == "" {
			return
		}
		for _, l := range org.Org.EffectiveLimits {
			if !l.FairShare || l.Metric != metric || l.Window.Duration() <= 0 || hasLimit(team.Limits, metric, l.Window) {
				continue
			}
			n := min(th.Apply(l.Window, l.Limit), vocab.MaxUnits)
			if n < 1 { // a limit of 0 refuses every check itself
				continue
			}
			req.Capacities = append(req.Capacities, quota.CapacityDraw{
				Capacity: quota.Capacity{ID: req.Org, FairShare: true, Metric: metric, Window: l.Window, Limit: n, Saturation: fairShareSaturation},
				Member:   req.Team, Weight: max(team.Weight, 1)})
		}
	}
	draw(req.Metric)
	for i := range req.More {
		draw(req.More[i].Metric)
	}
}

// hasLimit says whether ls holds a limit of metric and window.
func hasLimit(ls []vocab.Limit, metric string, w vocab.Window) bool {
	for _, l := range ls {
		if l.Metric == metric && l.Window == w {
			return true
		}
	}
	return false
}

// CapacityWindow is a capacity's current window as the operator sees it.
type CapacityWindow = quota.CapacityWindow

// CapacityWindow reads capacity c's current window: used, saturated, and each active
// org's weight, fair share and use. Errors: Unavailable (no engine, or its Redis does
// not answer), Internal.
func (s *Service) CapacityWindow(ctx context.Context, c tenants.Capacity) (CapacityWindow, error) {
	caps, ok := s.engine.(Capacities)
	if s.engine == nil || !ok {
		return CapacityWindow{}, ErrNoEngine
	}
	w, err := caps.CapacityWindow(ctx, quota.Capacity{ID: c.ID, Metric: c.Metric, Window: c.Window, Limit: c.Limit, Saturation: c.Saturation})
	if err != nil {
		if errors.Is(err, quota.ErrInvalid) { // a stored capacity the engine refuses: ours, not the caller's
			return CapacityWindow{}, derrors.E(derrors.Internal, fmt.Sprintf("capacity %s cannot be read", c.ID), err)
		}
		return CapacityWindow{}, engineError(err)
	}
	return w, nil
}

// capacitiesOf reads the capacities from the cache. Errors: Unavailable.
func (s *Service) capacitiesOf(ctx context.Context) (tenants.CapacitySet, error) {
	caps, err := s.cache.Capacities(ctx)
	if err != nil {
		return caps, derrors.E(derrors.Unavailable, "the tenancy store is unavailable and the capacities are not cached; retry shortly", err)
	}
	return caps, nil
}
