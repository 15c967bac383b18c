package quota

import (
	"fmt"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// DefaultSaturation is the share of a capacity's limit used in its window above which
// fair share applies, when Capacity.Saturation is 0.
const DefaultSaturation = 0.8

// MaxWeight is the largest weight a plan, org or team may carry; the smallest is 1.
const MaxWeight = vocab.MaxWeight

// Capacity is a limit above the orgs' own (docs/ARCHITECTURE.md "Capacities and fair
// share"): Limit units of one metric in one sliding window (Second to Day), drawn on
// by every check that names it, all or nothing with the check's own limits. Below
// Saturation x Limit used in the window anyone may use what is left; above it a member
// is admitted only within its weighted max-min fair share of the window.
type Capacity struct {
	// ID names the capacity: an operator's capacity id (vocab.ValidID), or, for an
	// org limit marked fair_share (FairShare), the org's id.
	ID string
	// FairShare says the capacity is an org limit shared by its teams: its members
	// are teams, its state lives beside the org's, and a refusal names the org limit
	// (vocab.Blocked.FairShare).
	FairShare bool
	// Metric is the metric the capacity counts; a fair-share capacity's key includes
	// it, as an org has one such limit per metric and window.
	Metric string
	Window vocab.Window
	Limit  int64
	// Saturation is in (0, 1]; 0 means DefaultSaturation.
	Saturation float64
}

// CapacityDraw is a check's draw on a capacity: the cost of the request's metric
// Capacity.Metric, drawn by Member with Weight.
type CapacityDraw struct {
	Capacity
	// Member is who draws: the org for an operator's capacity, the team for a
	// fair-share org limit.
	Member string
	// Weight is the member's weight, 1 to MaxWeight.
	Weight int64
}

// CapacityWindow is a capacity's current window as GET /v1/capacities/{id} shows it.
type CapacityWindow struct {
	Used  int64
	Limit int64
	// Saturated is true when Used is at or above Saturation x Limit: members are
	// then held to their shares.
	Saturated bool
	// Members are the members active in the window (admitted or refused in it),
	// by id.
	Members []CapacityMember
}

// CapacityMember is one active member of a capacity's window.
type CapacityMember struct {
	ID     string
	Weight int64
	// Share is the member's weighted max-min fair share of the window's limit now.
	Share int64
	// Used is what the member drew in the window (units granted to this and other
	// replicas, admitted or held for admission).
	Used int64
}

// validate reports what is wrong with the draw, wrapping ErrInvalid.
func (d *CapacityDraw) validate() error {
	switch {
	case !vocab.ValidID(d.ID):
		return fmt.Errorf("%w: capacity %q is not a valid id", ErrInvalid, d.ID)
	case d.Window.Duration() <= 0:
		return fmt.Errorf("%w: capacity %s: window %q is not second, minute, hour or day", ErrInvalid, d.ID, d.Window)
	case d.Limit < 1 || d.Limit > vocab.MaxUnits:
		return fmt.Errorf("%w: capacity %s: limit %d is not 1 to %d", ErrInvalid, d.ID, d.Limit, vocab.MaxUnits)
	case d.Saturation < 0 || d.Saturation > 1:
		return fmt.Errorf("%w: capacity %s: saturation %v is not in (0, 1]", ErrInvalid, d.ID, d.Saturation)
	case !vocab.ValidID(d.Member):
		return fmt.Errorf("%w: capacity %s: member %q is not a valid id", ErrInvalid, d.ID, d.Member)
	case d.Weight < 1 || d.Weight > MaxWeight:
		return fmt.Errorf("%w: capacity %s: weight %d is not 1 to %d", ErrInvalid, d.ID, d.Weight, MaxWeight)
	case !vocab.ValidID(d.Metric):
		return fmt.Errorf("%w: capacity %s: metric %q is not a valid id", ErrInvalid, d.ID, d.Metric)
	}
	return nil
}
