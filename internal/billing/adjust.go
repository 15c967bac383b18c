package billing

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// AdjustInput is an operator's correction of one month counter of an org's current
// period: Set (the committed units become it) or Add (added to them; negative
// lowers), exactly one, each within vocab.MaxUnits; Team names a team's counter,
// Team and User a user's, neither the org's.
type AdjustInput struct {
	Metric string
	Team   string
	User   string
	Set    *int64
	Add    *int64
	Reason string
}

// Adjustment is a counter adjustment as made and audited.
type Adjustment struct {
	Org     string
	Period  string
	Counter quota.Counter
	Before  int64
	After   int64
	Reason  string
	Actor   string
	At      time.Time
}

// adjuster is the engine's side of an adjustment (quota.Engine).
type adjuster interface {
	AdjustCounter(ctx context.Context, org string, anchorDay int, c quota.Counter, set bool, n int64) (quota.Adjusted, error)
	MarkDirty(ctx context.Context, org string, per vocab.Period, c quota.Counter) error
}

func (in AdjustInput) validate() error {
	var fe []derrors.FieldError
	add := func(field, msg string) { fe = append(fe, derrors.FieldError{Field: field, Message: msg}) }
	const idMsg = vocab.IDRule
	if !vocab.ValidID(in.Metric) {
		add("metric", idMsg)
	}
	if in.Team != "" && !vocab.ValidID(in.Team) {
		add("team", idMsg)
	}
	if in.User != "" {
		if !vocab.ValidID(in.User) {
			add("user", idMsg)
		}
		if in.Team == "" {
			add("team", "is required with user: a user's counter is its team's")
		}
	}
	switch {
	case (in.Set == nil) == (in.Add == nil):
		add("set", "give exactly one of set and add")
	case in.Set != nil && (*in.Set < 0 || *in.Set > vocab.MaxUnits):
		add("set", fmt.Sprintf("must be 0 to %d", vocab.MaxUnits))
	case in.Add != nil && (*in.Add < -vocab.MaxUnits || *in.Add > vocab.MaxUnits):
		add("add", fmt.Sprintf("must be -%d to %d", vocab.MaxUnits, vocab.MaxUnits))
	}
	if strings.TrimSpace(in.Reason) == "" || utf8.RuneCountInString(in.Reason) > 500 {
		add("reason", "must say why, in 1 to 500 characters")
	} else if strings.ContainsRune(in.Reason, 0) {
		// The audit row cannot hold it, and the live counter moves before that row is
		// written: refuse it before anything moves.
		add("reason", "must not contain the NUL character (\\u0000)")
	}
	if len(fe) > 0 {
		return &tenants.ValidationError{Fields: fe}
	}
	return nil
}

// AdjustUsage corrects one month counter of org's current period, for operators: the
// live counter in Redis (quota.Engine.AdjustCounter: the committed units set or moved,
// within 0..quota.MaxCounter), then, in one transaction under the period's lock, the
// ledger's row (lowered too: the row remembers when, and a drain whose snapshot began
// before never raises it back) and an audit row "usage.adjust" with who, when, before,
// after and the reason. Hydration after Redis loses the period restores the adjusted
// value. Sliding-window buckets are not touched: they age out within their window.
//
// Errors: ErrInvalid (tenants.ValidationError, naming the fields); tenants.ErrNotFound
// for an unknown org; ErrNoLiveCounters; quota.ErrUnavailable when Redis or Postgres
// fails (Redis may then hold the new value and the ledger the old: repeat a set).
func (s *Service) AdjustUsage(ctx context.Context, a tenants.Actor, org string, in AdjustInput) (Adjustment, error) {
	if err := in.validate(); err != nil {
		return Adjustment{}, err
	}
	o, err := s.Tenants.GetOrg(ctx, org)
	if err != nil {
		return Adjustment{}, err
	}
	if s.Counters == nil {
		return Adjustment{}, ErrNoLiveCounters
	}
	var plan tenants.Plan
	if p, err := s.Tenants.GetPlan(ctx, o.PlanID); err == nil {
		plan = p
	}
	cs, err := s.Counters.CountersFor(org, tenants.RouteOf(o, plan))
	if err != nil {
		return Adjustment{}, fmt.Errorf("adjust %s: %w: %w", org, ErrNoLiveCounters, err)
	}
	eng, ok := cs.(adjuster)
	if !ok {
		return Adjustment{}, ErrNoLiveCounters
	}
	c := quota.Counter{Metric: in.Metric, Level: vocab.LevelOrg}
	switch {
	case in.User != "":
		c.Level, c.Team, c.User = vocab.LevelUser, in.Team, in.User
	case in.Team != "":
		c.Level, c.Team = vocab.LevelTeam, in.Team
	}
	set, n := in.Set != nil, int64(0)
	if set {
		n = *in.Set
	} else {
		n = *in.Add
	}
	adj, err := eng.AdjustCounter(ctx, org, o.BillingAnchorDay, c, set, n)
	if err != nil {
		return Adjustment{}, err
	}
	out := Adjustment{Org: org, Period: adj.Period.ID, Counter: c, Before: adj.Before, After: adj.After,
		Reason: in.Reason, Actor: a.Name, At: adj.At.UTC()}
	if err := s.Store.recordAdjustment(ctx, a, out); err != nil {
		return Adjustment{}, err
	}
	// A drain between the Redis change and the ledger's row may have taken the
	// counter: the next one persists it again (from its value in Redis, after At).
	if err := eng.MarkDirty(ctx, org, adj.Period, c); err != nil && s.Logger != nil {
		s.Logger.Warn("adjust usage: counter not marked for the next drain", "org", org, "err", err.Error())
	}
	return out, nil
}

// auditAdjustment is what the audit log keeps of an adjustment.
type auditAdjustment struct {
	Period string `json:"period"`
	Metric string `json:"metric"`
	Level  string `json:"level"`
	Team   string `json:"team,omitempty"`
	User   string `json:"user,omitempty"`
	Units  int64  `json:"units"`
	Reason string `json:"reason,omitempty"`
}

// counterObject names a counter in the audit log: metric, metric/team or metric/team/user.
func counterObject(c quota.Counter) string {
	switch c.Level {
	case vocab.LevelTeam:
		return c.Metric + "/" + c.Team
	case vocab.LevelUser:
		return c.Metric + "/" + c.Team + "/" + c.User
	}
	return c.Metric
}
